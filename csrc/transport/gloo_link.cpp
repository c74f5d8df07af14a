#include "transport/gloo_link.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <exception>

namespace ringpg {

namespace {

// A request carried by Gloo: the Work of the backend's send()/recv() that moves it.
struct GlooRequest : Request {
  c10::intrusive_ptr<c10d::Work> work;
};

// A byte tensor viewing `len` bytes at `data` (Gloo reads or writes them in place).
at::Tensor bytesAt(const void* data, size_t len) {
  return at::from_blob(const_cast<void*>(data), {static_cast<int64_t>(len)}, at::TensorOptions().dtype(at::kByte));
}

// The factory the bindings installed; set once at module load, before any group.
GlooBackendFactory& glooFactory() {
  static GlooBackendFactory factory;
  return factory;
}

} // namespace

void setGlooBackendFactory(GlooBackendFactory factory) {
  glooFactory() = std::move(factory);
}

c10::intrusive_ptr<c10d::Backend> makeGlooBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout) {
  TORCH_CHECK(static_cast<bool>(glooFactory()),
              "ringpg: the gloo transport makes its ProcessGroupGloo through ringpg's Python module, which is not "
              "loaded (import ringpg)");
  auto gloo = glooFactory()(store, rank, size, timeout);
  TORCH_CHECK(gloo && gloo->getSize() == size && gloo->getRank() == rank,
              "ringpg: the Gloo link must be a group of the same ranks");
  return gloo;
}

GlooLink::GlooLink(c10::intrusive_ptr<c10d::Backend> gloo, Engine& engine, int rank, int size)
    : gloo_(std::move(gloo)), engine_(engine), failure_(engine.failure()), rank_(rank), sent_(size, 0),
      received_(size, 0) {
  TORCH_INTERNAL_ASSERT(gloo_ && gloo_->getSize() == size && gloo_->getRank() == rank,
                        "ringpg: the Gloo link's backend must have this group's ranks");
}

int32_t GlooLink::tagOf(const FrameHeader& op, uint32_t index) {
  // The signature's 9 bits: a multiplicative hash of what ranks must agree on.
  uint64_t h = op.opNumel * 0x9E3779B97F4A7C15ULL;
  h ^= (uint64_t{op.opcode} << 16 | uint64_t{op.dtype} << 8 | op.reduceOp) * 0xC2B2AE3D27D4EB4FULL;
  const uint32_t sig = static_cast<uint32_t>(h >> 55); // top 9 bits
  return static_cast<int32_t>(sig << 22 | (op.key & 0xFF) << 14 | (index & 0x3FFF));
}

uint32_t GlooLink::nextIndex(const FrameHeader& op, int peer, std::vector<uint32_t>& counts) {
  if (op.key != countsKey_) {
    // A new op: its messages count from 0 in both directions (ops run one at a time).
    countsKey_ = op.key;
    std::fill(sent_.begin(), sent_.end(), 0);
    std::fill(received_.begin(), received_.end(), 0);
  }
  return counts[peer]++;
}

RequestPtr GlooLink::post(Direction dir, int peer, const FrameHeader& op, const void* data, size_t len) {
  auto req = makeRequest<GlooRequest>(op, data, len, peer);
  req->link = this;
  if (len == 0) {
    // Nothing to move, and the other side posts no empty message either.
    req->state.store(Request::State::Done, std::memory_order_release);
    return req;
  }
  // A peer that left the group (engine.h) takes and sends nothing more: Gloo's send
  // moves only once the receive is posted, so all it sent went to receives posted
  // before it left.  Said at once, in its name, rather than after Gloo's pair fails.
  if (std::string why = engine_.goneFrom(peer); !why.empty()) {
    markFailed(*req, why, /*network=*/true);
    return req;
  }
  std::vector<at::Tensor> t{bytesAt(data, len)};
  try {
    if (dir == Direction::Send) {
      req->work = gloo_->send(t, peer, tagOf(op, nextIndex(op, peer, sent_)));
    } else {
      req->sourceRank = peer;
      req->work = gloo_->recv(t, peer, tagOf(op, nextIndex(op, peer, received_)));
    }
  } catch (const std::exception& e) {
    // Gloo refuses to post on a pair that has already closed: the same loss as a wait
    // that fails, and reported the same way.
    failLost(*req, e.what(), Clock::now() + kCauseGrace);
  }
  return req;
}

void GlooLink::failLost(Request& req, const std::string& error, Deadline deadline) {
  // A peer that failed first sends its Abort frame on its engine socket before it
  // closes its Gloo pairs, so the cause is usually on its way: wait for it briefly
  // (never past the op's deadline), so that every rank names the first failure (a
  // mismatch, a timeout) rather than the closed pair it led to.  A peer that left the
  // group (its engine socket ended between frames) is named as such: this op needed it.
  if (engine_.awaitBroken(std::min(deadline, Clock::now() + kCauseGrace), req.peer)) {
    bool network = true;
    std::string why = failure_.reason(&network);
    if (why.empty()) {
      why = engine_.goneFrom(req.peer);
      network = true;
    }
    markFailed(req, why, network);
    return;
  }
  // Gloo's pair failed: the peer's process or connection is gone.  "Connection closed
  // by peer", gloo's words, is what torchft and scripts match on; Gloo's message says
  // which of the two it saw.
  const std::string why = c10::str("ringpg: rank ", rank_, " lost its Gloo pair to rank ", req.peer,
                                   ": Connection closed by peer (Gloo: ", error,
                                   "; the peer process probably exited, crashed or was killed)");
  failure_.fail(why, /*network=*/true); // every rank hears it at once
  markFailed(req, why, /*network=*/true);
}

RequestPtr GlooLink::postSend(int peer, const FrameHeader& op, const void* data, size_t len) {
  return post(Direction::Send, peer, op, data, len);
}

RequestPtr GlooLink::postRecv(int peer, const FrameHeader& op, void* data, size_t len) {
  return post(Direction::Recv, peer, op, data, len);
}

void GlooLink::abortWaits() {
  std::lock_guard<std::mutex> lk(mu_); // aborted_, waiting_
  aborted_ = true;
  if (waiting_) {
    waiting_->abort(); // Gloo's wait returns false at once (a flag it keeps until then)
  }
}

bool GlooLink::waitUntil(const RequestPtr& r, Deadline deadline) {
  TORCH_INTERNAL_ASSERT(r->link == this);
  auto& req = static_cast<GlooRequest&>(*r);
  if (req.state.load(std::memory_order_acquire) != Request::State::Pending) {
    return true;
  }
  auto failWithEngine = [&] {
    bool network = true;
    markFailed(req, failure_.reason(&network), network);
    req.work.reset(); // withdraws the buffer from Gloo
    return true;
  };
  {
    std::lock_guard<std::mutex> lk(mu_); // aborted_, waiting_
    if (aborted_ || failure_.failed()) {
      return failWithEngine();
    }
    // Registered before the wait: an abortWaits() from here on reaches it.
    waiting_ = req.work.get();
  }
  bool completed = false;
  std::string error;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  try {
    completed = req.work->wait(std::max(left, std::chrono::milliseconds(1)));
  } catch (const std::exception& e) {
    error = e.what();
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    waiting_ = nullptr;
  }
  if (completed && error.empty()) {
    req.work.reset();
    req.progress = req.len;
    req.state.store(Request::State::Done, std::memory_order_release);
    return true;
  }
  if (error.empty() || failure_.failed()) {
    // abortWaits() woke it: the engine broke, and says why.
    return failWithEngine();
  }
  if (Clock::now() >= deadline) {
    // Gloo's own timeout (ours, passed down): the caller reports and breaks the group.
    // The registration stays with the request until the op releases it.
    return false;
  }
  failLost(req, error, deadline);
  req.work.reset();
  return true;
}

} // namespace ringpg
