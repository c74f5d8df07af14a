#include "backend/ring_backend.h"

#include <ATen/ATen.h>
#include <c10/util/irange.h>
#include <c10/util/Logging.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "algorithms/direct.h"
#include "algorithms/ring.h"
#include "algorithms/ring_plan.h"
#include "common/host.h"
#include "cuda/device_sync.h"
#include "cuda/staging.h"
#include "reduce/reduce.h"
#include "transport/rendezvous.h"

namespace ringpg {
namespace {

using c10d::OpType;

// ---- Stage 1 helpers: validation in the caller's thread --------------------------

void checkTensor(const char* op, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), "ringpg::", op, ": undefined tensor");
  TORCH_CHECK(t.layout() == at::kStrided, "ringpg::", op, ": only dense (strided) tensors are supported, got ",
              t.layout(), " (sparse tensors are not supported)");
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "ringpg::", op,
              ": tensors must be on cpu or cuda, got ", t.device());
}

void checkSingle(const char* op, const std::vector<at::Tensor>& ts) {
  TORCH_CHECK(ts.size() == 1, "ringpg::", op, ": expects exactly one tensor per call, got ", ts.size());
  checkTensor(op, ts[0]);
}

void checkSameDevice(const char* op, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.device() == b.device(), "ringpg::", op, ": tensors on different devices (", a.device(), " and ",
              b.device(), ") in one call");
}

void checkSameTypeAndSize(const char* op, const at::Tensor& ref, const at::Tensor& t, const char* what) {
  checkTensor(op, t);
  checkSameDevice(op, ref, t);
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "ringpg::", op, ": ", what, " has dtype ", t.scalar_type(),
              " but the input has ", ref.scalar_type());
  TORCH_CHECK(t.numel() == ref.numel(), "ringpg::", op, ": ", what, " has ", t.numel(),
              " elements but the input has ", ref.numel());
}

// A non-empty list of dense tensors on one device with one dtype; returns their total numel.
uint64_t checkUniform(const char* op, const std::vector<at::Tensor>& ts) {
  TORCH_CHECK(!ts.empty(), "ringpg::", op, ": no tensors");
  uint64_t total = 0;
  for (const auto& t : ts) {
    checkTensor(op, t);
    checkSameDevice(op, ts[0], t);
    TORCH_CHECK(t.scalar_type() == ts[0].scalar_type(), "ringpg::", op, ": all tensors must share a dtype");
    total += t.numel();
  }
  return total;
}

void checkRoot(const char* op, int64_t root, int size) {
  TORCH_CHECK(root >= 0 && root < size, "ringpg::", op, ": invalid root rank ", root, " for a group of size ",
              size);
}

void checkListLength(const char* op, size_t got, int size, const char* what) {
  TORCH_CHECK(static_cast<int>(got) == size, "ringpg::", op, ": ", what, " must hold one tensor per rank (",
              size, "), got ", got);
}

// A reduction as the kernels see it, plus AVG's division and PREMUL_SUM's factor.
struct Reduction {
  RedOp op = RedOp::Sum;
  bool average = false;
  std::optional<double> premul;
  std::optional<at::Tensor> premulTensor;
};

// Complex tensors reduce as pairs of reals (view_as_real): fine for the linear ops.
at::ScalarType reduceDtype(at::ScalarType dtype) {
  return at::isComplexType(dtype) ? c10::toRealValueType(dtype) : dtype;
}

at::Tensor asReal(const at::Tensor& t) {
  return t.is_complex() ? at::view_as_real(t).reshape({-1}) : t.reshape({-1});
}

Reduction toReduction(const char* opName, const c10d::ReduceOp& rop, at::ScalarType dtype) {
  Reduction r;
  TORCH_CHECK(!at::isComplexType(dtype) || rop.op_ == c10d::ReduceOp::SUM || rop.op_ == c10d::ReduceOp::AVG ||
                  rop.op_ == c10d::ReduceOp::PREMUL_SUM,
              "ringpg::", opName, ": complex tensors support SUM, AVG and PREMUL_SUM only");
  switch (rop.op_) {
    case c10d::ReduceOp::SUM: r.op = RedOp::Sum; break;
    case c10d::ReduceOp::AVG: r.op = RedOp::Sum; r.average = true; break;
    case c10d::ReduceOp::PRODUCT: r.op = RedOp::Prod; break;
    case c10d::ReduceOp::MIN: r.op = RedOp::Min; break;
    case c10d::ReduceOp::MAX: r.op = RedOp::Max; break;
    case c10d::ReduceOp::BAND: r.op = RedOp::Band; break;
    case c10d::ReduceOp::BOR: r.op = RedOp::Bor; break;
    case c10d::ReduceOp::BXOR: r.op = RedOp::Bxor; break;
    case c10d::ReduceOp::PREMUL_SUM: {
      r.op = RedOp::Sum;
      auto* sup = dynamic_cast<c10d::PreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK(sup, "ringpg::", opName, ": PREMUL_SUM without its factor");
      if (sup->tensor_factor.defined()) {
        r.premulTensor = sup->tensor_factor;
      } else {
        r.premul = sup->double_factor;
      }
      TORCH_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype), "ringpg::", opName,
                  ": PREMUL_SUM needs a floating or complex dtype, got ", dtype);
      break;
    }
    default:
      TORCH_CHECK(false, "ringpg::", opName, ": unsupported reduce op ", static_cast<int>(rop.op_));
  }
  TORCH_CHECK(reduceSupported(reduceDtype(dtype), r.op), "ringpg::", opName, ": ReduceOp ", redOpName(r.op),
              " is not supported for dtype ", dtype);
  TORCH_CHECK(!r.average || dtype != at::kBool, "ringpg::", opName, ": AVG is not defined for bool tensors");
  return r;
}

// ---- Stage 3 helpers: staging in the worker --------------------------------------

// A contiguous host view of `t`: `t` itself when already contiguous on the CPU.
at::Tensor toHost(const at::Tensor& t) {
  if (t.device().is_cpu() && t.is_contiguous()) {
    return t;
  }
  return t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::Contiguous).contiguous();
}

// A fresh contiguous host buffer shaped like `t` (for outputs written in full).
at::Tensor hostBufferFor(const at::Tensor& t) {
  if (t.device().is_cpu() && t.is_contiguous()) {
    return t;
  }
  return at::empty(t.sizes(), t.options().device(at::kCPU).memory_format(at::MemoryFormat::Contiguous));
}

void writeBack(const at::Tensor& user, const at::Tensor& host) {
  if (!user.is_same(host)) {
    user.copy_(host);
  }
}

char* bytes(const at::Tensor& t) {
  return static_cast<char*>(t.data_ptr());
}

size_t nbytes(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

// AVG's division, applied to each finished segment of the own chunk.
std::function<void(char*, int64_t)> finalizer(const Reduction& red, at::ScalarType dtype, int size) {
  if (!red.average) {
    return nullptr;
  }
  return [dtype, size](char* data, int64_t n) {
    if (at::isFloatingType(dtype)) {
      // ATen divides fp16/bf16 in fp32 and rounds once.
      at::from_blob(data, {n}, at::TensorOptions().dtype(dtype)).div_(size);
    } else {
      divideIntegers(dtype, data, n, size); // truncates toward zero, like integer division
    }
  };
}

// PREMUL_SUM: the factor multiplies each rank's contribution before the sum.
at::Tensor premultiplied(const Reduction& red, const at::Tensor& host, bool inPlace) {
  if (!red.premul && !red.premulTensor) {
    return host;
  }
  // A 0-dim factor never promotes the data's dtype (a float32 factor must not turn an
  // fp16 buffer into fp32): the product is computed in the data's opmath and rounded once.
  at::Tensor factor = red.premulTensor ? red.premulTensor->to(at::kCPU).reshape({}) : at::scalar_tensor(*red.premul);
  at::Tensor out = inPlace ? host.mul_(factor) : host.mul(factor);
  TORCH_INTERNAL_ASSERT(out.scalar_type() == host.scalar_type(), "ringpg: PREMUL_SUM changed the dtype");
  return out;
}

// Allreduce of a contiguous host tensor, in place: one-shot for small buffers, else
// the pipelined ring (reduce-scatter then all-gather).
void allreduceInPlace(OpContext& c, const at::Tensor& host, const Reduction& red) {
  const size_t bytesOut = nbytes(host) * static_cast<size_t>(c.size() - 1);
  if (c.size() > 1 && host.numel() > 0 && bytesOut <= c.config().oneShotBytes) {
    oneShotAllreduce(c, bytes(host), host.numel(), host.element_size(), red.op,
                     finalizer(red, host.scalar_type(), c.size()));
    return;
  }
  RingJob job;
  job.count = host.numel();
  job.elemSize = host.element_size();
  job.reduceScatter = job.allGather = true;
  job.op = red.op;
  job.finalize = finalizer(red, host.scalar_type(), c.size());
  ringCollective(c, job, RingBuffers{bytes(host), bytes(host), nullptr});
}

// Reduce-scatter of `input` (count = output.numel() * size) into `output`.
void ringReduceScatter(OpContext& c, const at::Tensor& input, const at::Tensor& output, const Reduction& red) {
  TORCH_INTERNAL_ASSERT(input.scalar_type() == output.scalar_type() && input.numel() == output.numel() * c.size());
  RingJob job;
  job.count = input.numel();
  job.elemSize = input.element_size();
  job.reduceScatter = true;
  job.op = red.op;
  job.finalize = finalizer(red, input.scalar_type(), c.size());
  // Partial sums of the other chunks need a buffer of the input's layout; the input
  // itself stays untouched, as users (and gloo) expect.  A fresh buffer per op cost
  // ~1100 page faults per 16 MiB (N=4 over shared memory: 10.4-10.8 ms per op against
  // 7.4 with a kept one), so the worker keeps it (RINGPG_WORK_CACHE_BYTES).  Every
  // element is written before it is read, so what an earlier op left there is moot.
  at::Tensor work = input;
  if (c.size() > 1) {
    char* kept = c.workspace(nbytes(input));
    work = kept ? at::from_blob(kept, input.sizes(), input.options()) : at::empty_like(input);
  }
  ringCollective(c, job, RingBuffers{bytes(input), bytes(work), bytes(output)});
}

// All-gather: `input` is chunk `rank` of `output` (count = input.numel() * size).
// The ring sends the own chunk straight from `input` and copies it into `output`
// while those bytes travel (ring.h).  An input that overlaps the output (FSDP passes
// the output's own chunk; anything else is allowed too) is put in place first instead.
void ringAllGather(OpContext& c, const at::Tensor& input, const at::Tensor& output) {
  const size_t chunkBytes = nbytes(input);
  char* ownSlot = bytes(output) + chunkBytes * c.rank();
  // Addresses as integers: `<` between pointers into different objects is unspecified.
  const auto in = reinterpret_cast<uintptr_t>(bytes(input));
  const auto out = reinterpret_cast<uintptr_t>(bytes(output));
  const bool overlaps = chunkBytes > 0 && in < out + nbytes(output) && out < in + chunkBytes;
  if (overlaps && bytes(input) != ownSlot) {
    std::memmove(ownSlot, bytes(input), chunkBytes);
  }
  RingJob job;
  job.count = output.numel();
  job.elemSize = output.element_size();
  job.allGather = true;
  ringCollective(c, job, RingBuffers{nullptr, bytes(output), overlaps ? nullptr : bytes(input)});
}

std::vector<at::Tensor> flatCat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const auto& t : ts) {
    flat.push_back(toHost(t).reshape({-1}));
  }
  return flat;
}

} // namespace

// ---- Construction and teardown --------------------------------------------------

RingBackend::RingBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout, std::string groupName)
    : c10d::Backend(rank, size), cfg_(Config::get()), timeout_(timeout), groupName_(std::move(groupName)) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "ringpg: invalid rank ", rank, " / size ", size);
  reduceIsa(); // a RINGPG_REDUCE_ISA this CPU cannot run fails the group's creation, not its first op
  if (!cfg_.tcpCongestion.empty()) {
    checkCongestionControl(cfg_.tcpCongestion); // likewise, before any connection
  }
  Mesh mesh = connectMesh(*store, rank, size, cfg_.ifname, timeout);
  localAddress_ = mesh.localAddress;
  engine_ = std::make_unique<Engine>(rank, size, std::move(mesh.tx), std::move(mesh.rx), cfg_.socketBuffer,
                                     cfg_.tcpCongestion, cfg_.engineSpinMicros());
  // Same-host groups move ring traffic through shared memory (transport/shm.h).  A
  // slot holds one default-sized segment; larger segments travel as fragments.
  const size_t slotBytes = std::clamp<size_t>(cfg_.segmentBytes, 64 * 1024, 4 * 1024 * 1024);
  // A shared-memory group has all its ranks on this host.
  shmSpinMicros_ = cfg_.shmSpinMicros(size, usableCpus());
  shm_ = ShmRing::connect(*store, mesh.keyPrefix, rank, size, cfg_.shmAllowed, slotBytes, shmSpinMicros_,
                          Clock::now() + timeout);
  worker_ = std::thread([this] { workerLoop(); });
  if (rank == 0) {
    LOG(INFO) << "ringpg: group '" << groupName_ << "' size " << size << " on " << localAddress_ << ": "
              << cfg_.summary() << " transport=" << transport() << " wait_spin_us="
              << waitSpinMicros() << " reduce_isa=" << reduceIsa() << " tcp_congestion_in_use="
              << tcpCongestion();
  }
}

RingBackend::~RingBackend() {
  // Joining threads must not hold the GIL: a future callback on the worker may need it.
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release noGil;
    stop(/*graceful=*/true);
  } else {
    stop(/*graceful=*/true);
  }
}

void RingBackend::stop(bool graceful) {
  {
    std::lock_guard<std::mutex> lk(queueMu_);
    if (stopping_) {
      return;
    }
    stopping_ = true;
  }
  if (!graceful && engine_) {
    engine_->fail("ringpg: the process group was aborted");
  }
  queueCv_.notify_all();
  if (worker_.joinable()) {
    worker_.join(); // drains the queue first: each op ends by its deadline
  }
  if (engine_) {
    if (graceful) {
      engine_->shutdown(Clock::now() + std::chrono::seconds(2));
    }
    engine_.reset();
  }
}

void RingBackend::shutdown() {
  stop(/*graceful=*/true);
}

void RingBackend::abort() {
  stop(/*graceful=*/false);
}

uint64_t RingBackend::getSequenceNumberForGroup() {
  std::lock_guard<std::mutex> lk(queueMu_);
  return seq_;
}

std::chrono::milliseconds RingBackend::effectiveTimeout(std::chrono::milliseconds opTimeout) const {
  return opTimeout == c10d::kUnsetTimeout || opTimeout.count() <= 0 ? timeout_ : opTimeout;
}

// ---- Stage 2: sequence number and queue ------------------------------------------

c10::intrusive_ptr<c10d::Work> RingBackend::enqueue(OpType type, const char* name, const char* profilingTitle,
                                                    c10::ScalarType dtype, uint64_t numel,
                                                    std::chrono::milliseconds timeout, bool asyncOp,
                                                    std::vector<at::Tensor> outputs,
                                                    const std::vector<at::Tensor>& inputs, OpFn fn) {
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), outputs.begin(), outputs.end());
  auto sync = DeviceSync::capture(name, all);
  std::unique_lock<std::mutex> lk(queueMu_);
  TORCH_CHECK(!stopping_, "ringpg::", name, ": the process group has been shut down");
  const uint64_t seq = ++seq_;
  auto work = c10::make_intrusive<RingWork>(getRank(), type, seq, profilingTitle, std::move(outputs), inputs,
                                            effectiveTimeout(timeout));
  if (sync) {
    work->setOnSynchronize([sync] { sync->blockCurrentStream(); });
    fn = [sync, inner = std::move(fn)](OpContext& c) {
      sync->waitForCaller();
      inner(c);
      sync->markDone();
    };
  }
  Queued q{work, std::move(fn), OpTag{name, seq, getRank()}, static_cast<uint8_t>(type), dtype, numel,
           effectiveTimeout(timeout)};
  if (!asyncOp && !sync && !running_ && queue_.empty()) {
    running_ = true;
    lk.unlock();
    execute(q);
    lk.lock();
    running_ = false;
    // Wake the worker only if it has something to do: ops queued meanwhile by other
    // threads, or a stop waiting for this op.  An unconditional notify costs a futex
    // wake and a context switch per op, which is most of a small op's time on few cores.
    const bool wakeWorker = !queue_.empty() || stopping_;
    lk.unlock();
    if (wakeWorker) {
      queueCv_.notify_all();
    }
    return work;
  }
  queue_.push_back(std::move(q));
  queueCv_.notify_all();
  return work;
}

void RingBackend::workerLoop() {
  while (true) {
    Queued q;
    {
      std::unique_lock<std::mutex> lk(queueMu_);
      queueCv_.wait(lk, [&] { return (stopping_ && !running_) || (!queue_.empty() && !running_); });
      if (queue_.empty()) {
        return;
      }
      q = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    execute(q);
    {
      std::lock_guard<std::mutex> lk(queueMu_);
      running_ = false;
    }
    queueCv_.notify_all();
  }
}

// Stage 3: runs one op to completion and completes its Work (never throws).
void RingBackend::execute(Queued& q) {
  std::exception_ptr error;
  try {
    bool network = false;
    const std::string broken = engine_->brokenReason(&network);
    if (!broken.empty()) {
      // After a failure every later op fails at once, with the original cause.
      const std::string msg = c10::str(describe(q.tag), ": not run, the group failed earlier: ", broken);
      network ? throwNetwork(msg) : throwBackend(msg);
    }
    OpContext ctx(*engine_, cfg_, q.tag, getSize(), q.opcode, q.dtype, q.numel, Clock::now() + q.timeout,
                  scratch_, workspace_, shm_.get());
    engine_->setCurrentCollective(ctx.header());
    q.fn(ctx);
  } catch (const c10::Error& e) {
    error = std::current_exception();
    // The op stopped part-way, so this rank's peers are out of step with it: break the
    // group with this cause (they hear it at once) rather than let the next op mismatch.
    engine_->fail(c10::str(describe(q.tag), ": ", e.what_without_backtrace()), /*network=*/false);
  } catch (const std::exception& e) {
    // Anything else (a std::bad_alloc, say) becomes a DistBackendError naming the op.
    const std::string msg = c10::str(describe(q.tag), ": ", e.what());
    engine_->fail(msg, /*network=*/false);
    try {
      throwBackend(msg);
    } catch (...) {
      error = std::current_exception();
    }
  }
  q.work->complete(error);
}

// ---- The collectives ---------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> RingBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  checkSingle("all_reduce", tensors);
  at::Tensor t = tensors[0];
  const Reduction red = toReduction("all_reduce", opts.reduceOp, t.scalar_type());
  return enqueue(OpType::ALLREDUCE, "all_reduce", "ringpg:all_reduce", reduceDtype(t.scalar_type()), t.numel(),
                 opts.timeout, opts.asyncOp,
                 tensors, tensors, [t, red](OpContext& c) {
                   if (!t.device().is_cpu() && t.is_contiguous() && c.size() > 1 &&
                       nbytes(t) * (c.size() - 1) > c.config().oneShotBytes) {
                     // Large CUDA tensors: chunked copies overlap the ring (cuda/staging.h).
                     at::Tensor dev = premultiplied(red, t, /*inPlace=*/true);
                     stagedRingAllreduce(c, asReal(dev), red.op,
                                         finalizer(red, reduceDtype(t.scalar_type()), c.size()));
                     return;
                   }
                   at::Tensor host = premultiplied(red, toHost(t), /*inPlace=*/true);
                   allreduceInPlace(c, asReal(host), red);
                   writeBack(t, host);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                const c10d::AllreduceCoalescedOptions& opts) {
  const char* op = "allreduce_coalesced";
  const uint64_t total = checkUniform(op, tensors);
  const Reduction red = toReduction(op, opts.reduceOp, tensors[0].scalar_type());
  return enqueue(OpType::ALLREDUCE_COALESCED, op, "ringpg:allreduce_coalesced", reduceDtype(tensors[0].scalar_type()),
                 total,
                 opts.timeout, opts.asyncOp, tensors, tensors, [tensors, red](OpContext& c) {
                   // One ring over the concatenation: one pipeline instead of many small ones.
                   at::Tensor flat = at::cat(flatCat(tensors));
                   premultiplied(red, flat, /*inPlace=*/true);
                   allreduceInPlace(c, asReal(flat), red);
                   int64_t off = 0;
                   for (const auto& t : tensors) {
                     t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
                     off += t.numel();
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  checkSingle("broadcast", tensors);
  checkRoot("broadcast", opts.rootRank, getSize());
  at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(OpType::BROADCAST, "broadcast", "ringpg:broadcast", t.scalar_type(), t.numel(), opts.timeout, opts.asyncOp,
                 tensors, tensors, [t, root](OpContext& c) {
                   at::Tensor host = c.rank() == root ? toHost(t) : hostBufferFor(t);
                   chainBroadcast(c, bytes(host), nbytes(host), root);
                   writeBack(t, host);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::reduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::ReduceOptions& opts) {
  checkSingle("reduce", tensors);
  checkRoot("reduce", opts.rootRank, getSize());
  at::Tensor t = tensors[0];
  const Reduction red = toReduction("reduce", opts.reduceOp, t.scalar_type());
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(OpType::REDUCE, "reduce", "ringpg:reduce", reduceDtype(t.scalar_type()), t.numel(), opts.timeout,
                 opts.asyncOp, tensors,
                 tensors, [t, red, root](OpContext& c) {
                   // Ring reduce-scatter (each rank finishes its chunk), then the chunks
                   // go straight to the root: (p-1)/p of the data crosses each link twice
                   // at most, instead of p-1 times through a chain.
                   const int p = c.size();
                   at::Tensor host = premultiplied(red, toHost(t), /*inPlace=*/false);
                   at::Tensor input = asReal(host);
                   at::Tensor resultHost = at::empty_like(host);
                   at::Tensor result = asReal(resultHost);
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
                     if (c.rank() != root) {
                       std::vector<RequestPtr> s{c.send(root, bytes(result) + mine.offset * es, mine.length * es)};
                       c.waitAll(s);
                     } else {
                       std::vector<RequestPtr> rv;
                       for (const auto q : c10::irange(p)) {
                         if (q != root) {
                           const Range R = chunkRange(job.count, p, q);
                           rv.push_back(c.recv(q, bytes(result) + R.offset * es, R.length * es));
                         }
                       }
                       c.waitAll(rv);
                     }
                   }
                   if (c.rank() == root) {
                     t.copy_(resultHost.view(t.sizes()));
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor";
  checkTensor(op, input);
  checkTensor(op, output);
  checkSameDevice(op, input, output);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "ringpg::", op, ": output dtype ",
              output.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "ringpg::", op, ": output has ", output.numel(),
              " elements, expected input numel x group size = ", input.numel() * getSize());
  at::Tensor in = input, out = output;
  return enqueue(OpType::_ALLGATHER_BASE, op, "ringpg:all_gather_into_tensor", input.scalar_type(), input.numel(),
                 opts.timeout, opts.asyncOp, {output}, {input}, [in, out](OpContext& c) {
                   at::Tensor hin = toHost(in);
                   at::Tensor hout = hostBufferFor(out);
                   ringAllGather(c, hin.reshape({-1}), hout.reshape({-1}));
                   writeBack(out, hout);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather";
  checkSingle(op, inputs);
  TORCH_CHECK(outputs.size() == 1, "ringpg::", op, ": expects one output list, got ", outputs.size());
  checkListLength(op, outputs[0].size(), getSize(), "the output list");
  at::Tensor in = inputs[0];
  for (const auto& o : outputs[0]) {
    checkSameTypeAndSize(op, in, o, "an output tensor");
  }
  std::vector<at::Tensor> outs = outputs[0];
  return enqueue(OpType::ALLGATHER, op, "ringpg:all_gather", in.scalar_type(), in.numel(), opts.timeout, opts.asyncOp, outs,
                 inputs, [in, outs](OpContext& c) {
                   at::Tensor hin = toHost(in).reshape({-1});
                   at::Tensor flat = at::empty({hin.numel() * c.size()}, hin.options());
                   ringAllGather(c, hin, flat);
                   for (const auto q : c10::irange(c.size())) {
                     outs[q].copy_(flat.narrow(0, q * hin.numel(), hin.numel()).view(outs[q].sizes()));
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllgatherOptions& opts) {
  const char* op = "allgather_coalesced";
  const uint64_t total = checkUniform(op, inputs);
  checkListLength(op, outputLists.size(), getSize(), "the output list of lists");
  std::vector<at::Tensor> outs;
  for (const auto& l : outputLists) {
    TORCH_CHECK(l.size() == inputs.size(), "ringpg::", op, ": each output list needs ", inputs.size(), " tensors");
    for (const auto i : c10::irange(l.size())) {
      checkSameTypeAndSize(op, inputs[i], l[i], "an output tensor");
      outs.push_back(l[i]);
    }
  }
  std::vector<at::Tensor> ins = inputs;
  return enqueue(OpType::ALLGATHER_COALESCED, op, "ringpg:allgather_coalesced", inputs[0].scalar_type(), total,
                 opts.timeout, opts.asyncOp, outs, inputs, [ins, outs](OpContext& c) {
                   at::Tensor flatIn = at::cat(flatCat(ins));
                   const int64_t n = flatIn.numel();
                   at::Tensor flat = at::empty({n * c.size()}, flatIn.options());
                   ringAllGather(c, flatIn, flat);
                   size_t k = 0;
                   for (const auto q : c10::irange(c.size())) {
                     int64_t off = q * n;
                     for (const auto& t : ins) {
                       outs[k++].copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
                       off += t.numel();
                     }
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::AllgatherOptions& opts) {
  const char* op = "allgather_into_tensor_coalesced";
  TORCH_CHECK(outputs.size() == inputs.size() && !inputs.empty(), "ringpg::", op,
              ": needs as many outputs as inputs (got ", outputs.size(), " and ", inputs.size(), ")");
  uint64_t total = 0;
  for (const auto i : c10::irange(inputs.size())) {
    checkTensor(op, inputs[i]);
    checkTensor(op, outputs[i]);
    checkSameDevice(op, inputs[0], inputs[i]);
    checkSameDevice(op, inputs[i], outputs[i]);
    TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type() &&
                    outputs[i].numel() == inputs[i].numel() * getSize(),
                "ringpg::", op, ": output ", i, " must have the input's dtype and numel x group size");
    total += inputs[i].numel();
  }
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  return enqueue(OpType::COALESCED, op, "ringpg:allgather_into_tensor_coalesced", inputs[0].scalar_type(), total,
                 opts.timeout, opts.asyncOp, outputs, inputs, [ins, outs](OpContext& c) {
                   for (const auto i : c10::irange(ins.size())) {
                     at::Tensor hout = hostBufferFor(outs[i]);
                     ringAllGather(c, toHost(ins[i]).reshape({-1}), hout.reshape({-1}));
                     writeBack(outs[i], hout);
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor";
  checkTensor(op, input);
  checkTensor(op, output);
  checkSameDevice(op, input, output);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "ringpg::", op, ": output dtype ",
              output.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "ringpg::", op, ": input has ", input.numel(),
              " elements, expected output numel x group size = ", output.numel() * getSize());
  const Reduction red = toReduction(op, opts.reduceOp, input.scalar_type());
  at::Tensor in = input, out = output;
  return enqueue(OpType::_REDUCE_SCATTER_BASE, op, "ringpg:reduce_scatter_tensor", reduceDtype(input.scalar_type()),
                 input.numel(), opts.timeout, opts.asyncOp, {output}, {input}, [in, out, red](OpContext& c) {
                   at::Tensor hin = asReal(premultiplied(red, toHost(in), /*inPlace=*/false));
                   at::Tensor hout = hostBufferFor(out);
                   ringReduceScatter(c, hin, asReal(hout), red);
                   writeBack(out, hout);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  checkSingle(op, outputs);
  TORCH_CHECK(inputs.size() == 1, "ringpg::", op, ": expects one input list, got ", inputs.size());
  checkListLength(op, inputs[0].size(), getSize(), "the input list");
  at::Tensor out = outputs[0];
  for (const auto& t : inputs[0]) {
    checkSameTypeAndSize(op, out, t, "an input tensor");
  }
  const Reduction red = toReduction(op, opts.reduceOp, out.scalar_type());
  std::vector<at::Tensor> ins = inputs[0];
  return enqueue(OpType::REDUCE_SCATTER, op, "ringpg:reduce_scatter", reduceDtype(out.scalar_type()),
                 out.numel() * getSize(),
                 opts.timeout, opts.asyncOp, outputs, ins, [ins, out, red](OpContext& c) {
                   at::Tensor flat = premultiplied(red, at::cat(flatCat(ins)), /*inPlace=*/true);
                   at::Tensor hout = hostBufferFor(out);
                   ringReduceScatter(c, asReal(flat), asReal(hout), red);
                   writeBack(out, hout);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  TORCH_CHECK(outputs.size() == inputs.size() && !inputs.empty(), "ringpg::", op,
              ": needs as many outputs as inputs (got ", outputs.size(), " and ", inputs.size(), ")");
  const uint64_t total = checkUniform(op, inputs);
  for (const auto i : c10::irange(inputs.size())) {
    checkTensor(op, outputs[i]);
    checkSameDevice(op, inputs[i], outputs[i]);
    TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type() &&
                    inputs[i].numel() == outputs[i].numel() * getSize(),
                "ringpg::", op, ": input ", i, " must have the output's dtype and numel x group size");
  }
  const Reduction red = toReduction(op, opts.reduceOp, inputs[0].scalar_type());
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  return enqueue(OpType::COALESCED, op, "ringpg:reduce_scatter_tensor_coalesced", reduceDtype(inputs[0].scalar_type()),
                 total,
                 opts.timeout, opts.asyncOp, outputs, inputs, [ins, outs, red](OpContext& c) {
                   for (const auto i : c10::irange(ins.size())) {
                     at::Tensor hin = asReal(premultiplied(red, toHost(ins[i]), /*inPlace=*/false));
                     at::Tensor hout = hostBufferFor(outs[i]);
                     ringReduceScatter(c, hin, asReal(hout), red);
                     writeBack(outs[i], hout);
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::GatherOptions& opts) {
  const char* op = "gather";
  checkSingle(op, inputs);
  checkRoot(op, opts.rootRank, getSize());
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs;
  if (getRank() == root) {
    TORCH_CHECK(outputs.size() == 1, "ringpg::", op, ": the root expects one output list, got ", outputs.size());
    checkListLength(op, outputs[0].size(), getSize(), "the output list");
    for (const auto& o : outputs[0]) {
      checkSameTypeAndSize(op, in, o, "an output tensor");
    }
    outs = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), "ringpg::", op,
                ": only the root (rank ", root, ") may pass output tensors");
  }
  return enqueue(OpType::GATHER, op, "ringpg:gather", in.scalar_type(), in.numel(), opts.timeout, opts.asyncOp, outs, inputs,
                 [in, outs, root](OpContext& c) {
                   at::Tensor hin = toHost(in);
                   std::vector<at::Tensor> hout;
                   std::vector<char*> ptrs;
                   for (const auto& o : outs) {
                     hout.push_back(hostBufferFor(o));
                     ptrs.push_back(bytes(hout.back()));
                   }
                   gatherTo(c, root, bytes(hin), nbytes(hin), ptrs);
                   for (const auto i : c10::irange(outs.size())) {
                     writeBack(outs[i], hout[i]);
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  const char* op = "scatter";
  checkSingle(op, outputs);
  checkRoot(op, opts.rootRank, getSize());
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> ins;
  if (getRank() == root) {
    TORCH_CHECK(inputs.size() == 1, "ringpg::", op, ": the root expects one input list, got ", inputs.size());
    checkListLength(op, inputs[0].size(), getSize(), "the input list");
    for (const auto& t : inputs[0]) {
      checkSameTypeAndSize(op, out, t, "an input tensor");
    }
    ins = inputs[0];
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), "ringpg::", op,
                ": only the root (rank ", root, ") may pass input tensors");
  }
  return enqueue(OpType::SCATTER, op, "ringpg:scatter", out.scalar_type(), out.numel(), opts.timeout, opts.asyncOp, outputs, ins,
                 [ins, out, root](OpContext& c) {
                   std::vector<at::Tensor> hin;
                   std::vector<const char*> ptrs;
                   for (const auto& t : ins) {
                     hin.push_back(toHost(t));
                     ptrs.push_back(bytes(hin.back()));
                   }
                   at::Tensor hout = hostBufferFor(out);
                   scatterFrom(c, root, ptrs, bytes(hout), nbytes(hout));
                   writeBack(out, hout);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                          std::vector<int64_t>& outputSplits,
                                                          std::vector<int64_t>& inputSplits,
                                                          const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all_single";
  checkTensor(op, input);
  checkTensor(op, output);
  checkSameDevice(op, input, output);
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "ringpg::", op, ": input and output dtypes differ");
  const int p = getSize();
  // Splits count rows (dim 0); empty splits mean equal parts.
  const int64_t inRows = input.dim() == 0 ? 1 : input.size(0);
  const int64_t outRows = output.dim() == 0 ? 1 : output.size(0);
  const int64_t inRow = inRows == 0 ? 0 : input.numel() / inRows;
  const int64_t outRow = outRows == 0 ? 0 : output.numel() / outRows;
  auto resolve = [&](std::vector<int64_t> splits, int64_t rows, const char* what) {
    if (splits.empty()) {
      TORCH_CHECK(rows % p == 0, "ringpg::", op, ": ", what, " dim 0 (", rows, ") is not divisible by group size ", p);
      return std::vector<int64_t>(p, rows / p);
    }
    checkListLength(op, splits.size(), p, what);
    int64_t sum = 0;
    for (auto s : splits) {
      TORCH_CHECK(s >= 0, "ringpg::", op, ": negative split size ", s);
      sum += s;
    }
    TORCH_CHECK(sum == rows, "ringpg::", op, ": ", what, " sum to ", sum, " but dim 0 is ", rows);
    return splits;
  };
  const auto ins = resolve(inputSplits, inRows, "input splits");
  const auto outs = resolve(outputSplits, outRows, "output splits");
  TORCH_CHECK(ins[getRank()] * inRow == outs[getRank()] * outRow, "ringpg::", op,
              ": this rank's own input and output splits differ in size");
  at::Tensor in = input, out = output;
  return enqueue(OpType::ALLTOALL_BASE, op, "ringpg:all_to_all", input.scalar_type(), 0, opts.timeout, opts.asyncOp, {output},
                 {input}, [in, out, ins, outs, inRow, outRow](OpContext& c) {
                   at::Tensor hin = toHost(in);
                   at::Tensor hout = hostBufferFor(out);
                   const size_t es = hin.element_size();
                   std::vector<const char*> sp;
                   std::vector<char*> rp;
                   std::vector<size_t> sb, rb;
                   int64_t so = 0, ro = 0;
                   for (const auto q : c10::irange(c.size())) {
                     sp.push_back(bytes(hin) + so * inRow * es);
                     sb.push_back(ins[q] * inRow * es);
                     so += ins[q];
                     rp.push_back(bytes(hout) + ro * outRow * es);
                     rb.push_back(outs[q] * outRow * es);
                     ro += outs[q];
                   }
                   allToAll(c, sp, sb, rp, rb);
                   writeBack(out, hout);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  checkListLength(op, inputs.size(), getSize(), "the input list");
  checkListLength(op, outputs.size(), getSize(), "the output list");
  for (const auto i : c10::irange(inputs.size())) {
    checkTensor(op, inputs[i]);
    checkTensor(op, outputs[i]);
    checkSameDevice(op, inputs[0], inputs[i]);
    checkSameDevice(op, inputs[0], outputs[i]);
    TORCH_CHECK(inputs[i].scalar_type() == inputs[0].scalar_type() &&
                    outputs[i].scalar_type() == inputs[0].scalar_type(),
                "ringpg::", op, ": all tensors must share a dtype");
  }
  TORCH_CHECK(inputs[getRank()].numel() == outputs[getRank()].numel(), "ringpg::", op,
              ": this rank's own input and output differ in size");
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  return enqueue(OpType::ALLTOALL, op, "ringpg:all_to_all", inputs[0].scalar_type(), 0, opts.timeout, opts.asyncOp, outputs,
                 inputs, [ins, outs](OpContext& c) {
                   std::vector<at::Tensor> hin, hout;
                   std::vector<const char*> sp;
                   std::vector<char*> rp;
                   std::vector<size_t> sb, rb;
                   for (const auto q : c10::irange(c.size())) {
                     hin.push_back(toHost(ins[q]));
                     hout.push_back(hostBufferFor(outs[q]));
                     sp.push_back(bytes(hin[q]));
                     sb.push_back(nbytes(hin[q]));
                     rp.push_back(bytes(hout[q]));
                     rb.push_back(nbytes(hout[q]));
                   }
                   allToAll(c, sp, sb, rp, rb);
                   for (const auto q : c10::irange(c.size())) {
                     writeBack(outs[q], hout[q]);
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::barrier(const c10d::BarrierOptions& opts) {
  // One byte per rank through the ring: every rank's chunk is non-empty, so no rank
  // leaves before it has heard, directly or through the ring, from every other.
  at::Tensor token = at::zeros({getSize()}, at::TensorOptions().dtype(at::kByte));
  return enqueue(OpType::BARRIER, "barrier", "ringpg:barrier", at::kByte, getSize(), opts.timeout, opts.asyncOp, {}, {},
                 [token](OpContext& c) {
                   Reduction red;
                   allreduceInPlace(c, token, red);
                 });
}

// ---- Point-to-point ----------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> RingBackend::p2p(OpType type, const char* name, at::Tensor& tensor, int peer,
                                                int tag) {
  TORCH_CHECK(tag >= 0, "ringpg::", name, ": tag must be non-negative, got ", tag);
  const bool isSend = type == OpType::SEND;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lk(queueMu_);
    TORCH_CHECK(!stopping_, "ringpg::", name, ": the process group has been shut down");
    // Ranks issue different numbers of p2p ops, so they count apart from collectives.
    seq = ++p2pSeq_;
  }
  const char* title = isSend ? "ringpg:send" : (peer < 0 ? "ringpg:recvAnySource" : "ringpg:recv");
  auto work = c10::make_intrusive<RingWork>(getRank(), type, seq, title, std::vector<at::Tensor>{tensor},
                                            std::vector<at::Tensor>{tensor}, timeout_);
  FrameHeader h;
  h.kind = static_cast<uint8_t>(FrameKind::P2P);
  h.key = static_cast<uint64_t>(tag);
  const OpTag opTag{name, seq, getRank()};
  // CUDA or non-contiguous tensors travel through a contiguous host copy: a send
  // copies now (ordered after the caller's current stream), a receive copies back
  // when its payload has landed, before the Work completes.
  const bool direct = tensor.device().is_cpu() && tensor.is_contiguous();
  at::Tensor host = direct ? tensor : (isSend ? toHost(tensor) : hostBufferFor(tensor));
  auto done = [work, opTag, tensor, host, direct, isSend](Request& r) {
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
    work->complete(err);
  };
  // The callback keeps `tensor` and `host` alive until the engine is done with them.
  if (isSend) {
    engine_->postSend(peer, h, host.data_ptr(), nbytes(host), done);
  } else {
    engine_->postRecv(peer, h, host.data_ptr(), nbytes(host), done);
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> RingBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  checkSingle("send", tensors);
  TORCH_CHECK(dstRank >= 0 && dstRank < getSize() && dstRank != getRank(), "ringpg::send: invalid destination rank ",
              dstRank, " (group size ", getSize(), ", this rank ", getRank(), ")");
  return p2p(OpType::SEND, "send", tensors[0], dstRank, tag);
}

c10::intrusive_ptr<c10d::Work> RingBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  checkSingle("recv", tensors);
  TORCH_CHECK(srcRank >= 0 && srcRank < getSize() && srcRank != getRank(), "ringpg::recv: invalid source rank ",
              srcRank, " (group size ", getSize(), ", this rank ", getRank(), ")");
  return p2p(OpType::RECV, "recv", tensors[0], srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> RingBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  checkSingle("recv", tensors);
  return p2p(OpType::RECVANYSOURCE, "recv", tensors[0], -1, tag);
}

} // namespace ringpg
