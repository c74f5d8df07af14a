// The plan of an op: the one place that decides which algorithm runs a collective, how
// its device tensors reach the host, whether its same-host messages are lent (single
// copy) and whether its output is written past the caches.  A pure function of the op,
// the group's shape and the settings, so that every rank (which sees the same of all of
// them) decides alike, and the tests can ask it about any shape without starting a
// process.  The thresholds are common/thresholds.h's; docs/internals.md ("Choosing an
// algorithm", "Why these constants") explains them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/config.h"
#include "common/thresholds.h"
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
                //   way, an all-gather's read once straight from the sender's tensor, a
                //   reduce-scatter's reduced straight out of the slots (direct.h)
  Bruck,        // over the links: Bruck's all-to-all, ceil(log2 p) rounds (direct.h)
  StagedRing,   // the ring over pinned host memory in chunks, for large CUDA tensors
  Hier,         // host rings, then rings across hosts (algorithms/hierarchical.h)
  ArenaOneShot, // the host arena: every member reduces every member's buffer
  Arena,        // the host arena's algorithm for the op (algorithms/arena_collectives.h)
};
const char* algorithmName(Algorithm a);
// Whether `a` runs over the host arena (its one step or its op's algorithm).
inline bool onArena(Algorithm a) {
  return a == Algorithm::Arena || a == Algorithm::ArenaOneShot;
}
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

// Whether an all-gather on `bytes` (its output) runs as a pair exchange (Algorithm::Pair):
// two ranks on one host's shared-memory link, host tensors, the algorithm left to the
// choice, past the arena's two-rank band (kArenaPairBytes), and either small enough to
// copy through the slots (kPairCopiedMostBytes) or of a size class that lends (single
// copy).  There the ring's segments buy nothing: the receiver takes the sender's whole
// block in one go, and the sender copies its own block meanwhile (docs/internals.md,
// "Why these constants").
bool pairApplies(const GroupShape& g, const Config& cfg, size_t bytes, bool deviceContiguous);

// Whether a pair's message on `bytes` is lent (single copy): past kPairCopiedMostBytes,
// where its size class lends.
bool pairLends(const SameHostCopy& copy, size_t bytes);

// Whether a reduce-scatter on `bytes` (its input) runs as a pair (Algorithm::Pair,
// pairReduceScatter): the same two ranks, past the arena's two-rank band, below
// kLentReduceFrom (from there the ring lends its reduce step, read in cache-sized
// pieces).  One message each way, copied through the slots and reduced out of them,
// where the arena copies the whole input in and the ring runs its segments through a
// kept buffer of partial sums (docs/internals.md, "Why these constants").
bool pairReduceScatterApplies(const GroupShape& g, const Config& cfg, size_t bytes, bool deviceContiguous);

// Whether an op on `bytes` (as OpQuery::bytes counts them) lends its large same-host
// messages (single copy) under the group's `plan` (transport/link.h): its size class's
// choice, cold buffers' from plan.streamingFrom (kStreamingOpBytes unless set).
inline bool singleCopyFor(const SameHostCopy& plan, size_t bytes) {
  return bytes >= plan.streamingFrom ? plan.streaming : plan.cached;
}

// How an op's tensors reach the host: already there (Host), copied whole before and
// after the op (Whole), or in pieces overlapping the ring's steps (OnRing: the staged
// ring) or the arena's rounds (OnArena) (staged_ring.h).
enum class HostStaging : uint8_t { Host, Whole, OnRing, OnArena };
const char* stagingName(HostStaging s);

// What the plan needs of one call: the same on every rank of a matched call.
struct OpQuery {
  Collective op = Collective::Allreduce;
  // allreduce, reduce, broadcast: the buffer; reduce_scatter: its input; all_gather: its
  // output; gather, scatter: one rank's block; barrier and all_to_all: 0 (the plan then
  // depends on the group alone: ranks' all-to-all splits differ).
  size_t bytes = 0;
  bool device = false;     // every tensor of the op is on a device (not the CPU)
  bool contiguous = false; // ... and contiguous
  // reduce_scatter, all_gather: input and output share no byte, or an all-gather's input
  // is exactly its own chunk of the output (FSDP); any other overlap stages whole.
  bool apart = true;
  // all_gather: the caller copies the output out at once (a list of outputs, the
  // coalesced forms), so it is kept in the caches.
  bool readBack = false;
};

// An op's whole plan.
struct OpPlan {
  Algorithm algorithm = Algorithm::Local; // what runs, exactly (RingBackend::algorithmFor reports it)
  HostStaging staging = HostStaging::Host;
  // The op's large same-host messages are lent (single copy) where the link takes them:
  // its size class's choice (singleCopyFor).  The ring still copies some sends
  // (ringSendCopied).
  bool lends = false;
  // A plain all-gather writes its output past the caches (Config::streams): the ring, the
  // pair and the arena on an output the caches cannot keep that no one reads back at once.
  bool streams = false;
};

// Whether the plan of `q` in a group of `shape` could stage its device tensors in pieces
// on the arena, so that the caller must first ask (collectively) whether device copies
// reach the arena's buffers (GroupShape::arenaReachesDevice).
bool planAsksDeviceReach(const OpQuery& q, const GroupShape& shape);

// The plan of `q` in a group of `shape` under `cfg`.  Device tensors below
// kStagedMinBytes, or laid out so that they cannot be staged in pieces, are staged whole
// and run the host tensors' algorithm; from it they take the staged ring, or the arena
// where it runs the op (at two ranks only where device copies reach its buffers).
OpPlan planOp(const OpQuery& q, const GroupShape& shape, const Config& cfg);

// Whether any collective of a group of `size` ranks on `hosts` hosts, with (`arena`) or
// without a host arena, can run over the same-host links (transport/shm.h) under `cfg`:
// not where one host's arena runs every collective (from kArenaMinRanks ranks, the
// algorithm and all-to-all left to the plan, all-to-all's blocks fitting its slots).
// Point-to-point always takes the engine.  A group maps those links, and measures
// single copy on them, only where they serve (transport/connect.h, GroupPlan).
bool sameHostLinksServe(int size, int hosts, bool arena, const Config& cfg);

// Whether a ring send of `sendBytes` is copied into the neighbour's slots rather than
// lent: a reduce step's (the neighbour reduces out of the slot its own core did not
// fill) but in a ring of two whose op moves at least kLentReduceFrom, and an allreduce's
// gather segments below kLentGatherAfterReduce.  `reduceScatter`: the ring's job
// reduces (an allreduce's gather steps included); `opBytes`: the job's whole layout.
bool ringSendCopied(bool reduceStep, bool reduceScatter, int ringSize, size_t opBytes, size_t sendBytes);

} // namespace ringpg
