// Pipelined host staging of CUDA tensors for the ring's and the host arena's allreduce,
// reduce-scatter and all-gather.
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

// Reduce-scatter of contiguous device tensor `input` (p chunks of output's size) into
// contiguous device tensor `output`: the input's chunks go to pinned memory in the
// order the ring reads them, and the own chunk's segments come back as each is final.
// `work`: host memory of the input's size for the partial sums (the worker's kept area).
void stagedRingReduceScatter(OpContext& c, const at::Tensor& input, const at::Tensor& output, RedOp op,
                             const std::function<void(char*, int64_t)>& finalize, char* work);

// All-gather of contiguous device tensor `input` into contiguous device tensor `output`
// (p chunks): each gathered segment goes back to the device as it lands, while the
// ring carries the rest.
void stagedRingAllGather(OpContext& c, const at::Tensor& input, const at::Tensor& output);

// Whether device copies reach `c`'s arena buffers directly: its segment registered with
// `device`'s runtime (cuda/host_register.h) on every member, asked on the first call
// and remembered (a refusal anywhere warns once).  The first call is collective: every
// member registers, then one arena round (arenaEveryMemberSays) makes the answer the
// same on all, since two ranks choose between the arena and the staged ring by it
// (choice.h).  False without an arena.
bool arenaReachesDevice(OpContext& c, const c10::Device& device);

// The same three over a single-host group's arena (arena_collectives.h): the input goes
// to pinned memory in stages of a few pieces, each awaited before the arena's round
// reads it, and final ranges come back as each stage of them is complete; or, where
// the arena reaches the device (arenaReachesDevice), each piece goes straight into this
// member's buffer and every final range straight from its member's buffer to the
// device: the CPU copies nothing in or out, it only reduces.
void stagedArenaAllreduce(OpContext& c, const at::Tensor& dev, RedOp op,
                          const std::function<void(char*, int64_t)>& finalize, bool oneShot);
void stagedArenaReduceScatter(OpContext& c, const at::Tensor& input, const at::Tensor& output, RedOp op,
                              const std::function<void(char*, int64_t)>& finalize);
// `streams`: the plan's (OpPlan::streams).
void stagedArenaAllGather(OpContext& c, const at::Tensor& input, const at::Tensor& output, bool streams);

} // namespace ringpg
