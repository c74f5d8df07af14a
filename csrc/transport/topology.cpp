#include "transport/topology.h"

#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <numeric>

#include "common/config.h"
#include "common/host.h"
#include "transport/rendezvous.h"
#include "transport/store_exchange.h"

namespace ringpg {

Topology Topology::fromHosts(const std::vector<std::string>& hostIds) {
  const int n = static_cast<int>(hostIds.size());
  Topology t;
  t.hostOf.resize(n);
  std::vector<std::string> seen; // hosts in order of first appearance
  for (const auto r : c10::irange(n)) {
    auto it = std::find(seen.begin(), seen.end(), hostIds[r]);
    t.hostOf[r] = static_cast<int>(it - seen.begin());
    if (it == seen.end()) {
      seen.push_back(hostIds[r]);
    }
  }
  t.hosts = std::max<int>(1, static_cast<int>(seen.size()));
  t.ring.resize(n);
  std::iota(t.ring.begin(), t.ring.end(), 0);
  // Stable: within a host the ranks keep their order.
  std::stable_sort(t.ring.begin(), t.ring.end(), [&](int a, int b) { return t.hostOf[a] < t.hostOf[b]; });
  t.position.resize(n);
  t.hostRanks.resize(t.hosts);
  t.local.resize(n);
  for (const auto pos : c10::irange(n)) {
    const int r = t.ring[pos];
    t.position[r] = pos;
    auto& mine = t.hostRanks[t.hostOf[r]];
    t.local[r] = static_cast<int>(mine.size());
    mine.push_back(r);
  }
  const int k = static_cast<int>(t.hostRanks[0].size());
  const bool equal = std::all_of(t.hostRanks.begin(), t.hostRanks.end(),
                                 [k](const std::vector<int>& h) { return static_cast<int>(h.size()) == k; });
  t.perHost = equal ? k : 0;
  for (const auto& h : t.hostRanks) {
    t.mostPerHost = std::max(t.mostPerHost, static_cast<int>(h.size()));
  }
  return t;
}

Topology Topology::singleHost(int size) {
  return fromHosts(std::vector<std::string>(size, ""));
}

std::vector<int> Topology::localRanks(int j) const {
  std::vector<int> out;
  for (const auto& mine : hostRanks) {
    if (j < static_cast<int>(mine.size())) {
      out.push_back(mine[j]);
    }
  }
  return out;
}

bool Topology::anyHostShared() const {
  return size() > hosts;
}

namespace {

std::string firstLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

} // namespace

std::string hostIdentity() {
  const Config& cfg = Config::get();
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

Topology exchangeTopology(c10d::Store& store, const std::string& prefix, int rank, int size) {
  if (size == 1) {
    Topology t = Topology::singleHost(1);
    t.hostCpus = {usableCpus()};
    return t;
  }
  // One value a rank, in one round trip: "IDENTITY\nSHARE" (a share holds no newline).
  const auto values = allGatherValues(store, prefix + "host", rank, size, hostIdentity() + "\n" + cpuShareText());
  std::vector<std::string> ids;
  std::vector<std::string> shares;
  for (const auto& v : values) {
    const size_t nl = v.rfind('\n');
    ids.push_back(nl == std::string::npos ? v : v.substr(0, nl));
    shares.push_back(nl == std::string::npos ? std::string() : v.substr(nl + 1));
  }
  Topology t = Topology::fromHosts(ids);
  for (const auto& ranks : t.hostRanks) {
    std::vector<std::string> mine;
    for (const int r : ranks) {
      mine.push_back(shares[r]);
    }
    t.hostCpus.push_back(cpusTogether(mine));
  }
  return t;
}

} // namespace ringpg
