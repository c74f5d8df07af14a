#include "algorithms/hierarchical.h"

#include "algorithms/ring.h"
#include "algorithms/ring_plan.h"

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

} // namespace ringpg
