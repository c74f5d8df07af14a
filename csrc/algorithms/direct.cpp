#include "algorithms/direct.h"

#include "algorithms/ring_plan.h"
#include "common/errors.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <cstring>
#include <utility>

namespace ringpg {

namespace {

enum class Direction : uint8_t { ToRoot, FromRoot };

// Two ranks over shared memory: `peer`'s message reduced straight out of its slots with
// `in` into `dst`, rank 0's operand first on both ranks, so that both hold the same bits
// (the kernels' NaN payloads, MIN/MAX beside a NaN, depend on the order).
RequestPtr recvReduceRankOrder(OpContext& c, int peer, char* dst, const char* in, int64_t count, size_t elemSize,
                               RedOp op) {
  return c.recvReduce(peer, dst, in, count, elemSize, op, -1, -1, -1,
                      peer == 0 ? OpContext::Operands::ReceivedFirst : OpContext::Operands::LocalFirst);
}

// Moves one `nbytes` buffer between the root and every other rank: `mine` on a non-root
// rank, atRoot[q] for rank q on the root (its own slot is a local copy).  Gather
// receives at the root, scatter sends from it; the root posts in ring-distance order.
void rootedExchange(OpContext& c, int root, Direction dir, char* mine, const std::vector<char*>& atRoot,
                    size_t nbytes) {
  const int p = c.size();
  const int r = c.rank();
  // The root receives what comes to it, every other rank what comes from it.
  const bool receives = (dir == Direction::ToRoot) == (r == root);
  auto post = [&](int peer, char* buf) { return receives ? c.recv(peer, buf, nbytes) : c.send(peer, buf, nbytes); };
  std::vector<RequestPtr> reqs;
  if (r != root) {
    reqs.push_back(post(root, mine));
    c.waitAll(reqs);
    return;
  }
  for (const auto d : c10::irange(1, p)) {
    const int q = (r + d) % p;
    reqs.push_back(post(q, atRoot[q]));
  }
  if (nbytes > 0 && atRoot[r] != mine) {
    dir == Direction::ToRoot ? std::memcpy(atRoot[r], mine, nbytes) : std::memcpy(mine, atRoot[r], nbytes);
  }
  c.waitAll(reqs);
}

} // namespace

void gatherTo(OpContext& c, int root, const char* input, size_t nbytes, const std::vector<char*>& outputs) {
  // Sends only read `input`: the cast lets one exchange serve both directions.
  rootedExchange(c, root, Direction::ToRoot, const_cast<char*>(input), outputs, nbytes);
}

void scatterFrom(OpContext& c, int root, const std::vector<const char*>& inputs, char* output, size_t nbytes) {
  // Likewise: the root only sends from `inputs`.
  std::vector<char*> atRoot;
  atRoot.reserve(inputs.size());
  for (const char* in : inputs) {
    atRoot.push_back(const_cast<char*>(in));
  }
  rootedExchange(c, root, Direction::FromRoot, output, atRoot, nbytes);
}

void pairAllGather(OpContext& c, const char* input, char* output, size_t nbytes, bool streaming) {
  TORCH_INTERNAL_ASSERT(c.size() == 2, "ringpg: a pair exchange has two ranks, not ", c.size());
  OpTrace* const trace = c.trace();
  const int me = c.rank();
  const int peer = 1 - me;
  char* own = output + nbytes * me;
  // RINGPG_TRACE: one event per named step, from `begin` to now; `block`: whose it moves.
  const auto traced = [&](TraceKind kind, const char* name, int64_t begin, int block) {
    if (trace) {
      trace->segment(kind, name, begin, 0, block, 0, peer, static_cast<int64_t>(nbytes));
    }
  };
  // Both posted before the copy: the peer reads `input` while this rank copies it.
  int64_t begin = trace ? traceNow() : 0;
  RequestPtr send = c.send(peer, input, nbytes);
  RequestPtr recv = c.recv(peer, output + nbytes * peer, nbytes, streaming);
  traced(TraceKind::Send, "send", begin, me);
  if (own != input) {
    begin = trace ? traceNow() : 0;
    copyMaybeStreaming(own, input, nbytes, streaming);
    traced(TraceKind::Primitive, "copy", begin, me);
  }
  begin = trace ? traceNow() : 0;
  c.wait(recv);
  traced(TraceKind::Recv, "recv", begin, peer);
  begin = trace ? traceNow() : 0;
  c.wait(send); // a lent `input` is the peer's to read until it releases the slot
  traced(TraceKind::Primitive, "finish", begin, me);
}

void pairReduceScatter(OpContext& c, const char* input, char* output, int64_t chunkCount, size_t elemSize, RedOp op,
                       const std::function<void(char*, int64_t)>& finalize) {
  TORCH_INTERNAL_ASSERT(c.size() == 2 && c.ringFusedEverywhere(),
                        "ringpg: a pair reduce-scatter has two ranks over shared memory");
  const int me = c.rank();
  const int peer = 1 - me;
  const size_t chunkBytes = static_cast<size_t>(chunkCount) * elemSize;
  // Copied, not lent: the peer reduces each fragment straight out of a slot as it lands.
  RequestPtr send = c.sendCopied(peer, input + chunkBytes * peer, chunkBytes);
  std::vector<RequestPtr> reqs{recvReduceRankOrder(c, peer, output, input + chunkBytes * me, chunkCount, elemSize, op),
                               std::move(send)};
  c.waitAll(reqs);
  if (finalize) {
    finalize(output, chunkCount);
  }
}

void oneShotAllreduce(OpContext& c, char* data, int64_t count, size_t elemSize, RedOp op,
                      const std::function<void(char*, int64_t)>& finalize) {
  const int p = c.size();
  const int r = c.rank();
  const size_t nbytes = static_cast<size_t>(count) * elemSize;
  if (p == 2 && c.ringFusedEverywhere()) {
    // Two ranks over shared memory (ringFusedEverywhere: the same on both ranks, so both
    // take this path).  The peer's buffer is reduced straight out of its slots (into ours,
    // below), rank 0's operand first on both ranks (the same bits everywhere), and
    // ours goes to it through the slots (Link::postSendCopied).  No staging copy, no
    // system call.
    const int peer = 1 - r;
    RequestPtr send = c.sendCopied(peer, data, nbytes);
    // A copied send finishes once its last fragment is in a slot, which is at once where
    // the slots have room (the peer took the last op's): `data` is read no more, and the
    // peer's buffer is reduced straight into it.  Else into the scratch area, and
    // copied back once the send is done: one more pass over the buffer, which cost a
    // 32-256 KiB allreduce a quarter of its time.
    const bool sent = send->state.load(std::memory_order_acquire) == Request::State::Done;
    char* acc = sent ? data : c.scratch(nbytes);
    std::vector<RequestPtr> reqs{recvReduceRankOrder(c, peer, acc, data, count, elemSize, op), std::move(send)};
    c.waitAll(reqs);
    if (finalize) {
      finalize(acc, count);
    }
    if (!sent) {
      std::memcpy(data, acc, nbytes); // after the send: it read `data` until it completed
    }
    return;
  }
  // Slot q holds peer q's buffer; slot p is the accumulator.
  char* slots = c.scratch(nbytes * (p + 1));
  std::vector<RequestPtr> reqs;
  for (const auto d : c10::irange(1, p)) {
    const int q = (r - d + p) % p;
    reqs.push_back(c.recv(q, slots + q * nbytes, nbytes));
  }
  for (const auto d : c10::irange(1, p)) {
    const int q = (r + d) % p;
    reqs.push_back(c.send(q, data, nbytes));
  }
  c.waitAll(reqs);
  std::vector<const char*> from(p);
  for (const auto q : c10::irange(p)) {
    from[q] = q == r ? data : slots + q * nbytes;
  }
  char* acc = slots + p * nbytes;
  reduceInOrder(c.dtype(), op, acc, from, count, elemSize);
  if (finalize) {
    finalize(acc, count);
  }
  std::memcpy(data, acc, nbytes);
}

void recursiveDoublingAllreduce(OpContext& c, char* data, int64_t count, size_t elemSize, RedOp op,
                                const std::function<void(char*, int64_t)>& finalize) {
  const int p = c.size();
  const int r = c.rank();
  const size_t nbytes = static_cast<size_t>(count) * elemSize;
  const RecursiveDoubling rd(p);
  // `cur` holds this rank's partial result; the partner's lands in `other`.  The two
  // swap when the result is written into `other` (a reduction may write over its first
  // operand, never its second: reduce.h).
  char* cur = data;
  char* other = c.scratch(nbytes);
  // Takes in the partial result `other` received from rank `from`: the lower rank's
  // operand first, on both ends of every pair.
  auto absorb = [&](int from) {
    if (r < from) {
      reduce(c.dtype(), op, cur, cur, other, count);
    } else {
      reduce(c.dtype(), op, other, other, cur, count);
      std::swap(cur, other);
    }
  };
  const int folded = rd.foldedInto(r);
  if (folded >= 0) {
    // Beyond the power of two: hand the buffer to the partner, take the result back
    // (in turn: the send may read `data` until it completes).
    c.wait(c.send(folded, data, nbytes));
    c.wait(c.recv(folded, data, nbytes));
    return; // finalized by the partner
  }
  const int helper = rd.foldedFrom(r);
  if (helper >= 0) {
    c.wait(c.recv(helper, other, nbytes));
    absorb(helper);
  }
  for (int bit = 1; bit < rd.m; bit <<= 1) {
    const int partner = rd.partner(r, bit);
    std::vector<RequestPtr> reqs{c.recv(partner, other, nbytes), c.send(partner, cur, nbytes)};
    c.waitAll(reqs); // the send read `cur` until here
    absorb(partner);
  }
  if (finalize) {
    finalize(cur, count);
  }
  if (cur != data) {
    std::memcpy(data, cur, nbytes);
  }
  if (helper >= 0) {
    c.wait(c.send(helper, data, nbytes));
  }
}

namespace {

void directAllToAll(OpContext& c, const std::vector<const char*>& sendBuf, const std::vector<size_t>& sendBytes,
                    const std::vector<char*>& recvBuf, const std::vector<size_t>& recvBytes) {
  const int p = c.size();
  const int r = c.rank();
  std::vector<RequestPtr> reqs;
  for (const auto d : c10::irange(1, p)) {
    const int q = (r - d + p) % p;
    reqs.push_back(c.recv(q, recvBuf[q], recvBytes[q]));
  }
  for (const auto d : c10::irange(1, p)) {
    const int q = (r + d) % p;
    reqs.push_back(c.send(q, sendBuf[q], sendBytes[q]));
  }
  if (recvBytes[r] > 0 && recvBuf[r] != sendBuf[r]) {
    std::memcpy(recvBuf[r], sendBuf[r], recvBytes[r]);
  }
  c.waitAll(reqs);
}

void bruckAllToAll(OpContext& c, const std::vector<const char*>& sendBuf, const std::vector<size_t>& sendBytes,
                   const std::vector<char*>& recvBuf, const std::vector<size_t>& recvBytes) {
  const int p = c.size();
  const int r = c.rank();
  const Bruck bruck(p);
  // Block i is size[i] bytes at at[i]: in the caller's input until it first moves, then
  // in the buffer of the round that brought it (`arrived`, kept to the end).
  std::vector<const char*> at(p);
  std::vector<uint64_t> size(p);
  for (const auto i : c10::irange(p)) {
    const int q = bruck.destinationOf(r, i);
    at[i] = sendBuf[q];
    size[i] = sendBytes[q];
  }
  std::vector<std::vector<char>> arrived;
  arrived.reserve(bruck.rounds());
  std::vector<char> packed; // this round's outgoing blocks, back to back
  for (int bit = 1; bit < p; bit <<= 1) {
    const std::vector<int> moved = bruck.movedIn(bit);
    const int to = bruck.sendsTo(r, bit);
    const int from = bruck.takesFrom(r, bit);
    std::vector<uint64_t> sizesOut(moved.size()), sizesIn(moved.size());
    uint64_t outBytes = 0;
    for (const auto k : c10::irange(moved.size())) {
      sizesOut[k] = size[moved[k]];
      outBytes += sizesOut[k];
    }
    packed.resize(outBytes);
    for (uint64_t k = 0, off = 0; k < moved.size(); off += sizesOut[k], ++k) {
      if (sizesOut[k] > 0) {
        std::memcpy(packed.data() + off, at[moved[k]], sizesOut[k]);
      }
    }
    const size_t sizesLen = moved.size() * sizeof(uint64_t);
    std::vector<RequestPtr> reqs{c.recv(from, sizesIn.data(), sizesLen), c.send(to, sizesOut.data(), sizesLen)};
    if (outBytes > 0) { // the receiver reads the same total from the sizes: no message on either side
      reqs.push_back(c.send(to, packed.data(), outBytes));
    }
    c.wait(reqs[0]);
    uint64_t inBytes = 0;
    for (const auto n : sizesIn) {
      inBytes += n;
    }
    arrived.emplace_back(inBytes);
    if (inBytes > 0) {
      reqs.push_back(c.recv(from, arrived.back().data(), inBytes));
    }
    c.waitAll(reqs); // the sends read `packed` and `sizesOut` until here
    for (uint64_t k = 0, off = 0; k < moved.size(); off += sizesIn[k], ++k) {
      at[moved[k]] = arrived.back().data() + off;
      size[moved[k]] = sizesIn[k];
    }
  }
  for (const auto i : c10::irange(p)) {
    const int q = bruck.sourceOf(r, i);
    if (size[i] != recvBytes[q]) {
      // What the direct exchange's frame check says of a receive of the wrong size; the
      // group breaks with it first, as a failed wait's does (OpContext::wait).
      const std::string why = c10::str("ringpg: collective mismatch between ranks: rank ", r, " expected ",
                                       recvBytes[q], " bytes from rank ", q, ", which sent ", size[i],
                                       ": the ranks disagree on the split sizes (a rank's output split for a "
                                       "peer must equal that peer's input split for it)");
      c.failGroup(why);
      throwBackend(c10::str(describe(c.tag()), ": ", why));
    }
    if (size[i] > 0 && recvBuf[q] != at[i]) {
      // memmove: block 0 still lies in the input, which an in-place call's output overlaps.
      std::memmove(recvBuf[q], at[i], size[i]);
    }
  }
}

} // namespace

void allToAll(OpContext& c, bool bruck, const std::vector<const char*>& sendBuf, const std::vector<size_t>& sendBytes,
              const std::vector<char*>& recvBuf, const std::vector<size_t>& recvBytes) {
  if (bruck) {
    bruckAllToAll(c, sendBuf, sendBytes, recvBuf, recvBytes);
  } else {
    directAllToAll(c, sendBuf, sendBytes, recvBuf, recvBytes);
  }
}

} // namespace ringpg
