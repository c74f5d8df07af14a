#include "transport/rendezvous.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <random>
#include <sstream>

namespace ringpg {

namespace {

constexpr const char* kAddressKey = "addr";

PeerAddress parseAddress(const std::string& line, int q) {
  PeerAddress a;
  std::istringstream in(line);
  in >> a.addr >> a.nonce;
  TORCH_CHECK(!in.fail() && !a.addr.empty(), "ringpg: rank ", q, "'s address in the Store is malformed: '", line,
              "': is another job using this Store's keys?");
  return a;
}

} // namespace

uint64_t randomNonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

void AddressBook::learn(const std::vector<int>& ranks) {
  std::vector<int> unknown;
  for (const int q : ranks) {
    if (known_.count(q) == 0) {
      unknown.push_back(q);
    }
  }
  if (unknown.empty() || !store_) {
    return;
  }
  const std::vector<std::string> lines = store_->readMany(kAddressKey, unknown);
  for (size_t i = 0; i < unknown.size(); ++i) {
    known_[unknown[i]] = parseAddress(lines[i], unknown[i]);
  }
}

const PeerAddress& AddressBook::of(int q) {
  if (auto it = known_.find(q); it != known_.end()) {
    return it->second;
  }
  TORCH_CHECK(store_, "ringpg: this group has no Store to read rank ", q, "'s address from");
  if (!own_) {
    own_ = std::make_unique<GroupStore>(store_->ownConnection());
  }
  return known_[q] = parseAddress(own_->read(kAddressKey, q), q);
}

std::string AddressBook::describe(int q) const {
  const auto it = known_.find(q);
  return it == known_.end() ? std::string("(address not read)") : it->second.addr;
}

Rendezvous rendezvous(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const std::string& ifname) {
  Rendezvous rv;
  rv.store = GroupStore::forNewGroup(store, rank);
  rv.book = AddressBook(rv.store);
  if (size == 1) {
    return rv;
  }
  SockAddr addr = chooseBindAddress(ifname);
  // The backlog covers a burst of first uses from every peer at once (an all-to-all);
  // the kernel caps it at net.core.somaxconn.
  rv.listener = listenOn(addr, 2 * size + 16);
  rv.localAddress = addr.str();
  rv.nonce = randomNonce();
  rv.store->publish(kAddressKey, rank, c10::str(rv.localAddress, " ", rv.nonce));
  return rv;
}

} // namespace ringpg
