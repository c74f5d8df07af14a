// The engine (engine.h), connecting on first use: dialling a peer, the hello and its
// acknowledgement, accepting a peer's connection, and what breaks the engine there.
#include "transport/engine.h"

#include <sys/socket.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/errors.h"
#include "transport/engine_internal.h"

namespace ringpg {

using engine_detail::wouldBlock;

// ---------------------------------------------------------------------------------
// Connecting on first use

void Engine::startDialLocked(int p, Completions& done) {
  Peer& P = peers_[p];
  TORCH_INTERNAL_ASSERT(P.dial == Dial::kNone && p != rank_);
  SockAddr to;
  try {
    // Read from the Store on the first dial (a round trip with mu_ held, once a peer).
    to = SockAddr::parse(book_.of(p).addr);
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
    const Hello h{kHelloMagic, kHelloVersion, rank_, p, book_.of(p).nonce}; // known since the dial
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
    markGoneLocked(p, Presence::kShutDown, done);
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
    inbound_.push_back(Inbound{Fd(fd), Hello{}, 0, Clock::now() + helloWindow_});
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
                            "takes two sockets; RINGPG_TUNING connect=lazy connects only the peers the ops use)"
                          : ""),
             done);
}

void Engine::dialFailedLocked(int p, const std::string& why, Completions& done) {
  if (leaving_ && !stopped_) {
    // Saying goodbye (shutdown): a peer that cannot be reached now has left too, as a
    // lost connection is taken then (failLostPeerLocked).
    endPeerQuietlyLocked(p, done);
    return;
  }
  failLocked(c10::str("ringpg: rank ", rank_, " could not connect to rank ", p, " at ", book_.describe(p),
                      " (the first use of that pair): ", why,
                      " (the peer process probably exited, crashed or was killed, or its group failed)"),
             done);
}

} // namespace ringpg
