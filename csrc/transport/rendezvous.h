// Store-based rendezvous: every rank listens on the chosen interface, publishes its
// address and a random nonce in the c10d Store it was created with, connects one
// socket to every peer (the socket it will send on) and accepts one from every peer
// (the socket it will receive on).  A connection is accepted only if its hello names
// this rank and quotes this rank's nonce (read from the Store), so stray or hostile
// connections are dropped.  The listening socket is closed once the mesh is complete.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <vector>

#include "transport/socket.h"

namespace ringpg {

struct Mesh {
  std::vector<Fd> tx; // tx[q]: we send to q on it
  std::vector<Fd> rx; // rx[q]: we receive from q on it
  std::string localAddress;
  std::string keyPrefix; // this group's namespace in the Store ("ringpg/<instance>/")
};

uint64_t randomNonce();

Mesh connectMesh(c10d::Store& store, int rank, int size, const std::string& ifname, std::chrono::milliseconds timeout);

} // namespace ringpg
