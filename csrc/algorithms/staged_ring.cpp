#include "algorithms/staged_ring.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/irange.h>

#include <vector>

#include "algorithms/ring.h"
#include "algorithms/ring_plan.h"

namespace ringpg {

void stagedRingAllreduce(OpContext& c, const at::Tensor& dev, RedOp op,
                         const std::function<void(char*, int64_t)>& finalize) {
  TORCH_INTERNAL_ASSERT(dev.is_contiguous() && !dev.device().is_cpu());
  const int p = c.size();
  const int r = c.rank();
  const int64_t count = dev.numel();
  const c10::Device device = dev.device();
  c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream d2h = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  const c10::Stream h2d = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true);
  // The copies start after whatever this thread queued on its current stream (the
  // PREMUL_SUM scaling, say); the caller's own stream was waited for already.
  c10::Event queued(device.type());
  queued.record(impl.getStream(device));
  queued.block(d2h);
  // The caching allocator must not hand `dev`'s memory to anyone before our copies end.
  impl.recordDataPtrOnStream(dev.storage().data_ptr(), d2h);
  impl.recordDataPtrOnStream(dev.storage().data_ptr(), h2d);

  at::Tensor host = at::empty({count}, dev.options().device(at::kCPU).pinned_memory(true));
  auto devRange = [&](const Range& R) { return dev.narrow(0, R.offset, R.length); };
  auto hostRange = [&](const Range& R) { return host.narrow(0, R.offset, R.length); };

  // Device-to-host, chunk by chunk, in the order the ring first reads them:
  // chunk r-1 leaves at step 0, then chunks r-2, r-3, ..., r are reduced.
  std::vector<c10::Event> copied;
  copied.reserve(p);
  for (const auto i : c10::irange(p)) {
    (void)i;
    copied.emplace_back(device.type());
  }
  {
    c10::StreamGuard onD2h(d2h);
    for (const auto k : c10::irange(p)) {
      const int chunk = mod(static_cast<int64_t>(r) - 1 - k, p);
      const Range R = chunkRange(count, p, chunk);
      if (!R.empty()) {
        hostRange(R).copy_(devRange(R), /*non_blocking=*/true);
      }
      copied[chunk].record(d2h);
    }
  }

  RingJob job;
  job.count = count;
  job.elemSize = dev.element_size();
  job.reduceScatter = job.allGather = true;
  job.op = op;
  job.finalize = finalize;
  job.awaitInput = [&](int chunk) { copied[chunk].synchronize(); };
  job.onFinal = [&](const Range& R) {
    // Final values never change again, so the copy back can start at once.
    c10::StreamGuard onH2d(h2d);
    devRange(R).copy_(hostRange(R), /*non_blocking=*/true);
  };
  char* h = static_cast<char*>(host.data_ptr());
  ringCollective(c, job, RingBuffers{h, h, nullptr});

  // Order this thread's current stream (where the op's completion event is recorded)
  // after every copy back.
  c10::Event back(device.type());
  back.record(h2d);
  back.block(impl.getStream(device));
}

} // namespace ringpg
