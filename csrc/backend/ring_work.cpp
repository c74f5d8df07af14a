#include "backend/ring_work.h"

#include <ATen/core/jit_type.h>

#include <algorithm>

#include "common/errors.h"

namespace ringpg {
namespace {

// The accelerator devices the outputs live on: a Future must know them to complete
// with CUDA tensors (it records an event on each device's current stream).
std::vector<c10::Device> devicesOf(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> devices;
  for (const auto& t : tensors) {
    if (t.defined() && !t.device().is_cpu() &&
        std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}

} // namespace

RingWork::RingWork(int rank, c10d::OpType opType, const char* opName, uint64_t seq, const char* profilingTitle,
                   std::vector<at::Tensor> outputs, const std::vector<at::Tensor>& inputs,
                   std::chrono::milliseconds timeout)
    : c10d::Work(rank, opType, profilingTitle, std::optional<std::vector<at::Tensor>>(inputs)),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       devicesOf(outputs_))),
      opName_(opName),
      seq_(seq),
      timeout_(timeout) {}

void RingWork::complete(std::exception_ptr error) {
  // Work's own state first (wait()/is_completed()), then the future, whose callbacks
  // (DDP comm hooks, user then()) may run inline here.
  finish(error);
  if (error) {
    future_->setError(error);
    return;
  }
  try {
    future_->markCompleted(c10::IValue(outputs_));
  } catch (...) {
    // Never let completion throw out of the worker or the engine thread.
    if (!future_->completed()) {
      future_->setError(std::current_exception());
    }
  }
}

c10::intrusive_ptr<c10::ivalue::Future> RingWork::getFuture() {
  return future_;
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

bool RingWork::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout == ::kNoTimeout ? timeout_ : timeout;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, limit, [&] { return completed_; })) {
      throwBackend(c10::str(describe(OpTag{opName_, seq_, rank_}), ": Work.wait() timed out after ", limit.count(),
                            " ms; the op has not completed (for a receive: no matching send arrived)"));
    }
  }
  // complete() finishes the Work just before it completes the Future; wait for that
  // too, so that after wait() the Future is complete, as with gloo (torchft chains
  // then() on get_future() after wait() and relies on it).  The Future is marked
  // complete before its callbacks run, so a callback that waits here cannot deadlock.
  future_->wait();
  return c10d::Work::wait(::kNoTimeout); // completed: rethrows its error, then synchronize()
}

void RingWork::synchronize() {
  if (onSynchronize_) {
    onSynchronize_();
  }
}

} // namespace ringpg
