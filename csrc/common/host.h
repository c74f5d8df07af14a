// What this process may use of its host, for defaults that depend on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ringpg {

// CPUs a cgroup CPU quota allows, from the text of cgroup v2's cpu.max ("QUOTA PERIOD"
// or "max PERIOD"): ceil(QUOTA / PERIOD), or nullopt when unlimited or unreadable.
std::optional<int> cpusFromCpuMax(const std::string& text);

// The path of this process's cgroup, from the text of /proc/self/cgroup: in the v1
// hierarchy that has `controller` ("N:cpu,cpuacct:/PATH"), or with an empty
// `controller` in the v2 hierarchy ("0::/PATH"); nullopt when there is none.
std::optional<std::string> cgroupPath(const std::string& procSelfCgroup, const std::string& controller);

// The tightest CPU quota on cgroup `path` of the hierarchy mounted at `mount` and on
// its ancestors (a limit anywhere above a cgroup also binds it): v2 reads each
// directory's cpu.max, v1 its cpu.cfs_quota_us and cpu.cfs_period_us.  Directories
// that do not exist (a container that sees only its own part of the tree) are
// skipped; nullopt when no level has a limit.
std::optional<int> quotaCpusAlong(const std::string& mount, const std::string& path, bool v2);

// A hint to the core that this thread is spinning on a memory location (x86 `pause`,
// Arm `yield`): the sibling hyperthread gets the pipeline, and the spin loop's exit
// costs no memory-order misspeculation.  Never gives the core away: callers that may
// share their core with the thread they wait for yield or sleep instead.
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Writes back and evicts [p, p + n) from every cache level of this core and its
// coherent peers (x86 clflush, Arm `dc civac`), so that the next access goes to
// memory, as a large op's buffers do: the shared-memory links' creation-time
// measurement of buffers the caches do not hold (ShmLink::chooseCopyByMeasuring).
// Returns false and evicts nothing on other architectures.
bool evictFromCaches(const void* p, size_t n);

// Names the calling thread (at most 15 characters: the kernel's limit), so that top -H,
// perf, py-spy and /proc/PID/task/*/comm tell ringpg's threads from the caller's.
void nameThisThread(const char* name);

// Bytes a sysfs cache size reads ("32768K", "1M", "512"), or nullopt where the text
// is no size.
std::optional<size_t> cacheBytesFromText(const std::string& text);

// Bytes of this CPU's last-level cache: the highest-level data or unified cache the
// kernel lists for CPU 0 (sysfs), else the L3 or L2 the C library reports; 0 where
// none is known.
size_t lastLevelCacheBytes();

// CPUs this process may run on: its affinity mask (taskset, cpusets), lowered by a
// CFS quota on its cgroup or an ancestor (container CPU limits, systemd CPUQuota);
// at least 1.
int usableCpus();

// Moves the calling thread off CPU `cpu` onto another CPU of its affinity mask and
// leaves the mask as it was: the mask less `cpu` for a moment (the kernel migrates the
// thread at once), then the mask again.  False, and the thread where it was, when the
// mask holds no other CPU or the kernel refuses (a sandbox without sched_setaffinity).
bool moveOffCpu(int cpu);

// The calling thread's kernel id (gettid), asked once per thread and again in a child a
// fork made (a cached id would be the forking thread's there).
int32_t currentThreadId();

// How a thread spinning on a same-host peer gives way, one look at a time (the waits
// of the shared-memory links and of the host arena: ShmWaiter::wait, which says why at
// length): it pauses where every rank has a core, yields where the host's ranks
// outnumber its CPUs (`yields`); and where the peer it waits for last waited on this
// thread's own CPU (`sharing`: a wakeup queued one behind the other) it moves to another
// CPU of its mask, once per wait (a mask with nowhere else to go refuses, and it yields
// for the rest of the wait).  One per wait.
class SpinGiveWay {
 public:
  explicit SpinGiveWay(bool yields) : yields_(yields) {}
  // One look's pause on `cpu`, this thread's; true when the thread moved off it (the
  // caller publishes where it runs now).
  bool pause(int cpu, bool sharing) {
    if (!yields_ && sharing && mayMove_ && (mayMove_ = moveOffCpu(cpu))) {
      return true;
    }
    if (yields_ || sharing) {
      std::this_thread::yield();
    } else {
      cpuRelax();
    }
    return false;
  }

 private:
  const bool yields_;
  bool mayMove_ = true; // moveOffCpu has not refused during this wait
};

// This process's share of its host's CPUs as text for the group's exchange: its
// affinity mask as a CPU list ("0-3,8") and, after a ';', its CPU quota ("-": none).
std::string cpuShareText();

// CPUs the processes whose cpuShareText() are `shares` may run on together: the union
// of their affinity masks, lowered by the largest of their quotas (ranks in one
// container share its quota; ranks each under a quota of their own are undercounted,
// which only costs a spin).  Ranks each pinned to a CPU of their own (taskset,
// numactl, an MPI launcher's binding) have one CPU each in their own mask but as many
// CPUs as ranks together.  At least 1; an unreadable share counts no CPU.
int cpusTogether(const std::vector<std::string>& shares);

} // namespace ringpg
