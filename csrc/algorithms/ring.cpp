#include "algorithms/ring.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cstring>

#include "algorithms/ring_plan.h"

namespace ringpg {

void ringCollective(OpContext& c, const RingJob& job, const RingBuffers& b) {
  const int p = c.size();
  const int r = c.rank();
  TORCH_INTERNAL_ASSERT(job.reduceScatter || job.allGather);
  if (p == 1 || job.count == 0) {
    if (job.reduceScatter && job.count > 0) {
      // World size 1: the reduction over one rank is its input (then finalized: AVG).
      if (job.awaitInput) {
        job.awaitInput(0);
      }
      char* dst = b.own ? b.own : b.work;
      if (dst != b.input) {
        std::memcpy(dst, b.input, job.count * job.elemSize);
      }
      if (job.finalize) {
        job.finalize(dst, job.count);
      }
    }
    if (!job.reduceScatter && b.own && job.count > 0 && b.own != b.work) {
      std::memcpy(b.work, b.own, job.count * job.elemSize); // world size 1: the own chunk is all
    }
    if (job.onFinal && job.count > 0) {
      job.onFinal(Range{0, job.count});
    }
    return;
  }
  const size_t es = job.elemSize;
  // Segments: at most the configured size, but at least minSegments per chunk (down to
  // kMinSegmentBytes) so that the ring's fill and drain, about one segment per step,
  // stay a small part of the whole.  Over shared memory a segment costs a hand-off
  // between processes, which dominates when ranks share cores, and fill is cheap: 4
  // per chunk there (measured on 2 cores, N=4, 1-16 MiB: +5-14% busbw over 16; N=2 even).
  const bool fused = c.fusedRecvReduce(c.left()); // the shared-memory ring (context.h)
  const int64_t minSegments = fused ? 4 : 16;
  constexpr int64_t kMinSegmentBytes = 64 * 1024;
  const int64_t chunkBytes = (job.count + p - 1) / p * static_cast<int64_t>(es);
  const int64_t segBytes = std::min<int64_t>(static_cast<int64_t>(c.config().segmentBytes),
                                             std::max(kMinSegmentBytes, chunkBytes / minSegments));
  const SegmentPlan plan = segmentPlan(job.count, p, std::max<int64_t>(1, segBytes / static_cast<int64_t>(es)));
  // Steps are numbered as in ring_plan.h: [0, p-1) reduce, [p-1, 2p-2) gather.
  const int firstStep = job.reduceScatter ? 0 : p - 1;
  const int endStep = job.allGather ? 2 * p - 2 : p - 1;
  const int64_t units = static_cast<int64_t>(endStep - firstStep) * plan.segments;
  const Range ownChunk = chunkRange(job.count, p, r);

  // Where the data of range R of chunk `chunk` lives (after it was reduced/received).
  auto at = [&](int chunk, const Range& R) -> char* {
    if (chunk == r && b.own) {
      return b.own + (R.offset - ownChunk.offset) * es;
    }
    return b.work + R.offset * es;
  };
  auto sendRange = [&](int step, int64_t j) {
    return segmentRange(chunkRange(job.count, p, ringSendChunk(r, p, step)), plan, j);
  };
  auto recvChunk = [&](int64_t u) { return ringRecvChunk(r, p, firstStep + static_cast<int>(u / plan.segments)); };
  auto recvRange = [&](int64_t u) {
    return segmentRange(chunkRange(job.count, p, recvChunk(u)), plan, u % plan.segments);
  };
  auto isReduce = [&](int64_t u) { return firstStep + u / plan.segments < p - 1; };

  const int window = c.config().recvWindow;
  const size_t slotBytes = static_cast<size_t>(plan.segElems) * es;
  // Fused: the link reduces each fragment as it arrives, with no staging slots.
  char* slots = job.reduceScatter && !fused ? c.scratch(slotBytes * window) : nullptr;

  // Each chunk's local input is awaited once, just before it is first read.
  std::vector<bool> inputReady(p, !job.awaitInput);
  auto needInput = [&](int chunk) {
    if (!inputReady[chunk]) {
      job.awaitInput(chunk);
      inputReady[chunk] = true;
    }
  };

  std::vector<RequestPtr> sends;
  // Step `firstStep` sends come straight from the input (reduce) or the own chunk (gather).
  for (const auto j : c10::irange(plan.segments)) {
    const Range R = sendRange(firstStep, j);
    if (R.empty()) {
      continue; // the neighbour computes the same empty range and posts nothing
    }
    const int chunk = ringSendChunk(r, p, firstStep);
    if (job.reduceScatter) {
      needInput(chunk);
    }
    const char* src = job.reduceScatter ? b.input + R.offset * es : at(chunk, R);
    sends.push_back(c.send(c.right(), src, R.length * es));
  }
  // All-gather from a separate input: the own chunk left from `own` above, and its copy
  // into the output runs now, while those sends are on the wire, instead of delaying
  // them (the chunk is never received, so nothing else writes that range).
  if (!job.reduceScatter && b.own && !ownChunk.empty()) {
    std::memcpy(b.work + ownChunk.offset * es, b.own, ownChunk.length * es);
  }

  std::vector<RequestPtr> recvs(units);
  int64_t posted = 0;
  // Posts receives for units [posted, done + window): unit u's scratch slot is
  // u % window, free again once unit u - window was reduced.
  auto postAhead = [&](int64_t done) {
    for (; posted < units && posted < done + window; ++posted) {
      const Range R = recvRange(posted);
      if (R.empty()) {
        continue;
      }
      const int chunk = recvChunk(posted);
      if (isReduce(posted) && fused) {
        needInput(chunk); // the reduction may run during any later wait
        recvs[posted] = c.recvReduce(c.left(), at(chunk, R), b.input + R.offset * es, R.length, es, job.op);
      } else {
        char* dst = isReduce(posted) ? slots + (posted % window) * slotBytes : at(chunk, R);
        recvs[posted] = c.recv(c.left(), dst, R.length * es);
      }
    }
  };

  for (const auto u : c10::irange(units)) {
    postAhead(u);
    const Range R = recvRange(u);
    if (R.empty()) {
      continue;
    }
    const int chunk = recvChunk(u);
    const int step = firstStep + static_cast<int>(u / plan.segments);
    c.wait(recvs[u]);
    recvs[u].reset();
    char* dst = at(chunk, R);
    if (isReduce(u)) {
      // recvReduce: dst = local contribution (op) what the left neighbour accumulated.
      if (!fused) {
        needInput(chunk);
        reduce(c.dtype(), job.op, dst, b.input + R.offset * es, slots + (u % window) * slotBytes, R.length);
      }
      if (step == p - 2) {
        if (job.finalize) {
          job.finalize(dst, R.length); // the own chunk is now complete
        }
        if (job.onFinal) {
          job.onFinal(R);
        }
      }
    } else if (job.onFinal) {
      job.onFinal(R); // a gathered segment arrives final
    }
    if (step + 1 < endStep) {
      // ...and forward: what was received at step k is sent at step k + 1.
      sends.push_back(c.send(c.right(), dst, R.length * es));
    }
  }
  c.waitAll(sends);
}

void chainBroadcast(OpContext& c, char* data, size_t nbytes, int root) {
  const int p = c.size();
  if (p == 1 || nbytes == 0) {
    return;
  }
  // Position along the chain root -> root+1 -> ... -> root-1.
  const int pos = (c.rank() - root + p) % p;
  const bool last = pos == p - 1;
  const int64_t segBytes = static_cast<int64_t>(c.config().segmentBytes);
  const int64_t segs = flatSegments(static_cast<int64_t>(nbytes), segBytes);
  std::vector<RequestPtr> sends;
  if (pos == 0) {
    for (const auto j : c10::irange(segs)) {
      const Range R = flatSegment(static_cast<int64_t>(nbytes), segBytes, j);
      sends.push_back(c.send(c.right(), data + R.offset, R.length));
    }
  } else {
    // Receives land in place, so all of them can be posted at once.
    std::vector<RequestPtr> recvs;
    for (const auto j : c10::irange(segs)) {
      const Range R = flatSegment(static_cast<int64_t>(nbytes), segBytes, j);
      recvs.push_back(c.recv(c.left(), data + R.offset, R.length));
    }
    for (const auto j : c10::irange(segs)) {
      c.wait(recvs[j]);
      if (!last) {
        const Range R = flatSegment(static_cast<int64_t>(nbytes), segBytes, j);
        sends.push_back(c.send(c.right(), data + R.offset, R.length));
      }
    }
  }
  c.waitAll(sends);
}

} // namespace ringpg
