#include "algorithms/choice.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "algorithms/ring_plan.h"

namespace ringpg {
namespace {

// Two ranks on one host, host tensors (none staged in pieces), the algorithm left to
// the choice: where the two-rank paths (the pair, the arena's two-rank bands) may run.
bool twoRanksLeftToChoice(const GroupShape& g, const Config& cfg, bool deviceContiguous) {
  return g.size == 2 && g.hosts == 1 && cfg.algo == Config::Algo::Auto && !deviceContiguous;
}

// The links' small-buffer allreduce, or nullopt-like Ring where the volume is too large.
Algorithm linksAllreduce(const GroupShape& g, const Config& cfg, size_t bytes, bool deviceContiguous) {
  // One-shot sends (p-1) copies of the buffer from each rank in one round; the ring
  // sends 2(p-1)/p of it in 2(p-1) rounds.  Below the configured volume the rounds cost
  // more.  Across hosts a host's ranks share its network link, so the volume that
  // counts is its K ranks' together (K: the most any host holds).
  const size_t sharers = g.hosts > 1 ? static_cast<size_t>(g.mostPerHost) : 1;
  // On one host over shared memory only a rank's ring neighbours share memory with it:
  // past two ranks the one-shot would reach the others over TCP loopback, where the
  // ring beats it (docs/internals.md, "Why these constants").
  const bool overSockets = g.ringFusedEverywhere && g.size > 2;
  // At two ranks the one-shot moves what the ring moves (each rank sends its whole buffer
  // once; the ring sends two halves, one a step) and saves the ring's second step for
  // reducing the whole buffer instead of half: its volume counts half there.  (Measured:
  // docs/internals.md, "Why these constants".)
  const size_t pairShare = g.size == 2 ? 2 : 1;
  if (!overSockets && g.size <= kOneShotMostRanks &&
      bytes * static_cast<size_t>(g.size - 1) * sharers <= cfg.oneShotBytes * pairShare) {
    return Algorithm::OneShot;
  }
  // Recursive doubling: log2(p) rounds of the whole buffer (one more for folded ranks).
  if (!overSockets && g.size > kOneShotMostRanks &&
      bytes * static_cast<size_t>(RecursiveDoubling(g.size).rounds()) * sharers <= cfg.oneShotBytes) {
    return Algorithm::Doubling;
  }
  // Large contiguous device tensors: chunked copies overlap the ring (staged_ring.h).
  if (deviceContiguous) {
    return Algorithm::StagedRing;
  }
  return g.hierarchical ? Algorithm::Hier : Algorithm::Ring;
}

// Whether the arena runs a large op (beyond the one-shot volume).  At two ranks the
// links are the same two-step exchange the arena would run, with single copy and a
// pipeline of slots tuned for it, so the arena takes only what it was asked for there
// and device tensors where device copies reach its buffers directly: then no CPU
// copies a byte in or out (docs/internals.md, "Why these constants").  (A two-rank
// all-gather through the slots takes it up to kArenaPairAllGatherBytes: chooseAlgorithm.)
bool arenaForLarge(const GroupShape& g, const Config& cfg, bool deviceContiguous) {
  return g.arena &&
         (cfg.algo == Config::Algo::Arena || g.size >= kArenaMinRanks || (deviceContiguous && g.arenaReachesDevice));
}

// The algorithm for `op` on `bytes` (OpQuery::bytes) in a group of `g` under `cfg`.
// `deviceContiguous`: asked for an op whose contiguous device tensors would be staged in
// pieces (planOp): at two ranks they take the arena where it reaches the device, else
// the staged ring.
Algorithm chooseAlgorithm(Collective op, const GroupShape& g, const Config& cfg, size_t bytes,
                          bool deviceContiguous = false) {
  if (g.size <= 1 || (bytes == 0 && op != Collective::Barrier && op != Collective::AllToAll)) {
    return Algorithm::Local;
  }
  // The arena's one step beats any number of link steps while what each member reads
  // of the others (bytes x (N - 1)) stays small.
  const bool arenaOneShot = g.arena && bytes * static_cast<size_t>(g.size - 1) <= kArenaOneShotVolume;
  // But a reduction at two ranks keeps the links' one-shot, which reduces each fragment
  // straight out of a slot as it lands: the arena's copies the whole buffer in before
  // anyone reduces (docs/internals.md, "Why these constants").
  const bool arenaReduces = arenaOneShot && (g.size >= kArenaMinRanks || cfg.algo == Config::Algo::Arena);
  switch (op) {
    case Collective::Allreduce:
      if (arenaReduces) {
        return Algorithm::ArenaOneShot;
      }
      if (arenaForLarge(g, cfg, deviceContiguous)) {
        return Algorithm::Arena; // device tensors too: the arena's rounds are staged (staged_ring.h)
      }
      return linksAllreduce(g, cfg, bytes, deviceContiguous);
    case Collective::Reduce:
      if (arenaReduces) {
        return Algorithm::ArenaOneShot;
      }
      return arenaForLarge(g, cfg, deviceContiguous) ? Algorithm::Arena : Algorithm::Ring;
    case Collective::ReduceScatter:
    case Collective::AllGather:
      // Two ranks: one message each way past the arena's two-rank band (choice.h).
      if (op == Collective::AllGather ? pairApplies(g, cfg, bytes, deviceContiguous)
                                      : pairReduceScatterApplies(g, cfg, bytes, deviceContiguous)) {
        return Algorithm::Pair;
      }
      if (arenaOneShot || arenaForLarge(g, cfg, deviceContiguous)) {
        return Algorithm::Arena;
      }
      if (g.hierarchical) {
        return Algorithm::Hier;
      }
      // Two ranks' all-gather through the slots: up to kArenaPairAllGatherBytes the
      // arena's one round beats the ring's per-segment sends and receives.
      if (op == Collective::AllGather && g.arena && twoRanksLeftToChoice(g, cfg, deviceContiguous) &&
          bytes <= kArenaPairAllGatherBytes) {
        return Algorithm::Arena;
      }
      // Contiguous device tensors: chunked copies overlap the ring (staged_ring.h).
      return deviceContiguous ? Algorithm::StagedRing : Algorithm::Ring;
    case Collective::Broadcast:
      return arenaOneShot || arenaForLarge(g, cfg, deviceContiguous) ? Algorithm::Arena : Algorithm::Chain;
    case Collective::Gather:
    case Collective::Scatter:
      return arenaOneShot || arenaForLarge(g, cfg, deviceContiguous) ? Algorithm::Arena : Algorithm::Direct;
    case Collective::Barrier:
      // Every member's arrival on the arena; else a token's allreduce: one byte where the
      // one-shot or recursive doubling carries it (log2 N rounds, not a ring's 2(N-1) or
      // the host rings' at thousands of ranks), else the ring's (collectives::barrier).
      return g.arena ? Algorithm::Arena : linksAllreduce(g, cfg, 1, false);
    case Collective::AllToAll:
      // The arena from three ranks, where the links reach a non-neighbour only over TCP;
      // at two, each block goes straight over the one link between them (single copy
      // where it pays), where the arena copies every byte twice.  A set alltoall
      // (direct, bruck) asks for the links' algorithm.
      if (g.arena && cfg.allToAll == Config::AllToAll::Auto &&
          (g.size >= kArenaMinRanks || cfg.algo == Config::Algo::Arena) &&
          arenaAllToAllSlot(cfg.arenaBytes, g.size) > 0) {
        return Algorithm::Arena;
      }
      return cfg.bruckAllToAll(g.size) ? Algorithm::Bruck : Algorithm::Direct;
  }
  return Algorithm::Ring;
}

} // namespace

namespace {

// Two ranks on one host's shared-memory link, host tensors, the algorithm left to the
// choice, past the arena's two-rank band (or with no arena).
bool pairShape(const GroupShape& g, const Config& cfg, size_t bytes, bool deviceContiguous) {
  return twoRanksLeftToChoice(g, cfg, deviceContiguous) && g.ringFusedEverywhere &&
         (bytes > kArenaPairBytes || !g.arena);
}

} // namespace

bool pairLends(const SameHostCopy& copy, size_t bytes) {
  return bytes > kPairCopiedMostBytes && singleCopyFor(copy, bytes);
}

bool pairReduceScatterApplies(const GroupShape& g, const Config& cfg, size_t bytes, bool deviceContiguous) {
  return pairShape(g, cfg, bytes, deviceContiguous) && bytes < kLentReduceFrom;
}

bool pairApplies(const GroupShape& g, const Config& cfg, size_t bytes, bool deviceContiguous) {
  // Copied through the slots up to kPairCopiedMostBytes, else only where it lends.
  return pairShape(g, cfg, bytes, deviceContiguous) && (bytes <= kPairCopiedMostBytes || pairLends(g.copy, bytes));
}

const char* algorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::Local:
      return "local";
    case Algorithm::OneShot:
      return "oneshot";
    case Algorithm::Doubling:
      return "doubling";
    case Algorithm::Ring:
      return "ring";
    case Algorithm::Chain:
      return "chain";
    case Algorithm::Direct:
      return "direct";
    case Algorithm::Pair:
      return "pair";
    case Algorithm::Bruck:
      return "bruck";
    case Algorithm::StagedRing:
      return "staged_ring";
    case Algorithm::Hier:
      return "hier";
    case Algorithm::ArenaOneShot:
      return "arena_oneshot";
    case Algorithm::Arena:
      return "arena";
  }
  return "?";
}

const char* collectiveName(Collective op) {
  switch (op) {
    case Collective::Allreduce:
      return "allreduce";
    case Collective::ReduceScatter:
      return "reduce_scatter";
    case Collective::AllGather:
      return "all_gather";
    case Collective::Broadcast:
      return "broadcast";
    case Collective::Reduce:
      return "reduce";
    case Collective::Barrier:
      return "barrier";
    case Collective::Gather:
      return "gather";
    case Collective::Scatter:
      return "scatter";
    case Collective::AllToAll:
      return "all_to_all";
  }
  return "?";
}

Collective collectiveNamed(const std::string& name) {
  constexpr Collective kAll[] = {Collective::Allreduce, Collective::ReduceScatter, Collective::AllGather,
                                 Collective::Broadcast, Collective::Reduce,        Collective::Barrier,
                                 Collective::Gather,    Collective::Scatter,       Collective::AllToAll};
  std::string names;
  for (const Collective op : kAll) {
    if (name == collectiveName(op)) {
      return op;
    }
    names += c10::str(names.empty() ? "" : ", ", collectiveName(op));
  }
  TORCH_CHECK(false, "ringpg: no collective named '", name, "' (", names, ")");
}

const char* stagingName(HostStaging s) {
  switch (s) {
    case HostStaging::Host:
      return "host";
    case HostStaging::Whole:
      return "whole";
    case HostStaging::OnRing:
      return "on_ring";
    case HostStaging::OnArena:
      return "on_arena";
  }
  return "?";
}

namespace {

// Whether `q` could be staged in pieces: a reduce-scatter, all-gather or allreduce of
// contiguous device tensors, apart, of at least kStagedMinBytes.
bool stagesInPieces(const OpQuery& q) {
  const bool staged =
      q.op == Collective::Allreduce || q.op == Collective::ReduceScatter || q.op == Collective::AllGather;
  return staged && q.device && q.contiguous && q.apart && q.bytes >= kStagedMinBytes;
}

} // namespace

bool planAsksDeviceReach(const OpQuery& q, const GroupShape& g) {
  return g.arena && stagesInPieces(q);
}

OpPlan planOp(const OpQuery& q, const GroupShape& g, const Config& cfg) {
  OpPlan p;
  if (stagesInPieces(q)) {
    const Algorithm a = chooseAlgorithm(q.op, g, cfg, q.bytes, /*deviceContiguous=*/true);
    if (a == Algorithm::StagedRing || onArena(a)) {
      p.algorithm = a;
      p.staging = a == Algorithm::StagedRing ? HostStaging::OnRing : HostStaging::OnArena;
    }
  }
  if (p.staging == HostStaging::Host) {
    p.algorithm = chooseAlgorithm(q.op, g, cfg, q.bytes);
    p.staging = q.device ? HostStaging::Whole : HostStaging::Host;
  }
  p.lends = p.algorithm == Algorithm::Pair ? pairLends(g.copy, q.bytes) : singleCopyFor(g.copy, q.bytes);
  // A plain all-gather only: an allreduce's gather lands where its reduce steps just
  // wrote, and the hierarchical phases and the staged ring move pieces the caches hold.
  const bool streamer =
      p.algorithm == Algorithm::Ring || p.algorithm == Algorithm::Pair || p.algorithm == Algorithm::Arena;
  p.streams = q.op == Collective::AllGather && streamer && p.staging != HostStaging::OnRing && !q.readBack &&
              cfg.streams(q.bytes);
  return p;
}

bool sameHostLinksServe(int size, int hosts, bool arena, const Config& cfg) {
  const bool arenaRunsAll = hosts == 1 && arena && size >= kArenaMinRanks &&
                            (cfg.algo == Config::Algo::Auto || cfg.algo == Config::Algo::Arena) &&
                            cfg.allToAll == Config::AllToAll::Auto && arenaAllToAllSlot(cfg.arenaBytes, size) > 0;
  return !arenaRunsAll;
}

bool ringSendCopied(bool reduceStep, bool reduceScatter, int ringSize, size_t opBytes, size_t sendBytes) {
  const bool lentReduce = ringSize == 2 && opBytes >= kLentReduceFrom;
  return (reduceStep && !lentReduce) || (reduceScatter && sendBytes < kLentGatherAfterReduce);
}

} // namespace ringpg
