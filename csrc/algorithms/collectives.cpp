#include "algorithms/collectives.h"

#include <ATen/ATen.h>
#include <c10/core/DynamicCast.h>
#include <c10/util/irange.h>

#include <cstdint>
#include <cstring>

#include "algorithms/arena_collectives.h"
#include "algorithms/direct.h"
#include "algorithms/hierarchical.h"
#include "algorithms/host_buffer.h"
#include "algorithms/ring.h"
#include "algorithms/ring_plan.h"
#include "algorithms/staged_ring.h"

namespace ringpg {
namespace collectives {
namespace {

// ---- Host buffers (host_buffer.h holds the ones p2p shares) -----------------------

// The elements a reduction's kernels see on the host paths, which read a contiguous
// tensor's bytes and counts and nothing of its shape: a real tensor is itself, whatever
// its dims, and a complex one its pairs of reals.  No reshape: that is a dispatched op
// and a new view, about half a microsecond a call on the 2-vCPU Xeon guest, which a
// 4 KiB op's own time should not pay (benchmarks/RESULTS.md, 2026-12-06 (4)).
at::Tensor hostReal(const at::Tensor& t) {
  return t.is_complex() ? at::view_as_real(t) : t;
}

// The same, flat: for the staged device paths, which cut it in pieces along dim 0.
at::Tensor flatReal(const at::Tensor& t) {
  if (t.is_complex()) {
    return at::view_as_real(t).reshape({-1});
  }
  return t.dim() == 1 ? t : t.reshape({-1});
}

// Contiguous host copies of `ts`, each flattened (for the coalesced forms).
std::vector<at::Tensor> flatHost(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const auto& t : ts) {
    flat.push_back(toHost(t).reshape({-1}));
  }
  return flat;
}

// A tensor like `t` in the worker's kept area (OpContext::workspace), or a fresh one
// where `t` is larger than the area may grow (RINGPG_TUNING work_cache_bytes).
at::Tensor keptLike(OpContext& c, const at::Tensor& t) {
  char* kept = c.workspace(nbytes(t));
  return kept ? at::from_blob(kept, t.sizes(), t.options()) : at::empty_like(t);
}

// ---- Reductions --------------------------------------------------------------------

// AVG's division, applied to each finished segment of the own chunk.
std::function<void(char*, int64_t)> finalizer(const Reduction& red, at::ScalarType dtype, int size) {
  if (!red.average) {
    return nullptr;
  }
  return [dtype, size](char* data, int64_t n) {
    if (at::isFloatingType(dtype)) {
      // ATen's bits (fp16/bf16 divided in fp32, rounded once), by ringpg's kernels: a
      // from_blob and a div_ per segment cost a 4 KiB allreduce half its time again.
      scaleFloats(dtype, data, data, n, static_cast<double>(size), Scale::Divide);
    } else {
      divideIntegers(dtype, data, n, size); // truncates toward zero, like integer division
    }
  };
}

// PREMUL_SUM's factor as the number the product below multiplies by, where it is one
// without a device round trip: a scalar, or a factor tensor's one element on the CPU
// (in its dtype).  Empty for a factor on a device.
std::optional<double> premulFactor(const Reduction& red) {
  if (red.premul) {
    return *red.premul;
  }
  const at::Tensor& f = *red.premulTensor;
  if (f.is_cpu() && f.numel() == 1 && at::isFloatingType(f.scalar_type())) {
    return c10::fetch_and_cast<double>(f.scalar_type(), f.data_ptr()); // exact: a wider type
  }
  return std::nullopt;
}

// PREMUL_SUM: the factor multiplies each rank's contribution before the sum.
at::Tensor premultiplied(const Reduction& red, const at::Tensor& host, bool inPlace) {
  if (!red.premul && !red.premulTensor) {
    return host;
  }
  // A contiguous CPU buffer of a real floating dtype: ringpg's kernel, with the bits of
  // ATen's product by a 0-dim factor (in the data's opmath, rounded once), without its
  // dispatch: a scalar_tensor and a mul_ cost a 4 KiB allreduce half its time again.
  if (host.is_cpu() && host.is_contiguous() && at::isFloatingType(host.scalar_type())) {
    if (const std::optional<double> factor = premulFactor(red)) {
      at::Tensor out = inPlace ? host : at::empty_like(host);
      scaleFloats(host.scalar_type(), bytes(out), bytes(host), host.numel(), *factor, Scale::Multiply);
      return out;
    }
  }
  // A 0-dim factor never promotes the data's dtype (a float32 factor must not turn an
  // fp16 buffer into fp32): the product is computed in the data's opmath and rounded once.
  // A scalar is held as a double, as Python's float is (float64 data multiplies by it
  // whole, as torch's `x * factor` and NCCL's premultiplied sum do).
  at::Tensor factor = red.premulTensor ? red.premulTensor->to(at::kCPU).reshape({})
                                       : at::scalar_tensor(*red.premul, at::TensorOptions().dtype(at::kDouble));
  at::Tensor out = inPlace ? host.mul_(factor) : host.mul(factor);
  TORCH_INTERNAL_ASSERT(out.scalar_type() == host.scalar_type(), "ringpg: PREMUL_SUM changed the dtype");
  return out;
}

// ---- The ring's three shapes on host buffers ----------------------------------------

// The plan (choice.h) of `q` in this group, the op's same-host sends set by it.
// `device`: the op's tensors' where they are on one; the arena is asked whether device
// copies reach its buffers only where the plan could use that (a collective question).
OpPlan planFor(OpContext& c, const OpQuery& q, const c10::Device* device = nullptr) {
  GroupShape g = shapeOf(c.links(), c.config());
  if (device != nullptr && planAsksDeviceReach(q, g)) {
    g.arenaReachesDevice = arenaReachesDevice(c, *device);
  }
  const OpPlan plan = planOp(q, g, c.config());
  c.setLends(plan.lends);
  if (c.trace() != nullptr) {
    c.trace()->algorithm = algorithmName(plan.algorithm); // the trace names what runs, as algorithm_for does
  }
  return plan;
}

// The query of an op on `bytes` of host memory.
OpQuery hostQuery(Collective op, size_t bytes, bool readBack = false) {
  OpQuery q;
  q.op = op;
  q.bytes = bytes;
  q.readBack = readBack;
  return q;
}

// Allreduce of a contiguous host tensor (of the kernels' dtype), in place, as `plan` says.
void hostAllreduce(OpContext& c, const at::Tensor& host, const Reduction& red, const OpPlan& plan) {
  auto finalize = finalizer(red, host.scalar_type(), c.size());
  const Algorithm algo = plan.algorithm;
  switch (algo) {
    case Algorithm::ArenaOneShot:
    case Algorithm::Arena:
      arenaAllreduce(c, bytes(host), host.numel(), host.element_size(), red.op, finalize,
                     /*oneShot=*/algo == Algorithm::ArenaOneShot);
      return;
    case Algorithm::OneShot:
      oneShotAllreduce(c, bytes(host), host.numel(), host.element_size(), red.op, finalize);
      return;
    case Algorithm::Doubling:
      recursiveDoublingAllreduce(c, bytes(host), host.numel(), host.element_size(), red.op, finalize);
      return;
    case Algorithm::Hier:
      hierAllreduce(c, bytes(host), host.numel(), host.element_size(), red.op, finalize);
      return;
    default:
      break; // the ring (whose local path finalizes a group of one)
  }
  RingJob job;
  job.count = host.numel();
  job.elemSize = host.element_size();
  job.reduceScatter = job.allGather = true;
  job.op = red.op;
  job.finalize = std::move(finalize);
  ringCollective(c, job, RingBuffers{bytes(host), bytes(host), nullptr});
}

// Whether `a` and `b` share a byte.  Addresses as integers: `<` between pointers into
// different objects is unspecified.
bool shareBytes(const at::Tensor& a, const at::Tensor& b) {
  const auto x = reinterpret_cast<uintptr_t>(a.data_ptr());
  const auto y = reinterpret_cast<uintptr_t>(b.data_ptr());
  return nbytes(a) > 0 && nbytes(b) > 0 && x < y + nbytes(b) && y < x + nbytes(a);
}

// The query of a reduce-scatter or all-gather of `input` into `output`.
OpQuery splitQuery(Collective op, const at::Tensor& input, const at::Tensor& output, int rank) {
  OpQuery q;
  q.op = op;
  q.bytes = op == Collective::AllGather ? nbytes(output) : nbytes(input);
  q.device = !input.device().is_cpu() && !output.device().is_cpu();
  q.contiguous = input.is_contiguous() && output.is_contiguous();
  // An all-gather's input may be its own chunk of the output (FSDP); any other overlap
  // stages whole.
  const bool ownChunk =
      op == Collective::AllGather && bytes(input) == bytes(output) + nbytes(input) * static_cast<size_t>(rank);
  q.apart = ownChunk || !shareBytes(input, output);
  return q;
}

// Reduce-scatter of `input` (count = output.numel() * size) into `output`.
void hostReduceScatter(OpContext& c, const at::Tensor& input, const at::Tensor& output, const Reduction& red,
                       const OpPlan& plan) {
  TORCH_INTERNAL_ASSERT(input.scalar_type() == output.scalar_type() && input.numel() == output.numel() * c.size());
  RingJob job;
  job.count = input.numel();
  job.elemSize = input.element_size();
  job.reduceScatter = true;
  job.op = red.op;
  job.finalize = finalizer(red, input.scalar_type(), c.size());
  const Algorithm algo = plan.algorithm;
  if (onArena(algo)) {
    arenaReduceScatter(c, bytes(input), bytes(output), output.numel(), input.element_size(), red.op, job.finalize);
    return;
  }
  if (algo == Algorithm::Pair) {
    // An output overlapping the input elsewhere than this rank's chunk would be written
    // while the peer's chunk is still being copied out of it: reduced aside, then put.
    const size_t chunkBytes = nbytes(output);
    const bool aside = shareBytes(input, output) && bytes(output) != bytes(input) + chunkBytes * c.rank();
    char* dst = aside ? c.scratch(chunkBytes) : bytes(output);
    pairReduceScatter(c, bytes(input), dst, output.numel(), input.element_size(), red.op, job.finalize);
    if (aside) {
      std::memcpy(bytes(output), dst, chunkBytes);
    }
    return;
  }
  if (algo == Algorithm::Hier) {
    // Across hosts: the chunks in hierSlot order in the kept area (hierarchical.h).
    hierReduceScatter(c, bytes(input), bytes(output), input.numel(), input.element_size(), red.op, job.finalize,
                      bytes(keptLike(c, input)));
    return;
  }
  // Partial sums of the other chunks need a buffer of the input's layout; the input
  // itself stays untouched, as users (and gloo) expect.  A fresh buffer per op pays its
  // page faults on every op, so the worker keeps one (RINGPG_TUNING work_cache_bytes;
  // docs/internals.md, "Why these constants").  Every element is written
  // before it is read, so what an earlier op left there is moot.
  const at::Tensor work = c.size() > 1 ? keptLike(c, input) : input;
  ringCollective(c, job, RingBuffers{bytes(input), bytes(work), bytes(output)});
}

// All-gather: `input` is chunk `rank` of `output` (count = input.numel() * size).
// The ring sends the own chunk straight from `input` and copies it into `output`
// while those bytes travel (ring.h).  An input that overlaps the output (FSDP passes
// the output's own chunk; anything else is allowed too) is put in place first instead.
void hostAllGather(OpContext& c, const at::Tensor& input, const at::Tensor& output, const OpPlan& plan) {
  const size_t chunkBytes = nbytes(input);
  char* ownSlot = bytes(output) + chunkBytes * c.rank();
  const bool overlaps = shareBytes(input, output);
  if (overlaps && bytes(input) != ownSlot) {
    std::memmove(ownSlot, bytes(input), chunkBytes);
  }
  const Algorithm algo = plan.algorithm;
  if (onArena(algo)) {
    arenaAllGather(c, overlaps ? ownSlot : bytes(input), bytes(output), input.numel(), output.element_size(),
                   plan.streams);
    return;
  }
  if (algo == Algorithm::Pair) {
    pairAllGather(c, overlaps ? ownSlot : bytes(input), bytes(output), chunkBytes, plan.streams);
    return;
  }
  if (algo == Algorithm::Hier) {
    // Across hosts (hierarchical.h): in place when its layout is rank order (a cyclic
    // placement, one piece), else through the kept area and copies into rank order.
    const bool inPlace = hierAllGatherInPlace(c, nbytes(output), input.numel());
    const at::Tensor layout = inPlace ? output : keptLike(c, output);
    hierAllGather(c, overlaps ? ownSlot : bytes(input), bytes(output), output.numel(), output.element_size(),
                  bytes(layout));
    return;
  }
  RingJob job;
  job.count = output.numel();
  job.elemSize = output.element_size();
  job.allGather = true;
  job.streams = plan.streams;
  ringCollective(c, job, RingBuffers{nullptr, bytes(output), overlaps ? nullptr : bytes(input)});
}

} // namespace

// ---- Allreduce -------------------------------------------------------------------

GroupShape shapeOf(const LinkTable& links, const Config& cfg) {
  const Topology& t = *links.topology;
  GroupShape g;
  g.size = t.size();
  g.hosts = t.hosts;
  g.mostPerHost = t.mostRanksOnAHost();
  g.hierarchical = hierarchicalApplies(t, cfg.algo);
  g.ringFusedEverywhere = links.ringFusedEverywhere;
  // The whole group's arena: one host's.  A group across hosts has one a host, which
  // only its hierarchical collectives' host phases use.
  g.arena = links.arena != nullptr && t.hosts == 1;
  g.copy = links.sameHostCopy;
  return g;
}

void allreduce(OpContext& c, const at::Tensor& t, const Reduction& red) {
  OpQuery q = hostQuery(Collective::Allreduce, nbytes(t));
  q.device = !t.device().is_cpu();
  q.contiguous = t.is_contiguous();
  const c10::Device device = t.device();
  const OpPlan plan = planFor(c, q, &device);
  if (plan.staging == HostStaging::OnRing || plan.staging == HostStaging::OnArena) {
    at::Tensor dev = flatReal(premultiplied(red, t, /*inPlace=*/true));
    auto finalize = finalizer(red, reduceDtype(t.scalar_type()), c.size());
    if (plan.staging == HostStaging::OnRing) {
      stagedRingAllreduce(c, dev, red.op, finalize);
    } else {
      stagedArenaAllreduce(c, dev, red.op, finalize, /*oneShot=*/plan.algorithm == Algorithm::ArenaOneShot);
    }
    return;
  }
  at::Tensor host = premultiplied(red, toHost(t), /*inPlace=*/true);
  hostAllreduce(c, hostReal(host), red, plan);
  writeBack(t, host);
}

void allreduceCoalesced(OpContext& c, const std::vector<at::Tensor>& ts, const Reduction& red) {
  at::Tensor flat = at::cat(flatHost(ts));
  premultiplied(red, flat, /*inPlace=*/true);
  hostAllreduce(c, hostReal(flat), red, planFor(c, hostQuery(Collective::Allreduce, nbytes(flat))));
  int64_t off = 0;
  for (const auto& t : ts) {
    t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

void barrier(OpContext& c) {
  const OpPlan plan = planFor(c, hostQuery(Collective::Barrier, 0));
  const Algorithm algo = plan.algorithm;
  if (onArena(algo)) {
    arenaBarrier(c); // one step: every member has arrived
    return;
  }
  // A token's allreduce, which the choice of an allreduce of its size runs: the one-shot
  // and recursive doubling have every rank hear from every other for one byte; through
  // the rings a byte a rank, so every chunk is non-empty and no rank leaves before it
  // has heard, directly or through the ring, from every other.
  const bool rings = algo == Algorithm::Ring || algo == Algorithm::Hier;
  at::Tensor token = at::zeros({rings ? c.size() : 1}, at::TensorOptions().dtype(at::kByte));
  hostAllreduce(c, token, Reduction{}, plan);
}

// ---- Rooted ----------------------------------------------------------------------

void broadcast(OpContext& c, const at::Tensor& t, int root) {
  at::Tensor host = c.rank() == root ? toHost(t) : hostBufferFor(t);
  if (onArena(planFor(c, hostQuery(Collective::Broadcast, nbytes(host))).algorithm)) {
    arenaBroadcast(c, bytes(host), nbytes(host), root);
  } else {
    chainBroadcast(c, bytes(host), nbytes(host), root);
  }
  writeBack(t, host);
}

void reduce(OpContext& c, const at::Tensor& t, const Reduction& red, int root) {
  // Ring reduce-scatter (each rank finishes its chunk), then the chunks go straight to
  // the root: (p-1)/p of the data crosses each link twice at most, instead of p-1
  // times through a chain.
  const int p = c.size();
  at::Tensor host = premultiplied(red, toHost(t), /*inPlace=*/false);
  at::Tensor input = hostReal(host);
  at::Tensor resultHost = at::empty_like(host);
  at::Tensor result = hostReal(resultHost);
  const Algorithm algo = planFor(c, hostQuery(Collective::Reduce, nbytes(input))).algorithm;
  if (onArena(algo)) {
    arenaReduce(c, bytes(input), bytes(result), input.numel(), input.element_size(), red.op,
                finalizer(red, input.scalar_type(), p), root, /*oneShot=*/algo == Algorithm::ArenaOneShot);
    if (c.rank() == root) {
      t.copy_(resultHost.view(t.sizes()));
    }
    return;
  }
  RingJob job;
  job.count = input.numel();
  job.elemSize = input.element_size();
  job.reduceScatter = true;
  job.op = red.op;
  job.finalize = finalizer(red, input.scalar_type(), p);
  ringCollective(c, job, RingBuffers{bytes(input), bytes(result), nullptr});
  if (p > 1 && job.count > 0) {
    const size_t es = input.element_size();
    const Range mine = chunkRange(job.count, p, c.rank());
    std::vector<RequestPtr> reqs;
    if (c.rank() != root) {
      reqs.push_back(c.send(root, bytes(result) + mine.offset * es, mine.length * es));
    } else {
      for (const auto q : c10::irange(p)) {
        if (q != root) {
          const Range R = chunkRange(job.count, p, q);
          reqs.push_back(c.recv(q, bytes(result) + R.offset * es, R.length * es));
        }
      }
    }
    c.waitAll(reqs);
  }
  if (c.rank() == root) {
    t.copy_(resultHost.view(t.sizes()));
  }
}

void gather(OpContext& c, const at::Tensor& input, const std::vector<at::Tensor>& outputs, int root) {
  at::Tensor hin = toHost(input);
  std::vector<at::Tensor> hout;
  std::vector<char*> ptrs;
  for (const auto& o : outputs) {
    hout.push_back(hostBufferFor(o));
    ptrs.push_back(bytes(hout.back()));
  }
  if (onArena(planFor(c, hostQuery(Collective::Gather, nbytes(hin))).algorithm)) {
    arenaGather(c, bytes(hin), nbytes(hin), ptrs, root);
  } else {
    gatherTo(c, root, bytes(hin), nbytes(hin), ptrs);
  }
  for (const auto i : c10::irange(outputs.size())) {
    writeBack(outputs[i], hout[i]);
  }
}

void scatter(OpContext& c, const std::vector<at::Tensor>& inputs, const at::Tensor& output, int root) {
  std::vector<at::Tensor> hin;
  std::vector<const char*> ptrs;
  for (const auto& t : inputs) {
    hin.push_back(toHost(t));
    ptrs.push_back(bytes(hin.back()));
  }
  at::Tensor hout = hostBufferFor(output);
  if (onArena(planFor(c, hostQuery(Collective::Scatter, nbytes(hout))).algorithm)) {
    arenaScatter(c, ptrs, bytes(hout), nbytes(hout), root);
  } else {
    scatterFrom(c, root, ptrs, bytes(hout), nbytes(hout));
  }
  writeBack(output, hout);
}

// ---- All-gather ------------------------------------------------------------------

void allGatherInto(OpContext& c, const at::Tensor& input, const at::Tensor& output) {
  const c10::Device device = input.device();
  const OpPlan plan = planFor(c, splitQuery(Collective::AllGather, input, output, c.rank()), &device);
  if (plan.staging == HostStaging::OnRing || plan.staging == HostStaging::OnArena) {
    const at::Tensor in = input.reshape({-1});
    const at::Tensor out = output.reshape({-1});
    plan.staging == HostStaging::OnRing ? stagedRingAllGather(c, in, out)
                                        : stagedArenaAllGather(c, in, out, plan.streams);
    return;
  }
  // Contiguous (toHost, hostBufferFor), so as good as flat for hostAllGather, which
  // reads bytes and counts: no reshape (a dispatched op and a new view each: hostReal).
  at::Tensor hin = toHost(input);
  at::Tensor hout = hostBufferFor(output);
  hostAllGather(c, hin, hout, plan);
  writeBack(output, hout);
}

void allGather(OpContext& c, const at::Tensor& input, const std::vector<at::Tensor>& outputs) {
  at::Tensor hin = toHost(input); // contiguous: hostAllGather reads its bytes, unreshaped
  at::Tensor flat = at::empty({hin.numel() * c.size()}, hin.options());
  hostAllGather(c, hin, flat, planFor(c, hostQuery(Collective::AllGather, nbytes(flat), /*readBack=*/true)));
  for (const auto q : c10::irange(c.size())) {
    outputs[q].copy_(flat.narrow(0, q * hin.numel(), hin.numel()).view(outputs[q].sizes()));
  }
}

void allGatherCoalesced(OpContext& c, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) {
  at::Tensor flatIn = at::cat(flatHost(inputs));
  const int64_t n = flatIn.numel();
  at::Tensor flat = at::empty({n * c.size()}, flatIn.options());
  hostAllGather(c, flatIn, flat, planFor(c, hostQuery(Collective::AllGather, nbytes(flat), /*readBack=*/true)));
  size_t k = 0;
  for (const auto q : c10::irange(c.size())) {
    int64_t off = q * n;
    for (const auto& t : inputs) {
      outputs[k++].copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  }
}

void allGatherIntoCoalesced(OpContext& c, const std::vector<at::Tensor>& inputs,
                            const std::vector<at::Tensor>& outputs) {
  for (const auto i : c10::irange(inputs.size())) {
    allGatherInto(c, inputs[i], outputs[i]);
  }
}

// ---- Reduce-scatter --------------------------------------------------------------

void reduceScatterInto(OpContext& c, const at::Tensor& input, const at::Tensor& output, const Reduction& red) {
  const c10::Device device = input.device();
  const OpPlan plan = planFor(c, splitQuery(Collective::ReduceScatter, input, output, c.rank()), &device);
  if (plan.staging == HostStaging::OnRing || plan.staging == HostStaging::OnArena) {
    // PREMUL_SUM's product on the device, into a tensor of its own: the input stays as it was.
    const at::Tensor in = flatReal(premultiplied(red, input, /*inPlace=*/false));
    const at::Tensor out = flatReal(output);
    auto finalize = finalizer(red, in.scalar_type(), c.size());
    if (plan.staging == HostStaging::OnArena) {
      stagedArenaReduceScatter(c, in, out, red.op, finalize);
      return;
    }
    char* work = c.workspace(nbytes(in));
    at::Tensor fresh; // where the input outgrows the kept area
    if (work == nullptr) {
      fresh = at::empty({in.numel()}, in.options().device(at::kCPU));
      work = bytes(fresh);
    }
    stagedRingReduceScatter(c, in, out, red.op, finalize, work);
    return;
  }
  at::Tensor hin = hostReal(premultiplied(red, toHost(input), /*inPlace=*/false));
  at::Tensor hout = hostBufferFor(output);
  hostReduceScatter(c, hin, hostReal(hout), red, plan);
  writeBack(output, hout);
}

void reduceScatter(OpContext& c, const std::vector<at::Tensor>& inputs, const at::Tensor& output,
                   const Reduction& red) {
  at::Tensor flat = premultiplied(red, at::cat(flatHost(inputs)), /*inPlace=*/true);
  at::Tensor hout = hostBufferFor(output);
  hostReduceScatter(c, hostReal(flat), hostReal(hout), red,
                    planFor(c, hostQuery(Collective::ReduceScatter, nbytes(flat))));
  writeBack(output, hout);
}

void reduceScatterIntoCoalesced(OpContext& c, const std::vector<at::Tensor>& inputs,
                                const std::vector<at::Tensor>& outputs, const Reduction& red) {
  for (const auto i : c10::irange(inputs.size())) {
    reduceScatterInto(c, inputs[i], outputs[i], red);
  }
}

// ---- All-to-all ------------------------------------------------------------------

namespace {

// The blocks' exchange, over the arena or the links as choice.h says.
void allToAllOf(OpContext& c, const std::vector<const char*>& sendBuf, const std::vector<size_t>& sendBytes,
                const std::vector<char*>& recvBuf, const std::vector<size_t>& recvBytes) {
  const Algorithm algo = planFor(c, hostQuery(Collective::AllToAll, 0)).algorithm;
  if (onArena(algo)) {
    arenaAllToAll(c, sendBuf, sendBytes, recvBuf, recvBytes);
  } else {
    ringpg::allToAll(c, algo == Algorithm::Bruck, sendBuf, sendBytes, recvBuf, recvBytes);
  }
}

} // namespace

void allToAllSingle(OpContext& c, const at::Tensor& input, const at::Tensor& output,
                    const std::vector<int64_t>& inSplits, const std::vector<int64_t>& outSplits) {
  // Splits count rows of dim 0; a row holds numel / rows elements (a 0-dim tensor is one row).
  auto rowElems = [](const at::Tensor& t) -> int64_t {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    return rows == 0 ? 0 : t.numel() / rows;
  };
  const int64_t inRow = rowElems(input);
  const int64_t outRow = rowElems(output);
  at::Tensor hin = toHost(input);
  at::Tensor hout = hostBufferFor(output);
  const size_t es = hin.element_size();
  std::vector<const char*> sp;
  std::vector<char*> rp;
  std::vector<size_t> sb, rb;
  int64_t so = 0, ro = 0;
  for (const auto q : c10::irange(c.size())) {
    sp.push_back(bytes(hin) + so * inRow * es);
    sb.push_back(inSplits[q] * inRow * es);
    so += inSplits[q];
    rp.push_back(bytes(hout) + ro * outRow * es);
    rb.push_back(outSplits[q] * outRow * es);
    ro += outSplits[q];
  }
  allToAllOf(c, sp, sb, rp, rb);
  writeBack(output, hout);
}

void allToAll(OpContext& c, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) {
  std::vector<at::Tensor> hin, hout;
  std::vector<const char*> sp;
  std::vector<char*> rp;
  std::vector<size_t> sb, rb;
  for (const auto q : c10::irange(c.size())) {
    hin.push_back(toHost(inputs[q]));
    hout.push_back(hostBufferFor(outputs[q]));
    sp.push_back(bytes(hin[q]));
    sb.push_back(nbytes(hin[q]));
    rp.push_back(bytes(hout[q]));
    rb.push_back(nbytes(hout[q]));
  }
  allToAllOf(c, sp, sb, rp, rb);
  for (const auto q : c10::irange(c.size())) {
    writeBack(outputs[q], hout[q]);
  }
}

} // namespace collectives
} // namespace ringpg
