// The engine (engine.h), its frames: writing a peer's queue, reading its socket through
// its FrameReceiver (transport/receiver.h), routing each header to a posted receive, the
// stash or the socket, and matching point-to-point receives by tag.
#include "transport/engine.h"

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

#include "common/errors.h"
#include "transport/engine_internal.h"

namespace ringpg {

using engine_detail::abortedBy;
using engine_detail::shutDownBy;
using engine_detail::wouldBlock;

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

std::string implausibleFrame(int peer, const FrameHeader& h) {
  return c10::str("ringpg: rank ", peer, " announced an implausible ", describeFrame(h));
}

} // namespace

// ---------------------------------------------------------------------------------
// Sending

bool Engine::writePeer(int p, std::unique_lock<std::mutex>& lk, Completions& done) {
  Peer& P = peers_[p];
  if (P.txBusy || P.dial != Dial::kOpen) {
    return true; // another thread is writing this socket right now, or it is being dialled
  }
  size_t budget = kPassBytes;
  while (!P.txq.empty() && budget > 0 && !stopped_) {
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
    if (stopped_) {
      // The group failed while we were writing; failLocked left this request to us.
      failWithGroupLocked(req, done);
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
  while (budget > 0 && !stopped_ && rx.readsSocket()) {
    const auto [dst, want] = rx.nextRead(budget);
    P.rxBusy = true;
    lk.unlock();
    const ssize_t r = ::recv(P.rxFd.get(), dst, want, MSG_DONTWAIT);
    const int err = errno;
    lk.lock();
    P.rxBusy = false;
    if (stopped_) {
      // The group failed while we were reading; failLocked left the receive state to us.
      RequestPtr into = rx.abandon();
      if (into && into->state.load() == Request::State::Pending) {
        failWithGroupLocked(into, done);
      }
      return;
    }
    if (r == 0) {
      if (leftQuietlyLocked(p)) {
        (void)rx.abandon(); // at a frame boundary: no receive is being filled
        markGoneLocked(p, Presence::kDeparted, done);
      } else {
        failLostPeerLocked(p, "end of stream", lk, done);
      }
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
      markGoneLocked(p, Presence::kShutDown, done);
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
  if (!stopped_ && rx.payloadComplete()) {
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
  // The lowest-ranked source whose stash holds the tag (a stash is a used peer's).
  int from = -1;
  std::deque<Stashed>::iterator match;
  for (const int q : peers_.used()) { // the body makes no peer: the list holds still
    if (q == rank_ || (req->peer >= 0 && req->peer != q) || (from >= 0 && q > from)) {
      continue;
    }
    auto& stash = peers_[q].p2pStash;
    const auto it =
        std::find_if(stash.begin(), stash.end(), [&](const Stashed& s) { return s.hdr.key == req->hdr.key; });
    if (it != stash.end()) {
      from = q;
      match = it;
    }
  }
  if (from < 0) {
    return false;
  }
  deliverStashed(req, *match, from, done);
  peers_[from].p2pStash.erase(match);
  return true;
}

} // namespace ringpg
