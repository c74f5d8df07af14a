// RINGPG_TRACE's common time axis: each rank's steady clock measured against rank 0's
// through the group's own links, when the group is created.
//
// Rank r (r > 0) sends rank 0 a ping at a, rank 0 answers with its clock t0 when the
// ping has landed, and the answer lands back at b; then rank 0's clock read about
// t0 - (a + b) / 2 more than rank r's, give or take half the round trip b - a.  The
// round with the shortest trip bounds the error most tightly, so that round's offset
// is kept (the min-RTT filter of NTP's clock filter).  On one host every rank reads the
// same CLOCK_MONOTONIC, the true offset is 0, and the measured one is within half a
// round trip of it (tests/test_trace.py checks that bound).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/config.h"
#include "common/trace.h"
#include "transport/engine.h"
#include "transport/link.h"

namespace ringpg {

struct ClockOffset {
  int64_t offsetNs = 0; // add to this rank's steady clock to read rank 0's
  int64_t rttNs = 0;    // the round trip of the round kept (0 on rank 0)
  int rounds = 0;       // rounds this rank ran (0 on rank 0)
};

// How many ping-pongs: at least `min`, then more until one took at most `goodRttNs`,
// but at most `max` and for at most `maxNs` in all (a few ms when the host is idle).
struct ClockRounds {
  int min = 64;
  int max = 1024;
  int64_t goodRttNs = 20 * 1000;
  int64_t maxNs = 200 * 1000 * 1000;
};

// Collective over the group, before its first op: rank 0 answers the pings of every
// other rank in turn (each says whether more follow), over the group's TCP links with
// the frames ops use (sequence number 0, which no op has).
ClockOffset measureClockOffset(Engine& engine, const Config& cfg, int rank, int size, const ClockRounds& plan,
                               Deadline deadline);

// The group's tracer when RINGPG_TRACE is set (after the clock exchange; collective),
// else null.  `transport`: the group's ring transport, for the file's header.
std::unique_ptr<Tracer> openTrace(Engine& engine, const char* transport, const Config& cfg, const std::string& group,
                                  int rank, int size, Deadline deadline);

} // namespace ringpg
