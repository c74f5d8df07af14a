#include "transport/engine.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
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

namespace ringpg {
namespace {

using RxState = FrameReceiver::State;

// Bytes one socket may move per pass of the progress loop, so one busy peer cannot
// starve the others (or keep the lock from posting threads for long).
constexpr size_t kPassBytes = 1 << 20;
// Largest payload the engine will read aside for a frame nobody has asked for yet.  A
// peer announcing more is treated as corrupt rather than trusted with an allocation.
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

// How long an accepted connection may take to say hello before it is dropped (a stray
// client that connects and stays silent must not hold a slot for long).
constexpr auto kHelloWindow = std::chrono::seconds(5);

std::string shutDownBy(int peer) {
  return c10::str("ringpg: rank ", peer, " has shut down this process group (Connection closed by peer)");
}

bool wouldBlock(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == EINTR;
}

// Reads on from `at` in the stream of socket `fd`, whose connection to peer `peer`
// just failed, for the frames it still had in flight: returns the reason they give
// (the Abort's reason, or a mismatch with `op`, the op running here, when not null),
// "" when they give none.  `network` becomes false for a mismatch; `remote` true for an
// Abort (the group failed on `peer` first).  The bytes read are never delivered: the
// group fails next.  Bounded in time (a peer that is really gone gives end-of-stream at
// once) and in bytes; runs without the engine's lock.
std::string readCauseOfLoss(int fd, FrameReceiver::Position at, int rank, int peer, const FrameHeader* op,
                            bool& network, bool& remote) {
  constexpr auto kPatience = std::chrono::milliseconds(200);
  constexpr size_t kMaxDrainBytes = size_t(256) << 20;
  const auto until = std::chrono::steady_clock::now() + kPatience;
  FrameHeader& h = at.hdr;
  size_t hdrGot = at.headerGot;
  size_t skip = at.payloadLeft; // payload left of the current frame
  bool inAbort = at.inAbort;
  std::string& abortWhy = at.abortSoFar;
  std::vector<char> sink(64 << 10);
  size_t drained = 0;
  while (drained < kMaxDrainBytes) {
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
      if (hasKind(h, FrameKind::Collective) && op && h.key == op->key && !ofSameOp(*op, h)) {
        network = false;
        return runningOpMismatch(rank, peer, *op, h);
      }
    }
    if (inAbort && skip == 0) {
      remote = true;
      return abortedBy(peer, abortWhy);
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
    if (r == 0 || !wouldBlock(errno)) {
      break; // end of stream or a dead socket: nothing more to learn
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      break;
    }
    pollfd pfd{fd, POLLIN, 0};
    (void)::poll(&pfd, 1, static_cast<int>(left.count()));
  }
  return "";
}

} // namespace

Engine::Engine(int rank, int size, Rendezvous rv, int socketBuffer, const std::string& congestion, int spinMicros)
    : rank_(rank), size_(size), spinMicros_(spinMicros), socketBuffer_(socketBuffer), congestion_(congestion),
      nonce_(rv.nonce), book_(std::move(rv.book)), peers_(size), listener_(std::move(rv.listener)) {
  if (listener_.valid()) {
    setNonBlocking(listener_.get(), true);
  }
  wake_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  TORCH_CHECK(wake_.valid(), "ringpg: eventfd failed: ", std::strerror(errno));
  thread_ = std::thread([this] {
    nameThisThread("ringpg-engine");
    loop();
  });
}

std::string Engine::congestionControl() {
  std::lock_guard<std::mutex> lk(mu_); // sockets appear as peers connect
  for (const auto& p : peers_) {
    if (p.txFd.valid()) {
      return congestionControlOf(p.txFd.get());
    }
  }
  return "";
}

void Engine::connectPeers(const std::vector<int>& peers, Deadline deadline) {
  Completions done;
  {
    std::lock_guard<std::mutex> lk(mu_); // the peers' dial states
    for (const int q : peers) {
      if (q != rank_ && peers_[q].dial == Dial::kNone && broken_.empty()) {
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
  cv_.wait_until(lk, deadline, [&] { return !broken_.empty() || missing().empty(); });
  if (!broken_.empty()) {
    throwNetwork(broken_);
  }
  const std::vector<int> left = missing();
  if (!left.empty()) {
    std::string names;
    for (const int q : left) {
      names += c10::str(names.empty() ? "" : ", ", q, " (", book_[q].addr, ")");
    }
    throwNetwork(c10::str("ringpg: rank ", rank_, " timed out during group creation waiting for its connections ",
                          "with rank(s) ", names, ": is each of them alive, and its address reachable from here?"));
  }
}

std::vector<int> Engine::connectedPeers() {
  std::lock_guard<std::mutex> lk(mu_); // the peers' sockets
  std::vector<int> connected;
  for (const auto q : c10::irange(size_)) {
    if (peers_[q].txFd.valid() || peers_[q].rxFd.valid()) {
      connected.push_back(q);
    }
  }
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
  runCallbacks(done);
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
    if (!broken_.empty()) {
      failRequest(req, broken_, done, brokenNetwork_);
    } else if (P.rx.closed()) {
      failRequest(req, shutDownBy(peer), done);
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
    if (!broken_.empty()) {
      failRequest(req, broken_, done, brokenNetwork_);
    } else if (peer >= 0 && peers_[peer].rx.closed()) {
      failRequest(req, shutDownBy(peer), done);
    } else if (hasKind(expect, FrameKind::Collective)) {
      Peer& P = peers_[peer];
      P.collPosted.push_back(req);
      drainStash(peer, done);
      // A paused header may be waiting for exactly this receive.  (A paused socket
      // that is busy is being read by the failure path: the group fails next.)
      if (P.rx.state() == RxState::kPaused && !P.rxBusy && !P.collPosted.empty()) {
        routeHeader(peer, done);
        if (broken_.empty() && P.rx.readsSocket()) {
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
  std::unique_lock<std::mutex> lk(mu_); // cv_'s mutex: completions notify after taking it
  return cv_.wait_until(lk, deadline,
                        [&] { return req->state.load(std::memory_order_acquire) != Request::State::Pending; });
}

void Engine::pollPeer(int p) {
  Completions done;
  {
    std::unique_lock<std::mutex> lk(mu_); // peer p's queues and receive state
    Peer& P = peers_[p];
    if (broken_.empty() && !stop_ && !P.rx.closed()) {
      if (!P.txq.empty() && !P.txBusy) {
        writePeer(p, lk, done);
      }
      if (broken_.empty() && P.rxFd.valid()) {
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

void Engine::fail(const std::string& reason, bool network, BreakCause cause) {
  Completions done;
  {
    std::lock_guard<std::mutex> lk(mu_); // broken_ and every queue
    failLocked(reason, done, network, cause);
  }
  wake();
  runCallbacks(done);
}

void Engine::setFailureListener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lk(mu_); // failureListener_
  failureListener_ = std::move(listener);
}

bool Engine::awaitBroken(Deadline deadline) {
  std::unique_lock<std::mutex> lk(mu_); // cv_'s mutex; breaking always notifies it (failLocked)
  return cv_.wait_until(lk, deadline, [&] { return !broken_.empty(); });
}

std::string Engine::brokenReason(bool* network, BreakCause* cause) {
  std::lock_guard<std::mutex> lk(mu_); // broken_ / brokenNetwork_ / brokenCause_
  if (network) {
    *network = brokenNetwork_;
  }
  if (cause) {
    *cause = brokenCause_;
  }
  return broken_;
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
    if (peers_[peer].dial == Dial::kNone && broken_.empty()) {
      startDialLocked(peer, done);
    }
  }
  wake();
  runCallbacks(done);
}

std::string Engine::goodbyeFrom(int peer) {
  if (!anyGoodbye()) {
    return ""; // the common case, without the lock
  }
  std::lock_guard<std::mutex> lk(mu_);
  return peers_[peer].rx.closed() ? shutDownBy(peer) : std::string();
}

void Engine::shutdown(Deadline deadline) {
  {
    std::lock_guard<std::mutex> lk(mu_); // leaving_ is read by the failure path under mu_
    leaving_ = true;
  }
  std::vector<int> connected; // a peer never dialled has nothing to be told
  {
    std::lock_guard<std::mutex> lk(mu_); // the dial states
    for (const auto q : c10::irange(size_)) {
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
        fail(c10::str("ringpg: poll failed on rank ", rank_, ": ", std::strerror(errno)));
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
  std::lock_guard<std::mutex> lk(mu_); // stop_, broken_, the queues and receive states
  if (stop_) {
    return false;
  }
  if (!broken_.empty()) {
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
  for (const auto q : c10::irange(size_)) {
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
    for (size_t i = 1; i < set.fds.size() && broken_.empty() && !stop_; ++i) {
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

// ---------------------------------------------------------------------------------
// Connecting on first use

void Engine::startDialLocked(int p, Completions& done) {
  Peer& P = peers_[p];
  TORCH_INTERNAL_ASSERT(P.dial == Dial::kNone && p != rank_);
  SockAddr to;
  try {
    to = SockAddr::parse(book_[p].addr);
  } catch (const std::exception& e) {
    socketFailedHereLocked(c10::str("read rank ", p, "'s address"), e.what(), 0, done);
    return;
  }
  P.txFd = Fd(::socket(to.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!P.txFd.valid()) {
    const int err = errno;
    socketFailedHereLocked(c10::str("open a socket to connect to rank ", p), std::strerror(err), err, done);
    return;
  }
  try { // before connect(): buffer sizes set later do not scale the TCP window
    tuneDataSocket(P.txFd.get(), socketBuffer_, congestion_);
  } catch (const std::exception& e) {
    socketFailedHereLocked(c10::str("set up its socket to rank ", p), e.what(), 0, done);
    return;
  }
  P.dial = Dial::kConnecting;
  if (::connect(P.txFd.get(), reinterpret_cast<const sockaddr*>(&to.storage), to.len) == 0) {
    advanceDialLocked(p, done); // connected at once (loopback may): say hello now
  } else if (errno != EINPROGRESS) {
    dialFailedLocked(p, std::strerror(errno), done);
  }
}

void Engine::advanceDialLocked(int p, Completions& done) {
  Peer& P = peers_[p];
  if (P.dial == Dial::kConnecting) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(P.txFd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
      err = errno;
    }
    if (err == EINPROGRESS || err == EALREADY) {
      return; // not yet: poll() woke for another reason
    }
    if (err != 0) {
      dialFailedLocked(p, std::strerror(err), done);
      return;
    }
    const Hello h{kHelloMagic, kHelloVersion, rank_, p, book_[p].nonce};
    // A fresh socket's send buffer takes 24 bytes whole, or the connection is dead.
    const ssize_t w = ::send(P.txFd.get(), &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w != static_cast<ssize_t>(sizeof(h))) {
      dialFailedLocked(p, w < 0 ? std::strerror(errno) : "the hello was cut short", done);
      return;
    }
    P.dial = Dial::kHello;
    return;
  }
  TORCH_INTERNAL_ASSERT(P.dial == Dial::kHello);
  uint8_t ack = 0;
  const ssize_t r = ::recv(P.txFd.get(), &ack, 1, MSG_DONTWAIT);
  if (r < 0 && wouldBlock(errno)) {
    return;
  }
  if (r != 1 || (ack != uint8_t(HelloAck::kWelcome) && ack != uint8_t(HelloAck::kLeaving))) {
    dialFailedLocked(p,
                     r == 0  ? "it closed the connection before welcoming this rank's hello"
                     : r < 0 ? std::strerror(errno)
                             : "it answered the hello with an unknown byte",
                     done);
    return;
  }
  P.dial = Dial::kOpen;
  if (ack == uint8_t(HelloAck::kLeaving)) {
    // It is shutting its group down: nothing sent to it would be read.  As a goodbye.
    goodbyes_.fetch_add(1, std::memory_order_release);
    endPeerQuietlyLocked(p, done);
    return;
  }
  // Queued sends go at the next pass of the progress loop, which polls for them now.
}

void Engine::acceptLocked(Completions& done) {
  // Several may be waiting (an all-to-all's first use); the listener is non-blocking.
  for (int i = 0; i < 64; ++i) {
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
      // The connection stays queued and the listener readable: poll() would spin on
      // it.  A peer this rank cannot take fails the group, saying why.
      const int err = errno;
      socketFailedHereLocked("accept a peer's connection", std::strerror(err), err, done);
      return;
    }
    if (fd < 0) {
      return; // EAGAIN, or a connection reset before it was taken: nothing to do
    }
    inbound_.push_back(Inbound{Fd(fd), Hello{}, 0, Clock::now() + kHelloWindow});
  }
}

void Engine::readHelloLocked(Inbound& in, Completions& done) {
  const ssize_t r =
      ::recv(in.fd.get(), reinterpret_cast<char*>(&in.hello) + in.got, sizeof(Hello) - in.got, MSG_DONTWAIT);
  if (r <= 0) {
    if (r < 0 && wouldBlock(errno)) {
      return;
    }
    in.fd.reset(); // closed or failed before a full hello: not one of ours
    return;
  }
  in.got += static_cast<size_t>(r);
  if (in.got < sizeof(Hello)) {
    return;
  }
  const Hello& h = in.hello;
  const int src = h.src;
  const bool ours = h.magic == kHelloMagic && h.version == kHelloVersion && h.dst == rank_ && h.nonce == nonce_ &&
                    src >= 0 && src < size_ && src != rank_ && !peers_[src].rxFd.valid();
  if (!ours) {
    in.fd.reset();
    return;
  }
  const auto ack = uint8_t(leaving_ ? HelloAck::kLeaving : HelloAck::kWelcome);
  if (::send(in.fd.get(), &ack, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
    in.fd.reset(); // it is gone already; its own dial fails and says so there
    return;
  }
  if (leaving_) {
    in.fd.reset();
    return;
  }
  Peer& P = peers_[src];
  try {
    tuneDataSocket(in.fd.get(), socketBuffer_, congestion_);
  } catch (const std::exception& e) {
    socketFailedHereLocked(c10::str("set up its socket from rank ", src), e.what(), 0, done);
    return;
  }
  P.rxFd = std::move(in.fd);
  // Dial back: a pair in use holds both directions, so goodbyes, aborts and a lost
  // connection are seen from both ends, as on the ring.
  if (P.dial == Dial::kNone) {
    startDialLocked(src, done);
  }
}

void Engine::socketFailedHereLocked(const std::string& what, const std::string& why, int err, Completions& done) {
  failLocked(c10::str("ringpg: rank ", rank_, " could not ", what, ": ", why,
                      err == EMFILE || err == ENFILE
                          ? " (this process has reached its limit on open files, ulimit -n: each connected peer "
                            "takes two sockets; RINGPG_CONNECT=lazy connects only the peers the ops use)"
                          : ""),
             done);
}

void Engine::dialFailedLocked(int p, const std::string& why, Completions& done) {
  if (leaving_ && broken_.empty()) {
    // Saying goodbye (shutdown): a peer that cannot be reached now has left too, as a
    // lost connection is taken then (failLostPeerLocked).
    endPeerQuietlyLocked(p, done);
    return;
  }
  failLocked(c10::str("ringpg: rank ", rank_, " could not connect to rank ", p, " at ", book_[p].addr,
                      " (the first use of that pair): ", why,
                      " (the peer process probably exited, crashed or was killed, or its group failed)"),
             done);
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

// ---------------------------------------------------------------------------------
// Failure path

void Engine::failRequest(const RequestPtr& req, const std::string& why, Completions& done, bool network) {
  markFailed(*req, why, network);
  done.push_back(req);
}

void Engine::failLocked(const std::string& reason, Completions& done, bool network, BreakCause cause) {
  if (broken_.empty()) {
    broken_ = reason;
    brokenNetwork_ = network;
    brokenCause_ = cause;
    brokenFlag_.store(true, std::memory_order_release);
    if (!stop_) {
      broadcastAbortLocked(); // not while being destroyed: peers got a goodbye already
    }
    // One completion for the break itself, a request of no link: runCallbacks then
    // wakes cv_'s waiters even when nothing was pending (awaitBroken), and runs the
    // failure listener, if any, after the lock is released.
    auto notice = std::make_shared<Request>();
    if (failureListener_) {
      notice->onComplete = [listener = failureListener_](Request&) { listener(); };
    }
    done.push_back(std::move(notice));
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
    if (!P.rxBusy) { // a busy reader abandons the receive state itself (see readPeer)
      // A receive in flight whose payload will never come: fail it; nothing touches
      // its buffer again because a broken engine reads no more.
      if (RequestPtr inFlight = P.rx.abandon()) {
        failRequest(inFlight, broken_, done, brokenNetwork_);
      }
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
    if (q == rank_ || !P.txFd.valid()) {
      continue;
    }
    const bool midFrame = P.txBusy || (!P.txq.empty() && P.txq.front()->progress > 0);
    if (P.dial == Dial::kOpen && !midFrame && !P.rx.closed()) {
      iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(why.data()), why.size()}};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = 2;
      (void)::sendmsg(P.txFd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    ::shutdown(P.txFd.get(), SHUT_RDWR);
    if (P.rxFd.valid()) {
      ::shutdown(P.rxFd.get(), SHUT_RDWR);
    }
  }
}

std::string Engine::peerLostReason(int p, const char* how) {
  // "Connection closed by peer", gloo's words, is what torchft and scripts match on.
  return c10::str("ringpg: rank ", rank_, " lost its connection to rank ", p, ": Connection closed by peer (", how,
                  "; the peer process probably exited, crashed or was killed)");
}

// The connection to peer p failed (`how`) while this group was healthy.  Before
// blaming the network, reads what p still had in flight and looks for the real cause
// (readCauseOfLoss):
//   - an Abort frame: p's group failed first and p said why before closing;
//   - a frame of the op running here with another op/dtype/size: the ranks called
//     different collectives, p saw it first and closed (its Abort could not follow a
//     frame it was half-way through writing).
// Without this, the rank whose *write* fails first reports "broken pipe" although the
// reason is sitting, unread, in its receive buffer.
void Engine::failLostPeerLocked(int p, const std::string& how, std::unique_lock<std::mutex>& lk, Completions& done) {
  Peer& P = peers_[p];
  if (leaving_ && broken_.empty()) {
    // This rank has finished its ops and is saying goodbye.  A peer that closes now
    // was leaving too and skipped its goodbye to us, having read ours (or died at
    // the very end): either way nothing here needs it any more.
    endPeerQuietlyLocked(p, done);
    return;
  }
  // Already broken, the socket being read by another thread (its state is that
  // thread's), or a peer that said goodbye: there is nothing more to learn.
  if (!broken_.empty() || P.rxBusy || !P.rxFd.valid() || P.rx.closed()) {
    failLocked(peerLostReason(p, how.c_str()), done);
    return;
  }
  // Copies: the lock goes down, and currentOp_ may change meanwhile.
  FrameReceiver::Position at = P.rx.position();
  const bool haveOp = haveCurrent_;
  const FrameHeader op = currentOp_;
  bool network = true;
  bool remote = false;
  P.rxBusy = true; // the socket is ours while the lock is down
  lk.unlock();
  const std::string reason =
      readCauseOfLoss(P.rxFd.get(), std::move(at), rank_, p, haveOp ? &op : nullptr, network, remote);
  lk.lock();
  P.rxBusy = false;
  // Whatever was consumed left the receive state behind: nothing reads this socket
  // again, because the group fails now (first reason wins if another thread was first).
  failLocked(reason.empty() ? peerLostReason(p, how.c_str()) : reason, done, network,
             remote ? BreakCause::Remote : BreakCause::Local);
}

void Engine::failPostedLocked(Peer& P, const std::string& why, Completions& done) {
  for (auto& r : P.collPosted) {
    failRequest(r, why, done);
  }
  for (auto& r : P.p2pPosted) {
    failRequest(r, why, done);
  }
  P.collPosted.clear();
  P.p2pPosted.clear();
}

void Engine::endPeerQuietlyLocked(int p, Completions& done) {
  Peer& P = peers_[p];
  const std::string why = shutDownBy(p);
  // The head of the send queue may be in another thread's send() (txBusy): that
  // thread completes or fails it when the call returns.
  const size_t keep = P.txBusy && !P.txq.empty() ? 1 : 0;
  while (P.txq.size() > keep) {
    failRequest(P.txq.back(), why, done);
    P.txq.pop_back();
  }
  failPostedLocked(P, why, done);
  if (!P.rxBusy) { // else its reader finds the connection closed itself
    if (RequestPtr inFlight = P.rx.abandon()) {
      failRequest(inFlight, why, done);
    }
  }
}

// ---------------------------------------------------------------------------------
// Sending

bool Engine::writePeer(int p, std::unique_lock<std::mutex>& lk, Completions& done) {
  Peer& P = peers_[p];
  if (P.txBusy || P.dial != Dial::kOpen) {
    return true; // another thread is writing this socket right now, or it is being dialled
  }
  size_t budget = kPassBytes;
  while (!P.txq.empty() && budget > 0 && broken_.empty()) {
    RequestPtr req = P.txq.front();
    const size_t total = sizeof(FrameHeader) + req->len;
    iovec iov[2];
    int cnt = 0;
    if (req->progress < sizeof(FrameHeader)) {
      iov[cnt++] = iovec{reinterpret_cast<char*>(&req->hdr) + req->progress, sizeof(FrameHeader) - req->progress};
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
    ssize_t w = ::sendmsg(P.txFd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    const int err = errno;
    lk.lock();
    P.txBusy = false;
    if (!broken_.empty()) {
      // The group failed while we were writing; failLocked left this request to us.
      failRequest(req, broken_, done, brokenNetwork_);
      return false;
    }
    if (w < 0) {
      if (wouldBlock(err)) {
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
// Receiving: the engine's side of FrameReceiver (transport/receiver.h).  readPeer
// moves bytes; routeHeader picks the transition out of kPaused; finishPayload takes
// what a complete payload was read for.

void Engine::readPeer(int p, std::unique_lock<std::mutex>& lk, Completions& done) {
  Peer& P = peers_[p];
  if (P.rxBusy) {
    return; // another thread is reading this socket right now
  }
  FrameReceiver& rx = P.rx;
  size_t budget = kPassBytes;
  // Stops when paused (waiting for a receive to be posted), closed, broken or drained.
  while (budget > 0 && broken_.empty() && rx.readsSocket()) {
    const auto [dst, want] = rx.nextRead(budget);
    P.rxBusy = true;
    lk.unlock();
    const ssize_t r = ::recv(P.rxFd.get(), dst, want, MSG_DONTWAIT);
    const int err = errno;
    lk.lock();
    P.rxBusy = false;
    if (!broken_.empty()) {
      // The group failed while we were reading; failLocked left the receive state to us.
      RequestPtr into = rx.abandon();
      if (into && into->state.load() == Request::State::Pending) {
        failRequest(into, broken_, done, brokenNetwork_);
      }
      return;
    }
    if (r == 0) {
      failLostPeerLocked(p, "end of stream", lk, done);
      return;
    }
    if (r < 0) {
      if (!wouldBlock(err)) {
        failLostPeerLocked(p, std::strerror(err), lk, done);
      }
      return;
    }
    budget -= std::min(budget, static_cast<size_t>(r));
    switch (rx.advance(static_cast<size_t>(r))) {
      case FrameReceiver::Completed::kNothing:
        break;
      case FrameReceiver::Completed::kHeader:
        routeHeader(p, done);
        break;
      case FrameReceiver::Completed::kPayload:
        finishPayload(p, done);
        break;
    }
  }
}

void Engine::routeHeader(int p, Completions& done) {
  Peer& P = peers_[p];
  FrameReceiver& rx = P.rx;
  TORCH_INTERNAL_ASSERT(rx.state() == RxState::kPaused && !P.rxBusy);
  const FrameHeader& h = rx.header();
  if (h.magic != kFrameMagic) {
    failLocked(c10::str("ringpg: rank ", rank_, " received a corrupt frame from rank ", p, " (bad magic 0x", std::hex,
                        h.magic, "); closing the group"),
               done);
    return;
  }
  switch (static_cast<FrameKind>(h.kind)) {
    case FrameKind::Bye: {
      rx.close();
      goodbyes_.fetch_add(1, std::memory_order_release);
      // Receives still waiting on this peer can never complete.
      failPostedLocked(P, shutDownBy(p), done);
      return;
    }
    case FrameKind::Abort:
      if (h.nbytes > kMaxAbortBytes) {
        failLocked(c10::str("ringpg: rank ", p, " sent an oversized ", describeFrame(h)), done);
        return;
      }
      readAside(p, /*keep=*/true, done); // read the reason, then fail (finishPayload)
      break;
    case FrameKind::Collective:
      routeCollective(p, done);
      break;
    case FrameKind::P2P:
      routeP2P(p, done);
      break;
    default:
      failLocked(c10::str("ringpg: rank ", rank_, " received a corrupt frame from rank ", p, " (unknown kind ",
                          int(h.kind), ")"),
                 done);
      return;
  }
  if (broken_.empty() && rx.payloadComplete()) {
    finishPayload(p, done); // a 0-byte payload: the frame is whole already
  }
}

void Engine::routeCollective(int p, Completions& done) {
  Peer& P = peers_[p];
  const FrameHeader& h = P.rx.header();
  if (!P.collPosted.empty()) {
    const FrameHeader& want = P.collPosted.front()->hdr;
    if (!sameCollective(want, h)) {
      failLocked(collectiveMismatch(rank_, p, want, h), done, /*network=*/false);
      return;
    }
    RequestPtr req = std::move(P.collPosted.front());
    P.collPosted.pop_front();
    P.rx.deliverTo(std::move(req));
  } else if (haveCurrent_ && h.key == currentOp_.key) {
    // Stay paused: the running op will post this receive next.  Whatever can be
    // checked is checked now, because an op that runs over shared memory may never post it.
    if (!ofSameOp(currentOp_, h)) {
      failLocked(runningOpMismatch(rank_, p, currentOp_, h), done, /*network=*/false);
    } else if (h.nbytes > kMaxStashBytes) {
      failLocked(implausibleFrame(p, h), done);
    }
  } else if (!haveCurrent_ || h.key > currentOp_.key) {
    readAside(p, /*keep=*/true, done); // a later op's frame
  } else {
    failLocked(c10::str("ringpg: rank ", rank_, " received ", describeFrame(h), " from rank ", p,
                        " for an op that already finished here (seq ", currentOp_.key,
                        " is running): the ranks disagree on the collectives they called"),
               done, /*network=*/false);
  }
}

void Engine::routeP2P(int p, Completions& done) {
  Peer& P = peers_[p];
  const FrameHeader& h = P.rx.header();
  RequestPtr req = takeP2PReceiver(p, h.key);
  if (!req) {
    readAside(p, /*keep=*/true, done);
  } else if (req->len != h.nbytes) {
    // The user posted a receive of another size: that receive fails, the payload is
    // read and dropped so the stream stays in step.
    failRequest(req, p2pSizeMismatch(rank_, p, req->len, h.key, h.nbytes), done, /*network=*/false);
    readAside(p, /*keep=*/false, done);
  } else {
    P.rx.deliverTo(std::move(req));
  }
}

void Engine::readAside(int p, bool keep, Completions& done) {
  FrameReceiver& rx = peers_[p].rx;
  const FrameHeader& h = rx.header();
  // Whatever is read aside (stashed, discarded or an abort reason) is bounded before
  // anything is allocated for it: a peer's length is never trusted with memory.
  if (h.nbytes > kMaxStashBytes) {
    failLocked(implausibleFrame(p, h), done);
    return;
  }
  try {
    if (keep) {
      rx.stash();
    } else {
      rx.discard();
    }
  } catch (const std::bad_alloc&) {
    failLocked(c10::str("ringpg: out of memory stashing ", describeFrame(h), " from rank ", p), done);
  }
}

void Engine::finishPayload(int p, Completions& done) {
  FrameReceiver& rx = peers_[p].rx;
  switch (rx.state()) {
    case RxState::kPayload: {
      RequestPtr req = rx.endDelivery();
      req->sourceRank = p;
      complete(req, done);
      return;
    }
    case RxState::kDiscard:
      rx.endDiscard();
      return;
    case RxState::kStash:
      break;
    default:
      TORCH_INTERNAL_ASSERT(false, "finishPayload outside a payload state");
  }
  Stashed s = rx.endStash();
  switch (static_cast<FrameKind>(s.hdr.kind)) {
    case FrameKind::Collective:
      peers_[p].collStash.push_back(std::move(s));
      drainStash(p, done);
      break;
    case FrameKind::P2P:
      peers_[p].p2pStash.push_back(std::move(s));
      drainStash(p, done);
      break;
    case FrameKind::Abort:
      failLocked(abortedBy(p, std::string(s.data.begin(), s.data.end())), done, /*network=*/true, BreakCause::Remote);
      break;
    default:
      TORCH_INTERNAL_ASSERT(false, "stashed a ", describeFrame(s.hdr)); // routeHeader stashes no other kind
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

} // namespace ringpg
