// Collectives whose data moves between fixed pairs rather than around the ring:
// gather to a root, scatter from a root, and all-to-all.  Every receive is posted
// before any send, and sends go out in ring-distance order (the peer d steps to the
// right first) so no two ranks start by sending to the same peer.
#pragma once

#include <functional>
#include <vector>

#include "algorithms/context.h"
#include "reduce/reduce.h"

namespace ringpg {

// Root receives `nbytes` from every rank q into outputs[q] (its own slot is copied).
void gatherTo(OpContext& c, int root, const char* input, size_t nbytes, const std::vector<char*>& outputs);

// Root sends inputs[q] (`nbytes` each) to every rank q; each rank's lands in `output`.
void scatterFrom(OpContext& c, int root, const std::vector<const char*>& inputs, char* output, size_t nbytes);

// All-gather between two ranks (Algorithm::Pair): this rank's block `input` (`nbytes`)
// goes to the peer in one message (lent where the op's size class lends: the peer reads
// it once, straight from `input`), the peer's lands in its slot of `output` in one
// receive, and the own block is copied into its slot meanwhile (unless `input` is that
// slot).  Two flag rounds: the send's descriptor, the receiver's release.  `output`
// holds both blocks in rank order; `streaming`: it outgrows the caches and is not read
// back, so the own block (and a received one, through the slots) is written past them,
// as the ring's all-gather does (RingSweep::streaming_).
void pairAllGather(OpContext& c, const char* input, char* output, size_t nbytes, bool streaming);

// Reduce-scatter between two ranks on one host's shared memory (Algorithm::Pair): the
// peer's chunk of `input` goes to it through the slots in one message, and ours is
// reduced straight out of its slots with our own chunk into `output` (`chunkCount`
// elements of `elemSize` bytes), rank 0's operand first on both ranks (the same bits
// everywhere), then `finalize`d.  One flag round each way; each rank copies one chunk
// and reduces one, where the arena copies the whole input first.  `output` is apart
// from `input`, or exactly this rank's chunk of it.
void pairReduceScatter(OpContext& c, const char* input, char* output, int64_t chunkCount, size_t elemSize, RedOp op,
                       const std::function<void(char*, int64_t)>& finalize);

// Small-message allreduce: every rank sends its whole buffer to every peer, then all
// ranks reduce the p buffers locally in the same order (rank 0, 1, ..., p-1), so the
// result is bitwise identical everywhere.  One round of latency instead of the ring's
// 2(p-1) steps, for (p-1)x the bytes: worth it below Config::oneShotBytes.
void oneShotAllreduce(OpContext& c, char* data, int64_t count, size_t elemSize, RedOp op,
                      const std::function<void(char*, int64_t)>& finalize);

// Small-message allreduce at many ranks: recursive doubling, ceil(log2 p) rounds in
// which each rank exchanges its partial result with the rank whose index differs in
// one bit, so a rank talks to O(log p) peers where the one-shot talks to all p-1 (and,
// with connections made on first use, connects to them).  The p - m ranks beyond the
// largest power of two m first fold into a partner and get the result back at the end.
// Each pair reduces the lower ranks' partial result first, so both ends, and so every
// rank, hold the same bits.
void recursiveDoublingAllreduce(OpContext& c, char* data, int64_t count, size_t elemSize, RedOp op,
                                const std::function<void(char*, int64_t)>& finalize);

// Rank sends sendBuf[q] (sendBytes[q]) to q and receives recvBuf[q] (recvBytes[q]) from q,
// straight (`bruck` false: every pair) or by Bruck's rounds (the choice, choice.h, agreed
// by every rank): ceil(log2 p) rounds in which a rank sends the blocks it holds at one
// ring distance (ring_plan.h's Bruck) to one peer, a message of their sizes and then one
// of their bytes (a block's size is known only to its sender and its final receiver, so
// it travels with it).  A block whose size differs from what its final receiver expects
// fails the op there.
void allToAll(OpContext& c, bool bruck, const std::vector<const char*>& sendBuf, const std::vector<size_t>& sendBytes,
              const std::vector<char*>& recvBuf, const std::vector<size_t>& recvBytes);

} // namespace ringpg
