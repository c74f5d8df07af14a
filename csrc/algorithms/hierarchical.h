// Collectives that cross each host's network once: for a group of H hosts holding K of
// its ranks each (transport/topology.h), an allreduce of n elements runs
//   1. a reduce-scatter over each host's ranks (shared memory): local rank j of every
//      host ends with chunk j (n/K elements) summed over its host;
//   2. K allreduces at once, ring j over local rank j of every host, each on chunk j;
//   3. an all-gather over each host's ranks: every rank ends with every chunk.
// Each host's network link carries 2(H-1)/H of the data instead of a flat ring's
// 2(N-1)/N (N = H*K), so bus bandwidth can exceed the link rate (NCCL and MPI do the
// same for the same reason).  Every element is reduced in one fixed order (host ring,
// then the ring across hosts) and then copied, so all ranks end bit-identical.
//
// A large buffer moves in pieces (Config::hierPieceBytes, RINGPG_TUNING hier_piece_bytes):
// while one piece crosses the network on the rings across hosts -- run by a second
// thread of the op on the TCP engine -- the op's thread runs the host rings of the
// pieces before and after it over shared memory, so the host work hides under the
// network's, the slowest part, except for the first and the last piece's.
#pragma once

#include <functional>

#include "algorithms/context.h"
#include "reduce/reduce.h"

namespace ringpg {

// Whether a group of this shape runs the hierarchical algorithms under setting `algo`
// (Config::algo): hosts must hold equal numbers of its ranks; auto takes them where
// both levels have more than one member (elsewhere they are the flat ring).
bool hierarchicalApplies(const Topology& t, Config::Algo algo);
inline bool hierarchicalApplies(const OpContext& c) {
  return hierarchicalApplies(c.topology(), c.config().algo);
}

// Whether each host's ranks share a host arena (transport/arena.h) under setting `algo`
// (Auto or Arena; Ring and Hier ask for the links): a group on one host runs its
// collectives there (choice.h), and a hierarchical group with at least
// kArenaMinRanks (common/thresholds.h) ranks a host its host phases, in one step a piece where the host
// ring pays K - 1.  At two ranks a host the ring is one step already, over one link
// that copies once where single copy pays.
bool hostArenaApplies(const Topology& t, Config::Algo algo);

// The peers rank `rank`'s rings exchange with under setting `algo`: its neighbours on
// the group's ring and, where the hierarchical algorithms apply, on its host's ring and
// on its local rank's ring across hosts (HierRings), without `rank` itself.  Symmetric
// (q is in rank's iff rank is in q's): what a group connects at its creation, so that
// each rank waits only for peers that dial it too (transport/connect.h).
std::vector<int> ringPeers(const Topology& t, int rank, Config::Algo algo);

// Reduce-scatter of `count` = N * n elements at `input` (rank r's chunk at r * n) into
// `output` (this rank's n elements): the input's chunks are laid out by hierSlot in
// `layout` (N * n elements' worth of bytes, the collective's scratch), so that each
// cross-host ring's chunks are contiguous; then a reduce-scatter over each host's ranks
// (local rank j ends with chunks of slots [j*H, (j+1)*H) summed over its host), then
// ring j's reduce-scatter across hosts leaves each rank its own chunk.  `finalize` as
// for the allreduce.  Each host's link carries (H-1)/H of the data, not (N-1)/N.
void hierReduceScatter(OpContext& c, const char* input, char* output, int64_t count, size_t elemSize, RedOp op,
                       const std::function<void(char*, int64_t)>& finalize, char* layout);

// All-gather of this rank's n elements at `input` into `output` (N * n, rank order):
// ring j's all-gather across hosts, then each host's, in the hierSlot layout at `layout`,
// then into rank order.  `layout` may be `output` where hierAllGatherInPlace says so
// (then `input` may be output's own chunk, or not overlap it); else it is N * n
// elements' worth of scratch and `input` must not overlap it.
bool hierAllGatherInPlace(const OpContext& c, size_t bytes, int64_t perRank);
void hierAllGather(OpContext& c, const char* input, char* output, int64_t count, size_t elemSize, char* layout);

// Allreduce of `count` elements of `elemSize` bytes at `data`, in place; `finalize`
// (AVG's division, may be empty) runs once on each finished element.
void hierAllreduce(OpContext& c, char* data, int64_t count, size_t elemSize, RedOp op,
                   const std::function<void(char*, int64_t)>& finalize);

} // namespace ringpg
