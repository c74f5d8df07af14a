#include "transport/rendezvous.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <atomic>
#include <exception>
#include <random>
#include <sstream>
#include <thread>

#include "common/errors.h"

namespace ringpg {
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

std::vector<uint8_t> toBytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

uint64_t randomNonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

} // namespace

Mesh connectMesh(c10d::Store& store, int rank, int size, const std::string& ifname,
                 std::chrono::milliseconds timeout) {
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

  SockAddr addr = chooseBindAddress(ifname);
  Fd listener = listenOn(addr, 2 * size + 16);
  mesh.localAddress = addr.str();
  const uint64_t nonce = randomNonce();
  store.set(prefix + "addr/" + std::to_string(rank), toBytes(c10::str(mesh.localAddress, " ", nonce)));

  // Accept the peers' send sockets on a helper thread while this thread connects ours:
  // doing both on one thread would deadlock two ranks connecting to each other.
  std::exception_ptr acceptError;
  std::atomic<bool> abandon{false}; // set when connecting failed: the acceptor gives up
  std::thread acceptor([&] {
    try {
      int missing = size - 1;
      while (missing > 0) {
        // Short slices so a failed connect phase can stop the acceptor promptly.
        Fd conn = acceptUntil(listener.get(), std::min(deadline, Clock::now() + std::chrono::milliseconds(100)));
        if (abandon.load()) {
          return;
        }
        if (!conn.valid() && Clock::now() < deadline) {
          continue;
        }
        if (!conn.valid()) {
          throwNetwork(c10::str("ringpg: rank ", rank, " timed out after ", timeout.count(),
                                " ms waiting for ", missing, " peer(s) to connect during rendezvous"));
        }
        Hello h{};
        // A short, bounded read: a silent or slow stray connection cannot stall rendezvous.
        const Deadline helloDeadline = std::min(deadline, Clock::now() + std::chrono::seconds(10));
        if (!recvAll(conn.get(), &h, sizeof(h), helloDeadline) || h.magic != kHelloMagic ||
            h.version != kProtocolVersion || h.dst != rank || h.nonce != nonce || h.src < 0 ||
            h.src >= size || h.src == rank || mesh.rx[h.src].valid()) {
          continue; // not one of ours: drop it
        }
        uint8_t ack = 1;
        if (!sendAll(conn.get(), &ack, 1, helloDeadline)) {
          continue;
        }
        mesh.rx[h.src] = std::move(conn);
        --missing;
      }
    } catch (...) {
      acceptError = std::current_exception();
    }
  });

  std::exception_ptr connectError;
  try {
    for (const auto step : c10::irange(1, size)) {
      // Connect in ring order (right neighbour first) to spread the load.
      const int q = (rank + step) % size;
      auto bytes = store.get(prefix + "addr/" + std::to_string(q));
      std::istringstream in(std::string(bytes.begin(), bytes.end()));
      std::string peerAddr;
      uint64_t peerNonce = 0;
      in >> peerAddr >> peerNonce;
      Fd conn = connectTo(SockAddr::parse(peerAddr), deadline);
      Hello h{kHelloMagic, kProtocolVersion, rank, q, peerNonce};
      uint8_t ack = 0;
      if (!sendAll(conn.get(), &h, sizeof(h), deadline) || !recvAll(conn.get(), &ack, 1, deadline) || ack != 1) {
        throwNetwork(c10::str("ringpg: rank ", rank, " could not complete the handshake with rank ", q,
                              " at ", peerAddr, " during rendezvous"));
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
