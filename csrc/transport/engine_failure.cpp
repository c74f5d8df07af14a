// The engine (engine.h), its failure path: failing the group, telling every
// peer why, failing what waits, and finding the real cause of a lost connection.
#include "transport/engine.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <cerrno>
#include <chrono>

#include "common/errors.h"
#include "transport/engine_internal.h"

namespace ringpg {

using engine_detail::abortedBy;
using engine_detail::departedFrom;
using engine_detail::shutDownBy;
using engine_detail::wouldBlock;

// ---------------------------------------------------------------------------------
// Failure path

void Engine::failRequest(const RequestPtr& req, const std::string& why, Completions& done, bool network) {
  markFailed(*req, why, network);
  done.push_back(req);
}

void Engine::failWithGroupLocked(const RequestPtr& req, Completions& done) {
  bool network = true;
  const std::string why = failure_->reason(&network);
  failRequest(req, why, done, network);
}

void Engine::failLocked(const std::string& reason, Completions& done, bool network, BreakCause cause) {
  if (failure_->record(reason, network, cause)) {
    // One completion for the failure itself, a request of no link: runCallbacks runs
    // the group's listeners (this engine's wakes cv_'s waiters, awaitBroken's among
    // them) after mu_ is released, even when nothing was pending.
    auto notice = std::make_shared<Request>();
    notice->onComplete = [failure = failure_](Request&) { failure->notify(); };
    done.push_back(std::move(notice));
  }
  const std::string why = failure_->reason(&network); // the group's first reason, maybe another's
  if (!stopped_) {
    stopped_ = true;
    if (!stop_) {
      broadcastAbortLocked(why); // not while being destroyed: peers got a goodbye already
    }
  }
  auto failAll = [&](std::deque<RequestPtr>& q) {
    for (auto& r : q) {
      failRequest(r, why, done, network);
    }
    q.clear();
  };
  const std::vector<int> used = peers_.used();
  for (const int q : used) {
    Peer& P = peers_[q];
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
        failRequest(inFlight, why, done, network);
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
void Engine::broadcastAbortLocked(const std::string& reason) {
  FrameHeader h = frameOfKind(FrameKind::Abort);
  const std::string why = reason.substr(0, kMaxAbortBytes);
  h.nbytes = why.size();
  const std::vector<int> used = peers_.used();
  for (const int q : used) {
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

std::string Engine::causeOfLoss(int fd, const FrameReceiver::Position& at, int rank, int peer, const FrameHeader* op,
                                bool* network, bool* remote) {
  using State = FrameReceiver::State;
  constexpr auto kPatience = std::chrono::milliseconds(200);
  constexpr size_t kMaxDrainBytes = size_t(256) << 20;
  const auto until = std::chrono::steady_clock::now() + kPatience;
  FrameReceiver rx = FrameReceiver::resumingAt(at);
  size_t drained = 0;
  while (drained < kMaxDrainBytes) {
    if (rx.state() == State::kPaused) { // a whole header: what does it say?
      const FrameHeader& h = rx.header();
      if (h.magic != kFrameMagic || (hasKind(h, FrameKind::Abort) && h.nbytes > kMaxAbortBytes)) {
        break;
      }
      if (hasKind(h, FrameKind::Collective) && op && h.key == op->key && !ofSameOp(*op, h)) {
        *network = false;
        return runningOpMismatch(rank, peer, *op, h);
      }
      if (hasKind(h, FrameKind::Abort)) {
        rx.stash(); // its reason, at most kMaxAbortBytes
      } else {
        rx.discard();
      }
      if (!rx.payloadComplete()) {
        continue;
      }
    } else {
      const auto [dst, want] = rx.nextRead(kMaxDrainBytes - drained);
      const ssize_t r = ::recv(fd, dst, want, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && !wouldBlock(errno))) {
        break; // end of stream or a dead socket: nothing more to learn
      }
      if (r < 0) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
          break;
        }
        pollfd pfd{fd, POLLIN, 0};
        (void)::poll(&pfd, 1, static_cast<int>(left.count()));
        continue;
      }
      drained += static_cast<size_t>(r);
      if (rx.advance(static_cast<size_t>(r)) != FrameReceiver::Completed::kPayload) {
        continue;
      }
    }
    // A payload complete: an Abort's reason is the answer; anything else was dropped.
    if (rx.state() == State::kStash) {
      const Stashed reason = rx.endStash();
      *remote = true;
      return abortedBy(peer, std::string(reason.data.begin(), reason.data.end()));
    }
    rx.endDiscard();
  }
  return "";
}

std::string Engine::peerLostReason(int p, const char* how) {
  // "Connection closed by peer", gloo's words, is what torchft and scripts match on.
  return c10::str("ringpg: rank ", rank_, " lost its connection to rank ", p, ": Connection closed by peer (", how,
                  "; the peer process probably exited, crashed or was killed)");
}

// The connection to peer p failed (`how`) while this group was healthy.  Before
// blaming the network, reads what p still had in flight and looks for the real cause
// (causeOfLoss):
//   - an Abort frame: p's group failed first and p said why before closing;
//   - a frame of the op running here with another op/dtype/size: the ranks called
//     different collectives, p saw it first and closed (its Abort could not follow a
//     frame it was half-way through writing).
// Without this, the rank whose *write* fails first reports "broken pipe" although the
// reason is sitting, unread, in its receive buffer.
void Engine::failLostPeerLocked(int p, const std::string& how, std::unique_lock<std::mutex>& lk, Completions& done) {
  Peer& P = peers_[p];
  if (leaving_ && !stopped_) {
    // This rank has finished its ops and is saying goodbye.  A peer that closes now
    // was leaving too and skipped its goodbye to us, having read ours (or died at
    // the very end): either way nothing here needs it any more.
    endPeerQuietlyLocked(p, done);
    return;
  }
  // Already broken, the socket being read by another thread (its state is that
  // thread's), or a peer that said goodbye: there is nothing more to learn.
  if (stopped_ || P.rxBusy || !P.rxFd.valid() || P.rx.closed()) {
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
  const std::string reason = causeOfLoss(P.rxFd.get(), at, rank_, p, haveOp ? &op : nullptr, &network, &remote);
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
// Leaving (engine.h, "Leaving is not failing")

bool Engine::leftQuietlyLocked(int p) const {
  const Peer& P = peers_[p];
  // While this rank says goodbye itself, failLostPeerLocked ends the peer quietly.
  // Otherwise the stream must have ended between frames (a peer killed part-way through
  // writing one is a failure), and nothing of p may be awaited: a receive posted from
  // it would never complete, a send queued to it never be read.  Frames p wrote before
  // it closed were all read before the end of stream (TCP keeps their order), so what
  // the running op still needs of p is in the stash or already delivered; a header of
  // the running op that waits for its receive (kPaused) stops reading, so the end of
  // stream is never seen before it.  Any-source receives (anyPosted_) may be served by
  // any peer: they do not make p expected.
  return !leaving_ && P.rx.atFrameBoundary() && P.collPosted.empty() && P.p2pPosted.empty() && P.txq.empty() &&
         !P.txBusy;
}

void Engine::markGoneLocked(int p, Presence how, Completions& done) {
  Peer& P = peers_[p];
  if (P.presence != Presence::kPresent) {
    return; // the first way out is the one reported
  }
  P.presence = how;
  gone_.fetch_add(1, std::memory_order_release);
  // A completion of no link, as failLocked's notice: runCallbacks then wakes cv_'s
  // waiters (awaitBroken for this peer) although no request ended.
  done.push_back(std::make_shared<Request>());
}

std::string Engine::goneReasonLocked(int p) const {
  switch (peers_[p].presence) {
    case Presence::kPresent:
      break;
    case Presence::kShutDown:
      return shutDownBy(p);
    case Presence::kDeparted:
      return departedFrom(rank_, p);
  }
  return "";
}

void Engine::failPostedToGoneLocked(int p, Completions& done) {
  Peer& P = peers_[p];
  const std::string why = goneReasonLocked(p);
  for (auto& r : P.collPosted) {
    failRequest(r, why, done);
  }
  P.collPosted.clear();
}

} // namespace ringpg
