#include "transport/rendezvous.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <random>
#include <sstream>
#include <thread>

#include "common/errors.h"
#include "common/host.h"
#include "transport/store_exchange.h"

namespace ringpg {

uint64_t randomNonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

namespace {

constexpr uint32_t kHelloMagic = 0x48475052; // "RPGH"
constexpr uint32_t kProtocolVersion = 1;

struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t src;
  int32_t dst;
  uint64_t nonce; // the destination's nonce, proving the sender read the Store
};

// Accepts one receive socket from every peer.  Connections are served concurrently
// (a stray client that connects and stays silent cannot hold up the real peers) and
// each must present a valid hello within kHelloWindow, or it is dropped.
void acceptPeers(int listenFd, int rank, int size, uint64_t nonce, Deadline deadline, std::chrono::milliseconds timeout,
                 const std::atomic<bool>& abandon, std::vector<Fd>& rx) {
  constexpr auto kHelloWindow = std::chrono::seconds(5);
  struct Pending {
    Fd fd;
    Hello hello{};
    size_t got = 0;
    Deadline until;
  };
  std::vector<Pending> pending;
  int missing = size - 1;
  while (missing > 0) {
    if (abandon.load()) {
      return;
    }
    if (Clock::now() >= deadline) {
      throwNetwork(c10::str("ringpg: rank ", rank, " timed out after ", timeout.count(), " ms waiting for ", missing,
                            " peer(s) to connect during rendezvous"));
    }
    std::vector<pollfd> fds{{listenFd, POLLIN, 0}};
    for (auto& c : pending) {
      fds.push_back(pollfd{c.fd.get(), POLLIN, 0});
    }
    // Short slices so `abandon` and the hello windows are checked promptly.
    const int n = ::poll(fds.data(), fds.size(), std::min(100, msUntil(deadline)));
    if (n < 0 && errno != EINTR) {
      throwNetwork(c10::str("ringpg: rank ", rank, ": poll failed during rendezvous: ", std::strerror(errno)));
    }
    const Deadline now = Clock::now();
    for (size_t i = 1; i < fds.size(); ++i) {
      Pending& c = pending[i - 1];
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) {
        continue;
      }
      ssize_t r = ::recv(c.fd.get(), reinterpret_cast<char*>(&c.hello) + c.got, sizeof(Hello) - c.got, MSG_DONTWAIT);
      if (r <= 0) {
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
          continue;
        }
        c.fd.reset(); // closed or failed before a full hello: not one of ours
        continue;
      }
      c.got += static_cast<size_t>(r);
      if (c.got < sizeof(Hello)) {
        continue;
      }
      const Hello& h = c.hello;
      const bool ours = h.magic == kHelloMagic && h.version == kProtocolVersion && h.dst == rank && h.nonce == nonce &&
                        h.src >= 0 && h.src < size && h.src != rank && !rx[h.src].valid();
      uint8_t ack = 1;
      if (ours && sendAll(c.fd.get(), &ack, 1, now + kHelloWindow)) {
        rx[h.src] = std::move(c.fd);
        --missing;
      }
      c.fd.reset();
    }
    // Forget closed connections and those whose hello window has passed.
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [&](const Pending& c) { return !c.fd.valid() || now >= c.until; }),
                  pending.end());
    if (fds[0].revents & POLLIN) {
      int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        pending.push_back(Pending{Fd(fd), Hello{}, 0, now + kHelloWindow});
      }
    }
  }
}

} // namespace

Mesh connectMesh(c10d::Store& store, int rank, int size, const std::string& ifname, std::chrono::milliseconds timeout) {
  Mesh mesh;
  mesh.tx.resize(size);
  mesh.rx.resize(size);
  if (size == 1) {
    return mesh;
  }
  const Deadline deadline = Clock::now() + timeout;

  // Each rank counts the ringpg groups it created on this store; group creation is
  // collective, so the count is the same on every rank and keys never collide with a
  // previous (destroyed) group on the same store.
  const int64_t instance = store.add(c10::str("ringpg/instance/", rank), 1);
  const std::string prefix = c10::str("ringpg/", instance, "/");
  mesh.keyPrefix = prefix;

  SockAddr addr = chooseBindAddress(ifname);
  Fd listener = listenOn(addr, 2 * size + 16);
  mesh.localAddress = addr.str();
  const uint64_t nonce = randomNonce();
  const std::vector<std::string> addrs =
      allGatherValues(store, prefix + "addr", rank, size, c10::str(mesh.localAddress, " ", nonce));

  // Accept the peers' send sockets on a helper thread while this thread connects ours:
  // doing both on one thread would deadlock two ranks connecting to each other.
  std::exception_ptr acceptError;
  std::atomic<bool> abandon{false}; // set when connecting failed: the acceptor gives up
  std::thread acceptor([&] {
    nameThisThread("ringpg-accept");
    try {
      acceptPeers(listener.get(), rank, size, nonce, deadline, timeout, abandon, mesh.rx);
    } catch (...) {
      acceptError = std::current_exception();
    }
  });

  std::exception_ptr connectError;
  try {
    for (const auto step : c10::irange(1, size)) {
      // Connect in ring order (right neighbour first) to spread the load.
      const int q = (rank + step) % size;
      std::istringstream in(addrs[q]);
      std::string peerAddr;
      uint64_t peerNonce = 0;
      in >> peerAddr >> peerNonce;
      Fd conn = connectTo(SockAddr::parse(peerAddr), deadline);
      Hello h{kHelloMagic, kProtocolVersion, rank, q, peerNonce};
      uint8_t ack = 0;
      if (!sendAll(conn.get(), &h, sizeof(h), deadline) || !recvAll(conn.get(), &ack, 1, deadline) || ack != 1) {
        throwNetwork(c10::str("ringpg: rank ", rank, " could not complete the handshake with rank ", q, " at ",
                              peerAddr, " during rendezvous"));
      }
      mesh.tx[q] = std::move(conn);
    }
  } catch (...) {
    connectError = std::current_exception();
    abandon.store(true);
  }
  acceptor.join();
  if (connectError) {
    std::rethrow_exception(connectError);
  }
  if (acceptError) {
    std::rethrow_exception(acceptError);
  }
  return mesh;
}

} // namespace ringpg
