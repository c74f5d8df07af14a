#include "transport/store_exchange.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <charconv>
#include <chrono>
#include <thread>

namespace ringpg {

namespace {

std::vector<uint8_t> bytesOf(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string stringOf(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

} // namespace

std::string packValues(const std::vector<std::string>& values) {
  std::string out;
  for (const auto& v : values) {
    out += std::to_string(v.size());
    out += ':';
    out += v;
  }
  return out;
}

std::vector<std::string> unpackValues(const std::string& packed, size_t count) {
  std::vector<std::string> out;
  const char* at = packed.data();
  const char* const end = packed.data() + packed.size();
  while (at < end) {
    size_t len = 0;
    const auto [colon, ec] = std::from_chars(at, end, len); // digits only: no sign, no space
    TORCH_CHECK(ec == std::errc() && colon < end && *colon == ':' && len <= static_cast<size_t>(end - colon - 1),
                "ringpg: a malformed value in the Store (at byte ", at - packed.data(), ")");
    out.emplace_back(colon + 1, len);
    at = colon + 1 + len;
  }
  TORCH_CHECK(out.size() == count, "ringpg: the Store holds ", out.size(), " values where ", count,
              " ranks were expected: is another job using this Store's keys?");
  return out;
}

std::vector<std::string> allGatherValues(c10d::Store& store, const std::string& key, int rank, int size,
                                         const std::string& mine) {
  if (size == 1) {
    return {mine};
  }
  store.set(c10::str(key, "/", rank), bytesOf(mine));
  // The add is counted after this rank's set, so the rank that brings the count to
  // `size` knows that every value is in.
  if (store.add(key + "/arrived", 1) == size) {
    std::vector<std::string> keys;
    keys.reserve(size);
    for (const auto q : c10::irange(size)) {
      keys.push_back(c10::str(key, "/", q));
    }
    std::vector<std::string> all;
    all.reserve(size);
    for (const auto& b : store.multiGet(keys)) { // one round trip where the Store has it (TCPStore)
      all.push_back(stringOf(b));
    }
    store.set(key + "/all", bytesOf(packValues(all)));
  }
  return unpackValues(stringOf(store.get(key + "/all")), static_cast<size_t>(size));
}

void leaveTogether(c10d::Store& store, const std::string& key, int size, Deadline deadline) {
  try {
    store.add(key, 1);
    while (store.add(key, 0) < size && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } catch (const std::exception&) {
    // The store's host has left: every rank it waited for has been and gone.
  }
}

} // namespace ringpg
