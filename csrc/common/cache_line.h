// The cache line every layout and stride in ringpg assumes.
#pragma once

#include <cstddef>

namespace ringpg {

// 64 bytes on every x86-64 and Arm core ringpg runs on.  Where a word that one process
// writes sits on a line of its own in shared memory, a peer's reads of its neighbours
// cost no transfer of that line; where blocks and pieces start on a line, no two
// writers share one.  A core with a larger line still works, only with some sharing;
// a stride that evicts lines (evictFromCaches) only has to be no larger than the line.
constexpr size_t kCacheLine = 64;

} // namespace ringpg
