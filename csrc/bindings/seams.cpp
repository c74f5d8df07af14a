#include "bindings/seams.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <cstring>
#include <exception>
#include <thread>
#include <utility>

#include "backend/ring_backend.h"
#include "transport/loopback_link.h"
#include "transport/socket.h"

namespace ringpg::seams {

namespace {

c10d::ReduceOp::RedOpType redOpTypeNamed(const std::string& name) {
  static const std::pair<const char*, c10d::ReduceOp::RedOpType> kNames[] = {
      {"sum", c10d::ReduceOp::SUM},   {"product", c10d::ReduceOp::PRODUCT}, {"min", c10d::ReduceOp::MIN},
      {"max", c10d::ReduceOp::MAX},   {"band", c10d::ReduceOp::BAND},       {"bor", c10d::ReduceOp::BOR},
      {"bxor", c10d::ReduceOp::BXOR}, {"avg", c10d::ReduceOp::AVG},
  };
  for (const auto& [n, op] : kNames) {
    if (name == n) {
      return op;
    }
  }
  TORCH_CHECK(false, "ringpg: unknown reduce op '", name, "'");
}

// The group's settings: the process's, with the options' algorithm and sizes, and no
// tracing (its clock sync would dial rank 0 over an engine with nowhere to dial).
Config configFor(const InProcessOptions& o) {
  Config cfg = Config::get();
  cfg.traceDir.clear();
  cfg.algo = Config::algoNamed(o.algo, "algo=");
  if (o.oneShotBytes >= 0) {
    cfg.oneShotBytes = static_cast<size_t>(o.oneShotBytes);
  }
  if (o.segmentBytes > 0) {
    cfg.segmentBytes = static_cast<size_t>(o.segmentBytes);
  }
  return cfg;
}

// Bytes algorithmFor weighs for `op` on ranks whose inputs are `input`: reduce_scatter's
// input, all_gather's output, every other op's tensor.
size_t choiceBytes(const std::string& op, const at::Tensor& input, int size) {
  const size_t bytes = input.numel() * input.element_size();
  return op == "all_gather" ? bytes * size : bytes;
}

// One run of `op` by rank `b` on `input`, through the backend's public ops, waited for
// up to `wait`; its result.
at::Tensor runOnce(RingBackend& b, const std::string& op, const at::Tensor& input, const InProcessOptions& o,
                   std::chrono::milliseconds wait) {
  const int size = b.getSize();
  const c10d::ReduceOp rop(redOpTypeNamed(o.reduceOp));
  if (op == "allreduce" || op == "broadcast" || op == "reduce") {
    std::vector<at::Tensor> t{input.clone()};
    c10::intrusive_ptr<c10d::Work> work;
    if (op == "allreduce") {
      c10d::AllreduceOptions opts;
      opts.reduceOp = rop;
      work = b.allreduce(t, opts);
    } else if (op == "broadcast") {
      c10d::BroadcastOptions opts;
      opts.rootRank = o.root;
      work = b.broadcast(t, opts);
    } else {
      c10d::ReduceOptions opts;
      opts.rootRank = o.root;
      opts.reduceOp = rop;
      work = b.reduce(t, opts);
    }
    work->wait(wait);
    return t[0];
  }
  at::Tensor in = input.reshape({-1});
  if (op == "reduce_scatter") {
    TORCH_CHECK(in.numel() % size == 0, "ringpg: reduce_scatter's input numel ", in.numel(),
                " is no multiple of the ranks, ", size);
    at::Tensor out = at::empty({in.numel() / size}, in.options());
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = rop;
    b._reduce_scatter_base(out, in, opts)->wait(wait);
    return out;
  }
  TORCH_CHECK(op == "all_gather", "ringpg: no in-process op '", op,
              "' (allreduce, reduce_scatter, all_gather, broadcast, reduce)");
  at::Tensor out = at::empty({in.numel() * size}, in.options());
  c10d::AllgatherOptions opts;
  b._allgather_base(out, in, opts)->wait(wait);
  return out;
}

std::string errorText(std::exception_ptr e) {
  try {
    std::rethrow_exception(std::move(e));
  } catch (const c10::Error& err) {
    return err.what_without_backtrace();
  } catch (const std::exception& err) {
    return err.what();
  }
}

} // namespace

InProcessResult runInProcess(const std::string& op, const std::vector<at::Tensor>& inputs, const InProcessOptions& o) {
  const int size = static_cast<int>(inputs.size());
  TORCH_CHECK(size >= 1, "ringpg: an in-process group needs at least one rank");
  TORCH_CHECK(o.repeat >= 1, "ringpg: repeat must be at least 1, got ", o.repeat);
  for (const auto& t : inputs) {
    TORCH_CHECK(t.is_cpu() && t.is_contiguous(), "ringpg: in-process inputs must be contiguous CPU tensors");
  }
  const Config cfg = configFor(o);
  auto hub = std::make_shared<LoopbackHub>(size);
  std::vector<c10::intrusive_ptr<RingBackend>> groups;
  for (const auto r : c10::irange(size)) {
    groups.push_back(c10::make_intrusive<RingBackend>(loopbackGroupLinks(hub, r), r, size, o.timeout, "in-process", cfg,
                                                      cfg.transport));
  }
  InProcessResult res;
  res.outputs.resize(size);
  res.errors.resize(size);
  res.algorithm = groups[0]->algorithmFor(op, choiceBytes(op, inputs[0], size));
  // A Work's wait ends by its op's deadline; this one only bounds a backend that would not.
  const auto wait = o.timeout * 2;
  const auto start = Clock::now();
  std::vector<std::thread> ranks;
  for (const auto r : c10::irange(size)) {
    if (r == o.absentRank) {
      continue;
    }
    ranks.emplace_back([&, r] {
      try {
        for (int i = 0; i < o.repeat; ++i) {
          res.outputs[r] = runOnce(*groups[r], op, inputs[r], o, wait);
        }
      } catch (...) {
        res.outputs[r] = at::Tensor();
        res.errors[r] = errorText(std::current_exception());
      }
    });
  }
  for (auto& t : ranks) {
    t.join();
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  groups.clear(); // each group stops its worker and engine
  return res;
}

// ---------------------------------------------------------------------------------

namespace {

FrameHeader headerOf(const std::string& raw) {
  TORCH_CHECK(raw.size() == sizeof(FrameHeader), "ringpg: a frame header is ", sizeof(FrameHeader), " bytes, got ",
              raw.size());
  FrameHeader h;
  std::memcpy(&h, raw.data(), sizeof(h));
  return h;
}

} // namespace

EngineProbe::EngineProbe(int rank, int size, const std::vector<std::string>& addrs, const std::vector<uint64_t>& nonces,
                         uint64_t nonce)
    : nonce_(nonce) {
  TORCH_CHECK(size >= 2 && rank >= 0 && rank < size, "ringpg: invalid rank ", rank, " / size ", size);
  TORCH_CHECK(addrs.size() == static_cast<size_t>(size) && nonces.size() == addrs.size(),
              "ringpg: one address and nonce per rank");
  Rendezvous rv;
  SockAddr addr = SockAddr::parse("127.0.0.1:0");
  rv.listener = listenOn(addr, 16);
  address_ = addr.str();
  rv.localAddress = address_;
  rv.nonce = nonce;
  for (const auto q : c10::irange(size)) {
    rv.book.know(q, q == rank ? PeerAddress{address_, nonce} : PeerAddress{addrs[q], nonces[q]});
  }
  engine_ = std::make_unique<Engine>(rank, size, std::move(rv), std::make_shared<GroupFailure>(), /*socketBuffer=*/0,
                                     /*congestion=*/"", /*spinMicros=*/0);
}

EngineProbe::~EngineProbe() {
  engine_.reset(); // fails what is pending before the buffers go
}

int64_t EngineProbe::postSend(int peer, const std::string& hdr, const std::string& payload) {
  auto p = std::make_unique<Posted>();
  p->buffer.assign(payload.begin(), payload.end());
  p->req = engine_->postSend(peer, headerOf(hdr), p->buffer.data(), p->buffer.size());
  posted_.emplace(nextId_, std::move(p));
  return nextId_++;
}

int64_t EngineProbe::postRecv(int peer, const std::string& hdr, size_t nbytes) {
  auto p = std::make_unique<Posted>();
  p->buffer.assign(nbytes, 0);
  p->req = engine_->postRecv(peer, headerOf(hdr), p->buffer.data(), p->buffer.size());
  posted_.emplace(nextId_, std::move(p));
  return nextId_++;
}

std::tuple<std::string, std::string, std::string, int> EngineProbe::wait(int64_t id,
                                                                         std::chrono::milliseconds timeout) {
  auto it = posted_.find(id);
  TORCH_CHECK(it != posted_.end(), "ringpg: no request ", id);
  const Posted& p = *it->second;
  engine_->waitUntil(p.req, Clock::now() + timeout);
  switch (p.req->state.load(std::memory_order_acquire)) {
    case Request::State::Pending:
      return {"pending", "", "", -1};
    case Request::State::Failed:
      return {"failed", p.req->error, "", -1};
    case Request::State::Done:
      break;
  }
  return {"done", "", std::string(p.buffer.begin(), p.buffer.end()), p.req->sourceRank};
}

void EngineProbe::setCurrentCollective(const std::string& hdr) {
  engine_->setCurrentCollective(headerOf(hdr));
}

void EngineProbe::connectPeers(const std::vector<int>& peers, std::chrono::milliseconds timeout) {
  engine_->connectPeers(peers, Clock::now() + timeout);
}

} // namespace ringpg::seams
