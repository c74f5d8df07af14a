// See flight_record.h.
#include "backend/flight_record.h"

#include <atomic>
#include <mutex>
#include <string_view>
#include <utility>

#if RINGPG_HAS_NATIVE_FLIGHT_RECORDER
#include <torch/csrc/distributed/c10d/FlightRecorderDetail.hpp>
#include <torch/csrc/distributed/c10d/Utils.hpp>
#endif

namespace ringpg {

namespace {

// The recorder instance torch keeps for this backend: the one the dump APIs read with
// backend="ringpg", and the one torch's hook wrote into before ringpg recorded itself.
constexpr const char* kRecorderName = "ringpg";

std::atomic<size_t> nextPgId{0};

} // namespace

std::string flightRecorderOpName(const std::string& profilingTitle) {
  constexpr std::string_view prefix = "ringpg:";
  if (profilingTitle.rfind(prefix, 0) != 0) {
    return "";
  }
  const std::string op = profilingTitle.substr(prefix.size());
  // Where the analyzer's name is not ringpg's: the tensor forms of all-gather and
  // reduce-scatter keep the names of the c10d methods they come through.
  if (op == "all_gather_into_tensor") {
    return "_all_gather_base";
  }
  if (op == "reduce_scatter_tensor") {
    return "_reduce_scatter_base";
  }
  if (op == "allgather_into_tensor_coalesced") {
    return "all_gather_into_tensor_coalesced";
  }
  if (op == "every_member_says") {
    return ""; // ringpg's own round inside a device op, which the caller never issued
  }
  return op;
}

std::string flightRecorderP2PName(bool isSend, int me, int peer) {
  if (isSend) {
    return "send " + std::to_string(me) + "->" + std::to_string(peer);
  }
  return "recv " + std::to_string(me) + "<-" + (peer < 0 ? std::string("?") : std::to_string(peer));
}

FlightRecord::FlightRecord(const c10d::Backend& group) : group_(group), pgId_(nextPgId++) {
#if RINGPG_HAS_NATIVE_FLIGHT_RECORDER
  c10d::FlightRecorder<c10::Event>* r = c10d::getFlightRecorder(kRecorderName);
  if (r != nullptr && r->enabled_) {
    recorder_ = r;
    status_ = std::make_shared<c10d::ProcessGroupStatus>();
  }
#endif
}

bool FlightRecord::enabled() const {
#if RINGPG_HAS_NATIVE_FLIGHT_RECORDER
  return recorder_ != nullptr;
#else
  return false;
#endif
}

void FlightRecord::setGlobalRanks(std::vector<uint64_t> ranks, int myGlobalRank) {
#if RINGPG_HAS_NATIVE_FLIGHT_RECORDER
  if (recorder_ == nullptr) {
    return;
  }
  recorder_->setRank(myGlobalRank);
  std::lock_guard<std::mutex> lk(mu_); // globalRanks_
  globalRanks_ = std::move(ranks);
#else
  (void)ranks;
  (void)myGlobalRank;
#endif
}

FlightRecord::Ticket FlightRecord::collective(const char* profilingTitle, const std::vector<at::Tensor>& inputs,
                                              const std::vector<at::Tensor>& outputs,
                                              std::chrono::milliseconds timeout) {
  if (!enabled()) {
    return {};
  }
  std::string name = flightRecorderOpName(profilingTitle);
  if (name.empty()) {
    return {};
  }
  return record(std::move(name), /*isP2P=*/false, inputs, outputs, timeout);
}

FlightRecord::Ticket FlightRecord::p2p(bool isSend, int me, int peer, const at::Tensor& tensor,
                                       std::chrono::milliseconds timeout) {
  if (!enabled()) {
    return {};
  }
  const std::vector<at::Tensor> tensors{tensor};
  return record(flightRecorderP2PName(isSend, me, peer), /*isP2P=*/true, tensors, tensors, timeout);
}

FlightRecord::Ticket FlightRecord::record(std::string name, bool isP2P, const std::vector<at::Tensor>& inputs,
                                          const std::vector<at::Tensor>& outputs, std::chrono::milliseconds timeout) {
#if RINGPG_HAS_NATIVE_FLIGHT_RECORDER
  // torch names the group after construction (ProcessGroup::setGroupName, setGroupDesc),
  // so the key is read per op; it no longer changes once the group has an op.
  std::tuple<std::string, std::string> pgName{group_.getGroupUid(), group_.getGroupDesc()};
  size_t collectiveSeq = 0;
  size_t p2pSeq = 0;
  size_t opId = 0;
  std::vector<uint64_t> publish;
  {
    std::lock_guard<std::mutex> lk(mu_); // the counters, the membership
    // As torch's hook numbered them: a collective's own sequence id counts from 1 and a
    // point-to-point op carries the last collective's (and the other way round).
    collectiveSeq = isP2P ? collectiveSeq_ : ++collectiveSeq_;
    p2pSeq = isP2P ? ++p2pSeq_ : p2pSeq_;
    opId = opId_++;
    if (!ranksPublished_ && !globalRanks_.empty()) {
      ranksPublished_ = true;
      publish = globalRanks_;
    }
    if (!isP2P) {
      status_->lastEnqueuedSeq = static_cast<int64_t>(collectiveSeq);
    }
  }
  if (!publish.empty()) {
    recorder_->record_pg_ranks(pgName, std::move(publish));
  }
  // Outside mu_: the recorder gathers the caller's Python stack, which takes the GIL.
  const auto id = recorder_->recordWithResetEnabled(pgId_, pgName, collectiveSeq, p2pSeq, opId, "ringpg:" + name,
                                                    inputs, outputs, nullptr, nullptr, timeout, status_, isP2P);
  return {id.id, id.reset_epoch};
#else
  (void)name;
  (void)isP2P;
  (void)inputs;
  (void)outputs;
  (void)timeout;
  return {};
#endif
}

void FlightRecord::retire(const Ticket& ticket, std::optional<float> durationMs) {
#if RINGPG_HAS_NATIVE_FLIGHT_RECORDER
  if (recorder_ == nullptr || !ticket.id) {
    return;
  }
  recorder_->retire_completed(ticket.id, ticket.epoch, durationMs);
#else
  (void)ticket;
  (void)durationMs;
#endif
}

void FlightRecord::dumpOnFailure() {
#if RINGPG_HAS_NATIVE_FLIGHT_RECORDER
  // Once a process; a second caller (the op's thread, while the engine's runs the abort
  // hooks) waits until the dump is written, so that the file exists by the time the
  // op's error reaches its caller.
  static std::once_flag dumped;
  std::call_once(dumped, [] {
    if (!c10d::getCvarBool(c10d::TORCH_FR_DUMP_ON_TIMEOUT, true)) {
      return;
    }
    const bool stacks = c10d::getCvarBool(c10d::TORCH_INCLUDE_STACK_TRACE, true);
    const bool onlyActive = c10d::getCvarBool(c10d::TORCH_INCLUDE_ONLY_ACTIVE, false);
    try {
      c10d::try_dump_fr_trace_file(/*includeCollectives=*/true, stacks, onlyActive, kRecorderName);
    } catch (const std::exception& e) {
      // A dump is best effort: the group's own error is what the caller must get.
      LOG(WARNING) << "ringpg: could not dump the flight recorder's trace: " << e.what();
    }
  });
#endif
}

} // namespace ringpg
