// The host collectives: a group whose ranks share one host runs them over its arena
// (transport/arena.h) in a few rounds at any rank count, where the ring pays 2(N-1)
// latency-bound steps.  Each round: every member copies what it contributes into its
// own buffer, arrives, waits for all, and then reads what it needs from any member's
// buffer.  Large buffers go in pieces of what a buffer holds (ArenaPieces), the two
// buffers of a member alternating, so a member copies the next piece in while slower
// ones still read the last.
//
//   allreduce, one shot  every member reduces every member's whole buffer, in member
//                        order (the same bits everywhere): one step a piece
//   allreduce            reduce-scatter then all-gather inside the arena: each member
//                        reduces its slice of the piece over every buffer, publishes it,
//                        and every member copies every slice out: two steps a piece
//   reduce_scatter       each member reduces its own chunk's part of every buffer: one step
//   all_gather           one copy in, every member copies every buffer out: one step
//   broadcast            the root copies in once, the others copy out: one step
//   gather, scatter      each member copies in, the root out (or the reverse): one step
//   reduce               as allreduce, the slices copied out by the root alone (or,
//                        one shot, the root reducing every buffer)
//   all_to_all           each member copies the next part of every block it sends into
//                        a slot per receiver, every member reads its slot of every
//                        buffer: one step a part (the first also carrying the sizes)
//   barrier              one step, no data
// Reductions run in member order over the members' buffers, so where every member
// computes the same element (one shot) they hold the same bits; elsewhere one member
// computes each element.  Which op runs here, and when, is choice.h's decision.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "algorithms/context.h"
#include "reduce/reduce.h"

namespace ringpg {

// Elements of one piece: the most whose `parts` blocks of `elemSize`-byte elements fit
// in a buffer of `bufferBytes` (all_gather and allreduce: 1 part, the piece itself;
// reduce_scatter: one part per member), whole cache lines where a line holds whole
// elements; at least 1.  Pure, for the tests.
int64_t arenaPieceElems(size_t bufferBytes, size_t elemSize, int parts);

using Finalize = std::function<void(char*, int64_t)>;

// Staging hooks for device tensors (staged_ring.h), all optional, in elements:
//   awaitPiece(i):     before the input of piece i (arenaPieceFor's pieces) is first read;
//   onFinal(off, n):   once output elements [off, off + n) hold their final values.
// Where the arena's segment is registered with the device, the copies go straight
// between the device and the arena (two-step allreduce, reduce_scatter, all_gather):
//   fillOwn(dst, off, n):  writes this member's contribution of the round (input
//                          elements [off, off + n): of each chunk, for reduce_scatter,
//                          block q at dst + q * n elements) into its buffer `dst`, and
//                          returns once it is there: the copy from the host input it
//                          replaces.  Called before each round's first step, so it also
//                          waits for the reads takeOut issued in the round before (a
//                          member's arrival tells the others it has finished reading);
//   takeOut(src, off, n):  output elements [off, off + n) are final at `src` (a member's
//                          buffer of this round): the copy into the host output it
//                          replaces; asynchronous, finished by the next fillOwn or by
//                          the caller after the op.
struct ArenaHooks {
  std::function<void(int64_t piece)> awaitPiece;
  std::function<void(int64_t offset, int64_t n)> onFinal;
  std::function<void(char* dst, int64_t offset, int64_t n)> fillOwn;
  std::function<void(const char* src, int64_t offset, int64_t n)> takeOut;
};

// Elements of one piece of `op` (allreduce, reduce_scatter: per chunk, all_gather) on
// `c`'s arena: what the functions below move a round.
int64_t arenaPieceFor(const OpContext& c, bool reduceScatter, size_t elemSize);

// `data`: `count` elements of `elemSize` bytes, reduced in place on every member.
// `oneShot`: every member reduces everything (choice.h says when).  With hooks.fillOwn
// and hooks.takeOut (two-step only) `data` is null: the data never lands on the host.
void arenaAllreduce(OpContext& c, char* data, int64_t count, size_t elemSize, RedOp op, const Finalize& finalize,
                    bool oneShot, const ArenaHooks& hooks = {});
// `input`: members() chunks of `chunkCount` elements; `output`: this member's chunk of their reduction.
void arenaReduceScatter(OpContext& c, const char* input, char* output, int64_t chunkCount, size_t elemSize, RedOp op,
                        const Finalize& finalize, const ArenaHooks& hooks = {});
// `output`: members() chunks of `chunkCount` elements, chunk m member m's `input`.
// `input` may be this member's chunk of `output`.  (hooks.awaitPiece is not called:
// the input is read whole from the first round on.)
// `streams`: the output is written past the caches (OpPlan::streams).
void arenaAllGather(OpContext& c, const char* input, char* output, int64_t chunkCount, size_t elemSize, bool streams,
                    const ArenaHooks& hooks = {});
void arenaBroadcast(OpContext& c, char* data, size_t nbytes, int root);
// `input`: this member's `count` elements; `result` (the root's only, else unused):
// their reduction.
void arenaReduce(OpContext& c, const char* input, char* result, int64_t count, size_t elemSize, RedOp op,
                 const Finalize& finalize, int root, bool oneShot);
// gather: the root's `outputs[q]` = member q's `input` (`nbytes` each; the root's own
// copied); scatter: member q's `output` = the root's `inputs[q]`.
void arenaGather(OpContext& c, const char* input, size_t nbytes, const std::vector<char*>& outputs, int root);
void arenaScatter(OpContext& c, const std::vector<const char*>& inputs, char* output, size_t nbytes, int root);
// all_to_all: this member sends sendBuf[q] (sendBytes[q]) to member q and receives
// recvBuf[q] (recvBytes[q]) from it, in rounds of arenaAllToAllSlot (ring_plan.h) bytes of every block.
// A member knows only its own sizes, so the first round's buffers also carry every
// member's send and receive sizes: from them each member counts the rounds the largest
// block needs, and checks every pair's sizes, so that all fail alike where ranks
// disagree on the splits (the group breaks, naming the first such pair).
void arenaAllToAll(OpContext& c, const std::vector<const char*>& sendBuf, const std::vector<size_t>& sendBytes,
                   const std::vector<char*>& recvBuf, const std::vector<size_t>& recvBytes);
void arenaBarrier(OpContext& c);
// One round in which every member says `mine`: true where every member of the arena
// said true.  For a fact each member finds out alone that all must act on alike
// (arenaReachesDevice).
bool arenaEveryMemberSays(OpContext& c, bool mine);

// The host phases of the hierarchical collectives (hierarchical.h) over a host's arena,
// whose members are the host's ranks: `count` elements cut into members() balanced
// chunks (ring_plan.h's chunkRange), chunk m member m's.
//   reduce-scatter: member m's chunk of `output` = its chunk of every member's `input`,
//                   reduced in member order (`output` may be `input`);
//   all-gather:     every member's chunk of `data` = that member's chunk of its own.
// In rounds of what a buffer holds of every chunk (reduce-scatter) or of one (all-gather).
void arenaHostReduceScatter(OpContext& c, const char* input, char* output, int64_t count, size_t elemSize, RedOp op);
void arenaHostAllGather(OpContext& c, char* data, int64_t count, size_t elemSize);

} // namespace ringpg
