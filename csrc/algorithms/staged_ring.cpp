#include "algorithms/staged_ring.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/irange.h>

#include <initializer_list>
#include <vector>

#include "algorithms/ring.h"
#include "algorithms/ring_plan.h"

namespace ringpg {
namespace {

// The side streams of one staged op on the device of its tensors: copies to the host
// on one, copies back on another (high priority: a final piece should not queue behind
// the next piece's copy out).
class Staging {
 public:
  // `tensors`: the op's device tensors, whose memory the caching allocator must not
  // hand out before our copies end.
  Staging(const c10::Device& device, std::initializer_list<const at::Tensor*> tensors)
      : impl_(device.type()), device_(device), d2h_(impl_.getStreamFromGlobalPool(device, /*isHighPriority=*/false)),
        h2d_(impl_.getStreamFromGlobalPool(device, /*isHighPriority=*/true)) {
    // The copies start after whatever this thread queued on its current stream (the
    // PREMUL_SUM scaling, say); the caller's own stream was waited for already.
    c10::Event queued(device.type());
    queued.record(impl_.getStream(device));
    queued.block(d2h_);
    queued.block(h2d_);
    for (const at::Tensor* t : tensors) {
      impl_.recordDataPtrOnStream(t->storage().data_ptr(), d2h_);
      impl_.recordDataPtrOnStream(t->storage().data_ptr(), h2d_);
    }
  }

  // Copies the p chunks of `dev` (chunkRange over `count`) into `host`, in the order
  // the ring first reads them: chunk r-1 leaves at step 0, then chunks r-2, r-3, ...,
  // r are reduced.  One event per chunk, which awaitOut(chunk) waits for.
  void copyChunksOut(const at::Tensor& dev, const at::Tensor& host, int64_t count, int p, int r) {
    out_.clear();
    out_.reserve(p);
    for (const auto i : c10::irange(p)) {
      (void)i;
      out_.emplace_back(device_.type());
    }
    c10::StreamGuard onD2h(d2h_);
    for (const auto k : c10::irange(p)) {
      const int chunk = mod(static_cast<int64_t>(r) - 1 - k, p);
      const Range R = chunkRange(count, p, chunk);
      if (!R.empty()) {
        host.narrow(0, R.offset, R.length).copy_(dev.narrow(0, R.offset, R.length), /*non_blocking=*/true);
      }
      out_[chunk].record(d2h_);
    }
  }
  void awaitOut(int chunk) { out_[chunk].synchronize(); }

  // `dst` (device) = `src` (host or device), on the copy-back stream.
  void back(const at::Tensor& dst, const at::Tensor& src) {
    c10::StreamGuard onH2d(h2d_);
    dst.copy_(src, /*non_blocking=*/true);
  }

  // Orders this thread's current stream (where the op's completion event is recorded)
  // after every copy back.
  void finish() {
    c10::Event back(device_.type());
    back.record(h2d_);
    back.block(impl_.getStream(device_));
  }

 private:
  c10::impl::VirtualGuardImpl impl_;
  c10::Device device_;
  c10::Stream d2h_;
  c10::Stream h2d_;
  std::vector<c10::Event> out_;
};

at::Tensor pinnedLike(const at::Tensor& dev, int64_t count) {
  return at::empty({count}, dev.options().device(at::kCPU).pinned_memory(true));
}

} // namespace

void stagedRingAllreduce(OpContext& c, const at::Tensor& dev, RedOp op,
                         const std::function<void(char*, int64_t)>& finalize) {
  TORCH_INTERNAL_ASSERT(dev.is_contiguous() && !dev.device().is_cpu());
  const int64_t count = dev.numel();
  Staging staging(dev.device(), {&dev});
  at::Tensor host = pinnedLike(dev, count);
  staging.copyChunksOut(dev, host, count, c.size(), c.rank());

  RingJob job;
  job.count = count;
  job.elemSize = dev.element_size();
  job.reduceScatter = job.allGather = true;
  job.op = op;
  job.finalize = finalize;
  job.awaitInput = [&](int chunk) { staging.awaitOut(chunk); };
  job.onFinal = [&](const Range& R) {
    // Final values never change again, so the copy back can start at once.
    staging.back(dev.narrow(0, R.offset, R.length), host.narrow(0, R.offset, R.length));
  };
  char* h = static_cast<char*>(host.data_ptr());
  ringCollective(c, job, RingBuffers{h, h, nullptr});
  staging.finish();
}

void stagedRingReduceScatter(OpContext& c, const at::Tensor& input, const at::Tensor& output, RedOp op,
                             const std::function<void(char*, int64_t)>& finalize, char* work) {
  TORCH_INTERNAL_ASSERT(input.is_contiguous() && output.is_contiguous() && !input.device().is_cpu());
  const int p = c.size();
  const int64_t count = input.numel();
  TORCH_INTERNAL_ASSERT(count == output.numel() * p);
  Staging staging(input.device(), {&input, &output});
  at::Tensor hostIn = pinnedLike(input, count);
  at::Tensor hostOut = pinnedLike(output, output.numel());
  staging.copyChunksOut(input, hostIn, count, p, c.rank());
  // The reduce-scatter leaves rank r chunk r (RingView::ofGroup), in `hostOut`.
  const Range own = chunkRange(count, p, c.rank());

  RingJob job;
  job.count = count;
  job.elemSize = input.element_size();
  job.reduceScatter = true;
  job.op = op;
  job.finalize = finalize;
  job.awaitInput = [&](int chunk) { staging.awaitOut(chunk); };
  job.onFinal = [&](const Range& R) {
    const int64_t at = R.offset - own.offset;
    staging.back(output.narrow(0, at, R.length), hostOut.narrow(0, at, R.length));
  };
  ringCollective(
      c, job, RingBuffers{static_cast<const char*>(hostIn.data_ptr()), work, static_cast<char*>(hostOut.data_ptr())});
  staging.finish();
}

void stagedRingAllGather(OpContext& c, const at::Tensor& input, const at::Tensor& output) {
  TORCH_INTERNAL_ASSERT(input.is_contiguous() && output.is_contiguous() && !input.device().is_cpu());
  const int p = c.size();
  const int64_t chunk = input.numel();
  const int64_t count = output.numel();
  TORCH_INTERNAL_ASSERT(count == chunk * p);
  Staging staging(input.device(), {&input, &output});
  at::Tensor host = pinnedLike(output, count);
  // The own chunk: to the host in place before the ring starts (it sends it first),
  // and into the output on the device, where it needs no trip through the host.
  const at::Tensor mine = host.narrow(0, chunk * c.rank(), chunk);
  mine.copy_(input); // blocking: the ring reads it next
  const at::Tensor ownOut = output.narrow(0, chunk * c.rank(), chunk);
  if (ownOut.data_ptr() != input.data_ptr()) { // in place (FSDP's call): already there
    staging.back(ownOut, input);
  }

  RingJob job;
  job.count = count;
  job.elemSize = output.element_size();
  job.allGather = true;
  job.outputReadBack = true; // the copies back read it at once: keep it in cache
  job.onFinal = [&](const Range& R) {
    staging.back(output.narrow(0, R.offset, R.length), host.narrow(0, R.offset, R.length));
  };
  ringCollective(c, job, RingBuffers{nullptr, static_cast<char*>(host.data_ptr()), nullptr});
  staging.finish();
}

} // namespace ringpg
