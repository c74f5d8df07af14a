// Pipelined host staging of CUDA tensors for the ring allreduce.
//
// ProcessGroupGloo stages serially: copy the whole tensor to the host, run the ring,
// copy it back.  Here the device-to-host copy is cut into the ring's chunks, issued
// on a side stream in the order the ring first reads them, each followed by an
// event; the ring waits only for the chunk it is about to read.  Every segment that
// becomes final (the own chunk after the reduce-scatter, each gathered segment) is
// copied back on a second stream while the ring goes on.  Total time approaches
// max(PCIe, network) instead of their sum.  Reductions run on the CPU, on pinned
// host memory.  Device-generic c10 stream/event APIs only: no nvcc, no CUDA headers.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

#include "algorithms/context.h"
#include "reduce/reduce.h"

namespace ringpg {

// In-place allreduce of contiguous device tensor `dev` (already ordered after the
// caller's stream).  On return every copy back has been issued, and the current
// stream of the calling thread is ordered after all of them.
void stagedRingAllreduce(OpContext& c, const at::Tensor& dev, RedOp op,
                         const std::function<void(char*, int64_t)>& finalize);

} // namespace ringpg
