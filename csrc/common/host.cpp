#include "common/host.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

namespace ringpg {
namespace {

std::optional<std::string> readFile(const char* path) {
  std::ifstream f(path);
  if (!f) {
    return std::nullopt;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// ceil(quota / period) CPUs; nullopt for "no limit" (a quota <= 0, as v1's -1).
std::optional<int> cpusFromQuota(long long quota, long long period) {
  if (quota <= 0 || period <= 0) {
    return std::nullopt;
  }
  return static_cast<int>(std::max(1LL, (quota + period - 1) / period));
}

std::optional<int> quotaCpus() {
  if (auto v2 = readFile("/sys/fs/cgroup/cpu.max")) {
    return cpusFromCpuMax(*v2);
  }
  for (const char* dir : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
    const auto quota = readFile((std::string(dir) + "/cpu.cfs_quota_us").c_str());
    const auto period = readFile((std::string(dir) + "/cpu.cfs_period_us").c_str());
    if (quota && period) {
      try {
        return cpusFromQuota(std::stoll(*quota), std::stoll(*period));
      } catch (const std::exception&) {
        return std::nullopt;
      }
    }
  }
  return std::nullopt;
}

} // namespace

std::optional<int> cpusFromCpuMax(const std::string& text) {
  std::istringstream in(text);
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || quota == "max") {
    return std::nullopt;
  }
  try {
    size_t used = 0;
    const long long q = std::stoll(quota, &used);
    return used == quota.size() ? cpusFromQuota(q, period) : std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

int usableCpus() {
  int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    cpus = std::max(1, CPU_COUNT(&set));
  }
  if (const auto q = quotaCpus()) {
    cpus = std::min(cpus, *q);
  }
  return cpus;
}

} // namespace ringpg
