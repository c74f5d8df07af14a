#include "transport/topology.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <numeric>
#include <sstream>
#include <unordered_map>

#include "common/config.h"
#include "common/host.h"
#include "transport/rendezvous.h"
#include "transport/store_exchange.h"

namespace ringpg {

Topology Topology::fromHosts(const std::vector<std::string>& hostIds) {
  std::unordered_map<std::string, int> index; // host -> its number, by first appearance
  std::vector<int> hostOf;
  hostOf.reserve(hostIds.size());
  for (const auto& id : hostIds) {
    hostOf.push_back(index.emplace(id, static_cast<int>(index.size())).first->second);
  }
  return fromHostIndexes(hostOf);
}

Topology::Topology() : a_(std::make_shared<const Arrays>()) {}

Topology Topology::fromHostIndexes(const std::vector<int>& hostOf, std::vector<int> hostCpus) {
  const int n = static_cast<int>(hostOf.size());
  const int hosts = std::max(1, n == 0 ? 0 : *std::max_element(hostOf.begin(), hostOf.end()) + 1);
  auto a = std::make_shared<Arrays>();
  a->hostOf = hostOf;
  a->ring.resize(n);
  std::iota(a->ring.begin(), a->ring.end(), 0);
  // Stable: within a host the ranks keep their order.
  std::stable_sort(a->ring.begin(), a->ring.end(), [&](int x, int y) { return hostOf[x] < hostOf[y]; });
  a->position.resize(n);
  a->hostRanks.resize(hosts);
  a->local.resize(n);
  for (const auto pos : c10::irange(n)) {
    const int r = a->ring[pos];
    a->position[r] = pos;
    auto& mine = a->hostRanks[hostOf[r]];
    a->local[r] = static_cast<int>(mine.size());
    mine.push_back(r);
  }
  a->hostCpus = std::move(hostCpus);
  return Topology(std::move(a));
}

Topology::Topology(std::shared_ptr<const Arrays> arrays) : a_(std::move(arrays)) {
  hosts = std::max<int>(1, a_->hostRanks.size());
  const int k = a_->hostRanks.empty() ? 0 : static_cast<int>(a_->hostRanks[0].size());
  const bool equal = std::all_of(a_->hostRanks.begin(), a_->hostRanks.end(),
                                 [k](const std::vector<int>& h) { return static_cast<int>(h.size()) == k; });
  perHost_ = equal ? k : 0;
  for (const auto& h : a_->hostRanks) {
    mostPerHost_ = std::max(mostPerHost_, static_cast<int>(h.size()));
  }
}

Topology Topology::singleHost(int size, std::vector<int> hostCpus) {
  return fromHostIndexes(std::vector<int>(size, 0), std::move(hostCpus));
}

Topology Topology::fromEncoded(const std::string& text, int size) {
  // The arrays this process decoded, by form and size, while some group holds them.
  // Guarded by `mu`; expired entries are dropped as new forms arrive.
  static std::mutex mu;
  static std::unordered_map<std::string, std::weak_ptr<const Arrays>> decoded;
  const std::string key = c10::str(size, ":", text);
  std::lock_guard<std::mutex> lk(mu);
  if (auto it = decoded.find(key); it != decoded.end()) {
    if (auto arrays = it->second.lock()) {
      return Topology(std::move(arrays));
    }
  }
  std::vector<int> hostOf;
  std::vector<int> cpus;
  decodeHosts(text, size, &hostOf, &cpus);
  Topology t = fromHostIndexes(hostOf, std::move(cpus));
  for (auto it = decoded.begin(); it != decoded.end();) {
    it = it->second.expired() ? decoded.erase(it) : std::next(it);
  }
  decoded[key] = t.a_;
  return t;
}

std::vector<int> Topology::localRanks(int j) const {
  std::vector<int> out;
  for (const auto& mine : a_->hostRanks) {
    if (j < static_cast<int>(mine.size())) {
      out.push_back(mine[j]);
    }
  }
  return out;
}

bool Topology::anyHostShared() const {
  return size() > hosts;
}

int Topology::cpusOfHost(int h) const {
  TORCH_CHECK(static_cast<size_t>(h) < a_->hostCpus.size(), "ringpg: no CPU count for host ", h, " in this topology");
  return a_->hostCpus[h];
}

namespace {

std::string firstLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

} // namespace

std::string hostIdentity(const Config& cfg) {
  if (!cfg.hostId.empty()) {
    return "id:" + cfg.hostId;
  }
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  char netns[128] = {0};
  ssize_t n = ::readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
  (void)n;
  return c10::str(host, "|", firstLine("/proc/sys/kernel/random/boot_id"), "|", netns);
}

std::string encodeHosts(const std::vector<int>& hostOf, const std::vector<int>& hostCpus) {
  const int n = static_cast<int>(hostOf.size());
  const int hosts = n == 0 ? 0 : *std::max_element(hostOf.begin(), hostOf.end()) + 1;
  // Host 0's ranks come first in blocks: K is where host 0's run ends.
  const int k =
      static_cast<int>(std::find_if(hostOf.begin(), hostOf.end(), [](int h) { return h != 0; }) - hostOf.begin());
  bool blocks = k > 0;
  bool cyclic = hosts > 0;
  for (const auto r : c10::irange(n)) {
    blocks = blocks && hostOf[r] == r / k;
    cyclic = cyclic && hostOf[r] == r % hosts;
  }
  std::string out;
  if (blocks) {
    out = c10::str("blocks ", k);
  } else if (cyclic) {
    out = c10::str("cyclic ", hosts);
  } else {
    out = "list";
    for (const int h : hostOf) {
      out += c10::str(" ", h);
    }
  }
  const bool sameCpus =
      !hostCpus.empty() && std::all_of(hostCpus.begin(), hostCpus.end(), [&](int c) { return c == hostCpus[0]; });
  out += sameCpus ? c10::str(";every ", hostCpus[0]) : std::string(";each");
  if (!sameCpus) {
    for (const int c : hostCpus) {
      out += c10::str(" ", c);
    }
  }
  return out;
}

void decodeHosts(const std::string& text, int size, std::vector<int>* hostOf, std::vector<int>* hostCpus) {
  const size_t semi = text.find(';');
  TORCH_CHECK(semi != std::string::npos, "ringpg: a malformed host topology in the Store: '", text, "'");
  std::istringstream hosts(text.substr(0, semi));
  std::istringstream cpus(text.substr(semi + 1));
  std::string form;
  hosts >> form;
  hostOf->assign(size, 0);
  int m = 0;
  if (form == "blocks" || form == "cyclic") {
    hosts >> m;
    TORCH_CHECK(!hosts.fail() && m > 0, "ringpg: a malformed host topology in the Store: '", text, "'");
    for (const auto r : c10::irange(size)) {
      (*hostOf)[r] = form == "blocks" ? r / m : r % m;
    }
  } else {
    TORCH_CHECK(form == "list", "ringpg: a malformed host topology in the Store: '", text, "'");
    for (auto& h : *hostOf) {
      hosts >> h;
    }
    TORCH_CHECK(!hosts.fail(), "ringpg: a host topology of fewer than ", size, " ranks in the Store");
  }
  const int count = size == 0 ? 0 : *std::max_element(hostOf->begin(), hostOf->end()) + 1;
  cpus >> form;
  hostCpus->assign(count, 0);
  if (form == "every") {
    cpus >> m;
    std::fill(hostCpus->begin(), hostCpus->end(), m);
  } else {
    for (auto& c : *hostCpus) {
      cpus >> c;
    }
  }
  TORCH_CHECK(!cpus.fail() && (form == "every" || form == "each"), "ringpg: a malformed host topology in the Store: '",
              text, "'");
}

namespace {

// Rank 0's decision over every rank's "IDENTITY\nSHARE": the compact form of the hosts.
std::string decideHosts(const std::vector<std::string>& values) {
  std::vector<std::string> ids;
  std::vector<std::string> shares;
  for (const auto& v : values) {
    const size_t nl = v.rfind('\n');
    ids.push_back(nl == std::string::npos ? v : v.substr(0, nl));
    shares.push_back(nl == std::string::npos ? std::string() : v.substr(nl + 1));
  }
  const Topology t = Topology::fromHosts(ids);
  std::vector<int> cpus;
  for (const auto h : c10::irange(t.hosts)) {
    std::vector<std::string> mine;
    for (const int r : t.ranksOfHost(h)) {
      mine.push_back(shares[r]);
    }
    cpus.push_back(cpusTogether(mine));
  }
  return encodeHosts(t.hostOfEach(), cpus);
}

} // namespace

Topology exchangeTopology(GroupStore& store, int rank, int size, const Config& cfg) {
  if (size == 1) {
    return Topology::singleHost(1, {usableCpus()});
  }
  // One value a rank: "IDENTITY\nSHARE" (a share holds no newline).  Rank 0 alone reads
  // them all and publishes the compact form every rank decodes.
  const std::string encoded = store.decide("host", rank, size, hostIdentity(cfg) + "\n" + cpuShareText(), decideHosts);
  return Topology::fromEncoded(encoded, size);
}

} // namespace ringpg
