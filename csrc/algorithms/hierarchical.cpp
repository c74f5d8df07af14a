#include "algorithms/hierarchical.h"

#include "algorithms/arena_collectives.h"
#include "algorithms/choice.h"
#include "algorithms/ring.h"
#include "algorithms/ring_plan.h"
#include "common/host.h"

#include <c10/util/irange.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace ringpg {

namespace {

// Segments per chunk on the host and cross-host rings.  Their hops mix links (a host
// ring closes over TCP), and both ends of every hop must cut alike, so one value for all.
constexpr int64_t kMinSegments = 16;
// At most this many pieces: each costs the network a ring's fill and drain.
constexpr int kMaxPieces = 16;

// Where rank r's chunk sits in the hierarchical reduce-scatter's and all-gather's
// layout (hierarchical.h): local-rank-major, localIndex(r) * hosts + host of r, so the
// chunks of one cross-host ring (one local index) are contiguous, in host order.
// Requires equal hosts (ranksPerHost() > 0).  The identity for a cyclic placement
// (rank r on host r % H).
int hierSlot(const Topology& t, int rank) {
  return t.localIndex(rank) * t.hosts + t.hostOf(rank);
}

// Whether hierSlot is the identity, so the layout is the rank order itself (an O(N)
// look per op, against an op that moves at least N chunks).
bool hierSlotIsRank(const Topology& t) {
  for (const auto r : c10::irange(t.size())) {
    if (hierSlot(t, r) != r) {
      return false;
    }
  }
  return true;
}

// What every hierarchical collective of this rank runs on: its host's ring and the ring
// of its local index across hosts.  Made at the start of the op, which it names in the
// trace.
struct HierRings {
  const Topology& t;
  int j;          // this rank's local index: its cross-host ring
  RingView host;  // this rank's host
  RingView cross; // local rank j of every host, hosts in order

  HierRings(const Topology& topo, int rank)
      : t(topo), j(t.localIndex(rank)), host(RingView::of(t.ranksOfHost(t.hostOf(rank)), rank, kMinSegments)),
        cross(RingView::of(t.localRanks(j), rank, kMinSegments)) {}
  explicit HierRings(OpContext& c) : HierRings(c.topology(), c.rank()) {
    if (c.trace()) {
      c.trace()->algorithm = algorithmName(Algorithm::Hier);
    }
  }
};

// The host phases, on the op's thread: over the host's arena where the group has one
// (hostArenaApplies: one step a round, where the host ring pays K - 1), else the host
// ring.  Reduce-scatter: local rank j's chunk (chunkRange of `count` over the host's K
// ranks) of `out` = that chunk of every host rank's `in`, reduced; all-gather: every
// local rank's chunk of `data` to every host rank.
void hostReduceScatter(OpContext& c, const HierRings& rings, const char* in, char* out, int64_t count, size_t es,
                       RedOp op) {
  if (c.arena() != nullptr) {
    arenaHostReduceScatter(c, in, out, count, es, op);
    return;
  }
  ringCollectiveOn(c, rings.host, RingJob{.count = count, .elemSize = es, .reduceScatter = true, .op = op},
                   RingBuffers{in, out, nullptr});
}

void hostAllGather(OpContext& c, const HierRings& rings, char* data, int64_t count, size_t es) {
  if (c.arena() != nullptr) {
    arenaHostAllGather(c, data, count, es);
    return;
  }
  ringCollectiveOn(c, rings.host, RingJob{.count = count, .elemSize = es, .allGather = true},
                   RingBuffers{nullptr, data, nullptr});
}

// Pieces a collective of `bytes` (its full buffer) moves in: one per
// Config::hierPieceBytes, at most kMaxPieces and `units` (so that none is empty).  One
// piece, and no second thread, where a level has one member or the rings across hosts
// do not run on the TCP engine (Gloo's pairs are moved by whoever posts on them).  The
// same on every rank: it depends on the group's shape, its settings and the op's size.
int piecesFor(const OpContext& c, size_t bytes, int64_t units) {
  const Topology& t = c.topology();
  const size_t per = c.config().hierPieceBytes;
  if (per == 0 || t.hosts < 2 || t.ranksPerHost() < 2) {
    return 1;
  }
  const int64_t pieces = std::min<int64_t>({static_cast<int64_t>(bytes / per), kMaxPieces, units});
  if (pieces < 2) {
    return 1; // small ops stop here, before the links are looked at
  }
  const RingView cross = RingView::of(t.localRanks(t.localIndex(c.rank())), c.rank(), kMinSegments);
  const LinkTable& links = c.links();
  // Shared memory is moved by its waiters, and Gloo's pairs count each op's messages
  // on one thread: rings across hosts on those stay on the op's thread, in one piece.
  if (!links.to(cross.right())->servesASecondThread() || !links.from(cross.left())->servesASecondThread()) {
    return 1;
  }
  return static_cast<int>(pieces);
}

// The second thread of a collective in pieces: it runs `across(ctx, i)` -- piece i's
// rings across hosts -- for each piece the op's thread hands over, in order, on a
// context of its own (OpContext::onThread) over the group's links with nothing driven.
// Those rings run on the TCP engine, which its progress thread moves; shared memory
// stays with the op's thread, which runs the host rings of other pieces meanwhile.
// Each thread talks to its own peers (a host's ranks; other hosts' ranks), so the
// frames of one peer are still posted by one thread, in order.
class AcrossHosts {
 public:
  using Across = std::function<void(OpContext&, int piece)>;

  AcrossHosts(OpContext& c, int pieces, Across across)
      : c_(c), pieces_(pieces), across_(std::move(across)), links_(c.links()) {
    links_.driven = nullptr; // waits there must not move shared memory: it is the op thread's
    if (c.trace()) {
      trace_ = std::make_unique<OpTrace>();
    }
    thread_ = std::thread([this] {
      nameThisThread("ringpg-across");
      run();
    });
  }
  ~AcrossHosts() {
    if (thread_.joinable()) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (state_ == State::Running) {
          state_ = State::Abandoned;
        }
      }
      cv_.notify_all();
      thread_.join();
    }
  }
  AcrossHosts(const AcrossHosts&) = delete;
  AcrossHosts& operator=(const AcrossHosts&) = delete;

  // Piece `piece` may cross now: its host part is done.  Pieces are handed over in order.
  void handOver(int piece) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      handed_ = piece + 1;
    }
    cv_.notify_all();
  }

  // Blocks until piece `piece` has crossed; rethrows what failed on the other thread.
  void awaitCrossed(int piece) {
    std::unique_lock<std::mutex> lk(mu_);
    // Every wait of the other thread ends by the op's deadline, when it records its
    // timeout, so this one ends soon after; the grace only bounds a bug there.
    const bool ended =
        cv_.wait_until(lk, c_.deadline() + kGrace, [&] { return crossed_ > piece || state_ == State::Failed; });
    if (state_ == State::Failed) {
      std::rethrow_exception(error_);
    }
    if (!ended) {
      throwBackend(c10::str(describe(c_.tag()), ": the rings across hosts did not end by the op's deadline"));
    }
  }

  // Joins the other thread (every piece has crossed) and keeps its trace events.
  void finish() {
    thread_.join();
    if (trace_ && c_.trace()) {
      c_.trace()->absorb(*trace_);
    }
  }

 private:
  static constexpr std::chrono::seconds kGrace{10};

  void run() {
    OpContext ctx = c_.onThread(links_, scratch_, workspace_, trace_.get());
    for (int i = 0; i < pieces_; ++i) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        // Bounded by the op's deadline: past it the op's thread reports its own timeout.
        cv_.wait_until(lk, c_.deadline(), [&] { return handed_ > i || state_ != State::Running; });
        if (handed_ <= i) {
          return; // abandoned (the op's thread failed), or out of time
        }
      }
      try {
        across_(ctx, i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        error_ = std::current_exception();
        state_ = State::Failed;
        cv_.notify_all();
        return;
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        crossed_ = i + 1;
      }
      cv_.notify_all();
    }
  }

  // Running: pieces cross as they are handed over.  Failed: a piece failed here and
  // error_ says why (the op's thread rethrows it).  Abandoned: the op's thread failed
  // or is done waiting; this one stops before its next piece.
  enum class State : uint8_t { Running, Failed, Abandoned };

  OpContext& c_;
  const int pieces_;
  const Across across_;
  LinkTable links_;                   // the group's, nothing driven
  std::vector<char> scratch_, workspace_; // this thread's staging (the op thread has its own)
  std::unique_ptr<OpTrace> trace_;    // this thread's events, absorbed by finish()
  std::mutex mu_;                     // guards handed_, crossed_, state_, error_
  std::condition_variable cv_;        // any of them changed
  int handed_ = 0;                    // pieces whose host part is done
  int crossed_ = 0;                   // pieces whose rings across hosts are done
  State state_ = State::Running;
  std::exception_ptr error_;
  std::thread thread_;
};

// Runs each of `pieces` pieces in three parts, in order: before(i) (host rings, this
// thread), across(ctx, i) (the rings across hosts) and after(i) (host rings, this
// thread).  With several pieces `across` runs on a second thread (AcrossHosts): this
// thread runs every `before` first, handing each piece over as it is done, then each
// `after` once its piece has crossed.  The network, the slowest part, then carries
// piece i while the hosts work on pieces i+1 and i-1; only the first piece's `before`
// and the last one's `after` are not hidden under it.  A failure here breaks the
// group first, so that the other thread's waits end at once.
void runPieces(OpContext& c, int pieces, const std::function<void(int)>& before, const AcrossHosts::Across& across,
               const std::function<void(int)>& after) {
  if (c.trace()) { // a coalesced op adds up its collectives' pieces
    c.trace()->pieces += pieces;
    c.trace()->threads = std::max(c.trace()->threads, pieces == 1 ? 1 : 2);
  }
  if (pieces == 1) {
    before(0);
    across(c, 0);
    after(0);
    return;
  }
  AcrossHosts a(c, pieces, across);
  try {
    for (int i = 0; i < pieces; ++i) {
      before(i);
      a.handOver(i);
    }
    for (int i = 0; i < pieces; ++i) {
      a.awaitCrossed(i);
      after(i);
    }
  } catch (const c10::Error& e) {
    c.failGroup(e.what_without_backtrace());
    throw;
  } catch (const std::exception& e) {
    c.failGroup(e.what());
    throw;
  }
  a.finish();
}

} // namespace

bool hierarchicalApplies(const Topology& t, Config::Algo algo) {
  if (algo == Config::Algo::Ring || t.size() < 2 || t.ranksPerHost() == 0) {
    return false; // asked for the flat ring, or hosts hold different numbers of ranks
  }
  return algo == Config::Algo::Hier || (t.hosts > 1 && t.ranksPerHost() > 1);
}

bool hostArenaApplies(const Topology& t, Config::Algo algo) {
  if (algo != Config::Algo::Auto && algo != Config::Algo::Arena) {
    return false;
  }
  return t.hosts == 1 || (hierarchicalApplies(t, algo) && t.ranksPerHost() >= kArenaMinRanks);
}

std::vector<int> ringPeers(const Topology& t, int rank, Config::Algo algo) {
  std::vector<int> peers = {t.left(rank), t.right(rank)};
  if (hierarchicalApplies(t, algo)) {
    // The neighbours on the rings its hierarchical collectives run on.
    const HierRings rings(t, rank);
    for (const RingView* ring : {&rings.host, &rings.cross}) {
      peers.push_back(ring->left());
      peers.push_back(ring->right());
    }
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  peers.erase(std::remove(peers.begin(), peers.end(), rank), peers.end());
  return peers;
}

void hierAllreduce(OpContext& c, char* data, int64_t count, size_t es, RedOp op,
                   const std::function<void(char*, int64_t)>& finalize) {
  const HierRings rings(c);
  const int pieces = piecesFor(c, static_cast<size_t>(count) * es, count);
  auto piece = [&](int i) { return chunkRange(count, pieces, i); };
  runPieces(
      c, pieces,
      [&](int i) {
        // 1. Reduce-scatter on the host: chunk j of K ends here, summed over the host.
        const Range P = piece(i);
        char* at = data + P.offset * static_cast<int64_t>(es);
        hostReduceScatter(c, rings, at, at, P.length, es, op);
      },
      [&](OpContext& ctx, int i) {
        // 2. Allreduce of chunk j over local rank j of every host (AVG divides here, once).
        const Range P = piece(i);
        const Range mine = chunkRange(P.length, rings.t.ranksPerHost(), rings.j);
        char* chunk = data + (P.offset + mine.offset) * static_cast<int64_t>(es);
        ringCollectiveOn(ctx, rings.cross,
                         RingJob{.count = mine.length,
                                 .elemSize = es,
                                 .reduceScatter = true,
                                 .allGather = true,
                                 .op = op,
                                 .finalize = finalize},
                         RingBuffers{chunk, chunk, nullptr});
      },
      [&](int i) {
        // 3. All-gather on the host: every chunk to every rank.
        const Range P = piece(i);
        hostAllGather(c, rings, data + P.offset * static_cast<int64_t>(es), P.length, es);
      });
}

// Reduce-scatter and all-gather move in pieces of every rank's chunk: piece i is
// elements chunkRange(n, pieces, i) of each of the N chunks, laid out by hierSlot, N of
// them contiguous at `layout` + N * (the piece's offset) elements.

void hierReduceScatter(OpContext& c, const char* input, char* output, int64_t count, size_t es, RedOp op,
                       const std::function<void(char*, int64_t)>& finalize, char* layout) {
  const HierRings rings(c);
  const Topology& t = rings.t;
  const int64_t n = count / t.size();
  const int pieces = piecesFor(c, static_cast<size_t>(count) * es, n);
  // One piece in rank order: the host ring reads the input where it is.
  const bool direct = pieces == 1 && hierSlotIsRank(t);
  auto piece = [&](int i) { return chunkRange(n, pieces, i); };
  auto slots = [&](const Range& P) { return layout + static_cast<size_t>(t.size() * P.offset) * es; };
  runPieces(
      c, pieces,
      [&](int i) {
        const Range P = piece(i);
        char* L = slots(P);
        const size_t len = static_cast<size_t>(P.length) * es;
        if (!direct) {
          for (int r = 0; r < t.size(); ++r) {
            std::memcpy(L + hierSlot(t, r) * len, input + (r * n + P.offset) * static_cast<int64_t>(es), len);
          }
        }
        // 1. Reduce-scatter on the host: slots [j*H, (j+1)*H) end here, summed over the host.
        hostReduceScatter(c, rings, direct ? input : L, L, t.size() * P.length, es, op);
      },
      [&](OpContext& ctx, int i) {
        // 2. Reduce-scatter of those H chunks across the hosts: the member at position h
        //    of ring j is host h's local rank j, whose chunk is slot j*H + h.
        const Range P = piece(i);
        char* mine = slots(P) + static_cast<size_t>(rings.j * t.hosts * P.length) * es;
        ringCollectiveOn(
            ctx, rings.cross,
            RingJob{.count = t.hosts * P.length, .elemSize = es, .reduceScatter = true, .op = op, .finalize = finalize},
            RingBuffers{mine, mine, output + P.offset * static_cast<int64_t>(es)});
      },
      [](int) {});
}

bool hierAllGatherInPlace(const OpContext& c, size_t bytes, int64_t perRank) {
  return hierSlotIsRank(c.topology()) && piecesFor(c, bytes, perRank) == 1;
}

void hierAllGather(OpContext& c, const char* input, char* output, int64_t count, size_t es, char* layout) {
  const HierRings rings(c);
  const Topology& t = rings.t;
  const int64_t n = count / t.size();
  const int pieces = piecesFor(c, static_cast<size_t>(count) * es, n);
  TORCH_INTERNAL_ASSERT(layout != output || (pieces == 1 && hierSlotIsRank(t)), "ringpg: all-gather layout");
  auto piece = [&](int i) { return chunkRange(n, pieces, i); };
  auto slots = [&](const Range& P) { return layout + static_cast<size_t>(t.size() * P.offset) * es; };
  runPieces(
      c, pieces, [](int) {},
      [&](OpContext& ctx, int i) {
        // 1. All-gather across the hosts into this ring's slots (the own piece read from
        //    `input`, or already in place when the layout is the output and `input` its
        //    own chunk).
        const Range P = piece(i);
        const size_t len = static_cast<size_t>(P.length) * es;
        char* L = slots(P);
        char* mine = L + static_cast<size_t>(rings.j * t.hosts) * len;
        const char* own = input + P.offset * static_cast<int64_t>(es);
        const bool inPlace = own == L + hierSlot(t, c.rank()) * len;
        ringCollectiveOn(ctx, rings.cross, RingJob{.count = t.hosts * P.length, .elemSize = es, .allGather = true},
                         RingBuffers{nullptr, mine, inPlace ? nullptr : const_cast<char*>(own)});
      },
      [&](int i) {
        // 2. All-gather on the host: every ring's slots to every rank; 3. rank order.
        const Range P = piece(i);
        const size_t len = static_cast<size_t>(P.length) * es;
        char* L = slots(P);
        hostAllGather(c, rings, L, t.size() * P.length, es);
        if (layout != output) {
          for (int r = 0; r < t.size(); ++r) {
            std::memcpy(output + (r * n + P.offset) * static_cast<int64_t>(es), L + hierSlot(t, r) * len, len);
          }
        }
      });
}

} // namespace ringpg
