#include "algorithms/clock_sync.h"

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <limits>
#include <thread>
#include <vector>

#include "algorithms/context.h"

namespace ringpg {
namespace {

// Waits for `req`; with `poll`, first polls it for up to 1 ms, yielding between looks.
// A sleeping waiter adds its wake-up, a delay that differs between the two ends; but
// the engine's progress thread completes the request, and on a host with fewer cores
// than busy threads a poll starves it (every polled round then lasts the whole poll).
// So rounds alternate, polled and not, and the min-RTT
// filter keeps whichever kind ran best here.
void await(OpContext& c, const RequestPtr& req, bool poll) {
  const int64_t until = poll ? traceNow() + 1000 * 1000 : 0;
  while (poll && req->state.load(std::memory_order_acquire) == Request::State::Pending && traceNow() < until) {
    std::this_thread::yield();
  }
  c.wait(req);
}

} // namespace

ClockOffset measureClockOffset(Engine& engine, const Config& cfg, int rank, int size, const ClockRounds& plan,
                               Deadline deadline) {
  ClockOffset out;
  if (size == 1) {
    return out;
  }
  std::vector<char> scratch, workspace;
  // TCP both ways, even where the ring has shared memory: the estimate is off by half
  // the difference of the two one-way delays, and on one host (true offset 0) a ping
  // over a socket answered through shared memory read further off than the same path
  // both ways (docs/internals.md, "Why these constants").
  EngineLink tcp(engine);
  const Topology ranks = Topology::singleHost(size); // direct exchanges only: no ring order needed
  const LinkTable links = LinkTable::engineOnly(tcp, engine, ranks);
  OpContext c(links, cfg, OpTag{"trace_clock_sync", 0, rank}, size, OpSignature(c10d::OpType::UNKNOWN, c10::kLong, 1),
              deadline, scratch, workspace);
  engine.setCurrentCollective(c.header());
  int64_t more = 1; // the ping: 1 while more rounds follow, 0 on the last
  int64_t answer = 0;
  if (rank == 0) {
    for (int peer = 1; peer < size; ++peer) {
      for (int i = 0; more != 0; ++i) {
        await(c, c.recv(peer, &more, sizeof(more)), i % 2 == 0);
        answer = traceNow();
        c.wait(c.send(peer, &answer, sizeof(answer)));
      }
      more = 1;
    }
    return out;
  }
  out.rttNs = std::numeric_limits<int64_t>::max();
  // The clock for maxNs starts with the first answer: rank 0 may be busy with other ranks before.
  int64_t giveUp = std::numeric_limits<int64_t>::max();
  for (int i = 0; more != 0; ++i) {
    // Enough rounds, and one of them short, or out of rounds or time: this ping is the last.
    const bool enough = i + 1 >= plan.min && out.rttNs <= plan.goodRttNs;
    more = enough || i + 1 >= plan.max || traceNow() >= giveUp ? 0 : 1;
    // The answer's receive is posted before the ping leaves, so it is ready when it lands.
    RequestPtr back = c.recv(0, &answer, sizeof(answer));
    const int64_t a = traceNow();
    RequestPtr sent = c.send(0, &more, sizeof(more));
    await(c, back, i % 2 == 0);
    const int64_t b = traceNow();
    c.wait(sent);
    out.rounds = i + 1;
    if (i == 0) {
      giveUp = b + plan.maxNs;
    }
    if (b - a < out.rttNs) {
      out.rttNs = b - a;
      out.offsetNs = answer - a - (b - a) / 2;
    }
  }
  return out;
}

std::unique_ptr<Tracer> openTrace(Engine& engine, const char* transport, const Config& cfg, const std::string& group,
                                  int rank, int size, Deadline deadline) {
  if (cfg.traceDir.empty()) {
    return nullptr;
  }
  const ClockOffset clock = measureClockOffset(engine, cfg, rank, size, ClockRounds{}, deadline);
  return std::make_unique<Tracer>(cfg.traceDir, group, rank, size, transport, clock.offsetNs, clock.rttNs,
                                  clock.rounds);
}

} // namespace ringpg
