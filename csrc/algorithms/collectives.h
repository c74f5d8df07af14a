// The collectives as the backend calls them: user tensors in, results written back.
//
// This is the one place that chooses an algorithm for an op (one-shot, ring, staged
// CUDA ring) and glues user tensors to it: it stages them to contiguous host memory
// where needed (CUDA, non-contiguous, complex as pairs of reals), applies PREMUL_SUM's
// factor and AVG's division, runs the algorithm, and copies results back.  Each
// function runs on the backend's worker (or inline in the caller), with the op's
// context; the backend has already validated every argument (backend/validation.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

#include "algorithms/choice.h"
#include "algorithms/context.h"
#include "reduce/reduce.h"

namespace ringpg {

// A reduction as the kernels see it, plus AVG's division and PREMUL_SUM's factor.
struct Reduction {
  RedOp op = RedOp::Sum;
  bool average = false;
  std::optional<double> premul;
  std::optional<at::Tensor> premulTensor;
};

// The dtype a reducing op's kernels run on: complex tensors reduce as pairs of reals
// (view_as_real), which is exact for the linear ops complex tensors allow.
inline at::ScalarType reduceDtype(at::ScalarType dtype) {
  return at::isComplexType(dtype) ? c10::toRealValueType(dtype) : dtype;
}

namespace collectives {

// What choice.h needs to know of this op's group: the same on every rank.
GroupShape shapeOf(const LinkTable& links, const Config& cfg);

void allreduce(OpContext& c, const at::Tensor& t, const Reduction& red);
// One allreduce over the concatenation of `ts` (one pipeline instead of many).
void allreduceCoalesced(OpContext& c, const std::vector<at::Tensor>& ts, const Reduction& red);
void broadcast(OpContext& c, const at::Tensor& t, int root);
void reduce(OpContext& c, const at::Tensor& t, const Reduction& red, int root);
void barrier(OpContext& c);

// all_gather_into_tensor: `output` = every rank's `input`, in rank order.
void allGatherInto(OpContext& c, const at::Tensor& input, const at::Tensor& output);
// all_gather: `outputs[q]` = rank q's `input`.
void allGather(OpContext& c, const at::Tensor& input, const std::vector<at::Tensor>& outputs);
// allgather_coalesced: `outputs` is rank-major (rank q's copy of input i at q * n + i).
void allGatherCoalesced(OpContext& c, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs);
void allGatherIntoCoalesced(OpContext& c, const std::vector<at::Tensor>& inputs,
                            const std::vector<at::Tensor>& outputs);

// reduce_scatter_tensor: `output` = chunk `rank` of the reduction of every `input`.
void reduceScatterInto(OpContext& c, const at::Tensor& input, const at::Tensor& output, const Reduction& red);
// reduce_scatter: `inputs[q]` is this rank's contribution to rank q's `output`.
void reduceScatter(OpContext& c, const std::vector<at::Tensor>& inputs, const at::Tensor& output, const Reduction& red);
void reduceScatterIntoCoalesced(OpContext& c, const std::vector<at::Tensor>& inputs,
                                const std::vector<at::Tensor>& outputs, const Reduction& red);

// `outputs` (the root's only; one per rank) receive every rank's `input`.
void gather(OpContext& c, const at::Tensor& input, const std::vector<at::Tensor>& outputs, int root);
// `output` receives the root's `inputs[rank]`.
void scatter(OpContext& c, const std::vector<at::Tensor>& inputs, const at::Tensor& output, int root);
// all_to_all_single: rows of dim 0 in `inSplits[q]` go to rank q, `outSplits[q]` come from it.
void allToAllSingle(OpContext& c, const at::Tensor& input, const at::Tensor& output,
                    const std::vector<int64_t>& inSplits, const std::vector<int64_t>& outSplits);
void allToAll(OpContext& c, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs);

} // namespace collectives
} // namespace ringpg
