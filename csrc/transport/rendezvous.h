// Store-based rendezvous: every rank listens on the chosen interface and publishes its
// address and a random nonce in the c10d Store it was created with; every rank reads
// the others' (one Store exchange).  No socket is connected here: the engine
// (engine.h) dials a peer the first time an op needs it, and at creation only the
// peers its rings use (connect.h).  A connection is accepted only if its hello names
// the accepting rank and quotes that rank's nonce (read from the Store), so stray or
// hostile connections are dropped.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "transport/socket.h"

namespace ringpg {

// The first bytes on every engine socket, dialler to listener; the listener answers
// one HelloAck byte.
struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t src;
  int32_t dst;
  uint64_t nonce; // the destination's nonce, proving the sender read the Store
};
constexpr uint32_t kHelloMagic = 0x48475052; // "RPGH"
constexpr uint32_t kHelloVersion = 2;        // 2: connections are made on first use
enum class HelloAck : uint8_t {
  kWelcome = 1, // frames may flow
  kLeaving = 2, // the listener is shutting its group down: it takes nothing more
};

// Where a peer listens, and the nonce its hellos must quote.
struct PeerAddress {
  std::string addr; // SockAddr::str()
  uint64_t nonce = 0;
};

struct Rendezvous {
  Fd listener;                   // this rank's listening socket (invalid in a group of one)
  uint64_t nonce = 0;            // what hellos to this rank must quote
  std::vector<PeerAddress> book; // book[q]: where rank q listens
  std::string localAddress;
  std::string keyPrefix; // this group's namespace in the Store ("ringpg/<instance>/")
};

uint64_t randomNonce();

// Collective over the group: listens and exchanges addresses (one Store round trip).
Rendezvous rendezvous(c10d::Store& store, int rank, int size, const std::string& ifname);

} // namespace ringpg
