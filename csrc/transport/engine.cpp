#include "transport/engine.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/errors.h"

namespace ringpg {
namespace {

// Bytes one socket may move per pass of the progress loop, so one busy peer cannot
// starve the others (or keep the lock from posting threads for long).
constexpr size_t kPassBytes = 1 << 20;
// Largest payload the engine will stash for a frame nobody has asked for yet.  A peer
// announcing more is treated as corrupt rather than trusted with an allocation.
constexpr uint64_t kMaxStashBytes = 1ULL << 36;

// Removes and returns the first request in `q` waiting for tag `key`, or null.
RequestPtr takeByTag(std::deque<RequestPtr>& q, uint64_t key) {
  for (auto it = q.begin(); it != q.end(); ++it) {
    if ((*it)->hdr.key == key) {
      RequestPtr r = *it;
      q.erase(it);
      return r;
    }
  }
  return nullptr;
}

std::string abortedBy(int peer, const std::string& why) {
  return c10::str("ringpg: rank ", peer, " aborted the group: ", why);
}

std::string implausibleFrame(int peer, const FrameHeader& h) {
  return c10::str("ringpg: rank ", peer, " announced an implausible ", describeFrame(h));
}

} // namespace

Engine::Engine(int rank, int size, std::vector<Fd> tx, std::vector<Fd> rx, int socketBuffer,
               const std::string& congestion, int spinMicros)
    : rank_(rank), size_(size), spinMicros_(spinMicros), peers_(size) {
  for (const auto q : c10::irange(size)) {
    if (q == rank) {
      continue;
    }
    peers_[q].tx = std::move(tx[q]);
    peers_[q].rx = std::move(rx[q]);
    tuneDataSocket(peers_[q].tx.get(), socketBuffer, congestion);
    tuneDataSocket(peers_[q].rx.get(), socketBuffer, congestion);
    setNonBlocking(peers_[q].tx.get(), true);
    setNonBlocking(peers_[q].rx.get(), true);
  }
  wake_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  TORCH_CHECK(wake_.valid(), "ringpg: eventfd failed: ", std::strerror(errno));
  thread_ = std::thread([this] { loop(); });
}

std::string Engine::congestionControl() const {
  // The sockets are fixed after construction and closed only by the destructor.
  for (const auto& p : peers_) {
    if (p.tx.valid()) {
      return congestionControlOf(p.tx.get());
    }
  }
  return "";
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  wake();
  if (thread_.joinable()) {
    thread_.join();
  }
  Completions done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    failLocked("ringpg: the process group was destroyed", done);
  }
  runCallbacks(done);
}

void Engine::wake() {
  uint64_t one = 1;
  ssize_t rc = ::write(wake_.get(), &one, sizeof(one));
  (void)rc; // a full eventfd counter still wakes poll()
}

std::string Engine::peerLostReason(int p, const char* how) {
  return c10::str("ringpg: rank ", rank_, " lost its connection to rank ", p, ": ", how,
                  " (the peer process probably exited, crashed or was killed)");
}

// The connection to peer p failed (`how`) while this group was healthy.  Before
// blaming the network, reads what p still had in flight and looks for the real cause:
//   - an Abort frame: p's group failed first and p said why before closing;
//   - a frame of the op running here with another op/dtype/size: the ranks called
//     different collectives, p saw it first and closed (its Abort could not follow a
//     frame it was half-way through writing).
// Without this, the rank whose *write* fails first reports "broken pipe" although the
// reason is sitting, unread, in its receive buffer.  The group is about to fail, so the
// bytes consumed here are never delivered to anyone.  Bounded in time (a peer that is
// really gone gives end-of-stream at once) and in bytes; best effort.
void Engine::failLostPeerLocked(int p, const std::string& how, std::unique_lock<std::mutex>& lk, Completions& done) {
  Peer& P = peers_[p];
  if (!broken_.empty() || P.rxBusy || !P.rx.valid()) {
    failLocked(peerLostReason(p, how.c_str()), done);
    return;
  }
  // The receive state machine as it stands; only the rxBusy holder touches it.
  FrameHeader h = P.hdr;
  size_t hdrGot = P.headerReady && !P.inPayload ? sizeof(FrameHeader) : P.hdrGot;
  size_t skip = P.inPayload ? P.hdr.nbytes - P.payloadGot : 0; // payload left of the current frame
  std::string abortWhy;
  bool inAbort = P.inPayload && P.stashTarget && hasKind(P.hdr, FrameKind::Abort);
  if (inAbort) {
    abortWhy.assign(P.stashing.data.data(), P.payloadGot);
  }
  const bool haveOp = haveCurrent_;
  const FrameHeader op = currentOp_;
  const int fd = P.rx.get();

  std::string reason;
  bool network = true;
  P.rxBusy = true;
  lk.unlock();
  {
    constexpr auto kPatience = std::chrono::milliseconds(200);
    constexpr size_t kMaxDrainBytes = size_t(256) << 20;
    const auto until = std::chrono::steady_clock::now() + kPatience;
    std::vector<char> sink(64 << 10);
    size_t drained = 0;
    while (reason.empty() && drained < kMaxDrainBytes) {
      if (hdrGot == sizeof(FrameHeader)) { // a whole header: what does it say?
        hdrGot = 0;
        if (h.magic != kFrameMagic) {
          break;
        }
        skip = h.nbytes;
        inAbort = hasKind(h, FrameKind::Abort);
        if (inAbort && h.nbytes > kMaxAbortBytes) {
          break;
        }
        if (hasKind(h, FrameKind::Collective) && haveOp && h.key == op.key &&
            !ofSameOp(op, h)) {
          reason = runningOpMismatch(rank_, p, op, h);
          network = false;
          break;
        }
      }
      if (inAbort && skip == 0) {
        reason = abortedBy(p, abortWhy);
        break;
      }
      char* dst = skip > 0 ? sink.data() : reinterpret_cast<char*>(&h) + hdrGot;
      const size_t want = skip > 0 ? std::min(skip, sink.size()) : sizeof(FrameHeader) - hdrGot;
      const ssize_t r = ::recv(fd, dst, want, MSG_DONTWAIT);
      if (r > 0) {
        drained += static_cast<size_t>(r);
        if (skip > 0) {
          skip -= static_cast<size_t>(r);
          if (inAbort) {
            abortWhy.append(dst, static_cast<size_t>(r));
          }
        } else {
          hdrGot += static_cast<size_t>(r);
        }
        continue;
      }
      if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        break; // end of stream or a dead socket: nothing more to learn
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        break;
      }
      pollfd pfd{fd, POLLIN, 0};
      (void)::poll(&pfd, 1, static_cast<int>(left.count()));
    }
  }
  lk.lock();
  P.rxBusy = false;
  // Whatever was consumed left the state machine behind: nothing reads this socket
  // again, because the group fails now (first reason wins if another thread was first).
  failLocked(reason.empty() ? peerLostReason(p, how.c_str()) : reason, done, network);
}

RequestPtr makeRequest(const FrameHeader& hdr, const void* buf, size_t len, int peer) {
  auto req = std::make_shared<Request>();
  req->hdr = hdr;
  req->hdr.nbytes = len;
  req->buf = static_cast<char*>(const_cast<void*>(buf));
  req->len = len;
  req->peer = peer;
  return req;
}

RequestPtr Engine::postSend(int peer, const FrameHeader& hdr, const void* data, size_t len,
                            std::function<void(Request&)> onComplete) {
  RequestPtr req = makeRequest(hdr, data, len, peer);
  req->hdr.magic = kFrameMagic;
  req->onComplete = std::move(onComplete);
  Completions done;
  bool needWake = false;
  {
    std::unique_lock<std::mutex> lk(mu_);
    Peer& P = peers_[peer];
    if (!broken_.empty()) {
      failRequest(req, broken_, done, brokenNetwork_);
    } else if (P.gone) {
      failRequest(req, c10::str("ringpg: rank ", peer, " has shut down this process group"), done);
    } else {
      const bool wasIdle = P.txq.empty() && !P.txBusy;
      P.txq.push_back(req);
      // Write eagerly from the posting thread when the socket is idle: small messages
      // then leave without a wake-up of the progress thread.
      if (wasIdle) {
        writePeer(peer, lk, done);
      }
      needWake = !P.txq.empty();
    }
  }
  if (needWake) {
    wake();
  }
  runCallbacks(done);
  return req;
}

RequestPtr Engine::postRecv(int peer, const FrameHeader& expect, void* data, size_t len,
                            std::function<void(Request&)> onComplete) {
  RequestPtr req = makeRequest(expect, data, len, peer);
  req->onComplete = std::move(onComplete);
  Completions done;
  bool needWake = false;
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (!broken_.empty()) {
      failRequest(req, broken_, done, brokenNetwork_);
    } else if (peer >= 0 && peers_[peer].gone) {
      failRequest(req, c10::str("ringpg: rank ", peer, " has shut down this process group"), done);
    } else if (hasKind(expect, FrameKind::Collective)) {
      Peer& P = peers_[peer];
      P.collPosted.push_back(req);
      drainStash(peer, done);
      // A paused header may be waiting for exactly this receive.
      if (P.headerReady && !P.inPayload && !P.collPosted.empty()) {
        if (routeHeader(peer, done)) {
          // Its payload is most likely in the socket already (the peer was ahead of
          // us): read it from this thread, as postSend writes eagerly, instead of
          // waking the progress thread to read it and then wake us.  The progress
          // thread is still woken: it stopped polling this socket while paused.
          readPeer(peer, lk, done);
          needWake = true;
        }
      }
    } else if (!matchP2PStash(req, done)) {
      if (peer >= 0) {
        peers_[peer].p2pPosted.push_back(req);
      } else {
        anyPosted_.push_back(req);
      }
      needWake = true;
    }
  }
  if (needWake) {
    wake();
  }
  runCallbacks(done);
  return req;
}

bool Engine::waitUntil(const RequestPtr& req, Deadline deadline) {
  if (spinMicros_ > 0 && req->peer >= 0) {
    // Spin phase: the waiting thread moves its peer's bytes itself, so a frame that
    // arrives now completes the request here, without the progress thread waking up
    // and then waking us (two scheduler hand-offs, most of a small op's latency).  It
    // yields between looks: on a host with more busy threads than cores, the thread
    // it would otherwise starve may be the very peer rank it waits for.
    const auto spinEnd = std::min(deadline, Clock::now() + std::chrono::microseconds(spinMicros_));
    while (req->state.load(std::memory_order_acquire) == Request::State::Pending && Clock::now() < spinEnd) {
      pollPeer(req->peer);
      std::this_thread::yield();
    }
  }
  if (req->state.load(std::memory_order_acquire) != Request::State::Pending) {
    return true;
  }
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_until(lk, deadline, [&] {
    return req->state.load(std::memory_order_acquire) != Request::State::Pending;
  });
}

void Engine::pollPeer(int p) {
  Completions done;
  {
    std::unique_lock<std::mutex> lk(mu_);
    Peer& P = peers_[p];
    if (broken_.empty() && !stop_ && !P.gone) {
      if (!P.txq.empty() && !P.txBusy) {
        writePeer(p, lk, done);
      }
      if (broken_.empty() && P.rx.valid()) {
        readPeer(p, lk, done); // returns at once when paused, busy elsewhere or empty
      }
    }
  }
  runCallbacks(done);
}

void Engine::setCurrentCollective(const FrameHeader& op) {
  std::lock_guard<std::mutex> lk(mu_);
  haveCurrent_ = true;
  currentOp_ = op;
}

void Engine::fail(const std::string& reason, bool network) {
  Completions done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    failLocked(reason, done, network);
  }
  wake();
  runCallbacks(done);
}

std::string Engine::brokenReason(bool* network) {
  std::lock_guard<std::mutex> lk(mu_);
  if (network) {
    *network = brokenNetwork_;
  }
  return broken_;
}

void Engine::debugSendRaw(int peer, std::string bytes) {
  auto req = std::make_shared<Request>();
  std::lock_guard<std::mutex> lk(mu_);
  rawKeepAlive_.push_back(std::move(bytes));
  const std::string& raw = rawKeepAlive_.back();
  // A header-less request: progress starts past the header, so only `raw` is written.
  req->buf = const_cast<char*>(raw.data());
  req->len = raw.size();
  req->progress = sizeof(FrameHeader);
  req->peer = peer;
  peers_[peer].txq.push_back(req);
  wake();
}

void Engine::shutdown(Deadline deadline) {
  std::vector<RequestPtr> byes;
  for (const auto q : c10::irange(size_)) {
    if (q == rank_) {
      continue;
    }
    byes.push_back(postSend(q, frameOfKind(FrameKind::Bye), nullptr, 0));
  }
  for (auto& b : byes) {
    waitUntil(b, deadline); // best effort: a dead peer must not delay shutdown past the deadline
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  wake();
  if (thread_.joinable()) {
    thread_.join();
  }
}

// ---------------------------------------------------------------------------------
// Progress loop

void Engine::loop() {
  std::vector<pollfd> fds;
  std::vector<std::pair<int, bool>> who; // (peer, isTx) per pollfd after the first
  while (true) {
    fds.clear();
    who.clear();
    fds.push_back(pollfd{wake_.get(), POLLIN, 0});
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) {
        return;
      }
      if (broken_.empty()) {
        for (const auto q : c10::irange(size_)) {
          Peer& P = peers_[q];
          if (q == rank_ || P.gone) {
            continue;
          }
          // A paused header waits for its receive to be posted: stop reading (flow control).
          if (!(P.headerReady && !P.inPayload) && P.rx.valid()) {
            fds.push_back(pollfd{P.rx.get(), POLLIN, 0});
            who.emplace_back(q, false);
          }
          if (!P.txq.empty() && !P.txBusy) {
            fds.push_back(pollfd{P.tx.get(), POLLOUT, 0});
            who.emplace_back(q, true);
          }
        }
      }
    }
    int n = ::poll(fds.data(), fds.size(), -1);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      fail(c10::str("ringpg: poll failed on rank ", rank_, ": ", std::strerror(errno)));
      continue;
    }
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      while (::read(wake_.get(), &v, sizeof(v)) > 0) {
      }
    }
    Completions done;
    {
      std::unique_lock<std::mutex> lk(mu_);
      for (size_t i = 1; i < fds.size() && broken_.empty() && !stop_; ++i) {
        if (fds[i].revents == 0) {
          continue;
        }
        const auto [q, isTx] = who[i - 1];
        if (isTx) {
          if (!peers_[q].txBusy) { // else a posting thread is writing this socket now
            writePeer(q, lk, done);
          }
        } else {
          readPeer(q, lk, done);
        }
      }
    }
    runCallbacks(done);
  }
}

void Engine::runCallbacks(Completions& done) {
  if (done.empty()) {
    return;
  }
  {
    // Taking the lock orders the notify after waiters' predicate checks.
    std::lock_guard<std::mutex> lk(mu_);
  }
  cv_.notify_all();
  for (auto& r : done) {
    if (r->onComplete) {
      auto cb = std::move(r->onComplete);
      r->onComplete = nullptr;
      cb(*r);
    }
  }
  done.clear();
}

void Engine::complete(const RequestPtr& req, Completions& done) {
  req->state.store(Request::State::Done, std::memory_order_release);
  done.push_back(req);
}

void markFailed(Request& req, const std::string& why, bool network) {
  req.error = why;
  req.networkError = network;
  req.state.store(Request::State::Failed, std::memory_order_release);
}

void Engine::failRequest(const RequestPtr& req, const std::string& why, Completions& done, bool network) {
  markFailed(*req, why, network);
  done.push_back(req);
}

void Engine::failLocked(const std::string& reason, Completions& done, bool network) {
  if (broken_.empty()) {
    broken_ = reason;
    brokenNetwork_ = network;
    brokenFlag_.store(true, std::memory_order_release);
    if (!stop_) {
      broadcastAbortLocked(); // not while being destroyed: peers got a goodbye already
    }
  }
  auto failAll = [&](std::deque<RequestPtr>& q) {
    for (auto& r : q) {
      failRequest(r, broken_, done, brokenNetwork_);
    }
    q.clear();
  };
  for (auto& P : peers_) {
    if (P.txBusy && !P.txq.empty()) {
      // Its writer fails it once send() returns (see writePeer).
      P.txq.pop_front();
    }
    failAll(P.txq);
    failAll(P.collPosted);
    failAll(P.p2pPosted);
    if (P.cur && !P.rxBusy) { // a busy reader fails its own request (see readPeer)
      // A receive in flight whose payload will never come: fail it; nothing touches
      // its buffer again because a broken engine reads no more.
      failRequest(P.cur, broken_, done, brokenNetwork_);
      P.cur.reset();
    }
    P.collStash.clear();
    P.p2pStash.clear();
  }
  failAll(anyPosted_);
}

// Best effort, never blocking: tell each peer why this group failed, then close.  A
// socket in the middle of a frame cannot carry a new one; closing it still tells the
// peer (a truncated frame, then end of stream).
void Engine::broadcastAbortLocked() {
  FrameHeader h = frameOfKind(FrameKind::Abort);
  const std::string why = broken_.substr(0, kMaxAbortBytes);
  h.nbytes = why.size();
  for (const auto q : c10::irange(size_)) {
    Peer& P = peers_[q];
    if (q == rank_ || !P.tx.valid()) {
      continue;
    }
    const bool midFrame = P.txBusy || (!P.txq.empty() && P.txq.front()->progress > 0);
    if (!midFrame && !P.gone) {
      iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(why.data()), why.size()}};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = 2;
      (void)::sendmsg(P.tx.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    ::shutdown(P.tx.get(), SHUT_RDWR);
    if (P.rx.valid()) {
      ::shutdown(P.rx.get(), SHUT_RDWR);
    }
  }
}

// ---------------------------------------------------------------------------------
// Sending

bool Engine::writePeer(int p, std::unique_lock<std::mutex>& lk, Completions& done) {
  Peer& P = peers_[p];
  if (P.txBusy) {
    return true; // another thread is writing this socket right now
  }
  size_t budget = kPassBytes;
  while (!P.txq.empty() && budget > 0 && broken_.empty()) {
    RequestPtr req = P.txq.front();
    const size_t total = sizeof(FrameHeader) + req->len;
    iovec iov[2];
    int cnt = 0;
    if (req->progress < sizeof(FrameHeader)) {
      iov[cnt++] = iovec{reinterpret_cast<char*>(&req->hdr) + req->progress,
                         sizeof(FrameHeader) - req->progress};
      if (req->len > 0) {
        iov[cnt++] = iovec{req->buf, std::min(req->len, budget)};
      }
    } else {
      const size_t off = req->progress - sizeof(FrameHeader);
      iov[cnt++] = iovec{req->buf + off, std::min(req->len - off, budget)};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = cnt;
    P.txBusy = true;
    lk.unlock();
    ssize_t w = ::sendmsg(P.tx.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    const int err = errno;
    lk.lock();
    P.txBusy = false;
    if (!broken_.empty()) {
      // The group failed while we were writing; failLocked left this request to us.
      failRequest(req, broken_, done, brokenNetwork_);
      return false;
    }
    if (w < 0) {
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) {
        return true;
      }
      failLostPeerLocked(p, std::strerror(err), lk, done);
      return false;
    }
    req->progress += static_cast<size_t>(w);
    budget -= std::min(budget, static_cast<size_t>(w));
    if (req->progress == total) {
      P.txq.pop_front(); // still `req`: only the txBusy holder pops the head
      complete(req, done);
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------
// Receiving

bool Engine::readPeer(int p, std::unique_lock<std::mutex>& lk, Completions& done) {
  Peer& P = peers_[p];
  if (P.rxBusy) {
    return true; // another thread is reading this socket right now
  }
  size_t budget = kPassBytes;
  while (budget > 0 && broken_.empty()) {
    if (P.headerReady && !P.inPayload) {
      return true; // paused: waits for a receive to be posted
    }
    char* dst;
    size_t want;
    if (!P.inPayload) {
      dst = reinterpret_cast<char*>(&P.hdr) + P.hdrGot;
      want = sizeof(FrameHeader) - P.hdrGot;
    } else {
      const size_t n = P.hdr.nbytes;
      if (P.cur) {
        dst = P.cur->buf + P.payloadGot;
      } else {
        dst = P.stashing.data.data() + P.payloadGot;
      }
      want = std::min(n - P.payloadGot, budget);
    }
    P.rxBusy = true;
    RequestPtr into = P.cur; // keeps the destination's request alive across the unlock
    lk.unlock();
    ssize_t r = ::recv(P.rx.get(), dst, want, MSG_DONTWAIT);
    const int err = errno;
    lk.lock();
    P.rxBusy = false;
    if (!broken_.empty()) {
      // The group failed while we were reading; failLocked left this request to us.
      if (into && into->state.load() == Request::State::Pending) {
        failRequest(into, broken_, done, brokenNetwork_);
      }
      P.cur.reset();
      return false;
    }
    if (r == 0) {
      if (!P.inPayload && P.hdrGot == 0 && P.gone) {
        return true;
      }
      failLostPeerLocked(p, "connection closed by peer", lk, done);
      return false;
    }
    if (r < 0) {
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) {
        return true;
      }
      failLostPeerLocked(p, std::strerror(err), lk, done);
      return false;
    }
    budget -= std::min(budget, static_cast<size_t>(r));
    if (!P.inPayload) {
      P.hdrGot += static_cast<size_t>(r);
      if (P.hdrGot < sizeof(FrameHeader)) {
        continue;
      }
      P.headerReady = true;
      if (!routeHeader(p, done)) {
        return true; // paused, or broken
      }
    } else {
      P.payloadGot += static_cast<size_t>(r);
      if (P.payloadGot == P.hdr.nbytes) {
        finishPayload(p, done);
      }
    }
  }
  return true;
}

// Decides where the payload of a complete header goes.  Returns true when the
// payload phase started (or the frame was fully handled), false when paused/broken.
bool Engine::routeHeader(int p, Completions& done) {
  Peer& P = peers_[p];
  const FrameHeader& h = P.hdr;
  if (h.magic != kFrameMagic) {
    failLocked(c10::str("ringpg: rank ", rank_, " received a corrupt frame from rank ", p,
                        " (bad magic 0x", std::hex, h.magic, "); closing the group"),
               done);
    return false;
  }
  P.cur.reset();
  P.stashTarget = false;
  P.payloadGot = 0;
  switch (static_cast<FrameKind>(h.kind)) {
    case FrameKind::Bye: {
      P.gone = true;
      P.headerReady = false;
      P.hdrGot = 0;
      // Receives still waiting on this peer can never complete.
      const std::string why = c10::str("ringpg: rank ", p, " has shut down this process group");
      for (auto& r : P.collPosted) failRequest(r, why, done);
      for (auto& r : P.p2pPosted) failRequest(r, why, done);
      P.collPosted.clear();
      P.p2pPosted.clear();
      return true;
    }
    case FrameKind::Abort:
      if (h.nbytes > kMaxAbortBytes) {
        failLocked(c10::str("ringpg: rank ", p, " sent an oversized ", describeFrame(h)), done);
        return false;
      }
      P.stashTarget = true; // read the reason, then fail (finishPayload)
      break;
    case FrameKind::Collective: {
      if (!P.collPosted.empty()) {
        const RequestPtr& want = P.collPosted.front();
        if (!sameCollective(want->hdr, h)) {
          failLocked(collectiveMismatch(rank_, p, want->hdr, h), done, /*network=*/false);
          return false;
        }
        P.cur = want;
        P.collPosted.pop_front();
      } else if (haveCurrent_ && h.key == currentOp_.key) {
        // Pause: the running op will post this receive next.  Whatever can be checked
        // is checked now, because an op that runs over shared memory may never post it.
        if (!ofSameOp(currentOp_, h)) {
          failLocked(runningOpMismatch(rank_, p, currentOp_, h), done, /*network=*/false);
        } else if (h.nbytes > kMaxStashBytes) {
          failLocked(implausibleFrame(p, h), done);
        }
        return false;
      } else if (!haveCurrent_ || h.key > currentOp_.key) {
        P.stashTarget = true;
      } else {
        failLocked(c10::str("ringpg: rank ", rank_, " received ", describeFrame(h), " from rank ", p,
                            " for an op that already finished here (seq ", currentOp_.key,
                            " is running): the ranks disagree on the collectives they called"),
                   done, /*network=*/false);
        return false;
      }
      break;
    }
    case FrameKind::P2P: {
      P.cur = takeP2PReceiver(p, h.key);
      if (!P.cur) {
        P.stashTarget = true;
      } else if (P.cur->len != h.nbytes) {
        // The user posted a receive of another size: that receive fails, the payload
        // is read aside so the stream stays in step.
        failRequest(P.cur, p2pSizeMismatch(rank_, p, P.cur->len, h.key, h.nbytes), done, /*network=*/false);
        P.cur.reset();
        P.stashTarget = true; // read into a throw-away buffer
        P.hdr.kind = 0;       // marks the stash as discard
      }
      break;
    }
    default:
      failLocked(c10::str("ringpg: rank ", rank_, " received a corrupt frame from rank ", p,
                          " (unknown kind ", int(h.kind), ")"),
                 done);
      return false;
  }
  if (P.stashTarget) {
    // Whatever is read aside (stashed, discarded or an abort reason) is bounded before
    // anything is allocated for it: a peer's length is never trusted with memory.
    if (P.hdr.nbytes > kMaxStashBytes) {
      failLocked(implausibleFrame(p, P.hdr), done);
      return false;
    }
    try {
      P.stashing.hdr = P.hdr;
      P.stashing.data.assign(P.hdr.nbytes, 0);
    } catch (const std::bad_alloc&) {
      failLocked(c10::str("ringpg: out of memory stashing ", describeFrame(P.hdr), " from rank ", p), done);
      return false;
    }
  }
  P.headerReady = false;
  P.inPayload = true;
  if (P.hdr.nbytes == 0) {
    finishPayload(p, done);
  }
  return true;
}

void Engine::finishPayload(int p, Completions& done) {
  Peer& P = peers_[p];
  P.inPayload = false;
  P.hdrGot = 0;
  P.payloadGot = 0;
  if (P.cur) {
    P.cur->sourceRank = p;
    complete(P.cur, done);
    P.cur.reset();
    return;
  }
  if (!P.stashTarget) {
    return;
  }
  P.stashTarget = false;
  Stashed s = std::move(P.stashing);
  P.stashing = Stashed{};
  switch (static_cast<FrameKind>(s.hdr.kind)) {
    case FrameKind::Collective:
      P.collStash.push_back(std::move(s));
      drainStash(p, done);
      break;
    case FrameKind::P2P:
      P.p2pStash.push_back(std::move(s));
      drainStash(p, done);
      break;
    case FrameKind::Abort:
      failLocked(abortedBy(p, std::string(s.data.begin(), s.data.end())),
                 done, /*network=*/true);
      break;
    default:
      break; // discarded payload
  }
}

// Matches stashed frames of peer p with receives posted since they arrived.
void Engine::drainStash(int p, Completions& done) {
  Peer& P = peers_[p];
  while (!P.collStash.empty() && !P.collPosted.empty()) {
    Stashed& s = P.collStash.front();
    RequestPtr req = P.collPosted.front();
    if (!sameCollective(req->hdr, s.hdr)) {
      failLocked(collectiveMismatch(rank_, p, req->hdr, s.hdr), done, /*network=*/false);
      return;
    }
    P.collPosted.pop_front();
    deliverStashed(req, s, p, done);
    P.collStash.pop_front();
  }
  // A p2p frame that just got stashed may match a receive posted meanwhile.
  for (auto it = P.p2pStash.begin(); it != P.p2pStash.end();) {
    RequestPtr match = takeP2PReceiver(p, it->hdr.key);
    if (!match) {
      ++it;
      continue;
    }
    deliverStashed(match, *it, p, done);
    it = P.p2pStash.erase(it);
  }
}

RequestPtr Engine::takeP2PReceiver(int p, uint64_t tag) {
  RequestPtr r = takeByTag(peers_[p].p2pPosted, tag);
  return r ? r : takeByTag(anyPosted_, tag);
}

void Engine::deliverStashed(const RequestPtr& req, const Stashed& s, int from, Completions& done) {
  if (req->len != s.data.size()) {
    // Only a p2p receive can differ in size here: collective sizes were compared already.
    failRequest(req, p2pSizeMismatch(rank_, from, req->len, s.hdr.key, s.data.size()), done, /*network=*/false);
    return;
  }
  if (!s.data.empty()) {
    std::memcpy(req->buf, s.data.data(), s.data.size());
  }
  req->sourceRank = from;
  complete(req, done);
}

bool Engine::matchP2PStash(const RequestPtr& req, Completions& done) {
  for (const auto q : c10::irange(size_)) {
    if (q == rank_ || (req->peer >= 0 && req->peer != q)) {
      continue;
    }
    auto& stash = peers_[q].p2pStash;
    for (auto it = stash.begin(); it != stash.end(); ++it) {
      if (it->hdr.key == req->hdr.key) {
        deliverStashed(req, *it, q, done);
        stash.erase(it);
        return true;
      }
    }
  }
  return false;
}

void throwRequestError(const OpTag& tag, const Request& req) {
  const std::string msg = c10::str(describe(tag), ": ", req.error);
  if (req.networkError) {
    throwNetwork(msg);
  }
  throwBackend(msg);
}

} // namespace ringpg
