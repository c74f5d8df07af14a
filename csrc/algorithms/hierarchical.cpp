#include "algorithms/hierarchical.h"

#include "algorithms/ring.h"
#include "algorithms/ring_plan.h"

#include <cstring>

namespace ringpg {

namespace {

// Segments per chunk on the host and cross-host rings.  Their hops mix links (a host
// ring closes over TCP), and both ends of every hop must cut alike, so one value for all.
constexpr int64_t kMinSegments = 16;

// What every hierarchical collective of this rank runs on: its host's ring and the ring
// of its local index across hosts.  Made at the start of the op, which it names in the
// trace.
struct HierRings {
  const Topology& t;
  int j;          // this rank's local index: its cross-host ring
  RingView host;  // this rank's host
  RingView cross; // local rank j of every host, hosts in order

  explicit HierRings(OpContext& c)
      : t(c.topology()), j(t.localIndex(c.rank())),
        host(RingView::of(t.ranksOfHost(t.hostOf[c.rank()]), c.rank(), kMinSegments)),
        cross(RingView::of(t.localRanks(j), c.rank(), kMinSegments)) {
    if (c.trace()) {
      c.trace()->algorithm = "hier";
    }
  }
};

} // namespace

bool hierarchicalApplies(const Topology& t, Config::Algo algo) {
  if (algo == Config::Algo::Ring || t.size() < 2 || t.ranksPerHost() == 0) {
    return false; // asked for the flat ring, or hosts hold different numbers of ranks
  }
  return algo == Config::Algo::Hier || (t.hosts > 1 && t.ranksPerHost() > 1);
}

void hierAllreduce(OpContext& c, char* data, int64_t count, size_t es, RedOp op,
                   const std::function<void(char*, int64_t)>& finalize) {
  const HierRings rings(c);
  // 1. Reduce-scatter on the host: chunk j of K ends here, summed over the host.
  ringCollectiveOn(c, rings.host, RingJob{.count = count, .elemSize = es, .reduceScatter = true, .op = op},
                   RingBuffers{data, data, nullptr});
  // 2. Allreduce of chunk j over local rank j of every host (AVG divides here, once).
  const Range mine = chunkRange(count, rings.t.ranksPerHost(), rings.j);
  char* chunk = data + mine.offset * static_cast<int64_t>(es);
  ringCollectiveOn(c, rings.cross,
                   RingJob{.count = mine.length, .elemSize = es, .reduceScatter = true, .allGather = true, .op = op,
                           .finalize = finalize},
                   RingBuffers{chunk, chunk, nullptr});
  // 3. All-gather on the host: every chunk to every rank.
  ringCollectiveOn(c, rings.host, RingJob{.count = count, .elemSize = es, .allGather = true},
                   RingBuffers{nullptr, data, nullptr});
}

void hierReduceScatter(OpContext& c, const char* input, char* output, int64_t count, size_t es, RedOp op,
                       const std::function<void(char*, int64_t)>& finalize, char* layout) {
  const HierRings rings(c);
  const Topology& t = rings.t;
  const size_t chunkBytes = static_cast<size_t>(count / t.size()) * es;
  for (int r = 0; r < t.size(); ++r) {
    std::memcpy(layout + t.hierSlot(r) * chunkBytes, input + r * chunkBytes, chunkBytes);
  }
  // 1. Reduce-scatter on the host: slots [j*H, (j+1)*H) end here, summed over the host.
  ringCollectiveOn(c, rings.host, RingJob{.count = count, .elemSize = es, .reduceScatter = true, .op = op},
                   RingBuffers{layout, layout, nullptr});
  // 2. Reduce-scatter of those H chunks across the hosts: the member at position h of
  //    ring j is host h's local rank j, whose chunk is slot j*H + h.
  char* mine = layout + static_cast<size_t>(rings.j) * t.hosts * chunkBytes;
  ringCollectiveOn(c, rings.cross,
                   RingJob{.count = count / t.size() * t.hosts, .elemSize = es, .reduceScatter = true, .op = op,
                           .finalize = finalize},
                   RingBuffers{mine, mine, output});
}

void hierAllGather(OpContext& c, const char* input, char* output, int64_t count, size_t es, char* layout) {
  const HierRings rings(c);
  const Topology& t = rings.t;
  const size_t chunkBytes = static_cast<size_t>(count / t.size()) * es;
  const char* ownSlot = layout + t.hierSlot(c.rank()) * chunkBytes;
  // 1. All-gather across the hosts into this ring's slots (the own chunk read from
  //    `input`, or already in place when it is the own slot).
  char* mine = layout + static_cast<size_t>(rings.j) * t.hosts * chunkBytes;
  ringCollectiveOn(c, rings.cross, RingJob{.count = count / t.size() * t.hosts, .elemSize = es, .allGather = true},
                   RingBuffers{nullptr, mine, input == ownSlot ? nullptr : const_cast<char*>(input)});
  // 2. All-gather on the host: every ring's slots to every rank.
  ringCollectiveOn(c, rings.host, RingJob{.count = count, .elemSize = es, .allGather = true},
                   RingBuffers{nullptr, layout, nullptr});
  // 3. Rank order.
  if (layout != output) {
    for (int r = 0; r < t.size(); ++r) {
      std::memcpy(output + r * chunkBytes, layout + t.hierSlot(r) * chunkBytes, chunkBytes);
    }
  }
}

} // namespace ringpg
