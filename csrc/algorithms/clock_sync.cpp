#include "algorithms/clock_sync.h"

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <limits>
#include <thread>
#include <vector>

#include "algorithms/context.h"

namespace ringpg {
namespace {

// c.wait(req), but first polls the request for up to 1 ms, yielding between looks: a
// sleeping waiter adds its wake-up, one more delay that differs between the two ends.
void awaitPolling(OpContext& c, const RequestPtr& req) {
  const int64_t until = traceNow() + 1000 * 1000;
  while (req->state.load(std::memory_order_acquire) == Request::State::Pending && traceNow() < until) {
    std::this_thread::yield();
  }
  c.wait(req);
}

} // namespace

ClockOffset measureClockOffset(Engine& engine, const Config& cfg, int rank, int size, int rounds,
                               Deadline deadline) {
  ClockOffset out;
  out.rounds = rounds;
  if (size == 1) {
    return out;
  }
  std::vector<char> scratch, workspace;
  // TCP both ways, even where the ring has shared memory: the estimate is off by half
  // the difference of the two one-way delays, and on one host (true offset 0) a ping
  // over a socket answered through shared memory read 17 us off; the same path both
  // ways, polled, reads under 1 us (up to ~10 us when the host is busy: see clock_rtt_ns).
  OpContext c(engine, cfg, OpTag{"trace_clock_sync", 0, rank}, size, static_cast<uint8_t>(c10d::OpType::UNKNOWN),
              c10::kLong, 1, deadline, scratch, workspace, /*shm=*/nullptr);
  engine.setCurrentCollective(c.header());
  int64_t ping = 0;
  int64_t answer = 0;
  if (rank == 0) {
    for (int peer = 1; peer < size; ++peer) {
      for (int i = 0; i < rounds; ++i) {
        awaitPolling(c, c.recv(peer, &ping, sizeof(ping)));
        answer = traceNow();
        c.wait(c.send(peer, &answer, sizeof(answer)));
      }
    }
    return out;
  }
  out.rttNs = std::numeric_limits<int64_t>::max();
  for (int i = 0; i < rounds; ++i) {
    // The answer's receive is posted before the ping leaves, so it is ready when it lands.
    RequestPtr back = c.recv(0, &answer, sizeof(answer));
    const int64_t a = traceNow();
    RequestPtr sent = c.send(0, &ping, sizeof(ping));
    awaitPolling(c, back);
    const int64_t b = traceNow();
    c.wait(sent);
    if (b - a < out.rttNs) {
      out.rttNs = b - a;
      out.offsetNs = answer - a - (b - a) / 2;
    }
  }
  return out;
}

std::unique_ptr<Tracer> openTrace(Engine& engine, ShmRing* shm, const Config& cfg, const std::string& group,
                                  int rank, int size, Deadline deadline) {
  if (cfg.traceDir.empty()) {
    return nullptr;
  }
  constexpr int kRounds = 64; // a few ms at group creation, only when tracing
  const ClockOffset clock = measureClockOffset(engine, cfg, rank, size, kRounds, deadline);
  return std::make_unique<Tracer>(cfg.traceDir, group, rank, size, shm ? "shm" : "tcp", clock.offsetNs, clock.rttNs,
                                  clock.rounds);
}

} // namespace ringpg
