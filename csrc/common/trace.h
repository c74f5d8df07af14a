// RINGPG_TRACE=DIR: a per-step timeline of every op, in Chrome trace-event JSON (the
// format Perfetto and chrome://tracing open), one file per rank and group:
//   DIR/ringpg.<group>.rank<r>.json
// `python -m ringpg.trace DIR` merges the ranks into one timeline (python/ringpg/trace.py).
//
// What a file holds, per op:
//   * a span named like the op ("all_reduce"), args: seq, bytes, dtype and, for the
//     ring, its plan (count, segments, elements per segment, fused or not);
//   * inside it, per ring primitive (send, recvReduceSend, ...), a span with its step;
//   * inside those, per segment: "send" (posting it; over shared memory the eager copy
//     into free slots), "recv" (this thread waiting until it has landed; args: when it
//     was posted), "reduce" (the reduction of a received segment, or over shared memory
//     of each fragment as it is pulled, inside whatever wait pulled it), each with
//     step, chunk, segment, bytes and peer.
// Every event is recorded by the thread that did the work: the one running the op
// (the backend's worker, or the caller for an inline op).  Timestamps are steady_clock
// shifted by this rank's offset to rank 0's, measured when the group was created
// (algorithms/clock_sync.h), so files of one group share a time axis.
//
// Cost: off, each recording site is a branch or two on a null pointer, never taken.
// On, each event is two clock reads and a push into a buffer that only the op's thread
// touches (no lock); the buffer is formatted into the file's stdio buffer when the op
// ends (on disk every MiB, after a failed op, and when the group stops), so a trace of
// a long job grows on disk, not in memory.  That write is itself in the trace: a
// "trace_write" event (cat "trace", args op_seq, events, bytes) right after each op.
// Ops of the ring's neighbours (one-shot, chain broadcast, direct) get the op span
// with their algorithm named, without per-segment events.
#pragma once

#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ringpg {

// Nanoseconds on this process's steady clock (what every trace event records).
inline int64_t traceNow() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Which part of a ring sweep an event is.
enum class TraceKind : uint8_t {
  Primitive, // one named ring primitive (name: "send", "recvReduceSend", ...)
  Send,      // one segment posted to the right neighbour
  Recv,      // waiting for one segment from the left neighbour
  Reduce,    // reducing one received segment (or one fragment of it)
};

struct TraceEvent {
  const char* name;  // static storage
  TraceKind kind;
  int64_t begin;     // traceNow()
  int64_t end;
  int32_t step;      // ring step (ring_plan.h), or -1
  int32_t chunk;     // chunk moved (Primitive: the chunk received, or -1)
  int32_t segment;   // segment of the chunk (Primitive: the chunk sent, or -1)
  int32_t peer;      // rank on the other end, or -1
  int64_t bytes;
  int64_t posted;    // Recv: when the receive was posted; else 0
};

// What the ring tells the op span about its plan (zero when the op ran no ring).
struct TraceRingPlan {
  int64_t count = 0;
  int64_t elemSize = 0;
  int64_t segments = 0;
  int64_t segElems = 0;
  int32_t window = 0;
  bool fused = false;
  bool reduceScatter = false;
  bool allGather = false;
};

// The events of the op that is running: only its thread appends (ops of a group
// never run at once), so appending takes no lock.
class OpTrace {
 public:
  void add(const TraceEvent& e) { events_.push_back(e); }
  // One segment event that began at `begin` and ends now.
  void segment(TraceKind kind, const char* name, int64_t begin, int step, int chunk, int64_t segment, int peer,
               int64_t bytes, int64_t posted = 0) {
    events_.push_back(
        TraceEvent{name, kind, begin, traceNow(), step, chunk, static_cast<int32_t>(segment), peer, bytes, posted});
  }

  // Appends the events `other` recorded: a second thread's of the same op (the
  // hierarchical pipeline's), once that thread has ended.
  void absorb(const OpTrace& other) { events_.insert(events_.end(), other.events_.begin(), other.events_.end()); }
  const char* algorithm = nullptr; // the op's plan's (algorithmName: "ring", "oneshot", ...); null: not said
  TraceRingPlan ring;
  // A hierarchical collective's pieces (a coalesced op's: all its collectives') and the
  // threads that ran them (1, or 2 when the rings across hosts ran on a second thread
  // beside the host rings); 0: not a hierarchical op.
  int pieces = 0;
  int threads = 0;

 private:
  friend class Tracer;
  std::vector<TraceEvent> events_;
};

// One group's trace file.  Created (after the clock exchange) by the backend when
// RINGPG_TRACE is set; closed, as a complete JSON array, when the group goes.
class Tracer {
 public:
  // Opens DIR/ringpg.<group>.rank<rank>.json (creating DIR); throws if it cannot.
  Tracer(const std::string& dir, const std::string& group, int rank, int size, const std::string& transport,
         int64_t clockOffsetNs, int64_t clockRttNs, int clockRounds);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  const std::string& path() const { return path_; }

  // The op that starts now on this thread; every event of it goes into the returned
  // buffer until endOp() writes it out.
  OpTrace* beginOp(const char* name, uint64_t seq, int64_t bytes, const char* dtype);
  void endOp(bool failed) noexcept;

 private:
  void write(const std::string& text, bool flush) noexcept;
  // Appends the "trace_write" event of the last op's flush (the tracer's own cost).
  void lastWriteEvent(std::string& out) const;
  // Appends the current op's events (thread `tid`), one line each.
  void appendOpEvents(std::string& out, long tid) const;

  const int rank_;
  const int64_t offsetNs_;
  std::string path_;
  std::FILE* file_ = nullptr;
  std::mutex mu_; // the file, between an op's end and the group's destruction
  std::vector<long> knownThreads_;
  // The running op.
  OpTrace op_;
  const char* opName_ = nullptr;
  uint64_t opSeq_ = 0;
  int64_t opBytes_ = 0;
  const char* opDtype_ = "";
  int64_t opBegin_ = 0;
  long opThread_ = 0;
  std::string text_; // formatting buffer, reused
  // The last op's flush, written with the next one (or at the end).
  int64_t writeBegin_ = 0;
  int64_t writeEnd_ = 0;
  long writeThread_ = 0;
  uint64_t writeSeq_ = 0;
  int64_t writeEvents_ = 0;
  int64_t writeBytes_ = 0;
};

// The op span around one op's execution (`numel` elements of `dtype`): records
// nothing when `tracer` is null.
class TraceOpScope {
 public:
  TraceOpScope(Tracer* tracer, const char* name, uint64_t seq, uint64_t numel, c10::ScalarType dtype)
      : tracer_(tracer), op_(tracer ? tracer->beginOp(name, seq, static_cast<int64_t>(numel * c10::elementSize(dtype)),
                                                      c10::toString(dtype))
                                    : nullptr) {}
  ~TraceOpScope() {
    if (tracer_) {
      tracer_->endOp(std::uncaught_exceptions() > 0);
    }
  }
  TraceOpScope(const TraceOpScope&) = delete;
  TraceOpScope& operator=(const TraceOpScope&) = delete;
  OpTrace* op() const { return op_; }

 private:
  Tracer* tracer_;
  OpTrace* op_;
};

} // namespace ringpg
