#include "transport/rendezvous.h"

#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <random>
#include <sstream>

#include "transport/store_exchange.h"

namespace ringpg {

uint64_t randomNonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

Rendezvous rendezvous(c10d::Store& store, int rank, int size, const std::string& ifname) {
  Rendezvous rv;
  rv.book.resize(size);
  // Each rank counts the ringpg groups it created on this store; group creation is
  // collective, so the count is the same on every rank and keys never collide with a
  // previous (destroyed) group on the same store.
  const int64_t instance = store.add(c10::str("ringpg/instance/", rank), 1);
  rv.keyPrefix = c10::str("ringpg/", instance, "/");
  if (size == 1) {
    return rv;
  }
  SockAddr addr = chooseBindAddress(ifname);
  // The backlog covers a burst of first uses from every peer at once (an all-to-all);
  // the kernel caps it at net.core.somaxconn.
  rv.listener = listenOn(addr, 2 * size + 16);
  rv.localAddress = addr.str();
  rv.nonce = randomNonce();
  const std::vector<std::string> lines =
      allGatherValues(store, rv.keyPrefix + "addr", rank, size, c10::str(rv.localAddress, " ", rv.nonce));
  for (const auto q : c10::irange(size)) {
    std::istringstream in(lines[q]);
    in >> rv.book[q].addr >> rv.book[q].nonce;
  }
  return rv;
}

} // namespace ringpg
