#include "algorithms/hierarchical.h"

#include "algorithms/ring.h"
#include "algorithms/ring_plan.h"

#include <cstring>

namespace ringpg {

namespace {

// Segments per chunk on the host and cross-host rings.  Their hops mix links (a host
// ring closes over TCP), and both ends of every hop must cut alike, so one value for all.
constexpr int64_t kMinSegments = 16;

} // namespace

bool hierarchicalApplies(const Topology& t, Config::Algo algo) {
  if (algo == Config::Algo::Ring || t.size() < 2 || t.ranksPerHost() == 0) {
    return false; // asked for the flat ring, or hosts hold different numbers of ranks
  }
  return algo == Config::Algo::Hier || (t.hosts > 1 && t.ranksPerHost() > 1);
}

void hierAllreduce(OpContext& c, char* data, int64_t count, size_t es, RedOp op,
                   const std::function<void(char*, int64_t)>& finalize) {
  const Topology& t = c.topology();
  const int rank = c.rank();
  const int k = t.ranksPerHost();
  const int j = t.localIndex(rank);
  if (c.trace()) {
    c.trace()->algorithm = "hier";
  }
  const RingView host = RingView::of(t.ranksOfHost(t.hostOf[rank]), rank, kMinSegments);
  // 1. Reduce-scatter on the host: chunk j of K ends here, summed over the host.
  RingJob rs;
  rs.count = count;
  rs.elemSize = es;
  rs.reduceScatter = true;
  rs.op = op;
  ringCollectiveOn(c, host, rs, RingBuffers{data, data, nullptr});
  // 2. Allreduce of chunk j over local rank j of every host (AVG divides here, once).
  const Range mine = chunkRange(count, k, j);
  RingJob ar;
  ar.count = mine.length;
  ar.elemSize = es;
  ar.reduceScatter = ar.allGather = true;
  ar.op = op;
  ar.finalize = finalize;
  char* chunk = data + mine.offset * static_cast<int64_t>(es);
  ringCollectiveOn(c, RingView::of(t.localRanks(j), rank, kMinSegments), ar, RingBuffers{chunk, chunk, nullptr});
  // 3. All-gather on the host: every chunk to every rank.
  RingJob ag;
  ag.count = count;
  ag.elemSize = es;
  ag.allGather = true;
  ringCollectiveOn(c, host, ag, RingBuffers{nullptr, data, nullptr});
}

void hierReduceScatter(OpContext& c, const char* input, char* output, int64_t count, size_t es, RedOp op,
                       const std::function<void(char*, int64_t)>& finalize, char* layout) {
  const Topology& t = c.topology();
  const int rank = c.rank();
  const int j = t.localIndex(rank);
  const int64_t n = count / t.size();
  const size_t chunkBytes = static_cast<size_t>(n) * es;
  if (c.trace()) {
    c.trace()->algorithm = "hier";
  }
  for (int r = 0; r < t.size(); ++r) {
    std::memcpy(layout + t.hierSlot(r) * chunkBytes, input + r * chunkBytes, chunkBytes);
  }
  // 1. Reduce-scatter on the host: slots [j*H, (j+1)*H) end here, summed over the host.
  RingJob host;
  host.count = count;
  host.elemSize = es;
  host.reduceScatter = true;
  host.op = op;
  ringCollectiveOn(c, RingView::of(t.ranksOfHost(t.hostOf[rank]), rank, kMinSegments), host,
                   RingBuffers{layout, layout, nullptr});
  // 2. Reduce-scatter of those H chunks across the hosts: the member at position h of
  //    ring j is host h's local rank j, whose chunk is slot j*H + h.
  char* mine = layout + static_cast<size_t>(j) * t.hosts * chunkBytes;
  RingJob cross;
  cross.count = n * t.hosts;
  cross.elemSize = es;
  cross.reduceScatter = true;
  cross.op = op;
  cross.finalize = finalize;
  ringCollectiveOn(c, RingView::of(t.localRanks(j), rank, kMinSegments), cross, RingBuffers{mine, mine, output});
}

void hierAllGather(OpContext& c, const char* input, char* output, int64_t count, size_t es, char* layout) {
  const Topology& t = c.topology();
  const int rank = c.rank();
  const int j = t.localIndex(rank);
  const int64_t n = count / t.size();
  const size_t chunkBytes = static_cast<size_t>(n) * es;
  if (c.trace()) {
    c.trace()->algorithm = "hier";
  }
  char* ownSlot = layout + t.hierSlot(rank) * chunkBytes;
  // 1. All-gather across the hosts into this ring's slots (the own chunk read from
  //    `input`, or already in place when it is the own slot).
  RingJob cross;
  cross.count = n * t.hosts;
  cross.elemSize = es;
  cross.allGather = true;
  char* mine = layout + static_cast<size_t>(j) * t.hosts * chunkBytes;
  ringCollectiveOn(c, RingView::of(t.localRanks(j), rank, kMinSegments), cross,
                   RingBuffers{nullptr, mine, input == ownSlot ? nullptr : const_cast<char*>(input)});
  // 2. All-gather on the host: every ring's slots to every rank.
  RingJob host;
  host.count = count;
  host.elemSize = es;
  host.allGather = true;
  ringCollectiveOn(c, RingView::of(t.ranksOfHost(t.hostOf[rank]), rank, kMinSegments), host,
                   RingBuffers{nullptr, layout, nullptr});
  // 3. Rank order.
  if (layout != output) {
    for (int r = 0; r < t.size(); ++r) {
      std::memcpy(output + r * chunkBytes, layout + t.hierSlot(r) * chunkBytes, chunkBytes);
    }
  }
}

} // namespace ringpg
