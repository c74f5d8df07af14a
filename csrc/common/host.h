// What this process may use of its host, for defaults that depend on it.
#pragma once

#include <optional>
#include <string>

namespace ringpg {

// CPUs a cgroup CPU quota allows, from the text of cgroup v2's cpu.max ("QUOTA PERIOD"
// or "max PERIOD"): ceil(QUOTA / PERIOD), or nullopt when unlimited or unreadable.
std::optional<int> cpusFromCpuMax(const std::string& text);

// CPUs this process may run on: its affinity mask (taskset, cpusets), lowered by a
// CFS quota (container CPU limits, cgroup v2 cpu.max or v1 cpu.cfs_quota_us, as seen
// at /sys/fs/cgroup); at least 1.
int usableCpus();

} // namespace ringpg
