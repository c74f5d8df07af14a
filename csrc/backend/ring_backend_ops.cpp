// RingBackend's c10d surface: each collective and point-to-point op validated on the
// caller's thread (backend/validation.h), then queued to the group's worker with the
// algorithm that runs it (algorithms/collectives.h).  The rest of the class, its
// construction, queue and failure state, is ring_backend.cpp.
#include "backend/ring_backend.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "algorithms/arena_collectives.h"
#include "algorithms/collectives.h"
#include "algorithms/host_buffer.h"
#include "backend/validation.h"

namespace ringpg {

using c10d::OpType;

// ---- The collectives: validate, then queue the algorithm (algorithms/collectives.h) ----

c10::intrusive_ptr<c10d::Work> RingBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  const char* op = "all_reduce";
  checkSingle(op, tensors);
  at::Tensor t = tensors[0];
  const Reduction red = toReduction(op, opts.reduceOp, t.scalar_type());
  return enqueue(op, "ringpg:all_reduce",
                 OpSignature(OpType::ALLREDUCE, reduceDtype(t.scalar_type()), t.numel(), opts.reduceOp), opts.timeout,
                 compat::asyncOp(opts), tensors, tensors,
                 [t, red](OpContext& c) { collectives::allreduce(c, t, red); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                const c10d::AllreduceCoalescedOptions& opts) {
  const char* op = "allreduce_coalesced";
  const uint64_t total = checkUniform(op, tensors);
  const Reduction red = toReduction(op, opts.reduceOp, tensors[0].scalar_type());
  std::vector<at::Tensor> ts = tensors;
  return enqueue(op, "ringpg:allreduce_coalesced",
                 OpSignature(OpType::ALLREDUCE_COALESCED, reduceDtype(ts[0].scalar_type()), total, opts.reduceOp),
                 opts.timeout, compat::asyncOp(opts), tensors, tensors,
                 [ts, red](OpContext& c) { collectives::allreduceCoalesced(c, ts, red); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  const char* op = "broadcast";
  checkSingle(op, tensors);
  checkRoot(op, opts.rootRank, getSize());
  at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(op, "ringpg:broadcast", OpSignature(OpType::BROADCAST, t.scalar_type(), t.numel()), opts.timeout,
                 compat::asyncOp(opts), tensors, tensors,
                 [t, root](OpContext& c) { collectives::broadcast(c, t, root); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  const char* op = "reduce";
  checkSingle(op, tensors);
  checkRoot(op, opts.rootRank, getSize());
  at::Tensor t = tensors[0];
  const Reduction red = toReduction(op, opts.reduceOp, t.scalar_type());
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(op, "ringpg:reduce",
                 OpSignature(OpType::REDUCE, reduceDtype(t.scalar_type()), t.numel(), opts.reduceOp), opts.timeout,
                 compat::asyncOp(opts), tensors, tensors,
                 [t, red, root](OpContext& c) { collectives::reduce(c, t, red, root); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor";
  checkScaledPair(op, input, output, getSize(), "input", "output");
  at::Tensor in = input, out = output;
  return enqueue(op, "ringpg:all_gather_into_tensor",
                 OpSignature(OpType::_ALLGATHER_BASE, input.scalar_type(), input.numel()), opts.timeout,
                 compat::asyncOp(opts), {output}, {input},
                 [in, out](OpContext& c) { collectives::allGatherInto(c, in, out); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather";
  checkSingle(op, inputs);
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs = checkPerRankList(op, outputs, in, getSize(), "output");
  return enqueue(op, "ringpg:all_gather", OpSignature(OpType::ALLGATHER, in.scalar_type(), in.numel()), opts.timeout,
                 compat::asyncOp(opts), outs, inputs,
                 [in, outs](OpContext& c) { collectives::allGather(c, in, outs); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllgatherOptions& opts) {
  const char* op = "allgather_coalesced";
  const uint64_t total = checkUniform(op, inputs);
  checkListLength(op, outputLists.size(), getSize(), "the output list of lists");
  std::vector<at::Tensor> outs; // rank-major, as collectives::allGatherCoalesced reads them
  for (const auto& l : outputLists) {
    RINGPG_CHECK(l.size() == inputs.size(), op, "each output list needs ", inputs.size(), " tensors");
    for (const auto i : c10::irange(l.size())) {
      checkSameTypeAndSize(op, inputs[i], l[i], "an output tensor");
      outs.push_back(l[i]);
    }
  }
  std::vector<at::Tensor> ins = inputs;
  return enqueue(op, "ringpg:allgather_coalesced",
                 OpSignature(OpType::ALLGATHER_COALESCED, inputs[0].scalar_type(), total), opts.timeout,
                 compat::asyncOp(opts), outs, inputs,
                 [ins, outs](OpContext& c) { collectives::allGatherCoalesced(c, ins, outs); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::AllgatherOptions& opts) {
  const char* op = "allgather_into_tensor_coalesced";
  RINGPG_CHECK(outputs.size() == inputs.size() && !inputs.empty(), op, "needs as many outputs as inputs (got ",
               outputs.size(), " and ", inputs.size(), ")");
  uint64_t total = 0;
  for (const auto i : c10::irange(inputs.size())) {
    checkScaledPair(op, inputs[i], outputs[i], getSize(), "input", "output", static_cast<int64_t>(i));
    checkSameDevice(op, inputs[0], inputs[i]);
    total += inputs[i].numel();
  }
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  return enqueue(op, "ringpg:allgather_into_tensor_coalesced",
                 OpSignature(OpType::COALESCED, inputs[0].scalar_type(), total), opts.timeout, compat::asyncOp(opts),
                 outputs, inputs, [ins, outs](OpContext& c) { collectives::allGatherIntoCoalesced(c, ins, outs); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor";
  checkScaledPair(op, output, input, getSize(), "output", "input");
  const Reduction red = toReduction(op, opts.reduceOp, input.scalar_type());
  at::Tensor in = input, out = output;
  return enqueue(
      op, "ringpg:reduce_scatter_tensor",
      OpSignature(OpType::_REDUCE_SCATTER_BASE, reduceDtype(input.scalar_type()), input.numel(), opts.reduceOp),
      opts.timeout, compat::asyncOp(opts), {output}, {input},
      [in, out, red](OpContext& c) { collectives::reduceScatterInto(c, in, out, red); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  checkSingle(op, outputs);
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> ins = checkPerRankList(op, inputs, out, getSize(), "input");
  const Reduction red = toReduction(op, opts.reduceOp, out.scalar_type());
  return enqueue(
      op, "ringpg:reduce_scatter",
      OpSignature(OpType::REDUCE_SCATTER, reduceDtype(out.scalar_type()), out.numel() * getSize(), opts.reduceOp),
      opts.timeout, compat::asyncOp(opts), outputs, ins,
      [ins, out, red](OpContext& c) { collectives::reduceScatter(c, ins, out, red); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  RINGPG_CHECK(outputs.size() == inputs.size() && !inputs.empty(), op, "needs as many outputs as inputs (got ",
               outputs.size(), " and ", inputs.size(), ")");
  const uint64_t total = checkUniform(op, inputs);
  for (const auto i : c10::irange(inputs.size())) {
    checkScaledPair(op, outputs[i], inputs[i], getSize(), "output", "input", static_cast<int64_t>(i));
  }
  const Reduction red = toReduction(op, opts.reduceOp, inputs[0].scalar_type());
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  return enqueue(op, "ringpg:reduce_scatter_tensor_coalesced",
                 OpSignature(OpType::COALESCED, reduceDtype(inputs[0].scalar_type()), total, opts.reduceOp),
                 opts.timeout, compat::asyncOp(opts), outputs, inputs,
                 [ins, outs, red](OpContext& c) { collectives::reduceScatterIntoCoalesced(c, ins, outs, red); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  const char* op = "gather";
  checkSingle(op, inputs);
  checkRoot(op, opts.rootRank, getSize());
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs = checkRootList(op, outputs, in, getRank(), root, getSize(), "output");
  return enqueue(op, "ringpg:gather", OpSignature(OpType::GATHER, in.scalar_type(), in.numel()), opts.timeout,
                 compat::asyncOp(opts), outs, inputs,
                 [in, outs, root](OpContext& c) { collectives::gather(c, in, outs, root); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  const char* op = "scatter";
  checkSingle(op, outputs);
  checkRoot(op, opts.rootRank, getSize());
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> ins = checkRootList(op, inputs, out, getRank(), root, getSize(), "input");
  return enqueue(op, "ringpg:scatter", OpSignature(OpType::SCATTER, out.scalar_type(), out.numel()), opts.timeout,
                 compat::asyncOp(opts), outputs, ins,
                 [ins, out, root](OpContext& c) { collectives::scatter(c, ins, out, root); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                          std::vector<int64_t>& outputSplits,
                                                          std::vector<int64_t>& inputSplits,
                                                          const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all_single";
  checkTensor(op, input);
  checkTensor(op, output);
  checkSameDevice(op, input, output);
  RINGPG_CHECK(input.scalar_type() == output.scalar_type(), op, "input and output dtypes differ");
  const int p = getSize();
  // Splits count rows (dim 0); empty splits mean equal parts.
  const int64_t inRows = input.dim() == 0 ? 1 : input.size(0);
  const int64_t outRows = output.dim() == 0 ? 1 : output.size(0);
  const auto ins = resolveSplits(op, inputSplits, inRows, p, "input splits");
  const auto outs = resolveSplits(op, outputSplits, outRows, p, "output splits");
  // Rows of this rank's own part may differ in shape, not in bytes.
  const int64_t inRow = inRows == 0 ? 0 : input.numel() / inRows;
  const int64_t outRow = outRows == 0 ? 0 : output.numel() / outRows;
  RINGPG_CHECK(ins[getRank()] * inRow == outs[getRank()] * outRow, op,
               "this rank's own input and output splits differ in size");
  at::Tensor in = input, out = output;
  return enqueue(op, "ringpg:all_to_all", OpSignature(OpType::ALLTOALL_BASE, input.scalar_type(), 0), opts.timeout,
                 compat::asyncOp(opts), {output}, {input},
                 [in, out, ins, outs](OpContext& c) { collectives::allToAllSingle(c, in, out, ins, outs); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                     const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  checkListLength(op, inputs.size(), getSize(), "the input list");
  checkListLength(op, outputs.size(), getSize(), "the output list");
  for (const auto i : c10::irange(inputs.size())) {
    checkTensor(op, inputs[i]);
    checkTensor(op, outputs[i]);
    checkSameDevice(op, inputs[0], inputs[i]);
    checkSameDevice(op, inputs[0], outputs[i]);
    RINGPG_CHECK(
        inputs[i].scalar_type() == inputs[0].scalar_type() && outputs[i].scalar_type() == inputs[0].scalar_type(), op,
        "all tensors must share a dtype");
  }
  RINGPG_CHECK(inputs[getRank()].numel() == outputs[getRank()].numel(), op,
               "this rank's own input and output differ in size");
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  return enqueue(op, "ringpg:all_to_all", OpSignature(OpType::ALLTOALL, inputs[0].scalar_type(), 0), opts.timeout,
                 compat::asyncOp(opts), outputs, inputs,
                 [ins, outs](OpContext& c) { collectives::allToAll(c, ins, outs); });
}

c10::intrusive_ptr<c10d::Work> RingBackend::barrier(const c10d::BarrierOptions& opts) {
  return enqueue("barrier", "ringpg:barrier", OpSignature(OpType::BARRIER, at::kByte, getSize()), opts.timeout,
                 compat::asyncOp(opts), {}, {}, [](OpContext& c) { collectives::barrier(c); });
}

bool RingBackend::everyMemberSays(bool mine) {
  TORCH_CHECK(net_->arena != nullptr && net_->topology.hosts == 1, opName("every_member_says"),
              ": the group has no host arena");
  auto all = std::make_shared<bool>(false);
  enqueue("barrier", "ringpg:every_member_says", OpSignature(OpType::BARRIER, at::kByte, getSize()),
          c10d::kUnsetTimeout, /*asyncOp=*/false, {}, {},
          [all, mine](OpContext& c) { *all = arenaEveryMemberSays(c, mine); })
      ->wait();
  return *all;
}

// ---- Point-to-point ----------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> RingBackend::p2p(OpType type, const char* name, at::Tensor& tensor, int peer, int tag) {
  RINGPG_CHECK(tag >= 0, name, "tag must be non-negative, got ", tag);
  const bool isSend = type == OpType::SEND;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lk(queueMu_);
    RINGPG_CHECK(!stopping_, name, "the process group has been shut down");
    // Ranks issue different numbers of p2p ops, so they count apart from collectives.
    seq = ++p2pSeq_;
  }
  const char* title = isSend ? "ringpg:send" : (peer < 0 ? "ringpg:recvAnySource" : "ringpg:recv");
  auto work = c10::make_intrusive<RingWork>(getRank(), type, name, seq, title, std::vector<at::Tensor>{tensor},
                                            std::vector<at::Tensor>{tensor}, timeout_.load());
  work->setFlightTicket(flight_.p2p(isSend, getRank(), peer, tensor, timeout_.load()));
  FrameHeader h = frameOfKind(FrameKind::P2P);
  h.key = static_cast<uint64_t>(tag);
  const OpTag opTag{name, seq, getRank()};
  // CUDA or non-contiguous tensors travel through a contiguous host copy: a send
  // copies now (ordered after the caller's current stream), a receive copies back
  // when its payload has landed, before the Work completes.
  const bool direct = tensor.device().is_cpu() && tensor.is_contiguous();
  at::Tensor host = direct ? tensor : (isSend ? toHost(tensor) : hostBufferFor(tensor));
  // Runs on the engine's thread (or the posting one) while the engine exists, which
  // stop() destroys before this backend, so `this` outlives it.
  auto done = [this, work, opTag, tensor, host, direct, isSend](Request& r) {
    std::exception_ptr err;
    try {
      if (r.state.load() == Request::State::Failed) {
        throwRequestError(opTag, r);
      }
      if (!isSend && !direct) {
        writeBack(tensor, host);
      }
      work->setSourceRank(r.sourceRank);
    } catch (...) {
      err = std::current_exception();
    }
    finishWork(*work, err);
  };
  // The callback keeps `tensor` and `host` alive until the engine is done with them.
  if (isSend) {
    net_->engine->postSend(peer, h, host.data_ptr(), nbytes(host), done);
  } else {
    net_->engine->postRecv(peer, h, host.data_ptr(), nbytes(host), done);
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> RingBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  checkSingle("send", tensors);
  checkPeer("send", dstRank, getRank(), getSize(), "destination");
  return p2p(OpType::SEND, "send", tensors[0], dstRank, tag);
}

c10::intrusive_ptr<c10d::Work> RingBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  checkSingle("recv", tensors);
  checkPeer("recv", srcRank, getRank(), getSize(), "source");
  return p2p(OpType::RECV, "recv", tensors[0], srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> RingBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  checkSingle("recv", tensors);
  return p2p(OpType::RECVANYSOURCE, "recv", tensors[0], -1, tag);
}

} // namespace ringpg
