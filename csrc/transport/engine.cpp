// The engine (engine.h): construction, the API and its waits, the progress loop, and
// completions.  Its other rooms: engine_dial.cpp, engine_failure.cpp, engine_frames.cpp.
#include "transport/engine.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/errors.h"
#include "common/host.h"
#include "transport/engine_internal.h"

namespace ringpg {

namespace {

using RxState = FrameReceiver::State;

} // namespace

Engine::Engine(int rank, int size, Rendezvous rv, std::shared_ptr<GroupFailure> failure, int socketBuffer,
               const std::string& congestion, int spinMicros, std::chrono::milliseconds helloWindow)
    : rank_(rank), size_(size), spinMicros_(spinMicros), helloWindow_(helloWindow), socketBuffer_(socketBuffer),
      congestion_(congestion), nonce_(rv.nonce), book_(std::move(rv.book)), listener_(std::move(rv.listener)),
      failure_(std::move(failure)) {
  TORCH_INTERNAL_ASSERT(failure_ != nullptr);
  if (listener_.valid()) {
    setNonBlocking(listener_.get(), true);
  }
  wake_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  TORCH_CHECK(wake_.valid(), "ringpg: eventfd failed: ", std::strerror(errno));
  thread_ = std::thread([this] {
    nameThisThread("ringpg-engine");
    loop();
  });
  // Last: a constructor that throws leaves no listener on a half-built engine.
  failureToken_ = failure_->listen([this] { onGroupFailed(); });
  if (failure_->failed()) {
    onGroupFailed(); // the group failed before this engine listened
  }
}

std::string Engine::congestionControl() {
  std::lock_guard<std::mutex> lk(mu_); // sockets appear as peers connect
  for (const int q : peers_.used()) {
    if (peers_[q].txFd.valid()) {
      return congestionControlOf(peers_[q].txFd.get());
    }
  }
  return "";
}

void Engine::connectPeers(const std::vector<int>& peers, Deadline deadline) {
  Completions done;
  {
    std::lock_guard<std::mutex> lk(mu_); // the peers' dial states
    for (const int q : peers) {
      if (q != rank_ && peers_[q].dial == Dial::kNone && !stopped_) {
        startDialLocked(q, done);
      }
    }
  }
  wake();
  runCallbacks(done);
  std::unique_lock<std::mutex> lk(mu_); // cv_'s mutex: connection events notify it (serviceReady)
  const auto missing = [&] {
    std::vector<int> m;
    for (const int q : peers) {
      if (q != rank_ && (peers_[q].dial != Dial::kOpen || !peers_[q].rxFd.valid())) {
        m.push_back(q);
      }
    }
    return m;
  };
  // A peer that left while the group is being made will take part in none of it.
  const auto gone = [&] {
    for (const int q : peers) {
      if (q != rank_ && peers_[q].presence != Presence::kPresent) {
        return q;
      }
    }
    return -1;
  };
  cv_.wait_until(lk, deadline, [&] { return stopped_ || gone() >= 0 || missing().empty(); });
  if (stopped_) {
    throwNetwork(failure_->reason());
  }
  if (const int q = gone(); q >= 0) {
    throwNetwork(c10::str(goneReasonLocked(q), " (during group creation)"));
  }
  const std::vector<int> left = missing();
  if (!left.empty()) {
    std::string names;
    for (const int q : left) {
      names += c10::str(names.empty() ? "" : ", ", q, " (", book_.describe(q), ")");
    }
    throwNetwork(c10::str("ringpg: rank ", rank_, " timed out during group creation waiting for its connections ",
                          "with rank(s) ", names, ": is each of them alive, and its address reachable from here?"));
  }
}

std::vector<int> Engine::connectedPeers() {
  std::lock_guard<std::mutex> lk(mu_); // the peers' sockets
  std::vector<int> connected;
  for (const int q : peers_.used()) {
    if (peers_[q].txFd.valid() || peers_[q].rxFd.valid()) {
      connected.push_back(q);
    }
  }
  std::sort(connected.begin(), connected.end());
  return connected;
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(mu_); // stop_ is read by the progress thread under mu_
    stop_ = true;
  }
  wake();
  if (thread_.joinable()) {
    thread_.join();
  }
  Completions done;
  {
    std::lock_guard<std::mutex> lk(mu_); // waiters may still look at the queues
    failLocked("ringpg: the process group was destroyed", done);
  }
  runCallbacks(done); // the group's listeners, this engine's among them, run here
  failure_->unlisten(failureToken_); // after the last notify() this engine can cause
}

void Engine::wake() {
  uint64_t one = 1;
  ssize_t rc = ::write(wake_.get(), &one, sizeof(one));
  (void)rc; // a full eventfd counter still wakes poll()
}

RequestPtr Engine::postSend(int peer, const FrameHeader& hdr, const void* data, size_t len,
                            std::function<void(Request&)> onComplete) {
  RequestPtr req = makeRequest(hdr, data, len, peer);
  req->hdr.magic = kFrameMagic;
  req->onComplete = std::move(onComplete);
  Completions done;
  bool needWake = false;
  {
    std::unique_lock<std::mutex> lk(mu_); // the send queue; writePeer drops it around send()
    Peer& P = peers_[peer];
    if (stopped_) {
      failWithGroupLocked(req, done);
    } else if (P.presence != Presence::kPresent) {
      failRequest(req, goneReasonLocked(peer), done);
    } else {
      const bool wasIdle = P.txq.empty() && !P.txBusy;
      P.txq.push_back(req);
      if (P.dial == Dial::kNone) {
        startDialLocked(peer, done); // its first use: the progress thread finishes the dial
      }
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
    std::unique_lock<std::mutex> lk(mu_); // the posted queues and stashes; readPeer drops it around recv()
    // A peer that has left may have sent this frame before it did: the stash is
    // matched first, and only a receive it leaves unmatched fails.
    if (stopped_) {
      failWithGroupLocked(req, done);
    } else if (hasKind(expect, FrameKind::Collective)) {
      Peer& P = peers_[peer];
      P.collPosted.push_back(req);
      drainStash(peer, done);
      if (P.presence != Presence::kPresent) {
        failPostedToGoneLocked(peer, done);
      } else if (P.rx.state() == RxState::kPaused && !P.rxBusy && !P.collPosted.empty()) {
        // A paused header may be waiting for exactly this receive.  (A paused socket
        // that is busy is being read by the failure path: the group fails next.)
        routeHeader(peer, done);
        if (!stopped_ && P.rx.readsSocket()) {
          // Its payload is most likely in the socket already (the peer was ahead of
          // us): read it from this thread, as postSend writes eagerly, instead of
          // waking the progress thread to read it and then wake us.  The progress
          // thread is still woken: it stopped polling this socket while paused.
          readPeer(peer, lk, done);
          needWake = true;
        }
      }
    } else if (!matchP2PStash(req, done)) {
      if (peer >= 0 && peers_[peer].presence != Presence::kPresent) {
        failRequest(req, goneReasonLocked(peer), done);
      } else if (peer >= 0) {
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
  std::unique_lock<std::mutex> lk(mu_); // cv_'s mutex: completions notify after taking it
  return cv_.wait_until(lk, deadline,
                        [&] { return req->state.load(std::memory_order_acquire) != Request::State::Pending; });
}

void Engine::pollPeer(int p) {
  Completions done;
  {
    std::unique_lock<std::mutex> lk(mu_); // peer p's queues and receive state
    Peer& P = peers_[p];
    if (!stopped_ && !stop_ && !P.rx.closed()) {
      if (!P.txq.empty() && !P.txBusy) {
        writePeer(p, lk, done);
      }
      if (!stopped_ && P.rxFd.valid()) {
        readPeer(p, lk, done); // returns at once when paused, busy elsewhere or empty
      }
    }
  }
  runCallbacks(done);
}

void Engine::setCurrentCollective(const FrameHeader& op) {
  std::lock_guard<std::mutex> lk(mu_); // currentOp_ is read by routing, under mu_
  haveCurrent_ = true;
  currentOp_ = op;
}

void Engine::onGroupFailed() {
  Completions done;
  {
    std::lock_guard<std::mutex> lk(mu_); // every queue
    bool network = true;
    BreakCause cause = BreakCause::Local;
    const std::string why = failure_->reason(&network, &cause);
    failLocked(why, done, network, cause); // recorded already: stops traffic, tells the peers
  }
  wake();
  runCallbacks(done);
  notifyWaiters(); // awaitBroken and connectPeers wait for the failure itself
}

bool Engine::awaitBroken(Deadline deadline, int peer) {
  // cv_'s mutex; breaking and a peer's leaving always notify it (failLocked, markGoneLocked).
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_until(lk, deadline,
                        [&] { return stopped_ || (peer >= 0 && peers_[peer].presence != Presence::kPresent); });
}

void Engine::debugSendRaw(int peer, std::string bytes) {
  auto req = std::make_shared<Request>();
  Completions done;
  {
    std::lock_guard<std::mutex> lk(mu_); // rawKeepAlive_, the send queue and the dial state
    rawKeepAlive_.push_back(std::move(bytes));
    const std::string& raw = rawKeepAlive_.back();
    // A header-less request: progress starts past the header, so only `raw` is written.
    req->buf = const_cast<char*>(raw.data());
    req->len = raw.size();
    req->progress = sizeof(FrameHeader);
    req->peer = peer;
    peers_[peer].txq.push_back(req);
    if (peers_[peer].dial == Dial::kNone && !stopped_) {
      startDialLocked(peer, done);
    }
  }
  wake();
  runCallbacks(done);
}

std::string Engine::goneFrom(int peer) {
  if (!anyGone()) {
    return ""; // the common case, without the lock
  }
  std::lock_guard<std::mutex> lk(mu_); // the peers' presence
  return goneReasonLocked(peer);
}

void Engine::shutdown(Deadline deadline) {
  {
    std::lock_guard<std::mutex> lk(mu_); // leaving_ is read by the failure path under mu_
    leaving_ = true;
  }
  std::vector<int> connected; // a peer never dialled has nothing to be told
  {
    std::lock_guard<std::mutex> lk(mu_); // the dial states
    for (const int q : peers_.used()) {
      if (q != rank_ && peers_[q].dial != Dial::kNone) {
        connected.push_back(q);
      }
    }
  }
  std::vector<RequestPtr> byes;
  for (const int q : connected) {
    byes.push_back(postSend(q, frameOfKind(FrameKind::Bye), nullptr, 0));
  }
  for (auto& b : byes) {
    waitUntil(b, deadline); // best effort: a dead peer must not delay shutdown past the deadline
  }
  {
    std::lock_guard<std::mutex> lk(mu_); // stop_ is read by the progress thread under mu_
    stop_ = true;
  }
  wake();
  if (thread_.joinable()) {
    thread_.join();
  }
  listener_.reset(); // a peer dialling now is refused, at once, instead of left unanswered
  inbound_.clear();
}

// ---------------------------------------------------------------------------------
// Progress loop

void Engine::loop() {
  PollSet set;
  while (collectPollSet(set)) {
    // Without the lock: posting and waiting threads keep moving bytes meanwhile.
    const int n = ::poll(set.fds.data(), set.fds.size(), set.timeoutMs);
    if (n < 0) {
      if (errno != EINTR) {
        failure_->fail(c10::str("ringpg: poll failed on rank ", rank_, ": ", std::strerror(errno)));
      }
      continue;
    }
    if (set.fds[0].revents & POLLIN) {
      uint64_t v;
      while (::read(wake_.get(), &v, sizeof(v)) > 0) {
      }
    }
    serviceReady(set);
  }
}

bool Engine::collectPollSet(PollSet& set) {
  set.fds.clear();
  set.who.clear();
  set.timeoutMs = -1;
  set.fds.push_back(pollfd{wake_.get(), POLLIN, 0});
  std::lock_guard<std::mutex> lk(mu_); // stop_, the queues and receive states
  if (stop_) {
    return false;
  }
  if (stopped_) {
    // A broken engine moves no byte: sleep until woken to stop.  Closing the listener
    // (only this thread polls it) refuses peers that dial now, at once.
    listener_.reset();
    inbound_.clear();
    return true;
  }
  if (listener_.valid()) {
    set.fds.push_back(pollfd{listener_.get(), POLLIN, 0});
    set.who.emplace_back(-1, Role::kListen);
  }
  for (const auto i : c10::irange(inbound_.size())) {
    set.fds.push_back(pollfd{inbound_[i].fd.get(), POLLIN, 0});
    set.who.emplace_back(static_cast<int>(i), Role::kInbound);
    set.timeoutMs = 100; // wake to drop connections whose hello window passed
  }
  for (const int q : peers_.used()) { // the body makes no peer: the list holds still
    Peer& P = peers_[q];
    if (q == rank_ || P.rx.closed()) {
      continue; // a peer that said goodbye sends and takes nothing more
    }
    // A paused header waits for its receive to be posted: not reading is the flow control.
    if (P.rx.readsSocket() && P.rxFd.valid()) {
      set.fds.push_back(pollfd{P.rxFd.get(), POLLIN, 0});
      set.who.emplace_back(q, Role::kRx);
    }
    if (P.dial == Dial::kConnecting || P.dial == Dial::kHello) {
      set.fds.push_back(pollfd{P.txFd.get(), static_cast<short>(P.dial == Dial::kConnecting ? POLLOUT : POLLIN), 0});
      set.who.emplace_back(q, Role::kDial);
    } else if (P.dial == Dial::kOpen && !P.txq.empty() && !P.txBusy) {
      set.fds.push_back(pollfd{P.txFd.get(), POLLOUT, 0});
      set.who.emplace_back(q, Role::kTx);
    }
  }
  return true;
}

void Engine::serviceReady(const PollSet& set) {
  Completions done;
  bool connections = false; // a connection step happened: connectPeers may be waiting
  {
    std::unique_lock<std::mutex> lk(mu_); // the queues; dropped around each recv() / send()
    for (size_t i = 1; i < set.fds.size() && !stopped_ && !stop_; ++i) {
      if (set.fds[i].revents == 0) {
        continue;
      }
      const auto [q, role] = set.who[i - 1];
      switch (role) {
        case Role::kTx:
          if (!peers_[q].txBusy) { // else a posting thread is writing this socket now
            writePeer(q, lk, done);
          }
          break;
        case Role::kRx:
          readPeer(q, lk, done); // the state may have moved since poll(): readPeer looks again
          break;
        case Role::kDial:
          advanceDialLocked(q, done);
          connections = true;
          break;
        case Role::kListen:
          acceptLocked(done);
          break;
        case Role::kInbound:
          readHelloLocked(inbound_[q], done);
          connections = true;
          break;
      }
    }
    // Forget inbound connections that were taken, dropped, or out of time.  (Indices
    // in `set` are stale from here: it is rebuilt before the next poll.)
    const Deadline now = Clock::now();
    inbound_.erase(std::remove_if(inbound_.begin(), inbound_.end(),
                                  [&](const Inbound& c) { return !c.fd.valid() || now >= c.until; }),
                   inbound_.end());
  }
  if (connections) {
    notifyWaiters(); // connectPeers waits for connections on cv_
  }
  runCallbacks(done);
}

void Engine::notifyWaiters() {
  {
    // Taking the lock orders the notify after waiters' predicate checks.
    std::lock_guard<std::mutex> lk(mu_);
  }
  cv_.notify_all();
}

void Engine::runCallbacks(Completions& done) {
  if (done.empty()) {
    return;
  }
  notifyWaiters();
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

} // namespace ringpg
