#include "common/host.h"

#if defined(__x86_64__)
#include <emmintrin.h> // _mm_clflush, _mm_mfence: SSE2, in every x86-64
#endif

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/cache_line.h"

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

// One directory's limit.
std::optional<int> quotaCpusAt(const std::string& dir, bool v2) {
  if (v2) {
    const auto text = readFile((dir + "/cpu.max").c_str());
    return text ? cpusFromCpuMax(*text) : std::nullopt;
  }
  const auto quota = readFile((dir + "/cpu.cfs_quota_us").c_str());
  const auto period = readFile((dir + "/cpu.cfs_period_us").c_str());
  if (!quota || !period) {
    return std::nullopt;
  }
  try {
    return cpusFromQuota(std::stoll(*quota), std::stoll(*period));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The v2 (unified) hierarchy if the cpu controller lives there, else the v1 one.
std::optional<int> quotaCpus() {
  const std::string self = readFile("/proc/self/cgroup").value_or("");
  if (readFile("/sys/fs/cgroup/cgroup.controllers")) {
    return quotaCpusAlong("/sys/fs/cgroup", cgroupPath(self, "").value_or("/"), /*v2=*/true);
  }
  for (const char* mount : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
    if (readFile((std::string(mount) + "/cpu.cfs_period_us").c_str())) {
      return quotaCpusAlong(mount, cgroupPath(self, "cpu").value_or("/"), /*v2=*/false);
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

std::optional<std::string> cgroupPath(const std::string& procSelfCgroup, const std::string& controller) {
  std::istringstream in(procSelfCgroup);
  std::string line;
  while (std::getline(in, line)) {
    // "ID:CONTROLLERS:PATH"; the path itself may contain ':'.
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) {
      continue;
    }
    std::istringstream names(line.substr(a + 1, b - a - 1));
    std::string name;
    bool match = controller.empty() && line.compare(0, a, "0") == 0 && b == a + 1;
    while (!match && !controller.empty() && std::getline(names, name, ',')) {
      match = name == controller;
    }
    if (match) {
      return line.substr(b + 1);
    }
  }
  return std::nullopt;
}

std::optional<int> quotaCpusAlong(const std::string& mount, const std::string& path, bool v2) {
  std::optional<int> tightest;
  std::string rel = path.empty() || path[0] == '/' ? path : "/" + path;
  while (true) {
    while (!rel.empty() && rel.back() == '/') {
      rel.pop_back();
    }
    if (const auto q = quotaCpusAt(mount + rel, v2)) {
      tightest = std::min(tightest.value_or(*q), *q);
    }
    if (rel.empty()) {
      return tightest; // the mount's root was the last level
    }
    rel.erase(rel.rfind('/') == std::string::npos ? 0 : rel.rfind('/'));
  }
}

bool evictFromCaches(const void* p, size_t n) {
  // A larger line than kCacheLine is evicted whole by the first address in it, so the
  // stride only has to be no larger.
  const auto* bytes = static_cast<const char*>(p);
#if defined(__x86_64__)
  for (size_t o = 0; o < n; o += kCacheLine) {
    _mm_clflush(bytes + o);
  }
  _mm_mfence(); // the flushes are done before anything timed after them
  return true;
#elif defined(__aarch64__)
  for (size_t o = 0; o < n; o += kCacheLine) {
    asm volatile("dc civac, %0" ::"r"(bytes + o) : "memory");
  }
  asm volatile("dsb ish" ::: "memory");
  return true;
#else
  (void)bytes;
  (void)n;
  return false;
#endif
}

void nameThisThread(const char* name) {
  char buf[16] = {}; // the kernel keeps 15 characters and the terminator
  std::snprintf(buf, sizeof(buf), "%s", name);
  pthread_setname_np(pthread_self(), buf); // only a label: a failure changes nothing
}

std::optional<size_t> cacheBytesFromText(const std::string& text) {
  std::istringstream in(text);
  long long n = 0;
  std::string unit;
  if (!(in >> n) || n < 0) {
    return std::nullopt;
  }
  in >> unit; // empty where the size has no suffix
  const size_t scale = unit.empty()  ? 1
                       : unit == "K" ? size_t{1} << 10
                       : unit == "M" ? size_t{1} << 20
                       : unit == "G" ? size_t{1} << 30
                                     : 0;
  if (scale == 0 || (in >> unit)) {
    return std::nullopt;
  }
  return static_cast<size_t>(n) * scale;
}

size_t lastLevelCacheBytes() {
  // The kernel's view first: glibc's sysconf counts a whole socket's L3 on some AMD
  // parts (384 MiB on a Zen 5 guest whose core sees 32 MiB).
  size_t best = 0;
  int bestLevel = 0;
  for (int i = 0;; ++i) {
    const std::string dir = c10::str("/sys/devices/system/cpu/cpu0/cache/index", i, "/");
    const auto level = readFile((dir + "level").c_str());
    const auto type = readFile((dir + "type").c_str());
    const auto size = readFile((dir + "size").c_str());
    if (!level || !type || !size) {
      break;
    }
    const int lv = std::atoi(level->c_str());
    const auto bytes = cacheBytesFromText(*size);
    if (bytes && type->rfind("Instruction", 0) != 0 && lv > bestLevel) {
      best = *bytes;
      bestLevel = lv;
    }
  }
  if (best > 0) {
    return best;
  }
  for (const int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long bytes = ::sysconf(name);
    if (bytes > 0) {
      return static_cast<size_t>(bytes);
    }
  }
  return 0;
}

int usableCpus() {
  return cpusTogether({cpuShareText()}); // this process alone: its mask, lowered by its quota
}

namespace {

// Bumped in every child a fork makes (registered on the first currentThreadId), so that
// a thread id cached before the fork is asked for again after it.
std::atomic<uint32_t> forkGeneration{0};

} // namespace

int32_t currentThreadId() {
  static const bool registered =
      ::pthread_atfork(nullptr, nullptr, [] { forkGeneration.fetch_add(1, std::memory_order_relaxed); }) == 0;
  (void)registered;
  thread_local uint32_t askedIn = UINT32_MAX;
  thread_local int32_t self = 0;
  const uint32_t now = forkGeneration.load(std::memory_order_relaxed);
  if (askedIn != now) {
    self = static_cast<int32_t>(::syscall(SYS_gettid));
    askedIn = now;
  }
  return self;
}

bool moveOffCpu(int cpu) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof(mask), &mask) != 0 || CPU_COUNT(&mask) < 2 ||
      !CPU_ISSET(cpu, &mask)) {
    return false;
  }
  cpu_set_t others = mask;
  CPU_CLR(cpu, &others);
  if (sched_setaffinity(0, sizeof(others), &others) != 0) {
    return false;
  }
  if (sched_setaffinity(0, sizeof(mask), &mask) != 0) {
    // Only if the cpuset shrank meanwhile; the thread keeps the narrower mask.
    TORCH_WARN_ONCE("ringpg: could not restore this thread's CPU affinity after moving it off CPU ", cpu, ": ",
                    std::strerror(errno));
  }
  return true;
}

std::string cpuShareText() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    // A mask we cannot read (more CPUs than a cpu_set_t holds): every CPU the host
    // has, up to what a cpu_set_t holds.
    for (unsigned cpu = 0; cpu < std::max(1u, std::thread::hardware_concurrency()) && cpu < CPU_SETSIZE; ++cpu) {
      CPU_SET(cpu, &set);
    }
  }
  // Runs of set bits as "a-b" (or "a" alone), comma-separated: a pinned rank is one
  // number, an unpinned one a range, whatever the host's CPU count.
  std::string list;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) {
      continue;
    }
    int last = cpu;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) {
      ++last;
    }
    list += c10::str(list.empty() ? "" : ",", cpu, last > cpu ? c10::str("-", last) : std::string());
    cpu = last;
  }
  const auto quota = quotaCpus();
  return c10::str(list, ";", quota ? std::to_string(*quota) : std::string("-"));
}

int cpusTogether(const std::vector<std::string>& shares) {
  std::vector<bool> any; // any[cpu]: some share's mask holds cpu
  std::optional<int> largestQuota;
  bool unlimited = false; // some share has no quota
  for (const auto& share : shares) {
    const size_t semi = share.find(';');
    std::istringstream runs(share.substr(0, semi));
    std::string run;
    while (std::getline(runs, run, ',')) {
      int first = 0;
      int last = 0;
      char dash = 0;
      std::istringstream in(run);
      if (!(in >> first) || first < 0) {
        continue;
      }
      last = first;
      if (in >> dash && !(dash == '-' && in >> last)) {
        continue;
      }
      if (last < first || last >= CPU_SETSIZE) {
        continue;
      }
      if (any.size() <= static_cast<size_t>(last)) {
        any.resize(last + 1, false);
      }
      std::fill(any.begin() + first, any.begin() + last + 1, true);
    }
    const std::string quota = semi == std::string::npos ? "-" : share.substr(semi + 1);
    int q = 0;
    if (std::istringstream(quota) >> q && q > 0) {
      largestQuota = std::max(largestQuota.value_or(q), q);
    } else {
      unlimited = true;
    }
  }
  int cpus = static_cast<int>(std::count(any.begin(), any.end(), true));
  if (largestQuota && !unlimited) {
    cpus = std::min(cpus, *largestQuota);
  }
  return std::max(1, cpus);
}

} // namespace ringpg
