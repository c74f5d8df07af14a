#include "algorithms/ring.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "algorithms/choice.h"
#include "algorithms/ring_plan.h"
#include "reduce/reduce.h"

namespace ringpg {

namespace {

// World size 1 or an empty buffer: nothing travels.  A reduce-scatter's result is the
// input itself (finalized: AVG divides by one); an all-gather's own chunk is all of it.
void localCollective(const RingJob& job, const RingBuffers& b) {
  if (job.count == 0) {
    return;
  }
  if (job.reduceScatter) {
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
  } else if (b.own && b.own != b.work) {
    std::memcpy(b.work, b.own, job.count * job.elemSize);
  }
  if (job.onFinal) {
    job.onFinal(Range{0, job.count});
  }
}

// One sweep of the ring over a buffer, as NCCL writes it: a step is one chunk moving
// one hop, in pipeline segments (ring_plan.h), and each named primitive below is one
// step on this rank.  At step k a rank sends chunk ringSendChunk(k) to the right and
// receives chunk ringRecvChunk(k) from the left, and what it received at step k it
// sends at step k + 1; so every primitive named "...Send" that runs for step k posts
// the sends of step k + 1.
//
// Receives are posted a window of segments ahead, in the order the primitives consume
// them, so the link lands data while this thread reduces; a received segment is
// forwarded as soon as it is final on this rank, while the next ones are in flight.
class RingSweep {
 public:
  RingSweep(OpContext& c, const RingView& ring, const RingJob& job, const RingBuffers& b);

  // Posts step `step`'s sends: the chunk leaves from the input (reduce-scatter's first
  // step) or from the own chunk (all-gather's first step).
  void send(int step);
  // The first step of an all-gather from a separate input (NCCL's copySend): each
  // segment of the own chunk is posted, which copies it into a shared-memory slot at
  // once where one is free, and then copied into its home in the output, so the second
  // copy reads it from this core's cache rather than memory (nothing is received into
  // that range).
  void copySend(int step);
  // A reduce step: partial sums arrive, the local input is added, the sum moves on.
  void recvReduceSend(int step);
  // The last reduce step of an allreduce: the own chunk becomes final (AVG divides it)
  // and leaves at once as the all-gather's first step.
  void recvReduceCopySend(int step);
  // The last reduce step of a reduce-scatter: the own chunk becomes final and stays.
  void recvReduceCopy(int step);
  // A gather step: a final segment lands in place and moves on.
  void recvCopySend(int step);
  // The last gather step: the final segments land in place.
  void recv(int step);
  // Waits for every send still in flight.
  void finish();

 private:
  // A segment received at some step: `unit` numbers it in receive order.
  struct Arrival {
    int64_t unit;
    int chunk;
    Range range; // elements of the full layout
    char* dst;   // where it now lives: its chunk's home in `work` (or `own`)
  };
  // What each step does with a segment once it has arrived.
  enum class Reduce : uint8_t { No, Yes };
  enum class Final : uint8_t { No, Yes };
  enum class Forward : uint8_t { No, Yes };
  // Receives every non-empty segment of step `step` in order, and for each: reduces it
  // into the local input, marks it final, forwards it, as asked.  `name`: the
  // primitive's, for the trace.
  void receiveStep(const char* name, int step, Reduce reduceIt, Final final, Forward forward);
  // Posts segment `j` (`n` elements at `src`) of chunk `chunk` to the right: a send of step `step`.
  void postSend(int step, int chunk, int64_t j, const char* src, int64_t n);
  // RINGPG_TRACE: the span of primitive `name`, from `begin` to now.
  void tracePrimitive(const char* name, int64_t begin, int step, int recvChunk, int sendChunk) {
    trace_->add(TraceEvent{name, TraceKind::Primitive, begin, traceNow(), step, recvChunk, sendChunk, -1, 0, 0});
  }

  int64_t unitOf(int step, int64_t segment) const {
    return static_cast<int64_t>(step - firstStep_) * plan_.segments + segment;
  }
  // The elements of chunk `chunk`: chunks are numbered by ring position (ring_plan.h
  // with r = this rank's position), and the chunk of position i is the data chunk of
  // the rank there, so a reduce-scatter leaves each rank its own.
  Range chunkOf(int chunk) const;
  // Range of segment `j` of the chunk that moves at step `step`, received or sent.
  Range recvRange(int step, int64_t j) const;
  Range sendRange(int step, int64_t j) const;
  // Where range R of chunk `chunk` lives.
  char* home(int chunk, const Range& R) const;
  bool isReduceStep(int step) const { return step < p_ - 1; }
  // Awaits chunk `chunk`'s local input once, before it is first read (CUDA staging).
  void needInput(int chunk);
  // Posts the receives of units [posted_, done + window).
  void postAhead(int64_t done);

  OpContext& c_;
  const RingView& ring_;
  OpTrace* const trace_;  // null unless RINGPG_TRACE: off, a recording site is a never-taken branch or two
  const RingJob& job_;
  const RingBuffers& b_;
  const int p_;
  const int r_;           // this rank's ring position (OpContext::position)
  const size_t es_;
  const bool fused_;      // the link reduces each fragment as it arrives (context.h)
  SegmentPlan plan_;
  int firstStep_;         // steps numbered as in ring_plan.h: [0, p-1) reduce, [p-1, 2p-2) gather
  int64_t units_;         // segments received in the whole sweep
  Range ownChunk_;
  int window_;            // receives posted ahead
  // A plain all-gather into an output of at least Config::streamFrom(): the own chunk
  // and every received segment are written with streaming stores (reduce.h).
  bool streaming_;
  size_t slotBytes_;      // one staging slot: a full segment
  char* slots_ = nullptr; // window_ staging slots for unfused reduce steps; unit u uses u % window_
  std::vector<bool> inputReady_;
  // Sends not yet seen done: those done are dropped once the list reaches pruneAt_, so a
  // rank holds about a window of them, not one a unit (thousands on a ring of many hosts).
  std::vector<RequestPtr> sends_;
  size_t pruneAt_ = kSendsKept;
  static constexpr size_t kSendsKept = 64;
  std::vector<RequestPtr> recvs_; // unit u's at u % window_: at most window_ are posted at once
  int64_t posted_ = 0;            // units whose receive is posted (or empty)
  std::vector<int64_t> postedAt_; // traced: when each unit's receive was posted
};

RingSweep::RingSweep(OpContext& c, const RingView& ring, const RingJob& job, const RingBuffers& b)
    : c_(c), ring_(ring), trace_(c.trace()), job_(job), b_(b), p_(ring.size()), r_(ring.me), es_(job.elemSize),
      fused_(c.fusedRecvReduce(ring.left())) {
  // Segments: at most the configured size, but at least the ring's minSegments per
  // chunk (down to kMinSegmentBytes) so that the ring's fill and drain, about one
  // segment per step, stay a small part of the whole (RingView::minSegments).
  const int64_t minSegments = ring.minSegments;
  const int64_t chunkBytes = (job.count + p_ - 1) / p_ * static_cast<int64_t>(es_);
  const int64_t segBytes =
      std::min<int64_t>(static_cast<int64_t>(c.config().segmentBytes),
                        std::max(static_cast<int64_t>(kMinSegmentBytes), chunkBytes / minSegments));
  plan_ = segmentPlan(job.count, p_, std::max<int64_t>(1, segBytes / static_cast<int64_t>(es_)));
  firstStep_ = job.reduceScatter ? 0 : p_ - 1;
  const int endStep = job.allGather ? 2 * p_ - 2 : p_ - 1;
  units_ = static_cast<int64_t>(endStep - firstStep_) * plan_.segments;
  ownChunk_ = chunkOf(r_);
  window_ = c.recvWindowFrom(ring.left());
  // The plan's (OpPlan::streams): only ever a plain all-gather's output.
  TORCH_INTERNAL_ASSERT(!job.streams || (job.allGather && !job.reduceScatter), "ringpg: only an all-gather streams");
  streaming_ = job.streams;
  slotBytes_ = static_cast<size_t>(plan_.segElems) * es_;
  // Fused: the link reduces each fragment as it arrives, with no staging slots.
  slots_ = job.reduceScatter && !fused_ ? c.scratch(slotBytes_ * window_) : nullptr;
  inputReady_.assign(p_, !job.awaitInput);
  recvs_.resize(static_cast<size_t>(window_));
  if (trace_) {
    if (trace_->algorithm == nullptr) {
      trace_->algorithm = algorithmName(Algorithm::Ring); // an op names its plan's first
    }
    trace_->ring = TraceRingPlan{job.count, static_cast<int64_t>(es_), plan_.segments, plan_.segElems, window_,
                                 fused_,    job.reduceScatter,         job.allGather};
    postedAt_.assign(units_, 0);
  }
}

Range RingSweep::chunkOf(int chunk) const {
  return chunkRange(job_.count, p_, ring_.dataChunk[chunk]);
}

Range RingSweep::recvRange(int step, int64_t j) const {
  return segmentRange(chunkOf(ringRecvChunk(r_, p_, step)), plan_, j);
}

Range RingSweep::sendRange(int step, int64_t j) const {
  return segmentRange(chunkOf(ringSendChunk(r_, p_, step)), plan_, j);
}

char* RingSweep::home(int chunk, const Range& R) const {
  if (chunk == r_ && b_.own) {
    return b_.own + (R.offset - ownChunk_.offset) * es_;
  }
  return b_.work + R.offset * es_;
}

void RingSweep::needInput(int chunk) {
  if (!inputReady_[chunk]) {
    job_.awaitInput(ring_.dataChunk[chunk]);
    inputReady_[chunk] = true;
  }
}

void RingSweep::postAhead(int64_t done) {
  for (; posted_ < units_ && posted_ < done + window_; ++posted_) {
    const int step = firstStep_ + static_cast<int>(posted_ / plan_.segments);
    const Range R = recvRange(step, posted_ % plan_.segments);
    if (R.empty()) {
      continue; // the neighbour computes the same empty range and sends nothing
    }
    const int chunk = ringRecvChunk(r_, p_, step);
    if (trace_) {
      postedAt_[posted_] = traceNow();
    }
    if (isReduceStep(step) && fused_) {
      needInput(chunk); // the reduction may run during any later wait
      recvs_[posted_ % window_] = c_.recvReduce(ring_.left(), home(chunk, R), b_.input + R.offset * es_, R.length, es_,
                                                job_.op, step, chunk, posted_ % plan_.segments);
    } else if (isReduceStep(step)) {
      // Slot u % window is free again: unit u - window was reduced before u was posted.
      recvs_[posted_ % window_] = c_.recv(ring_.left(), slots_ + (posted_ % window_) * slotBytes_, R.length * es_);
    } else {
      recvs_[posted_ % window_] = c_.recv(ring_.left(), home(chunk, R), R.length * es_, streaming_); // lands in place
    }
  }
}

void RingSweep::postSend(int step, int chunk, int64_t j, const char* src, int64_t n) {
  const int64_t begin = trace_ ? traceNow() : 0;
  const size_t bytes = static_cast<size_t>(n) * es_;
  // Copied or lent: the plan's rule for a ring's sends (ringSendCopied, choice.h).
  const bool copied = ringSendCopied(isReduceStep(step), job_.reduceScatter, ring_.size(),
                                     static_cast<size_t>(job_.count) * es_, bytes);
  if (sends_.size() >= pruneAt_) {
    // Amortized: the next pass waits until the list has doubled past what stayed.
    sends_.erase(std::remove_if(sends_.begin(), sends_.end(),
                                [](const RequestPtr& r) { return r->state.load() == Request::State::Done; }),
                 sends_.end());
    pruneAt_ = std::max(kSendsKept, 2 * sends_.size());
  }
  sends_.push_back(copied ? c_.sendCopied(ring_.right(), src, bytes) : c_.send(ring_.right(), src, bytes));
  if (trace_) {
    trace_->segment(TraceKind::Send, "send", begin, step, chunk, j, ring_.right(), n * static_cast<int64_t>(es_));
  }
}

void RingSweep::send(int step) {
  const int64_t begin = trace_ ? traceNow() : 0;
  const int chunk = ringSendChunk(r_, p_, step);
  for (const auto j : c10::irange(plan_.segments)) {
    const Range R = sendRange(step, j);
    if (R.empty()) {
      continue; // the neighbour computes the same empty range and posts nothing
    }
    const char* src;
    if (isReduceStep(step)) {
      needInput(chunk);
      src = b_.input + R.offset * es_;
    } else {
      src = home(chunk, R);
    }
    postSend(step, chunk, j, src, R.length);
  }
  if (trace_) {
    tracePrimitive("send", begin, step, -1, chunk);
  }
}

void RingSweep::copySend(int step) {
  const int64_t begin = trace_ ? traceNow() : 0;
  const int chunk = ringSendChunk(r_, p_, step);
  TORCH_INTERNAL_ASSERT(chunk == r_ && b_.own, "ringpg: copySend sends the own chunk from a separate input");
  for (const auto j : c10::irange(plan_.segments)) {
    const Range R = sendRange(step, j);
    if (R.empty()) {
      continue; // the neighbour computes the same empty range and posts nothing
    }
    const char* src = home(chunk, R);
    postSend(step, chunk, j, src, R.length);
    // Copied segment by segment as each is sent, not as one copy after every send: the
    // copy overlaps the neighbour's reads (docs/internals.md, "Why these constants").
    copyMaybeStreaming(b_.work + R.offset * es_, src, static_cast<size_t>(R.length) * es_, streaming_);
  }
  if (trace_) {
    tracePrimitive("copySend", begin, step, -1, chunk);
  }
}

void RingSweep::receiveStep(const char* name, int step, Reduce reduceIt, Final final, Forward forward) {
  const int64_t stepBegin = trace_ ? traceNow() : 0;
  const int chunk = ringRecvChunk(r_, p_, step);
  for (const auto j : c10::irange(plan_.segments)) {
    const int64_t u = unitOf(step, j);
    postAhead(u);
    const Range R = recvRange(step, j);
    if (R.empty()) {
      continue;
    }
    const int64_t waitBegin = trace_ ? traceNow() : 0;
    c_.wait(recvs_[u % window_]);
    if (trace_) {
      trace_->segment(TraceKind::Recv, "recv", waitBegin, step, chunk, j, ring_.left(),
                      R.length * static_cast<int64_t>(es_), postedAt_[u]);
    }
    recvs_[u % window_].reset();
    char* dst = home(chunk, R);
    if (reduceIt == Reduce::Yes && !fused_) {
      // dst = local contribution (op) what the left neighbour accumulated.
      needInput(chunk);
      const int64_t reduceBegin = trace_ ? traceNow() : 0;
      reduce(c_.dtype(), job_.op, dst, b_.input + R.offset * es_, slots_ + (u % window_) * slotBytes_, R.length);
      if (trace_) {
        trace_->segment(TraceKind::Reduce, "reduce", reduceBegin, step, chunk, j, ring_.left(),
                        R.length * static_cast<int64_t>(es_));
      }
    }
    if (final == Final::Yes) {
      if (reduceIt == Reduce::Yes && job_.finalize) {
        job_.finalize(dst, R.length); // the own chunk's sum is complete: AVG divides it
      }
      if (job_.onFinal) {
        job_.onFinal(R);
      }
    }
    if (forward == Forward::Yes) {
      postSend(step + 1, chunk, j, dst, R.length); // step + 1's send: what arrived at step k leaves at k + 1
    }
  }
  if (trace_) {
    tracePrimitive(name, stepBegin, step, chunk, forward == Forward::Yes ? chunk : -1);
  }
}

void RingSweep::recvReduceSend(int step) {
  receiveStep("recvReduceSend", step, Reduce::Yes, Final::No, Forward::Yes);
}

void RingSweep::recvReduceCopySend(int step) {
  receiveStep("recvReduceCopySend", step, Reduce::Yes, Final::Yes, Forward::Yes);
}

void RingSweep::recvReduceCopy(int step) {
  receiveStep("recvReduceCopy", step, Reduce::Yes, Final::Yes, Forward::No);
}

void RingSweep::recvCopySend(int step) {
  receiveStep("recvCopySend", step, Reduce::No, Final::Yes, Forward::Yes);
}

void RingSweep::recv(int step) {
  receiveStep("recv", step, Reduce::No, Final::Yes, Forward::No);
}

void RingSweep::finish() {
  const int64_t begin = trace_ ? traceNow() : 0;
  c_.waitAll(sends_);
  if (trace_) {
    tracePrimitive("finish", begin, -1, -1, -1);
  }
}

} // namespace

RingView RingView::ofGroup(const OpContext& c) {
  RingView v;
  v.members.resize(c.size());
  for (int pos = 0; pos < c.size(); ++pos) {
    v.members[pos] = c.ringRank(pos);
  }
  v.dataChunk = v.members; // the member at each position owns its rank's chunk
  v.me = c.position();
  // Over shared memory a segment costs a hand-off between processes, which dominates
  // when ranks share cores, and fill is cheap: fewer segments a chunk there measured
  // faster (docs/internals.md, "Why these constants").
  v.minSegments = c.ringFusedEverywhere() ? 4 : 16;
  return v;
}

RingView RingView::of(std::vector<int> members, int rank, int64_t minSegments) {
  RingView v;
  const auto it = std::find(members.begin(), members.end(), rank);
  TORCH_INTERNAL_ASSERT(it != members.end(), "ringpg: rank ", rank, " is not on the ring it runs");
  v.me = static_cast<int>(it - members.begin());
  v.dataChunk.resize(members.size());
  std::iota(v.dataChunk.begin(), v.dataChunk.end(), 0);
  v.members = std::move(members);
  v.minSegments = minSegments;
  return v;
}

void ringCollective(OpContext& c, const RingJob& job, const RingBuffers& b) {
  ringCollectiveOn(c, RingView::ofGroup(c), job, b);
}

void ringCollectiveOn(OpContext& c, const RingView& view, const RingJob& job, const RingBuffers& b) {
  TORCH_INTERNAL_ASSERT(job.reduceScatter || job.allGather);
  const int p = view.size();
  if (p == 1 || job.count == 0) {
    localCollective(job, b);
    return;
  }
  RingSweep ring(c, view, job, b);
  const int lastReduce = p - 2;     // after it, rank r holds the reduced chunk r
  const int lastGather = 2 * p - 3; // after it, every rank holds every chunk
  if (job.reduceScatter) {
    ring.send(0);
    for (int step = 0; step < lastReduce; ++step) {
      ring.recvReduceSend(step);
    }
    if (job.allGather) {
      ring.recvReduceCopySend(lastReduce); // its sends are the gather's first step
    } else {
      ring.recvReduceCopy(lastReduce);
    }
  } else if (b.own) {
    ring.copySend(p - 1); // the own chunk starts the gather, and lands in the output
  } else {
    ring.send(p - 1); // in place: the own chunk is already home
  }
  if (job.allGather) {
    for (int step = p - 1; step < lastGather; ++step) {
      ring.recvCopySend(step);
    }
    ring.recv(lastGather);
  }
  ring.finish();
}

void chainBroadcast(OpContext& c, char* data, size_t nbytes, int root) {
  const int p = c.size();
  if (p == 1 || nbytes == 0) {
    return;
  }
  // Position along the chain from the root around the ring (root's right neighbour
  // first, its left one last).
  const int pos = (c.position() - c.positionOf(root) + p) % p;
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
