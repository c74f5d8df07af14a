// The Work handed back for every ringpg op: completed by the worker (collectives) or
// by the transport engine (point-to-point), with a Future that carries the outputs.
// The Future is made on first request (getFuture: DDP's comm hooks, async users,
// torchft), not per op: a synchronous op that is only waited on never builds one.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "backend/flight_record.h"
#include "common/torch_compat.h"

namespace ringpg {

class RingWork : public c10d::Work {
 public:
  // `opName`: the op's c10d name ("all_reduce"), as every ringpg message names it.
  RingWork(int rank, c10d::OpType opType, const char* opName, uint64_t seq, const char* profilingTitle,
           std::vector<at::Tensor> outputs, const std::vector<at::Tensor>& inputs, std::chrono::milliseconds timeout);

  // Completes with success (error == nullptr) or with the error; called once.
  // `onFinished` runs once the Work reads completed (is_completed(), its duration) and
  // before its Future completes, so a wait() that returns has seen it run (the
  // backend's completion hooks).
  void complete(std::exception_ptr error, const std::function<void()>& onFinished = nullptr);
  // The op starts running now (else: it ran from its creation); its duration counts from here.
  void markStarted();

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;
  uint64_t getSequencenumber() const override;
  // A virtual of c10d::Work since torch 2.14 (common/torch_compat.h).
  std::chrono::milliseconds getTimeout() const RINGPG_OVERRIDE_SINCE_2_14;
  int sourceRank() const override;
  // Milliseconds from the op's start to its completion (c10d::Work::getDuration, which
  // torch's flight recorder asks of an op that finished before it could be told so);
  // a TORCH_CHECK error while the op has not completed.
  float getDuration() const override;
  // A virtual of c10d::Work since torch 2.15 (common/torch_compat.h): the key the
  // backend's completion hooks name this Work by; unique in the process, never reused.
  uint64_t getCompletionKey() const RINGPG_OVERRIDE_SINCE_2_15;
  // Every wait has a deadline: with no timeout given, the op's own (the group's or the
  // op's timeout), counted for a collective from when it starts running, plus time for
  // its failure to be reported (collectives end by their deadline anyway, and their own
  // error says more); a receive whose sender never sends would otherwise wait forever.
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;

  void setSourceRank(int r) { sourceRank_ = r; }
  // Where the op's entry is in torch's flight recorder (backend/flight_record.h): set
  // once, by the issuing thread, before the Work is queued or posted.
  void setFlightTicket(const FlightRecord::Ticket& t) { flightTicket_ = t; }
  const FlightRecord::Ticket& flightTicket() const { return flightTicket_; }
  // Run in the caller's thread by synchronize() (which Work::wait calls after completion):
  // (CUDA: make the current stream wait on the op's completion event).
  void setOnSynchronize(std::function<void()> fn) { onSynchronize_ = std::move(fn); }
  // Set for a collective queued for the worker thread (an async op), before it is
  // queued: wait() with no timeout of its own calls it first, and it runs the op right
  // there in the waiter's thread if no other op runs and this one is next in the queue
  // (RingBackend::runIfNext): an op waited on at once then costs no thread hand-off.
  void setRunHere(std::function<void()> fn) { runHere_ = std::move(fn); }
  bool canRunHere() const { return static_cast<bool>(runHere_); }

 private:
  // Completes `f` with this Work's outcome (complete() has run).
  void completeFuture(const c10::intrusive_ptr<c10::ivalue::Future>& f);

  std::vector<at::Tensor> outputs_;
  // futureMu_ guards future_ and outcome_: getFuture() may race complete(), and the
  // Future must be completed exactly once, by whichever of them sees the other done.
  std::mutex futureMu_;
  std::condition_variable outcomeCv_; // outcome_ left Pending (wait() waits for it)
  c10::intrusive_ptr<c10::ivalue::Future> future_; // null until getFuture()
  enum class Outcome : uint8_t { Pending, Succeeded, Failed };
  Outcome outcome_ = Outcome::Pending;
  std::exception_ptr error_; // the failure, once outcome_ is Failed
  const char* opName_;
  uint64_t seq_;
  std::chrono::milliseconds timeout_;
  std::atomic<int> sourceRank_{-1};
  const uint64_t completionKey_;
  // Start and end of the op, as steady_clock nanoseconds: start is written by the thread
  // that runs the op before it runs, end by complete() before finish(); getDuration()
  // reads them after seeing completed_ under Work's mutex, which orders the writes.
  std::atomic<int64_t> startNs_;
  std::atomic<int64_t> endNs_{0};
  std::function<void()> onSynchronize_;
  std::function<void()> runHere_; // see setRunHere; empty: the op never waits in the queue
  FlightRecord::Ticket flightTicket_;
};

} // namespace ringpg
