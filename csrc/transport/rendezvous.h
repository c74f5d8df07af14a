// Store-based rendezvous: every rank listens on the chosen interface and publishes its
// address and a random nonce under the group's keys in the c10d Store it was created
// with.  Nobody reads every address: a rank reads a peer's when it first dials it
// (AddressBook), so the Store serves each rank O(peers it talks to) bytes, not O(N)
// (store_exchange.h).  No socket is connected here: the engine (engine.h) dials a peer
// the first time an op needs it, and at creation only the peers its rings use
// (connect.h).  A connection is accepted only if its hello names the accepting rank and
// quotes that rank's nonce (read from the Store), so stray or hostile connections are
// dropped.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/socket.h"
#include "transport/store_exchange.h"

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

// The addresses of the peers this rank has needed so far, read from the group's Store on
// first need and kept (no entry for a peer never dialled).  Not thread-safe: the engine
// holds its lock around every call.
class AddressBook {
 public:
  AddressBook() = default; // none to read (the in-process tests' groups): of() throws
  explicit AddressBook(std::shared_ptr<GroupStore> store) : store_(std::move(store)) {}
  // Reads the addresses of those of `ranks` not yet known, in one Store round trip.
  void learn(const std::vector<int>& ranks);
  // Where rank q listens: known, or read now (after the group's creation, on a Store
  // connection of the book's own).  Throws where the Store cannot say.
  const PeerAddress& of(int q);
  // Gives rank q's address (the engine tests' groups, which have no Store).
  void know(int q, PeerAddress a) { known_[q] = std::move(a); }
  // Rank q's address if known, else "(address not read)": for messages.
  std::string describe(int q) const;

 private:
  std::shared_ptr<GroupStore> store_;
  std::unique_ptr<GroupStore> own_; // ownConnection(), made at the first read after learn()
  std::unordered_map<int, PeerAddress> known_;
};

struct Rendezvous {
  Fd listener;       // this rank's listening socket (invalid in a group of one)
  uint64_t nonce = 0; // what hellos to this rank must quote
  AddressBook book;  // where the peers listen, read as they are needed
  std::string localAddress;
  std::shared_ptr<GroupStore> store; // this group's keys ("ringpg/<instance>/") and their traffic
};

uint64_t randomNonce();

// Collective over the group: listens and publishes this rank's address (one set).
Rendezvous rendezvous(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const std::string& ifname);

} // namespace ringpg
