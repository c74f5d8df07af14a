// ringpg's own entries in torch's flight recorder (torch >= 2.15), written the way
// ProcessGroupGloo writes its own: an entry when an op is issued, retired with the op's
// duration when it completes, left "scheduled" when it fails (so a dump tells a finished
// op from a hung one), and the trace dumped once per process when a group breaks.
// torch attaches its per-op FlightRecorderHook only to backends that do not record
// themselves (distributed_c10d._FR_SELF_RECORDING_BACKENDS); ringpg's registration joins
// that set where this is compiled in, so an op pays for its entry and nothing else.
// Before 2.15 every call here is a no-op (torch records no ringpg op there).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/torch_compat.h"

#if RINGPG_HAS_NATIVE_FLIGHT_RECORDER
#include <torch/csrc/distributed/c10d/FlightRecorder.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#endif

namespace ringpg {

// The name torch's analyzer (torch.distributed.flight_recorder, its COLLECTIVES set)
// knows an op by, from ringpg's profiling title: "ringpg:all_gather_into_tensor" ->
// "_all_gather_base", "ringpg:all_reduce" -> "all_reduce"; "" for an op that is not
// recorded (the arena's internal agreement round) or a title that is not ringpg's.
std::string flightRecorderOpName(const std::string& profilingTitle);

// The recorder's name for a point-to-point op, group ranks on both sides: "send 0->1",
// "recv 1<-0", and "recv 1<-?" for a receive from any source.
std::string flightRecorderP2PName(bool isSend, int me, int peer);

class FlightRecord {
 public:
  // Where an op's entry is in the recorder (both empty: not recorded).
  struct Ticket {
    std::optional<size_t> id;
    std::optional<size_t> epoch;
  };

  // `group`: the backend whose name and description (set by torch after construction)
  // key the entries; it outlives this object.
  explicit FlightRecord(const c10d::Backend& group);

  // Whether entries are written: torch >= 2.15 with the recorder on (TORCH_FR_BUFFER_SIZE
  // not 0).
  bool enabled() const;

  // The group's members' global ranks, by group rank, and this process's global rank:
  // the recorder publishes the first as the group's membership (the analyzer matches
  // ranks through it) and names the dump file after the second.  A group never told
  // (one made by split or shrink) publishes no membership, rather than a made-up one.
  void setGlobalRanks(std::vector<uint64_t> ranks, int myGlobalRank);

  // An entry for a collective about to be queued, named by its profiling title.
  Ticket collective(const char* profilingTitle, const std::vector<at::Tensor>& inputs,
                    const std::vector<at::Tensor>& outputs, std::chrono::milliseconds timeout);
  // An entry for a send or receive about to be posted (`peer` < 0: any source).
  Ticket p2p(bool isSend, int me, int peer, const at::Tensor& tensor, std::chrono::milliseconds timeout);
  // The op of `ticket` completed, in `durationMs`.
  void retire(const Ticket& ticket, std::optional<float> durationMs);

  // Writes the recorder's trace to its dump file (TORCH_FR_DUMP_TEMP_FILE<rank>), once
  // per process, unless TORCH_FR_DUMP_ON_TIMEOUT is 0: a group broke (its abort path).
  static void dumpOnFailure();

 private:
  Ticket record(std::string name, bool isP2P, const std::vector<at::Tensor>& inputs,
                const std::vector<at::Tensor>& outputs, std::chrono::milliseconds timeout);

  const c10d::Backend& group_;
#if RINGPG_HAS_NATIVE_FLIGHT_RECORDER
  c10d::FlightRecorder<c10::Event>* recorder_ = nullptr; // null: the recorder is off
  std::shared_ptr<c10d::ProcessGroupStatus> status_;
#endif
  const size_t pgId_; // the recorder's id of this group: groups in order of creation
  // mu_ guards the counters, the membership and whether it was published: ops may be
  // issued from several threads, and retire() runs on the worker or the engine's thread.
  std::mutex mu_;
  size_t collectiveSeq_ = 0; // collectives recorded (the entry's collective_seq_id)
  size_t p2pSeq_ = 0;        // point-to-point ops recorded (its p2p_seq_id)
  size_t opId_ = 0;          // every op recorded (its op_id)
  std::vector<uint64_t> globalRanks_;
  bool ranksPublished_ = false;
};

} // namespace ringpg
