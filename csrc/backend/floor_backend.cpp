// See floor_backend.h.
#include "backend/floor_backend.h"

#include "backend/ring_work.h"

namespace ringpg {

using c10d::OpType;

FloorBackend::FloorBackend(int rank, int size) : c10d::Backend(rank, size) {}

c10::intrusive_ptr<c10d::Work> FloorBackend::done(OpType type, std::vector<at::Tensor> outputs) {
  // The same Work a ringpg op returns, so the floor counts its making too.
  auto work = c10::make_intrusive<RingWork>(getRank(), type, "floor", ++seq_, "ringpg_floor", std::move(outputs),
                                            std::vector<at::Tensor>{}, c10d::kUnsetTimeout);
  work->complete(nullptr);
  return work;
}

c10::intrusive_ptr<c10d::Work> FloorBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& /*opts*/) {
  return done(OpType::BROADCAST, tensors);
}

c10::intrusive_ptr<c10d::Work> FloorBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& /*opts*/) {
  return done(OpType::ALLREDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> FloorBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceCoalescedOptions& /*opts*/) {
  return done(OpType::ALLREDUCE_COALESCED, tensors);
}

c10::intrusive_ptr<c10d::Work> FloorBackend::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& /*opts*/) {
  return done(OpType::REDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> FloorBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& /*inputs*/,
                                                       const c10d::AllgatherOptions& /*opts*/) {
  return done(OpType::ALLGATHER, outputs.empty() ? std::vector<at::Tensor>{} : outputs[0]);
}

c10::intrusive_ptr<c10d::Work> FloorBackend::_allgather_base(at::Tensor& output, at::Tensor& /*input*/,
                                                             const c10d::AllgatherOptions& /*opts*/) {
  return done(OpType::_ALLGATHER_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> FloorBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& /*inputs*/,
                                                                             const c10d::AllgatherOptions& /*opts*/) {
  return done(OpType::COALESCED, outputs);
}

c10::intrusive_ptr<c10d::Work> FloorBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& /*inputs*/,
                                                    const c10d::GatherOptions& /*opts*/) {
  return done(OpType::GATHER, outputs.empty() ? std::vector<at::Tensor>{} : outputs[0]);
}

c10::intrusive_ptr<c10d::Work> FloorBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& /*inputs*/,
                                                     const c10d::ScatterOptions& /*opts*/) {
  return done(OpType::SCATTER, outputs);
}

c10::intrusive_ptr<c10d::Work> FloorBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& /*inputs*/,
                                                            const c10d::ReduceScatterOptions& /*opts*/) {
  return done(OpType::REDUCE_SCATTER, outputs);
}

c10::intrusive_ptr<c10d::Work> FloorBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& /*input*/,
                                                                  const c10d::ReduceScatterOptions& /*opts*/) {
  return done(OpType::_REDUCE_SCATTER_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> FloorBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& /*inputs*/, const c10d::ReduceScatterOptions& /*opts*/) {
  return done(OpType::COALESCED, outputs);
}

c10::intrusive_ptr<c10d::Work> FloorBackend::alltoall_base(at::Tensor& output, at::Tensor& /*input*/,
                                                           std::vector<int64_t>& /*outputSplits*/,
                                                           std::vector<int64_t>& /*inputSplits*/,
                                                           const c10d::AllToAllOptions& /*opts*/) {
  return done(OpType::ALLTOALL_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> FloorBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& /*inputs*/,
                                                      const c10d::AllToAllOptions& /*opts*/) {
  return done(OpType::ALLTOALL, outputs);
}

c10::intrusive_ptr<c10d::Work> FloorBackend::barrier(const c10d::BarrierOptions& /*opts*/) {
  return done(OpType::BARRIER, {});
}

} // namespace ringpg
