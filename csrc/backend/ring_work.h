// The Work handed back for every ringpg op: completed by the worker (collectives) or
// by the transport engine (point-to-point), with a Future that carries the outputs.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <vector>

#include "common/torch_compat.h"

namespace ringpg {

class RingWork : public c10d::Work {
 public:
  // `opName`: the op's c10d name ("all_reduce"), as every ringpg message names it.
  RingWork(int rank, c10d::OpType opType, const char* opName, uint64_t seq, const char* profilingTitle,
           std::vector<at::Tensor> outputs, const std::vector<at::Tensor>& inputs,
           std::chrono::milliseconds timeout);

  // Completes with success (error == nullptr) or with the error; called once.
  void complete(std::exception_ptr error);

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;
  uint64_t getSequencenumber() const override;
  // A virtual of c10d::Work since torch 2.14 (common/torch_compat.h).
  std::chrono::milliseconds getTimeout() const RINGPG_OVERRIDE_SINCE_2_14;
  int sourceRank() const override;
  // Every wait has a deadline: with no timeout given, the op's own (the group's or the
  // op's timeout).  Collectives end by their deadline anyway; a receive whose sender
  // never sends would otherwise wait forever.
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;

  void setSourceRank(int r) {
    sourceRank_ = r;
  }
  // Run in the caller's thread by synchronize() (which Work::wait calls after completion):
  // (CUDA: make the current stream wait on the op's completion event).
  void setOnSynchronize(std::function<void()> fn) {
    onSynchronize_ = std::move(fn);
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  const char* opName_;
  uint64_t seq_;
  std::chrono::milliseconds timeout_;
  std::atomic<int> sourceRank_{-1};
  std::function<void()> onSynchronize_;
};

} // namespace ringpg
