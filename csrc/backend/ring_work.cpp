#include "backend/ring_work.h"

#include <ATen/core/jit_type.h>

#include <algorithm>
#include <chrono>

#include "common/errors.h"

namespace ringpg {
namespace {

// The accelerator devices the outputs live on: a Future must know them to complete
// with CUDA tensors (it records an event on each device's current stream).
std::vector<c10::Device> devicesOf(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> devices;
  for (const auto& t : tensors) {
    if (t.defined() && !t.device().is_cpu() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Completion keys: one counter for the process, so no two Works share one even across
// groups, and a key is never reused after its Work is gone.
std::atomic<uint64_t> nextCompletionKey{1};

} // namespace

RingWork::RingWork(int rank, c10d::OpType opType, const char* opName, uint64_t seq, const char* profilingTitle,
                   std::vector<at::Tensor> outputs, const std::vector<at::Tensor>& inputs,
                   std::chrono::milliseconds timeout)
    : c10d::Work(rank, opType, profilingTitle, std::optional<std::vector<at::Tensor>>(inputs)),
      outputs_(std::move(outputs)), opName_(opName), seq_(seq), timeout_(timeout),
      completionKey_(nextCompletionKey.fetch_add(1, std::memory_order_relaxed)), startNs_(nowNs()) {}

void RingWork::markStarted() {
  startNs_.store(nowNs(), std::memory_order_relaxed);
}

void RingWork::complete(std::exception_ptr error, const std::function<void()>& onFinished) {
  endNs_.store(nowNs(), std::memory_order_relaxed);
  // Work's own state first (wait()/is_completed()), then `onFinished`, then the future,
  // whose callbacks (DDP comm hooks, user then()) may run inline here.
  finish(error);
  if (onFinished) {
    onFinished();
  }
  c10::intrusive_ptr<c10::ivalue::Future> f;
  {
    std::lock_guard<std::mutex> lk(futureMu_);
    outcome_ = error ? Outcome::Failed : Outcome::Succeeded;
    error_ = error;
    f = future_; // null: getFuture() will complete the one it makes
  }
  outcomeCv_.notify_all();
  if (f) {
    completeFuture(f);
  }
}

void RingWork::completeFuture(const c10::intrusive_ptr<c10::ivalue::Future>& f) {
  if (error_) {
    f->setError(error_);
    return;
  }
  try {
    f->markCompleted(c10::IValue(outputs_));
  } catch (...) {
    // Never let completion throw out of the worker or the engine thread.
    if (!f->completed()) {
      f->setError(std::current_exception());
    }
  }
}

c10::intrusive_ptr<c10::ivalue::Future> RingWork::getFuture() {
  c10::intrusive_ptr<c10::ivalue::Future> f;
  bool done = false;
  {
    std::lock_guard<std::mutex> lk(futureMu_);
    if (future_) {
      return future_;
    }
    future_ =
        c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devicesOf(outputs_));
    f = future_;
    done = outcome_ != Outcome::Pending; // complete() ran before there was a Future
  }
  if (done) {
    completeFuture(f); // error_ and outputs_ are final once outcome_ is set
  }
  return f;
}

std::vector<at::Tensor> RingWork::result() {
  return outputs_;
}

uint64_t RingWork::getSequencenumber() const {
  return seq_;
}

std::chrono::milliseconds RingWork::getTimeout() const {
  return timeout_;
}

int RingWork::sourceRank() const {
  return sourceRank_.load();
}

float RingWork::getDuration() const {
  {
    std::lock_guard<std::mutex> lock(mutex_); // completed_ (Work's)
    TORCH_CHECK(completed_, describe(OpTag{opName_, seq_, rank_}), ": Work.get_duration(): the op has not completed");
  }
  const int64_t ns = endNs_.load(std::memory_order_relaxed) - startNs_.load(std::memory_order_relaxed);
  return static_cast<float>(ns) / 1e6f; // ns -> ms
}

uint64_t RingWork::getCompletionKey() const {
  return completionKey_;
}

bool RingWork::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout == ::kNoTimeout ? timeout_ : timeout;
  auto timedOut = [&](std::chrono::milliseconds waited) {
    throwBackend(c10::str(describe(OpTag{opName_, seq_, rank_}), ": Work.wait() timed out after ", waited.count(),
                          " ms; the op has not completed (for a receive: no matching send arrived)"));
  };
  if (runHere_ && timeout == ::kNoTimeout) {
    // Only under the op's own deadline: a wait with a shorter timeout of its own must be
    // able to give up while the op goes on, which an op run here could not.
    runHere_();
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout == ::kNoTimeout && !c10d::isP2POp(opType_)) {
      // A collective ends by its own deadline, which the worker counts from the op's
      // start (ops queue behind each other), and it completes once the failure is
      // reported (getError(), the abort hooks).  Wait for that, so the caller sees the
      // op's own error (naming the rank it waited for) after the group has said why,
      // not a wait that expired a moment before the op's deadline.  kReportGrace only
      // bounds a worker that never gets there.
      constexpr auto kReportGrace = std::chrono::seconds(60);
      while (!completed_) {
        const auto until =
            std::chrono::steady_clock::time_point(std::chrono::nanoseconds(startNs_.load(std::memory_order_relaxed))) +
            timeout_ + kReportGrace;
        if (std::chrono::steady_clock::now() >= until) {
          timedOut(timeout_ + std::chrono::duration_cast<std::chrono::milliseconds>(kReportGrace));
        }
        cv_.wait_until(lock, until); // then looks again: the op may have started since
      }
    } else if (!cv_.wait_for(lock, limit, [&] { return completed_; })) {
      timedOut(limit);
    }
  }
  // complete() finishes the Work just before it completes the Future; wait for that
  // too, so that after wait() the Future is complete, as with gloo (torchft chains
  // then() on get_future() after wait() and relies on it).  The Future is marked
  // complete before its callbacks run, so a callback that waits here cannot deadlock.
  // No Future yet: a later getFuture() completes the one it makes before returning it,
  // once complete() has set the outcome, which it does right after the completion
  // hooks: wait for that, so get_future().done() holds when wait() returns.
  c10::intrusive_ptr<c10::ivalue::Future> f;
  {
    std::unique_lock<std::mutex> lk(futureMu_);
    outcomeCv_.wait(lk, [&] { return outcome_ != Outcome::Pending; });
    f = future_;
  }
  if (f) {
    f->wait();
  }
  return c10d::Work::wait(::kNoTimeout); // completed: rethrows its error, then synchronize()
}

void RingWork::synchronize() {
  if (onSynchronize_) {
    onSynchronize_();
  }
}

} // namespace ringpg
