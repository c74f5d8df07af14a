// Stream ordering for CUDA tensors, through torch's device-generic event API (no nvcc,
// no CUDA headers: the same build serves CPU-only machines).
//
// At enqueue the caller's current stream is marked with an event; the worker waits
// for it before staging the tensor to host memory, so the op sees everything queued
// before the call.  After the results are copied back, a completion event is
// recorded, and Work::synchronize()/wait() make the caller's *current* stream wait on
// it (the ProcessGroupNCCL contract: wait() does not block the CPU).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <memory>
#include <vector>

namespace ringpg {

class DeviceSync {
 public:
  // Null when no tensor of `inputs` and `outputs` is on an accelerator.  Throws on
  // mixed devices.
  static std::shared_ptr<DeviceSync> capture(const char* op, const std::vector<at::Tensor>& inputs,
                                             const std::vector<at::Tensor>& outputs);

  void waitForCaller();       // worker thread
  void markDone();            // worker thread, after results are back on the device
  void blockCurrentStream();  // caller thread

 private:
  explicit DeviceSync(c10::Device device);
  c10::Device device_;
  c10::Event ready_;
  c10::Event done_;
  bool doneRecorded_ = false;
};

} // namespace ringpg
