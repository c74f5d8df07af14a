// ringpg's c10d::Backend: the op surface and the runtime.  Every op follows the same
// three stages (the shape of ProcessGroupGloo):
//   1. validate in the caller's thread (backend/validation.h: "ringpg::<op>: ..."),
//      before a sequence number is taken, so a refused call leaves all ranks in step;
//   2. take the next sequence number and queue the op for the single worker thread,
//      which runs ops in issue order (the order is the same on every rank);
//   3. the worker runs the op's collective (algorithms/collectives.h: it chooses the
//      algorithm, stages tensors to host memory and back) with a deadline of the
//      group's (or the op's) timeout, and completes the Work and its Future.
// Host ops skip the hand-off where they can: a synchronous one issued while the group
// is idle runs in the caller's thread, and an async one whose Work is waited on
// before the worker took it runs in the waiter's (runIfNext), in the same order.
// Point-to-point ops bypass the worker: they are posted to the engine at once and
// completed by it, so a blocked receive never holds up collectives.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "algorithms/context.h"
#include "backend/flight_record.h"
#include "backend/ring_work.h"
#include "common/config.h"
#include "common/torch_compat.h"
#include "common/trace.h"
#include "transport/connect.h"

namespace ringpg {

class RingBackend final : public c10d::Backend {
 public:
  // `transportChoice`: this group's Config::Transport ("" = RINGPG_TRANSPORT's).
  // `algoChoice`: this group's Config::Algo ("" = RINGPG_ALGO's).  `copyChoice`: how
  // its large same-host messages move ("cma", "slots", "auto"; "" = RINGPG_CMA_BYTES's,
  // ringpg.use_copy).  `hostChoice`: this rank's host identity ("" = RINGPG_HOSTID's;
  // ranks as threads of one process emulate hosts with it).  Ranks that disagree
  // on a setting the group must share (gloo or shm on some ranks only, the algorithm,
  // the segment, one-shot or hierarchical piece size, tracing on or off) fail here,
  // every one of them, with a ValueError naming it and each rank's value.
  // Connects the group (connectGroup, transport/connect.h), then runs it as the
  // constructor below does.
  RingBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
              std::string groupName, const std::string& transportChoice = "", const std::string& algoChoice = "",
              const std::string& copyChoice = "", const std::string& hostChoice = "");
  // A group over links it is given, connected already: what connectGroup returned (the
  // constructor above), or links a test built in one process (transport/loopback_link.h).
  // `net` must hold an engine (the group's control channel) and a
  // LinkTable of `size` peers; `cfg`: the group's settings (its algorithm included);
  // `transportSetting`: what the group was asked for (split and shrink pass it on);
  // `store`: the Store shrink's children meet on, null where the group has none (shrink
  // is then refused).  Starts the worker; the links must carry no op yet.
  RingBackend(std::unique_ptr<GroupLinks> net, int rank, int size, std::chrono::milliseconds timeout,
              std::string groupName, Config cfg, Config::Transport transportSetting,
              c10::intrusive_ptr<c10d::Store> store = {});
  ~RingBackend() override;

  const std::string getBackendName() const override { return "ringpg"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // One op of the host arena's agreement round (arenaEveryMemberSays, which the first
  // device op runs and no CPU op reaches): true where every rank said true.  Collective;
  // a group on one host with an arena.  For the tests.
  bool everyMemberSays(bool mine);
  // The group's members' global ranks (by group rank) and this process's: what torch's
  // flight recorder publishes as the group's membership and names its dump file by
  // (backend/flight_record.h).  Set by the Python creator, which torch tells them.
  void setFlightRecorderRanks(std::vector<uint64_t> globalRanks, int myGlobalRank) {
    flight_.setGlobalRanks(std::move(globalRanks), myGlobalRank);
  }

  uint64_t getSequenceNumberForGroup() override;
  void setSequenceNumberForGroup() override {}
  bool supportsCoalescing() const RINGPG_OVERRIDE_SINCE_2_7 { return false; }
  // Virtuals of c10d::Backend since torch 2.7 (common/torch_compat.h); before that
  // they are ringpg's own, reached through ringpg.backend(group).
  void shutdown() RINGPG_OVERRIDE_SINCE_2_7;
  void abort() RINGPG_OVERRIDE_SINCE_2_7;
#if RINGPG_HAS_BACKEND_SET_TIMEOUT
  // dist.set_timeout(): the default timeout of ops issued from now on; ops already
  // queued or running keep theirs, and an op's own timeout still wins.
  void setTimeout(std::chrono::milliseconds timeout) override;
#endif
#if RINGPG_HAS_BACKEND_GET_ERROR
  // Whether the group has failed, and why (the first cause, which every later op's
  // error repeats): SUCCESS while healthy (a receive whose Work.wait() timed out leaves
  // the group healthy), TIMEOUT when an op of this rank passed its deadline,
  // REMOTE_ERROR when another rank's group failed first and said so (its Abort frame:
  // that rank timed out, lost a peer or was aborted), COMM_ERROR for every other
  // failure: a peer or connection lost, a corrupt frame, ranks calling different
  // collectives, an op that threw part-way, or abort() on this rank (the group's
  // connections are gone).  A shutdown() is no failure.
  c10d::ErrorType getError() override;
#endif
#if RINGPG_HAS_BACKEND_ABORT_HOOKS
  // Abort hooks (torch's Hooks.hpp): run when the group fails or is aborted, before the
  // op that saw it fail completes (see runAbortHooks).  An id registers once; a null
  // hook is refused; unregistering an unknown id does nothing.
  void registerAbortHook(int64_t hookId, c10d::AbortHook hook) override;
  void unregisterAbortHook(int64_t hookId) override;
#endif
#if RINGPG_HAS_BACKEND_COMPLETION_HOOKS
  bool supportsAbortHooks() const override { return true; }
  // Completion hooks (torch's Hooks.hpp): run once per op that completed successfully
  // (failed and timed-out ones fire nothing, as Hooks.hpp asks), with its duration, on
  // the thread that completed it (the worker, the engine's thread for point-to-point,
  // or the caller's for an op run inline), after the Work reads completed and before
  // its Future completes.  Same id rules as the abort hooks.
  bool supportsCompletionHooks() const override { return true; }
  void registerCompletionHook(int64_t hookId, c10d::CompletionHook hook) override;
  void unregisterCompletionHook(int64_t hookId) override;
#endif

  // ---- Split and shrink (torch 2.9 / 2.10: common/torch_compat.h) ----------------
  // A child group is a new RingBackend of the parent's transport and algorithm on a Store namespace
  // of its own; it never uses the parent's connections, so a broken parent (a dead
  // peer, an abort) still splits and shrinks.
#if RINGPG_HAS_BACKEND_SPLIT
  bool supportsSplitting() const override { return true; }
  // A fresh copy on every call (torch 2.9 to 2.14 edit what they get): this group's
  // default timeout and name.
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
  // dist.split_group(): every rank of the parent calls it with the ranks of its part
  // (a rank in no part passes another part's and gets nullptr); the child's rank is
  // this rank's position in `ranks`, its keys go under `store` (torch's namespace).
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
#endif
#if RINGPG_HAS_BACKEND_SHRINK
  bool supportsShrinking() const override { return true; }
  // dist.distributed_c10d.shrink_group(): the survivors alone call it, alike; they
  // meet under a new namespace of this group's Store, never waiting on an excluded
  // rank.  SHRINK_ABORT aborts this group first (its pending ops fail at once).
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
                                           const c10::intrusive_ptr<c10d::Backend::Options>& optsOverride) override;
#endif

  // Test hook (see Engine::debugSendRaw).
  void debugSendRaw(int peer, std::string bytes) { net_->engine->debugSendRaw(peer, std::move(bytes)); }

  // The links collectives move over, the same on every rank: "gloo" (Gloo's pairs,
  // RINGPG_TRANSPORT=gloo), "shm" (shared memory, one host), "shm+tcp" (shared memory
  // within hosts, ringpg's engine between them), "tcp" (the engine everywhere)
  // (diagnostics, traces, tests).
  const std::string& transport() const { return net_->transport; }
  // What a large allreduce on host memory runs here: "arena" (the host arena),
  // "hier" (algorithms/hierarchical.h) or "ring" (the group's algo, RINGPG_ALGO or
  // `algoChoice`, and its shape decide).
  const char* allreduceAlgorithm() const;
  // The algorithm `op` ("allreduce", "reduce_scatter", "all_gather", "broadcast",
  // "reduce", "barrier", ...) runs on `bytes` in this group: the op's plan
  // (algorithms/choice.h, planOp) for contiguous tensors, apart, on `device` ("cpu", or a
  // device such as "cuda", whose copies are taken to reach the arena's buffers unless a
  // device op has already found they do not).
  const char* algorithmFor(const std::string& op, size_t bytes, const std::string& device = "cpu") const;
  // The group's host arena: bytes of each of a rank's two buffers, 0 where it has none;
  // and why a group on one host has none ("" otherwise).
  size_t arenaBufferBytes() const { return net_->arena ? net_->arena->bufferBytes() : 0; }
  const std::string& arenaWhyNot() const { return net_->arenaWhyNot; }
  // How often this rank's arena waits woke others and slept (HostArena::counts); zeros
  // where the group has no arena.
  HostArena::Counts arenaWaitCounts() const { return net_->arena ? net_->arena->counts() : HostArena::Counts{}; }
  // Where the group's ranks run (transport/topology.h): hosts, their ranks, ring order.
  const Topology& topology() const { return net_->topology; }
  // How same-host messages of at least RINGPG_CMA_BYTES move, the same on every rank:
  // "cma" (single copy, cross-memory attach), "slots" (two copies through shared
  // memory), or the two joined by "+" where the size classes differ (ops below
  // kStreamingOpBytes, then from it: "slots+cma"); "" where the group has no
  // shared-memory link on this rank.
  std::string sameHostCopy() const;
  // Messages this rank has lent to its right same-host neighbour (single copy) so far.
  uint64_t sameHostLent() const { return net_->shm ? net_->shm->lentMessages() : 0; }
  // What the group measured to choose it (ShmLink::CopyProbe); not `measured` where it
  // did not (no shared-memory link here, RINGPG_CMA_BYTES set, single copy refused).
  ShmLink::CopyProbe sameHostCopyProbe() const { return net_->shm ? net_->shm->copyProbe() : ShmLink::CopyProbe{}; }
  // Microseconds the group's waits spin before sleeping (RINGPG_TUNING spin_us, or what
  // auto chose for this transport and host): its same-host waits' (links or arena) where
  // it has any, else its TCP waits'.
  int waitSpinMicros() const { return sameHostWaits() ? net_->shmSpinMicros : cfg_.engineSpinMicros(); }
  // Whether those spins yield the CPU on every look (this host's ranks outnumber its CPUs).
  bool waitSpinYields() const { return sameHostWaits() && net_->shmSpinYields; }
  // Whether this rank waits on shared memory: a same-host link or a host arena.
  bool sameHostWaits() const { return net_->shm != nullptr || net_->arena != nullptr; }

  // The TCP congestion control of the group's data sockets: RINGPG_TUNING tcp_congestion, or
  // the host's default; "" in a group of one (diagnostics and tests).
  std::string tcpCongestion() const { return net_->engine->congestionControl(); }
  // The peers this rank's engine has connected to so far (RINGPG_TUNING connect): its rings'
  // neighbours from creation, others after their first use.
  std::vector<int> connectedPeers() const { return net_->engine->connectedPeers(); }

  // RINGPG_TRACE: whether this group's ops are being traced.  Off without RINGPG_TRACE;
  // with it, on from the start and switchable at any time (trace a window of a job,
  // or alternate in the bench); a switch applies from the next op.
  bool tracing() const { return tracing_.load(std::memory_order_relaxed); }
  void setTracing(bool on);

  // This group's namespace in its Store ("ringpg/<instance>/"; "" in a group of one):
  // a link made beside it (the gloo transport's) takes its keys below it.
  std::string keyPrefix() const { return net_->store ? net_->store->prefix() : std::string(); }
  // What this group's Store calls have cost this rank (creation, and addresses read on
  // first dials since); zeros in a group made without a Store.
  StoreTraffic storeTraffic() const { return net_->store ? net_->store->traffic() : StoreTraffic{}; }

  // The address this rank's listener used (diagnostics and tests).
  const std::string& localAddress() const { return net_->localAddress; }

 private:
  // The first constructor's second step: `cfg` made once, for connectGroup and the group.
  RingBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
              std::string groupName, const Config& cfg, Config::Transport transportSetting);

  using OpFn = std::function<void(OpContext&)>;
  struct Queued {
    c10::intrusive_ptr<RingWork> work;
    OpFn fn;
    OpTag tag;
    OpSignature sig;
    std::chrono::milliseconds timeout;
  };

  // Stage 2: takes a sequence number and queues `fn` for the worker, or, for a
  // synchronous call on CPU tensors while the group is idle, runs it right here in
  // the caller's thread (same order, same deadline, no thread hand-offs).
  c10::intrusive_ptr<c10d::Work> enqueue(const char* name, const char* profilingTitle, OpSignature sig,
                                         std::chrono::milliseconds timeout, bool asyncOp,
                                         std::vector<at::Tensor> outputs, const std::vector<at::Tensor>& inputs,
                                         OpFn fn);
  void execute(Queued& q);
  // Runs the op of `work` in this thread if it is next in the queue and no op is
  // running (RingWork::setRunHere); else leaves it to the worker.
  void runIfNext(const RingWork* work);
  // Runs `q` in this thread; `lk` holds queueMu_ on entry and is released on return.
  void runInline(Queued& q, std::unique_lock<std::mutex>& lk);
  c10::intrusive_ptr<c10d::Work> p2p(c10d::OpType type, const char* name, at::Tensor& tensor, int peer, int tag);
  void workerLoop();
  void stop(bool graceful);
  // The group's failure listener: the group failed (once, on the thread that failed
  // it), so wake the Gloo link's waits, note why and run the abort hooks.  Not for the
  // engine's own teardown.
  void onGroupFailed();
  // Copies the group's cause of failure into failedCause_ (getError).
  void noteFailure();
  // Runs every abort hook, outside hooksMu_, each in a try (a throwing hook is logged
  // and skipped, never kills the calling thread); marks abortHooksRan_ after.
  void runAbortHooks();
  // Completes `work` and, on success, runs the completion hooks (RingWork::complete's
  // onFinished).
  void finishWork(RingWork& work, std::exception_ptr error);
  std::chrono::milliseconds effectiveTimeout(std::chrono::milliseconds opTimeout) const;
#if RINGPG_HAS_BACKEND_SPLIT
  // A group of this one's transport and algorithm on `store` (split, shrink).
  c10::intrusive_ptr<c10d::Backend> makeChild(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                              std::chrono::milliseconds timeout, const std::string& name) const;
#endif

  // The process's Config (RINGPG_*), with this group's algorithm (`algoChoice`): a copy,
  // which the ops' OpContext refers to.
  const Config cfg_;
  const Config::Transport transportSetting_; // what this group was asked for (Config::Transport)
  // The default op timeout: atomic, because setTimeout() may run on any thread while
  // callers read it to stamp their ops.
  std::atomic<std::chrono::milliseconds> timeout_;
  const std::string groupName_;
  // The group's links, connected once by the constructor (transport/connect.h).
  std::unique_ptr<GroupLinks> net_;

  // How a queued op's Work reaches this group to run in its waiter's thread
  // (RingWork::setRunHere).  A Work may outlive its group, and holding the group by a
  // weak reference would defer its destructor to whichever thread drops the last Work
  // (the worker's own, which cannot join itself), so the Work holds this instead.
  // mu guards group and inside: the destructor clears group, then waits until no
  // waiter is still inside runIfNext.
  struct WaiterDoor {
    std::mutex mu;
    std::condition_variable left;
    RingBackend* group = nullptr; // null once the group is being destroyed
    int inside = 0;               // waiters in runIfNext now
    // Runs runIfNext(work) unless the group is gone.
    void runIfNext(const RingWork* work);
  };
  const std::shared_ptr<WaiterDoor> door_ = std::make_shared<WaiterDoor>();

  // queueMu_ guards queue_, seq_, running_ and stopping_: taking the sequence number and
  // queueing under one lock keeps queue order == sequence order.
  std::mutex queueMu_;
  std::condition_variable queueCv_;
  std::deque<Queued> queue_;
  uint64_t seq_ = 0;    // collectives
  uint64_t p2pSeq_ = 0; // point-to-point ops (not in step across ranks)
  bool running_ = false; // an op is executing (on the worker or inline)
  bool stopping_ = false;
  std::thread worker_;
  std::vector<char> scratch_;   // used by the op that is running_ only
  std::vector<char> workspace_; // likewise (OpContext::workspace)
  std::unique_ptr<Tracer> tracer_; // RINGPG_TRACE (common/trace.h), else null
  std::atomic<bool> tracing_{false}; // tracer_ && not switched off (setTracing)

  // Split and shrink.  store_: the Store this group was created on (shrink's children
  // meet under it).  splitMu_ guards lastSplit*_: torch calls split() once per device
  // type of the parent (cpu and cuda both map to this backend) with the same Store
  // object, and both get the one child made by the first call.
  const c10::intrusive_ptr<c10d::Store> store_;
  std::atomic<int> shrinks_{0}; // shrink() calls so far: each child's namespace
  std::mutex splitMu_;
  const c10d::Store* lastSplitStore_ = nullptr;
  std::vector<int> lastSplitRanks_;
  c10::weak_intrusive_ptr<c10d::Backend> lastSplitChild_{c10::intrusive_ptr<c10d::Backend>()};

  // What getError() reports: a BreakCause + 1, 0 while healthy or closing.  Written once
  // the group has failed (by its listener, and by the worker before it completes a
  // failed op, so a caller that saw the error sees the cause); read by any thread.
  std::atomic<int> failedCause_{0};
  // Set by stop() before the engine is destroyed: the "destroyed" failure the engine
  // reports then is teardown, not a failure (no hooks, getError unchanged).
  std::atomic<bool> closing_{false};
  // The abort hooks have run to their end once since the group broke (runAbortHooks).
  std::atomic<bool> abortHooksRan_{false};

  // The hook tables, copy-on-write: hooksMu_ guards the two pointers only.  A thread
  // that runs hooks copies the pointer under the lock and calls the hooks after
  // releasing it, so no hook ever runs under hooksMu_ (torch's FlightRecorderHook
  // unregisters while hooks may be running: Hooks.hpp's lock-order note), and
  // registering replaces the table instead of changing one that is being iterated.
  using AbortHookFn = std::function<void()>;
  std::mutex hooksMu_;
  std::shared_ptr<const std::map<int64_t, AbortHookFn>> abortHooks_;
#if RINGPG_HAS_BACKEND_COMPLETION_HOOKS
  std::shared_ptr<const std::map<int64_t, c10d::CompletionHook>> completionHooks_;
#endif

  // This group's entries in torch's flight recorder: one per op issued, retired when the
  // op completes (finishWork); named by the group's name and description, which torch
  // sets after construction.
  FlightRecord flight_{*this};
};

} // namespace ringpg
