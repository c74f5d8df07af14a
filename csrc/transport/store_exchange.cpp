#include "transport/store_exchange.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "common/torch_compat.h"

namespace ringpg {

namespace {

std::vector<uint8_t> bytesOf(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string stringOf(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

// What sending `keys` costs (a wait's or a multiGet's request).
uint64_t keyBytes(const std::vector<std::string>& keys) {
  return std::accumulate(keys.begin(), keys.end(), uint64_t{0},
                         [](uint64_t n, const std::string& k) { return n + k.size(); });
}

} // namespace

std::shared_ptr<GroupStore> GroupStore::forNewGroup(c10::intrusive_ptr<c10d::Store> store, int rank) {
  const std::string key = c10::str("ringpg/instance/", rank);
  const int64_t instance = store->add(key, 1);
  auto g = std::make_shared<GroupStore>(std::move(store), c10::str("ringpg/", instance, "/"));
  g->count(key.size(), 0);
  return g;
}

GroupStore::GroupStore(c10::intrusive_ptr<c10d::Store> store, std::string prefix)
    : GroupStore(std::move(store), std::move(prefix), std::make_shared<Counts>()) {}

GroupStore::GroupStore(c10::intrusive_ptr<c10d::Store> store, std::string prefix, std::shared_ptr<Counts> counts)
    : store_(std::move(store)), prefix_(std::move(prefix)), counts_(std::move(counts)) {}

void GroupStore::count(uint64_t written, uint64_t read) const {
  counts_->requests.fetch_add(1, std::memory_order_relaxed);
  counts_->written.fetch_add(written, std::memory_order_relaxed);
  counts_->read.fetch_add(read, std::memory_order_relaxed);
}

std::string GroupStore::keyOf(const std::string& key, int q) const {
  return c10::str(prefix_, key, "/", q);
}

void GroupStore::publish(const std::string& key, int rank, const std::string& value) {
  const std::string k = keyOf(key, rank);
  store_->set(k, bytesOf(value));
  count(k.size() + value.size(), 0);
}

std::string GroupStore::read(const std::string& key, int q) {
  const std::string k = keyOf(key, q);
  std::string value = stringOf(store_->get(k));
  count(k.size(), value.size());
  return value;
}

std::vector<std::string> GroupStore::keysOf(const std::string& key, const std::vector<int>& ranks) const {
  std::vector<std::string> keys;
  keys.reserve(ranks.size());
  for (const int q : ranks) {
    keys.push_back(keyOf(key, q));
  }
  return keys;
}

std::vector<std::string> GroupStore::readKeys(const std::vector<std::string>& keys) {
  std::vector<std::string> values;
  uint64_t read = 0;
  for (const auto& b : store_->multiGet(keys)) { // one round trip where the Store has it (TCPStore)
    values.push_back(stringOf(b));
    read += values.back().size();
  }
  count(keyBytes(keys), read);
  return values;
}

std::vector<std::string> GroupStore::readMany(const std::string& key, const std::vector<int>& ranks) {
  return readKeys(keysOf(key, ranks));
}

std::string GroupStore::decide(const std::string& key, int rank, int size, const std::string& mine,
                               const Decision& decision) {
  if (size == 1) {
    return decision({mine});
  }
  publish(key, rank, mine);
  // The decision goes under key -1 (not a rank's), marked as made or failed.
  constexpr char kMade = '+';
  constexpr char kFailed = '!';
  if (rank != 0) {
    const std::string v = read(key, -1);
    TORCH_CHECK(!v.empty() && v[0] != kFailed, "ringpg: rank 0 could not decide the group's ", key, ": ",
                v.empty() ? std::string("(no reason given)") : v.substr(1));
    return v.substr(1);
  }
  std::vector<int> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  const std::vector<std::string> keys = keysOf(key, ranks);
  store_->wait(keys); // every rank's value is in (a multiGet need not wait)
  count(keyBytes(keys), 0);
  std::string made;
  try {
    made = decision(readKeys(keys));
  } catch (const std::exception& e) {
    publish(key, -1, kFailed + std::string(e.what()));
    throw;
  }
  publish(key, -1, kMade + made);
  return made;
}

void GroupStore::leaveTogether(const std::string& key, int size, Deadline deadline) {
  const std::string k = prefix_ + key;
  try {
    store_->add(k, 1);
    count(k.size(), 0);
    while (store_->add(k, 0) < size && Clock::now() < deadline) {
      count(k.size(), 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } catch (const std::exception&) {
    // The store's host has left: every rank it waited for has been and gone.
  }
}

GroupStore GroupStore::ownConnection() const {
#if RINGPG_HAS_STORE_CLONE
  try {
    return GroupStore(store_->clone(), prefix_, counts_);
  } catch (const c10::Error&) {
    // A Store that cannot be cloned (one written in Python, say) is shared as it is.
  }
#endif
  return GroupStore(store_, prefix_, counts_);
}

StoreTraffic GroupStore::traffic() const {
  return StoreTraffic{counts_->requests.load(std::memory_order_relaxed),
                      counts_->written.load(std::memory_order_relaxed), counts_->read.load(std::memory_order_relaxed)};
}

} // namespace ringpg
