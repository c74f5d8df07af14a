// Stage 1 of every op: the checks of what the user passed, run in the caller's thread
// before a sequence number is taken, so a refused call leaves every rank in step.
// Each failure is a TORCH_CHECK error (Python: ValueError/RuntimeError) that reads
// "ringpg::<op>: <what is wrong>" (RINGPG_CHECK, common/errors.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>
#include <vector>

#include "algorithms/collectives.h"

namespace ringpg {

// A dense tensor on cpu or cuda.
void checkTensor(const char* op, const at::Tensor& t);
// Exactly one tensor, checked as above.
void checkSingle(const char* op, const std::vector<at::Tensor>& ts);
void checkSameDevice(const char* op, const at::Tensor& a, const at::Tensor& b);
// `t` (described as `what`) has `ref`'s device, dtype and numel.
void checkSameTypeAndSize(const char* op, const at::Tensor& ref, const at::Tensor& t, const char* what);
// A non-empty list of dense tensors on one device with one dtype; returns their total numel.
uint64_t checkUniform(const char* op, const std::vector<at::Tensor>& ts);
// `big` (the all-gather output, the reduce-scatter input) holds `size` times `small`'s
// elements, in `small`'s dtype, on its device; the names say which is which in the
// message, and `index` >= 0 numbers a pair of a coalesced call.
void checkScaledPair(const char* op, const at::Tensor& small, const at::Tensor& big, int size, const char* smallName,
                     const char* bigName, int64_t index = -1);
void checkRoot(const char* op, int64_t root, int size);
// A list (`what`) holds one entry per rank.
void checkListLength(const char* op, size_t got, int size, const char* what);
// all_gather's outputs, reduce_scatter's inputs (`what`: "output" or "input"): one list
// of one tensor per rank, each with `ref`'s device, dtype and numel.  Returns the list.
std::vector<at::Tensor> checkPerRankList(const char* op, const std::vector<std::vector<at::Tensor>>& lists,
                                         const at::Tensor& ref, int size, const char* what);
// gather's outputs, scatter's inputs: the root passes a per-rank list as above, every
// other rank none.  Returns the root's list (empty elsewhere).
std::vector<at::Tensor> checkRootList(const char* op, const std::vector<std::vector<at::Tensor>>& lists,
                                      const at::Tensor& ref, int rank, int root, int size, const char* what);
// A point-to-point peer: another rank of the group.
void checkPeer(const char* op, int peer, int rank, int size, const char* what);

// The reduction `rop` asks for on `dtype` tensors, or a TORCH_CHECK error when ringpg
// (and the kernels for that dtype) cannot do it.
Reduction toReduction(const char* op, const c10d::ReduceOp& rop, at::ScalarType dtype);

// all_to_all_single's split sizes (rows of dim 0 per rank), checked against `rows`;
// empty `splits` mean equal parts.
std::vector<int64_t> resolveSplits(const char* op, const std::vector<int64_t>& splits, int64_t rows, int size,
                                   const char* what);

} // namespace ringpg
