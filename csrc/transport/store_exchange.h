// The Store steps of a group's set-up, written once (GroupStore), with what they cost.
//
// Bytes.  No step has every rank read every rank's value: that makes the Store's host
// serve O(N^2) bytes to a group of N (about 20 GB at 10,000 ranks), which is where
// large jobs' CPU groups stall (docs/scale.md).  A rank publishes its values under keys
// of its own, and reads only
//  - the values of the few ranks it works with (read, readMany): a neighbour's address,
//    a same-host neighbour's shared-memory region, its host arena's name;
//  - decisions over every rank's value, which rank 0 alone reads and makes (decide):
//    whether the settings agree, the host topology (in a compact form), whether shared
//    memory and the arena serve the group.
// So a rank other than 0 reads a constant number of bytes whatever N (the topology's
// form is constant in size for ranks placed host by host or cyclically; docs/scale.md),
// and rank 0 reads O(N), once.  Round trips are constant per rank.
//
// Every call counts its request and bytes (traffic(), the benchmarks' Store columns).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/socket.h" // Deadline

namespace ringpg {

// What a group's Store calls have cost this rank so far.
struct StoreTraffic {
  uint64_t requests = 0;     // Store calls (a multiGet is one)
  uint64_t bytesWritten = 0; // keys and values sent
  uint64_t bytesRead = 0;    // values received
};

// This group's keys in its c10d Store (all under `prefix`), and their traffic.
class GroupStore {
 public:
  // A decision over every rank's value (index = rank), made on rank 0: what every rank
  // returns from decide().
  using Decision = std::function<std::string(const std::vector<std::string>& values)>;

  // The keys of a new group on `store`, made by this rank: each rank counts the ringpg
  // groups it created on the store (one add), and group creation is collective, so the
  // count, and with it the prefix ("ringpg/<count>/"), is the same on every rank and
  // never that of an earlier group on the same store.
  static std::shared_ptr<GroupStore> forNewGroup(c10::intrusive_ptr<c10d::Store> store, int rank);
  GroupStore(c10::intrusive_ptr<c10d::Store> store, std::string prefix);

  const std::string& prefix() const { return prefix_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

  // Publishes this rank's `value` under `key` (one set).
  void publish(const std::string& key, int rank, const std::string& value);
  // Rank q's value under `key`; waits, as the Store's get() does, until it is there.
  std::string read(const std::string& key, int q);
  // Several ranks' values under `key`, in the order of `ranks` (one round trip where the
  // Store has multiGet).
  std::vector<std::string> readMany(const std::string& key, const std::vector<int>& ranks);
  // Collective over a group of `size`: every rank publishes `mine`, rank 0 reads them all
  // and publishes decision(values), which every rank returns.  Where the decision throws
  // on rank 0, it publishes the error, so every other rank raises it at once (not at the
  // Store's timeout).
  std::string decide(const std::string& key, int rank, int size, const std::string& mine, const Decision& decision);
  // Every rank of a group of `size` adds one to `key` and waits until all have (or
  // `deadline` passes; a store gone meanwhile means its host has been and left): a step
  // after which ranks that all raise may do so without pulling the store from under a
  // slower one.
  void leaveTogether(const std::string& key, int size, Deadline deadline);
  // A GroupStore of the same keys and counts on a connection of its own where the Store
  // can make one (torch 2.9 on), for reads from other threads: a thread of this process
  // blocked in a wait on the shared connection would hold it.
  GroupStore ownConnection() const;

  StoreTraffic traffic() const;

 private:
  struct Counts {
    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> written{0};
    std::atomic<uint64_t> read{0};
  };
  GroupStore(c10::intrusive_ptr<c10d::Store> store, std::string prefix, std::shared_ptr<Counts> counts);
  void count(uint64_t written, uint64_t read) const;
  std::string keyOf(const std::string& key, int q) const;
  std::vector<std::string> keysOf(const std::string& key, const std::vector<int>& ranks) const;
  // The values of `keys` (one round trip where the Store has multiGet).
  std::vector<std::string> readKeys(const std::vector<std::string>& keys);

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  std::shared_ptr<Counts> counts_; // shared with ownConnection()'s copies
};

} // namespace ringpg
