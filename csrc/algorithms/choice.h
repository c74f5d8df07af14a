// Which algorithm runs a collective: the one place that decides, a pure function of
// the op, its bytes, the group's shape and the settings, so that every rank (which
// sees the same of all of them) decides alike, and the tests can ask it about any
// shape without starting a process.  docs/internals.md ("Choosing an algorithm")
// explains the thresholds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/config.h"
#include "transport/link.h"

namespace ringpg {

enum class Collective : uint8_t {
  Allreduce,
  ReduceScatter,
  AllGather,
  Broadcast,
  Reduce,
  Barrier,
  Gather,
  Scatter,
  AllToAll
};

enum class Algorithm : uint8_t {
  Local,        // one rank, or nothing to move: no peer is involved
  OneShot,      // over the links: every rank sends its whole buffer to every peer
  Doubling,     // over the links: recursive doubling (many ranks, small buffers)
  Ring,         // over the links: the flat ring
  Chain,        // over the links: a broadcast passed along the ring from the root
  Direct,       // over the links: straight between ranks (gather, scatter: root and rank;
                //   all-to-all: every pair)
  Pair,         // over the link of two ranks on one host: each block in one message each
                //   way, read once straight from the sender's tensor (direct.h)
  Bruck,        // over the links: Bruck's all-to-all, ceil(log2 p) rounds (direct.h)
  StagedRing,   // the ring over pinned host memory in chunks, for large CUDA tensors
  Hier,         // host rings, then rings across hosts (algorithms/hierarchical.h)
  ArenaOneShot, // the host arena: every member reduces every member's buffer
  Arena,        // the host arena's algorithm for the op (algorithms/arena_collectives.h)
};
const char* algorithmName(Algorithm a);
const char* collectiveName(Collective op);
// The Collective collectiveName() calls `name`; TORCH_CHECK-fails, listing them, for any other.
Collective collectiveNamed(const std::string& name);

// What the choice needs to know of a group: the same on every rank.
struct GroupShape {
  int size = 1;
  int hosts = 1;
  int mostPerHost = 1;              // the most ranks any host holds
  bool hierarchical = false;        // hierarchicalApplies: hosts hold equal numbers (> 1) of ranks
  bool ringFusedEverywhere = false; // the ring runs on shared memory on one host
  bool arena = false;               // the group has a host arena (transport/arena.h)
  // Device copies reach the arena's buffers by DMA (its segment is registered with the
  // device's runtime: staged_ring.h); asked only for an op on device tensors.
  bool arenaReachesDevice = false;
  // Which ops' large same-host messages go by single copy (the group's measured plan,
  // transport/link.h): the same on every rank.
  SameHostCopy copy{};
};

// Whether an all-gather on `bytes` runs as a pair exchange (Algorithm::Pair): two ranks
// on one host's shared-memory link, the op's size class lending (single copy), host
// tensors, the algorithm left to the choice.  There the ring's segments buy nothing:
// the receiver reads the sender's whole block in one go, and the sender copies its own
// block meanwhile (docs/internals.md, "Why these constants").
bool pairApplies(const GroupShape& g, const Config& cfg, size_t bytes, bool deviceContiguous);

// Below this volume (bytes x (ranks - 1): what each member reads of the others) an
// arena allreduce or reduce reduces everything on every member in one step instead
// of reduce-scatter and all-gather in two.
constexpr size_t kArenaOneShotVolume = 64 * 1024;

// Whether an op on `bytes` (as chooseAlgorithm counts them) lends its large same-host
// messages (single copy) under the group's `plan` (transport/link.h): its size class's
// choice, cold buffers' from plan.streamingFrom (kStreamingOpBytes unless set).
inline bool singleCopyFor(const SameHostCopy& plan, size_t bytes) {
  return bytes >= plan.streamingFrom ? plan.streaming : plan.cached;
}

// The algorithm for `op` on `bytes` (allreduce, reduce, broadcast: the buffer;
// reduce_scatter: its input, all_gather: its output; gather, scatter: one rank's
// block; barrier and all_to_all: 0, the choice then depending on the group alone, since
// ranks' all-to-all splits differ) in a group of
// `shape` under `cfg`.  `deviceContiguous`: the op's tensors are contiguous CUDA
// tensors (the staged ring's case: allreduce, reduce-scatter, all-gather); at two
// ranks they take the arena where it reaches the device, else the staged ring.
Algorithm chooseAlgorithm(Collective op, const GroupShape& shape, const Config& cfg, size_t bytes,
                          bool deviceContiguous = false);

} // namespace ringpg
