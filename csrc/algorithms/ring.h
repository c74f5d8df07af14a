// Ring collectives, written with NCCL's named steps (ring.cpp, RingSweep): on each rank
//   reduce-scatter = send, recvReduceSend x (p-2), recvReduceCopy
//   all-gather     = copySend (send, in place), recvCopySend x (p-2), recv
//   allreduce      = send, recvReduceSend x (p-2), recvReduceCopySend, recvCopySend x (p-2), recv
// in one pipelined sweep: the last reduced segment leaves as the first gathered one.
//
// Every step moves its chunk in segments (ring_plan.h): a segment is forwarded as soon
// as it is reduced, while the next ones are still arriving, and receives are posted a
// window ahead so the link can land data while this thread reduces.
#pragma once

#include <functional>
#include <vector>

#include "algorithms/context.h"
#include "algorithms/ring_plan.h"
#include "reduce/reduce.h"

namespace ringpg {

struct RingBuffers {
  const char* input = nullptr; // this rank's contribution, full layout (reduce steps)
  char* work = nullptr;        // full layout: partial results and gathered chunks
  char* own = nullptr;         // where this rank's own chunk lives, if not in `work`
};

struct RingJob {
  int64_t count = 0;   // elements in the full layout
  size_t elemSize = 0; // bytes per element
  bool reduceScatter = false;
  bool allGather = false;
  // A plain all-gather writes its output past the caches (OpPlan::streams, choice.h).
  bool streams = false;
  RedOp op = RedOp::Sum;
  // Applied to each finished segment of the own chunk after the reduce-scatter
  // (AVG's division); may be empty.
  std::function<void(char* data, int64_t n)> finalize;
  // Staging hooks (CUDA tensors), both optional:
  //   awaitInput(c): called before the local input of chunk c is first read;
  //   onFinal(R):    called once range R of the full layout holds its final value.
  std::function<void(int chunk)> awaitInput;
  std::function<void(const Range& range)> onFinal;
};

// The ring a sweep runs on: the group's (every rank, ordered host by host), or a ring
// of some of its ranks (a host's ranks; one rank of each host: the hierarchical
// collectives).  The sweep numbers chunks by ring position (ring_plan.h over
// members.size() parts); the member at position `pos` owns data chunk dataChunk[pos]
// (ring_plan.h's chunkRange of that index), where a reduce-scatter leaves its result.
struct RingView {
  std::vector<int> members;   // group ranks in ring order
  std::vector<int> dataChunk; // dataChunk[pos]: the data chunk the member at pos owns
  int me = 0;                 // this rank's position
  // Ring steps cut each chunk into at least this many segments; both ends of every
  // hop must agree, so it is a property of the whole ring (OpContext::ringFusedEverywhere).
  int64_t minSegments = 16;

  int size() const { return static_cast<int>(members.size()); }
  int left() const { return members[(me + size() - 1) % size()]; }
  int right() const { return members[(me + 1) % size()]; }

  // The group's ring: chunks are its ranks' (reduce-scatter leaves rank r chunk r).
  static RingView ofGroup(const OpContext& c);
  // A ring of `members` (group ranks, in ring order; this rank among them) whose
  // member at position i owns chunk i.
  static RingView of(std::vector<int> members, int rank, int64_t minSegments);
};

// Requires job.reduceScatter || job.allGather.  For all-gather alone the own chunk
// is either already in `work`, or, with `own` set, read from `own` and copied into
// `work` by the collective (`own` must not overlap `work`).
void ringCollective(OpContext& c, const RingJob& job, const RingBuffers& b);
// The same on the ring `ring`.
void ringCollectiveOn(OpContext& c, const RingView& ring, const RingJob& job, const RingBuffers& b);

// Pipelined chain broadcast of `nbytes` from `root` along the ring.
void chainBroadcast(OpContext& c, char* data, size_t nbytes, int root);

} // namespace ringpg
