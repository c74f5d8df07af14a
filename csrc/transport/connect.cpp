#include "transport/connect.h"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <vector>

#include "common/thresholds.h"
#include "transport/rendezvous.h"
#include "transport/store_exchange.h"

namespace ringpg {

namespace {

// The settings every rank of a group must share, agreed on in one Store round trip
// (right after the addresses, before any socket is connected): each rank publishes one line of them
// under the group's keys and reads every other rank's.
//  - RINGPG_TRANSPORT: Gloo's pairs need a ProcessGroupGloo on every rank (one rank
//    alone on them would wait for the others until the timeout), and shm, which refuses
//    a group that cannot use shared memory, must be asked for by all or its refusal
//    would reach some ranks only; auto and tcp mix (the shared-memory agreement then
//    keeps the whole group on TCP).
//  - the wire plan: the algorithm (hierarchical or ring), the one-shot limit, the
//    segment size (frame sizes; the shared-memory slot size), the hierarchical piece
//    size, the arena's buffer size and the all-to-all algorithm decide which frames each rank sends and
//    expects, so ranks that differ would fail their first op with a "collective
//    mismatch" that names no setting; and a rank with RINGPG_TRACE set runs a clock
//    sync with rank 0 that untraced ranks skip.
// (Local settings stay local: the receive window, the spin, socket buffers, the work
// cache, the reduction ISA, congestion control; tests/test_rendezvous_and_registration.py
// runs a group whose ranks differ in the receive window.)
// Whether the ranks' values of a setting (one per rank) may run together.
using Agreement = bool (*)(const std::vector<std::string>& values);

bool allEqual(const std::vector<std::string>& values) {
  return std::all_of(values.begin(), values.end(), [&](const std::string& x) { return x == values[0]; });
}

// Transports mix auto and tcp; gloo and shm only with themselves.
bool transportsMix(const std::vector<std::string>& values) {
  const auto all = [&](const char* v) {
    return std::all_of(values.begin(), values.end(), [&](auto& x) { return x == v; });
  };
  const auto any = [&](const char* v) {
    return std::any_of(values.begin(), values.end(), [&](auto& x) { return x == v; });
  };
  return (!any("gloo") || all("gloo")) && (!any("shm") || all("shm"));
}

struct SharedSetting {
  const char* name;  // as the user sets it
  const char* rule;  // what the error asks for
  Agreement agrees;  // when the ranks' values may run together
  std::string value; // this rank's
};

std::vector<SharedSetting> sharedSettings(const Config& cfg, Config::Transport transport) {
  constexpr const char* kSame = "it must be the same on every rank";
  return {
      {"RINGPG_TRANSPORT", "gloo and shm must be set on every rank or on none", transportsMix,
       Config::transportName(transport)},
      {"RINGPG_ALGO / ringpg.use_algorithm", kSame, allEqual, Config::algoName(cfg.algo)},
      {"RINGPG_TUNING segment_bytes", kSame, allEqual, std::to_string(cfg.segmentBytes)},
      {"RINGPG_TUNING oneshot_bytes", kSame, allEqual, std::to_string(cfg.oneShotBytes)},
      {"RINGPG_TUNING hier_piece_bytes", kSame, allEqual, std::to_string(cfg.hierPieceBytes)},
      {"RINGPG_ARENA_BYTES", kSame, allEqual, std::to_string(cfg.arenaBytes)},
      {"RINGPG_TUNING alltoall", kSame, allEqual, Config::allToAllName(cfg.allToAll)},
      {"RINGPG_TRACE", "set it on every rank or on none", allEqual, cfg.traceDir.empty() ? "off" : "on"},
  };
}

// The disagreements among the ranks' lines of settings (one line a rank, its values
// '\n'-separated in sharedSettings' order), as the error's text; "" where they agree.
// Rank 0's decision (GroupStore::decide), so only rank 0 reads every rank's line.
std::string settingsDisagreement(const std::vector<SharedSetting>& mine, const std::vector<std::string>& lines) {
  const int size = static_cast<int>(lines.size());
  std::vector<std::vector<std::string>> values(mine.size()); // [setting][rank]
  for (const auto q : c10::irange(size)) {
    std::vector<std::string> theirs(1);
    for (const auto ch : lines[q]) {
      if (ch == '\n') {
        theirs.emplace_back();
      } else {
        theirs.back() += static_cast<char>(ch);
      }
    }
    if (theirs.size() <= mine.size()) {
      return c10::str("the number of settings: rank ", q, " published ", theirs.size() - 1, " where rank 0 has ",
                      mine.size(), "; is it running another ringpg build?");
    }
    for (const auto i : c10::irange(mine.size())) {
      values[i].push_back(theirs[i]);
    }
  }
  std::string why;
  for (const auto i : c10::irange(mine.size())) {
    if (mine[i].agrees(values[i])) {
      continue;
    }
    std::string listed;
    for (const auto q : c10::irange(size)) {
      listed += c10::str(q == 0 ? "" : ", ", "rank ", q, ": ", values[i][q]);
    }
    why += c10::str(why.empty() ? "" : "; and on ", mine[i].name, " (", listed, "); ", mine[i].rule);
  }
  return why;
}

void agreeOnSettings(GroupStore& store, int rank, int size, const Config& cfg, Config::Transport transport,
                     Deadline deadline) {
  if (size == 1) {
    return;
  }
  const std::vector<SharedSetting> mine = sharedSettings(cfg, transport);
  std::string line; // the values, one per setting, '\n'-separated (none holds a newline)
  for (const auto& s : mine) {
    line += s.value + "\n";
  }
  const std::string why = store.decide("settings", rank, size, line, [&](const std::vector<std::string>& lines) {
    return settingsDisagreement(mine, lines);
  });
  if (!why.empty()) {
    // Every rank raises, so the store's host may soon be gone: leave together.
    store.leaveTogether("settings/read", size, deadline);
    TORCH_CHECK_VALUE(false, "ringpg: the ranks of a group disagree on ", why);
  }
}

// The peers a rank connects at creation: all of them (RINGPG_CONNECT all), else those
// its rings use, so a neighbour that cannot be reached fails the creation and every
// rank has two connected neighbours to spread a failure along; the rest on first use.
std::vector<int> peersToConnect(const Config& cfg, const GroupPlan& plan, const Topology& topo, int rank, int size) {
  if (cfg.connect != Config::Connect::All) {
    return plan.peers(topo);
  }
  std::vector<int> peers;
  for (const auto q : c10::irange(size)) {
    if (q != rank) {
      peers.push_back(q);
    }
  }
  return peers;
}

// How the group's same-host waits (the links' and the arena's) spin.
void setSameHostWaits(GroupLinks& g, const Config& cfg, int rank) {
  // Waits spin, pausing while this host's ranks can each have a core, and yielding on
  // every look where they outnumber the CPUs they may use together (counted over their
  // masks, so that ranks pinned one to a core each have one): the rank waited for may
  // need this very core.
  const int localRanks = g.topology.ranksOn(g.topology.hostOf(rank));
  const int cpus = g.topology.cpusOfHost(g.topology.hostOf(rank));
  g.shmSpinMicros = cfg.shmSpinMicros();
  g.shmSpinYields = localRanks > cpus;
}

// The same-host links of this rank's host ring (shm.h); `*used`: every rank agreed on
// shared memory.
void connectSharedMemory(GroupLinks& g, const Config& cfg, Config::Transport transport, int rank, Deadline deadline,
                         bool* used) {
  // A slot holds one segment, its size clamped (common/thresholds.h); larger segments travel as fragments.
  const size_t slotBytes = std::clamp<size_t>(cfg.segmentBytes, kSlotMinBytes, kSlotMaxBytes);
  ShmOptions shmOptions;
  shmOptions.setting = transport;
  shmOptions.slotBytes = slotBytes;
  shmOptions.spinMicros = g.shmSpinMicros;
  shmOptions.spinYields = g.shmSpinYields;
  shmOptions.cmaBytes = cfg.cmaBytes;
  shmOptions.measureCopy = !cfg.cmaBytesSet && cfg.cmaOpBytes == Config::kCmaOpAuto;
  shmOptions.cmaOpBytes = cfg.cmaOpBytes;
  g.shm = ShmLink::connect(*g.store, *g.engine, g.topology, rank, shmOptions, deadline, used);
}

// The host arena of each host's ranks (arena.h), where the algorithms use one, unless
// the links were asked for (RINGPG_TRANSPORT tcp or gloo) or RINGPG_ARENA_BYTES=0.
// The plan's answer and gloo are agreed on every rank (the topology, agreeOnSettings),
// so a group that does not use one skips the arena's agreement altogether; tcp may be
// one rank's alone, and that rank's refusal reaches the others through the agreement.
void connectArena(GroupLinks& g, const Config& cfg, Config::Transport transport, int rank, const GroupPlan& plan) {
  const bool arenaAllowed = transport != Config::Transport::Gloo && plan.hostArena(g.topology);
  const bool arenaWanted = arenaAllowed && transport != Config::Transport::Tcp;
  if (arenaAllowed) {
    g.arena = HostArena::connect(*g.store, *g.engine, g.topology, rank, arenaWanted, cfg.arenaBytes, g.shmSpinMicros,
                                 g.shmSpinYields, &g.arenaWhyNot);
  }
  if (!g.arena && rank == 0 && arenaWanted && !g.arenaWhyNot.empty()) {
    LOG(INFO) << "ringpg: no host arena, the collectives run on the links: " << g.arenaWhyNot;
  }
}

// The links: every peer on the engine, but the neighbours on this host's ring on
// shared memory; with the gloo transport every collective frame on Gloo's pairs (the
// engine keeps control: announcements, aborts, point-to-point).
void wireLinks(GroupLinks& g, Config::Transport transport, int rank, int size, std::chrono::milliseconds timeout,
               bool shmUsed) {
  g.engineLink = std::make_unique<EngineLink>(*g.engine);
  g.links = LinkTable::engineOnly(*g.engineLink, *g.engine, g.topology);
  if (g.shm) {
    if (g.shm->sendsRight()) {
      g.links.routeTo(g.shm->right(), g.shm.get());
    }
    if (g.shm->receivesLeft()) {
      g.links.routeFrom(g.shm->left(), g.shm.get());
    }
    g.links.driven = g.shm.get();
    g.links.sameHostCopy = g.shm->copyPlan();
  }
  if (transport == Config::Transport::Gloo && size > 1) {
    // Gloo's rendezvous on a prefix of this group's keys, after ringpg's own, where
    // ranks that disagree about the transport have failed already.
    auto glooStore = c10::make_intrusive<c10d::PrefixStore>(g.store->prefix() + "gloo_link/", g.store->store());
    g.gloo = std::make_unique<GlooLink>(makeGlooBackend(glooStore, rank, size, timeout), *g.engine, rank, size);
    g.links.routeAll(g.gloo.get());
  }
  // Agreed facts only, since every rank must plan alike: shared memory, on one host.
  g.links.ringFusedEverywhere = shmUsed && g.topology.hosts == 1;
  g.links.arena = g.arena.get();
}

} // namespace

// In named steps: rendezvous, the settings' agreement, the topology, the engine and the
// rings' sockets, shared memory, the arena, the link table.
std::unique_ptr<GroupLinks> connectGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                         std::chrono::milliseconds timeout, const Config& cfg,
                                         Config::Transport transport, const GroupPlan& plan) {
  auto g = std::make_unique<GroupLinks>();
  const Deadline deadline = Clock::now() + timeout;
  Rendezvous rv = rendezvous(store, rank, size, cfg.ifname);
  g->localAddress = rv.localAddress;
  g->store = rv.store;
  agreeOnSettings(*g->store, rank, size, cfg, transport, deadline);
  // The ring runs host by host (topology.h); its hops between ranks of one host move
  // through shared memory (shm.h).
  g->topology = exchangeTopology(*g->store, rank, size, cfg);
  // The peers connected now, their addresses read in one round trip before the engine
  // starts: a peer's hello may then be answered without another read.
  const std::vector<int> peers = peersToConnect(cfg, plan, g->topology, rank, size);
  rv.book.learn(peers);
  g->engine = std::make_unique<Engine>(rank, size, std::move(rv), g->failure, cfg.socketBuffer, cfg.tcpCongestion,
                                       cfg.engineSpinMicros(),
                                       std::max<std::chrono::milliseconds>(timeout, Engine::kMinHelloWindow));
  g->engine->connectPeers(peers, deadline);
  setSameHostWaits(*g, cfg, rank);
  connectArena(*g, cfg, transport, rank, plan);
  // The same-host links where an op can use them; where the arena runs every
  // collective, shared memory is the arena's alone.
  bool shmUsed = false;
  const bool linksServe = !plan.sameHostLinks || plan.sameHostLinks(g->topology, g->arena != nullptr);
  if (linksServe) {
    connectSharedMemory(*g, cfg, transport, rank, Clock::now() + timeout, &shmUsed);
  }
  g->transport = transport == Config::Transport::Gloo ? "gloo"
                 : !shmUsed && linksServe             ? "tcp"
                 : g->topology.hosts == 1             ? "shm"
                                                      : "shm+tcp";
  wireLinks(*g, transport, rank, size, timeout, shmUsed);
  return g;
}

} // namespace ringpg
