#include "backend/ring_backend.h"

#include <ATen/ATen.h>
#include <c10/util/Logging.h>
#include <c10/util/ScopeExit.h>
#include <c10/util/irange.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "algorithms/clock_sync.h"
#include "algorithms/collectives.h"
#include "algorithms/hierarchical.h"
#include "common/host.h"
#include "common/interpreter.h"
#include "cuda/device_sync.h"
#include "reduce/reduce.h"

namespace ringpg {

// ---- Construction and teardown --------------------------------------------------

namespace {

// The process's Config with `algoChoice` (a Config::Algo name; "" keeps RINGPG_ALGO's),
// `copyChoice` ("cma", "slots" or "auto", as RINGPG_CMA_BYTES set, 0 or unset; ""
// keeps RINGPG_CMA_BYTES's) and `hostChoice` (the rank's host identity; "" keeps
// RINGPG_HOSTID's).
Config configWithChoices(const std::string& algoChoice, const std::string& copyChoice, const std::string& hostChoice) {
  Config c = Config::get();
  if (!hostChoice.empty()) {
    c.hostId = hostChoice;
  }
  if (!algoChoice.empty()) {
    c.algo = Config::algoNamed(algoChoice, "algo ");
  }
  if (!copyChoice.empty()) {
    TORCH_CHECK(copyChoice == "auto" || copyChoice == "cma" || copyChoice == "slots", "ringpg: copy ", copyChoice,
                " is not one of auto, cma, slots");
    const size_t asSet = c.cmaBytes > 0 ? c.cmaBytes : Config().cmaBytes; // a size for "cma" under RINGPG_CMA_BYTES=0
    c.cmaBytes = copyChoice == "slots" ? 0 : asSet;
    c.cmaBytesSet = copyChoice != "auto";
    c.cmaOpBytes = Config::kCmaOpAuto; // every op (cma), none (slots), or as measured (auto)
  }
  return c;
}

// " (measured: ...)" after same_host_copy in the INFO line, where the group measured.
std::string copyProbeText(const ShmLink::CopyProbe& p) {
  if (!p.measured) {
    return "";
  }
  const auto us = [](double v) { return std::round(v * 10) / 10; }; // 0.1 us is all a probe resolves
  return c10::str("(measured each way, summed over the ranks, single copy / slots: ops below ", kStreamingOpBytes >> 20,
                  " MiB ", us(p.lentMicros), " / ", us(p.copiedMicros), " us for ", p.bytes / 1024,
                  " KiB warm, from it ", us(p.coldLentMicros), " / ", us(p.coldCopiedMicros), " us for ",
                  p.coldBytes / 1024, " KiB cold)");
}

// A copy of `table` with `hook` added under `id` (TORCH_CHECK: a new id, a callable hook).
template <class Hook>
std::shared_ptr<const std::map<int64_t, Hook>> withHook(const std::shared_ptr<const std::map<int64_t, Hook>>& table,
                                                        int64_t id, Hook hook, const char* method) {
  TORCH_CHECK(static_cast<bool>(hook), opName(method), ": the hook is empty");
  auto next = table ? std::make_shared<std::map<int64_t, Hook>>(*table) : std::make_shared<std::map<int64_t, Hook>>();
  TORCH_CHECK(next->emplace(id, std::move(hook)).second, opName(method), ": hook id ", id,
              " is already registered on this group");
  return next;
}

// A copy of `table` without `id` (the same table if it has no such hook).
template <class Hook>
std::shared_ptr<const std::map<int64_t, Hook>> withoutHook(const std::shared_ptr<const std::map<int64_t, Hook>>& table,
                                                           int64_t id) {
  if (!table || table->count(id) == 0) {
    return table;
  }
  auto next = std::make_shared<std::map<int64_t, Hook>>(*table);
  next->erase(id);
  return next;
}

// Calls hook(args...) for a hook registered under `id`; a hook that throws is logged
// and the caller (the worker, the engine's thread) carries on.
template <class Hook, class... Args>
void callHook(const char* kind, int64_t id, const Hook& hook, const Args&... args) {
  try {
    hook(args...);
  } catch (const std::exception& e) {
    LOG(WARNING) << "ringpg: " << kind << " hook " << id << " threw (ignored): " << e.what();
  } catch (...) {
    LOG(WARNING) << "ringpg: " << kind << " hook " << id << " threw a non-exception (ignored)";
  }
}

// The checks that must fail a group's creation before it touches the network, then
// connectGroup: what the Store constructor hands to the one over given links.
std::unique_ptr<GroupLinks> connectForBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                              std::chrono::milliseconds timeout, const Config& cfg,
                                              Config::Transport transportSetting) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "ringpg: invalid rank ", rank, " / size ", size);
  reduceIsa(); // a RINGPG_TUNING reduce_isa this CPU cannot run fails the group's creation, not its first op
  if (!cfg.tcpCongestion.empty()) {
    checkCongestionControl(cfg.tcpCongestion); // likewise, before any connection
  }
  GroupPlan plan;
  plan.peers = [&](const Topology& t) { return ringPeers(t, rank, cfg.algo); };
  plan.hostArena = [&](const Topology& t) { return hostArenaApplies(t, cfg.algo); };
  plan.sameHostLinks = [&](const Topology& t, bool arena) { return sameHostLinksServe(t.size(), t.hosts, arena, cfg); };
  return connectGroup(store, rank, size, timeout, cfg, transportSetting, plan);
}

} // namespace

RingBackend::RingBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout, std::string groupName, const std::string& transportChoice,
                         const std::string& algoChoice, const std::string& copyChoice, const std::string& hostChoice)
    : RingBackend(
          store, rank, size, timeout, std::move(groupName), configWithChoices(algoChoice, copyChoice, hostChoice),
          transportChoice.empty() ? Config::get().transport : Config::transportNamed(transportChoice, "transport ")) {}

RingBackend::RingBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout, std::string groupName, const Config& cfg,
                         Config::Transport transportSetting)
    : RingBackend(connectForBackend(store, rank, size, timeout, cfg, transportSetting), rank, size, timeout,
                  std::move(groupName), cfg, transportSetting, store) {}

RingBackend::RingBackend(std::unique_ptr<GroupLinks> net, int rank, int size, std::chrono::milliseconds timeout,
                         std::string groupName, Config cfg, Config::Transport transportSetting,
                         c10::intrusive_ptr<c10d::Store> store)
    : c10d::Backend(rank, size), cfg_(std::move(cfg)), transportSetting_(transportSetting), timeout_(timeout),
      groupName_(std::move(groupName)), net_(std::move(net)), store_(std::move(store)) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "ringpg: invalid rank ", rank, " / size ", size);
  TORCH_CHECK(net_ && net_->engine, "ringpg: a group's links must come with their engine");
  const LinkTable& links = net_->links;
  TORCH_CHECK(links.engine == net_->engine.get() && links.failure == net_->failure.get() &&
                  links.topology == &net_->topology && net_->topology.size() == size && links.control != nullptr &&
                  links.collective != nullptr,
              "ringpg: a group's LinkTable must name its engine and topology, a control link and a collective link, "
              "for ",
              size, " ranks");
  reduceIsa(); // as connectForBackend: links made elsewhere fail here, not at the first op
  tracer_ = openTrace(*net_->engine, transport().c_str(), cfg_, groupName_, rank, size, Clock::now() + timeout);
  tracing_ = tracer_ != nullptr;
  door_->group = this; // before any op: no Work can reach the door yet
  worker_ = std::thread([this] {
    nameThisThread("ringpg-worker");
    workerLoop();
  });
  // Last, so that a constructor that throws never leaves the listener pointing at a
  // half-built backend; a failure that came before it is caught up on here.
  net_->failure->listen([this] { onGroupFailed(); });
  if (net_->failure->failed()) {
    onGroupFailed();
  }
  if (rank == 0) {
    LOG(INFO) << "ringpg: group '" << groupName_ << "' size " << size << " on " << net_->localAddress << ": "
              << cfg_.summary() << " transport=" << transport() << " same_host_copy=" << sameHostCopy()
              << copyProbeText(sameHostCopyProbe()) << " hosts=" << net_->topology.hosts
              << " ranks_per_host=" << net_->topology.ranksPerHost() << " allreduce=" << allreduceAlgorithm()
              << " arena_bytes=" << arenaBufferBytes() << " wait_spin_us=" << waitSpinMicros()
              << " reduce_isa=" << reduceIsa() << " tcp_congestion_in_use=" << tcpCongestion();
  }
}

std::string RingBackend::sameHostCopy() const {
  if (!net_->shm) {
    return "";
  }
  const SameHostCopy plan = net_->shm->copyPlan();
  const auto name = [](bool lends) { return lends ? "cma" : "slots"; };
  return plan.cached == plan.streaming ? name(plan.cached) : c10::str(name(plan.cached), "+", name(plan.streaming));
}

RingBackend::~RingBackend() {
  {
    // Close the door to waiters (WaiterDoor): after this no Work runs an op here.
    std::unique_lock<std::mutex> lk(door_->mu);
    door_->group = nullptr;
    door_->left.wait(lk, [&] { return door_->inside == 0; });
  }
  runBlocking([this] { stop(/*graceful=*/true); });
}

void RingBackend::stop(bool graceful) {
  {
    std::lock_guard<std::mutex> lk(queueMu_);
    if (stopping_) {
      return;
    }
    stopping_ = true;
  }
  if (!graceful) {
    // Runs the abort hooks here (the listener) unless the group had failed already.
    net_->failure->fail("ringpg: the process group was aborted", /*network=*/false, BreakCause::Aborted);
  }
  queueCv_.notify_all();
  if (worker_.joinable()) {
    worker_.join(); // drains the queue first: each op ends by its deadline
  }
  tracing_ = false;
  tracer_.reset(); // closes the trace file: a complete JSON array from here on
  closing_ = true; // what the engine reports from here on is its teardown
  if (net_->engine) {
    if (graceful) {
      net_->engine->shutdown(Clock::now() + std::chrono::seconds(2));
    }
    net_->engine.reset();
  }
  net_->gloo.reset(); // after the engine, whose failure reaches the group's listeners, this one's among them
}

const char* RingBackend::allreduceAlgorithm() const {
  return algorithmFor("allreduce", size_t{1} << 30);
}

const char* RingBackend::algorithmFor(const std::string& op, size_t bytes, const std::string& device) const {
  OpQuery q;
  q.op = collectiveNamed(op);
  q.bytes = bytes;
  q.device = !c10::Device(device).is_cpu();
  q.contiguous = true;
  GroupShape g = collectives::shapeOf(net_->links, cfg_);
  g.arenaReachesDevice = q.device && g.arena && net_->arena->devicePin() != HostArena::DevicePin::Refused;
  return algorithmName(planOp(q, g, cfg_).algorithm);
}

void RingBackend::setTracing(bool on) {
  TORCH_CHECK(!on || tracer_, "ringpg: tracing needs RINGPG_TRACE=DIR set before the group is created");
  tracing_ = on;
}

void RingBackend::shutdown() {
  runBlocking([this] { stop(/*graceful=*/true); });
}

void RingBackend::abort() {
  runBlocking([this] { stop(/*graceful=*/false); });
}

// ---- Failure state and hooks ---------------------------------------------------------

void RingBackend::onGroupFailed() {
  if (net_->gloo) {
    net_->gloo->abortWaits(); // first: the hooks may take a while (a trace dump)
  }
  if (closing_) {
    return;
  }
  noteFailure();
  runAbortHooks();
}

void RingBackend::noteFailure() {
  BreakCause cause = BreakCause::Local;
  if (net_->failure->reason(nullptr, &cause).empty()) {
    return;
  }
  int healthy = 0; // the first cause wins, as in the engine
  failedCause_.compare_exchange_strong(healthy, static_cast<int>(cause) + 1);
}

void RingBackend::runAbortHooks() {
  FlightRecord::dumpOnFailure(); // as torch's hook did from its abort hook
  std::shared_ptr<const std::map<int64_t, AbortHookFn>> hooks;
  {
    std::lock_guard<std::mutex> lk(hooksMu_); // abortHooks_ (the pointer)
    hooks = abortHooks_;
  }
  if (hooks) {
    for (const auto& [id, hook] : *hooks) {
      callHook("abort", id, hook);
    }
  }
  abortHooksRan_ = true;
}

void RingBackend::finishWork(RingWork& work, std::exception_ptr error) {
#if RINGPG_HAS_BACKEND_COMPLETION_HOOKS
  if (!error) {
    work.complete(nullptr, [this, &work] {
      flight_.retire(work.flightTicket(), work.getDuration()); // a failed op stays "scheduled"
      std::shared_ptr<const std::map<int64_t, c10d::CompletionHook>> hooks;
      {
        std::lock_guard<std::mutex> lk(hooksMu_); // completionHooks_ (the pointer)
        hooks = completionHooks_;
      }
      if (!hooks || hooks->empty()) {
        return;
      }
      c10d::CompletionHookArgs args;
      args.completionKey = work.getCompletionKey();
      args.duration_ms = work.getDuration();
      for (const auto& [id, hook] : *hooks) {
        callHook("completion", id, hook, args);
      }
    });
    return;
  }
#endif
  work.complete(error);
}

#if RINGPG_HAS_BACKEND_GET_ERROR
c10d::ErrorType RingBackend::getError() {
  const int failure = failedCause_.load();
  if (failure == 0) {
    return c10d::ErrorType::SUCCESS;
  }
  switch (static_cast<BreakCause>(failure - 1)) {
    case BreakCause::Timeout:
      return c10d::ErrorType::TIMEOUT;
    case BreakCause::Remote:
      return c10d::ErrorType::REMOTE_ERROR;
    case BreakCause::Local:
    case BreakCause::Aborted:
      break;
  }
  return c10d::ErrorType::COMM_ERROR;
}
#endif

#if RINGPG_HAS_BACKEND_ABORT_HOOKS
void RingBackend::registerAbortHook(int64_t hookId, c10d::AbortHook hook) {
  std::lock_guard<std::mutex> lk(hooksMu_); // abortHooks_
  abortHooks_ = withHook<AbortHookFn>(abortHooks_, hookId, std::move(hook), "register_abort_hook");
}

void RingBackend::unregisterAbortHook(int64_t hookId) {
  std::lock_guard<std::mutex> lk(hooksMu_); // abortHooks_
  abortHooks_ = withoutHook(abortHooks_, hookId);
}
#endif

#if RINGPG_HAS_BACKEND_COMPLETION_HOOKS
void RingBackend::registerCompletionHook(int64_t hookId, c10d::CompletionHook hook) {
  std::lock_guard<std::mutex> lk(hooksMu_); // completionHooks_
  completionHooks_ = withHook(completionHooks_, hookId, std::move(hook), "register_completion_hook");
}

void RingBackend::unregisterCompletionHook(int64_t hookId) {
  std::lock_guard<std::mutex> lk(hooksMu_); // completionHooks_
  completionHooks_ = withoutHook(completionHooks_, hookId);
}
#endif

uint64_t RingBackend::getSequenceNumberForGroup() {
  std::lock_guard<std::mutex> lk(queueMu_);
  return seq_;
}

std::chrono::milliseconds RingBackend::effectiveTimeout(std::chrono::milliseconds opTimeout) const {
  return opTimeout == c10d::kUnsetTimeout || opTimeout.count() <= 0 ? timeout_.load() : opTimeout;
}

#if RINGPG_HAS_BACKEND_SET_TIMEOUT
void RingBackend::setTimeout(std::chrono::milliseconds timeout) {
  TORCH_CHECK(timeout.count() > 0, opName("set_timeout"), ": the timeout must be positive, got ", timeout.count(),
              " ms");
  timeout_.store(timeout);
}
#endif

// ---- Split and shrink -----------------------------------------------------------

#if RINGPG_HAS_BACKEND_SPLIT
namespace {

// A connection of the child's own to `store`: torch warns that a split's Store may share
// the parent's live connection, and a rendezvous blocks on it.  A Store that cannot be
// cloned (one written in Python, say) is shared as it is.
c10::intrusive_ptr<c10d::Store> ownConnection(const c10::intrusive_ptr<c10d::Store>& store) {
  try {
    return store->clone();
  } catch (const c10::Error&) {
    return store;
  }
}

// "a,b,c" (messages and Store keys).
template <class T>
std::string joined(const std::vector<T>& v) {
  std::string out;
  for (const auto& x : v) {
    out += c10::str(out.empty() ? "" : ",", x);
  }
  return out;
}

} // namespace

c10::intrusive_ptr<c10d::Backend> RingBackend::makeChild(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                         int size, std::chrono::milliseconds timeout,
                                                         const std::string& name) const {
  const std::string transport = Config::transportName(transportSetting_);
  const std::string algo = Config::algoName(cfg_.algo);
  // The rendezvous blocks: not with the interpreter's lock, if the caller held it.
  c10::intrusive_ptr<c10d::Backend> child;
  runBlocking([&] { child = c10::make_intrusive<RingBackend>(store, rank, size, timeout, name, transport, algo); });
  return child;
}

c10::intrusive_ptr<c10d::Backend::Options> RingBackend::getBackendOptions() {
  auto opts = c10::make_intrusive<c10d::Backend::Options>(getBackendName(), timeout_.load());
  opts->group_name = groupName_;
  return opts;
}

c10::intrusive_ptr<c10d::Backend> RingBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::vector<int>& ranks,
                                                     const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  std::vector<bool> seen(getSize(), false);
  for (const int r : ranks) {
    TORCH_CHECK_VALUE(r >= 0 && r < getSize() && !seen[r], opName("split"), ": rank ", r,
                      " is out of range or repeated in [", joined(ranks), "] (group size ", getSize(), ")");
    seen[r] = true;
  }
  const auto me = std::find(ranks.begin(), ranks.end(), getRank());
  if (me == ranks.end()) {
    return nullptr; // in no part: torch makes this rank a non-member
  }
  {
    std::lock_guard<std::mutex> lk(splitMu_);
    if (store.get() == lastSplitStore_ && ranks == lastSplitRanks_) {
      if (auto child = lastSplitChild_.lock()) {
        return child; // the same split, for the parent's next device type
      }
    }
  }
  const auto timeout = opts && opts->timeout.count() > 0 ? opts->timeout : timeout_.load();
  const std::string name = opts && !opts->group_name.empty() ? opts->group_name : groupName_ + ":split";
  // Not under splitMu_: the rendezvous blocks, and the gloo transport takes the GIL.
  auto child = makeChild(ownConnection(store), static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()),
                         timeout, name);
  std::lock_guard<std::mutex> lk(splitMu_);
  lastSplitStore_ = store.get();
  lastSplitRanks_ = ranks;
  lastSplitChild_ = c10::weak_intrusive_ptr<c10d::Backend>(child);
  return child;
}
#endif

#if RINGPG_HAS_BACKEND_SHRINK
c10::intrusive_ptr<c10d::Backend> RingBackend::shrink(const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
                                                      const c10::intrusive_ptr<c10d::Backend::Options>& optsOverride) {
  constexpr int kShrinkAbort = 0x01; // torch.distributed.distributed_c10d.SHRINK_ABORT
  TORCH_CHECK_VALUE(shrinkFlags == 0 || shrinkFlags == kShrinkAbort, opName("shrink"),
                    ": shrink_flags must be SHRINK_DEFAULT (0) or SHRINK_ABORT (1), got ", shrinkFlags);
  TORCH_CHECK_VALUE(!ranksToExclude.empty(), opName("shrink"), ": no rank to exclude");
  TORCH_CHECK(store_, opName("shrink"), ": this group was made over links it was given, with no Store to meet on");
  std::vector<bool> excluded(getSize(), false);
  for (const int64_t r : ranksToExclude) {
    TORCH_CHECK_VALUE(r >= 0 && r < getSize() && !excluded[r], opName("shrink"), ": rank ", r,
                      " is out of range or repeated in [", joined(ranksToExclude), "] (group size ", getSize(), ")");
    excluded[r] = true;
  }
  TORCH_CHECK_VALUE(!excluded[getRank()], opName("shrink"), ": rank ", getRank(),
                    " is among the ranks to exclude; only the survivors call shrink");
  // The survivors keep their order: the new rank counts the survivors below this one.
  int newRank = 0;
  int newSize = 0;
  for (const auto q : c10::irange(getSize())) {
    newRank += !excluded[q] && q < getRank() ? 1 : 0;
    newSize += excluded[q] ? 0 : 1;
  }
  if (shrinkFlags == kShrinkAbort) {
    abort();
  }
  // A namespace no earlier group used: this group's, the shrink's count (the same on
  // every survivor, as each shrinks this group alike) and the excluded ranks (survivors
  // that disagree on them wait on different keys and time out rather than mix).
  std::vector<int64_t> sorted = ranksToExclude;
  std::sort(sorted.begin(), sorted.end());
  const std::string prefix = c10::str(keyPrefix(), "shrink/", ++shrinks_, "/", joined(sorted), "/");
  const auto timeout = optsOverride && optsOverride->timeout.count() > 0 ? optsOverride->timeout : timeout_.load();
  const std::string name =
      optsOverride && !optsOverride->group_name.empty() ? optsOverride->group_name : groupName_ + ":shrunk";
  return makeChild(c10::make_intrusive<c10d::PrefixStore>(prefix, ownConnection(store_)), newRank, newSize, timeout,
                   name);
}
#endif

// ---- Stage 2: sequence number and queue ------------------------------------------

c10::intrusive_ptr<c10d::Work> RingBackend::enqueue(const char* name, const char* profilingTitle, OpSignature sig,
                                                    std::chrono::milliseconds timeout, bool asyncOp,
                                                    std::vector<at::Tensor> outputs,
                                                    const std::vector<at::Tensor>& inputs, OpFn fn) {
  auto sync = DeviceSync::capture(name, inputs, outputs);
  std::unique_lock<std::mutex> lk(queueMu_);
  RINGPG_CHECK(!stopping_, name, "the process group has been shut down");
  lk.unlock();
  // The recorder's entry, before the op can run (a dump shows a hung op as scheduled)
  // and outside queueMu_: the recorder takes the GIL to gather the caller's Python
  // stack, and a thread that holds the GIL may be waiting for queueMu_.
  const FlightRecord::Ticket ticket = flight_.collective(profilingTitle, inputs, outputs, effectiveTimeout(timeout));
  lk.lock();
  RINGPG_CHECK(!stopping_, name, "the process group has been shut down"); // stopped meanwhile
  const uint64_t seq = ++seq_; // under the lock that queues it: queue order == sequence order
  auto work = c10::make_intrusive<RingWork>(getRank(), sig.type, name, seq, profilingTitle, std::move(outputs), inputs,
                                            effectiveTimeout(timeout));
  work->setFlightTicket(ticket);
  if (sync) {
    work->setOnSynchronize([sync] { sync->blockCurrentStream(); });
    fn = [sync, inner = std::move(fn)](OpContext& c) {
      sync->waitForCaller();
      inner(c);
      sync->markDone();
    };
  }
  Queued q{work, std::move(fn), OpTag{name, seq, getRank()}, sig, effectiveTimeout(timeout)};
  if (!asyncOp && !sync && !running_ && queue_.empty()) {
    runInline(q, lk);
    return work;
  }
  if (!sync) {
    // An async host op that its caller waits on before the worker has taken it runs in
    // the waiter's thread (runIfNext), through the door: the Work may outlive the group.
    work->setRunHere([door = door_, w = work.get()] { door->runIfNext(w); });
  }
  queue_.push_back(std::move(q));
  queueCv_.notify_all();
  return work;
}

void RingBackend::runInline(Queued& q, std::unique_lock<std::mutex>& lk) {
  running_ = true;
  lk.unlock();
  execute(q);
  lk.lock();
  running_ = false;
  // Wake the worker only if it has something to do: ops queued meanwhile by other
  // threads, or a stop waiting for this op.  An unconditional notify costs a futex
  // wake and a context switch per op, which is most of a small op's time on few cores.
  const bool wakeWorker = !queue_.empty() || stopping_;
  lk.unlock();
  if (wakeWorker) {
    queueCv_.notify_all();
  }
}

void RingBackend::WaiterDoor::runIfNext(const RingWork* work) {
  RingBackend* g = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu); // group, inside
    if (group == nullptr) {
      return; // the group is going: the op ends with it
    }
    g = group;
    ++inside;
  }
  const auto leave = c10::make_scope_exit([this] {
    std::lock_guard<std::mutex> lk(mu); // inside
    --inside;
    left.notify_all();
  });
  // Not under mu: the op may run a completion callback that waits on another Work.
  g->runIfNext(work);
}

void RingBackend::runIfNext(const RingWork* work) {
  std::unique_lock<std::mutex> lk(queueMu_);
  if (running_ || queue_.empty() || queue_.front().work.get() != work) {
    return; // another op runs first, or the worker has taken this one
  }
  Queued q = std::move(queue_.front());
  queue_.pop_front();
  runInline(q, lk);
}

void RingBackend::workerLoop() {
  uint64_t yieldedFor = 0; // the sequence number of the op this thread last yielded to its caller
  while (true) {
    Queued q;
    {
      std::unique_lock<std::mutex> lk(queueMu_);
      queueCv_.wait(lk, [&] { return (stopping_ && !running_) || (!queue_.empty() && !running_); });
      if (queue_.empty()) {
        return;
      }
      // An op its caller may run itself (runIfNext) is left to the caller for one yield
      // of this thread's CPU: a caller that waits at once (async_op=True then wait(), or
      // a functional collective's wait_tensor) then runs it on its own CPU, with no
      // hand-off to this thread and back.  Where this CPU has nothing else to run, the
      // yield returns at once and the op starts here as before.
      if (queue_.front().work->canRunHere() && yieldedFor != queue_.front().tag.seq) {
        yieldedFor = queue_.front().tag.seq;
        lk.unlock();
        std::this_thread::yield();
        continue;
      }
      q = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    execute(q);
    {
      std::lock_guard<std::mutex> lk(queueMu_);
      running_ = false;
    }
    queueCv_.notify_all();
  }
}

// Stage 3: runs one op to completion and completes its Work (never throws).
void RingBackend::execute(Queued& q) {
  std::exception_ptr error;
  q.work->markStarted();
  try {
    bool network = false;
    // The flag first: the reason takes a lock, which a small op should not.
    const std::string broken = net_->failure->failed() ? net_->failure->reason(&network) : std::string();
    if (!broken.empty()) {
      // After a failure every later op fails at once, with the original cause.
      const std::string msg = c10::str(describe(q.tag), ": not run, the group failed earlier: ", broken);
      network ? throwNetwork(msg) : throwBackend(msg);
    }
    OpContext ctx(net_->links, cfg_, q.tag, getSize(), q.sig, Clock::now() + q.timeout, scratch_, workspace_);
    net_->engine->setCurrentCollective(ctx.header());
    TraceOpScope traced(tracing() ? tracer_.get() : nullptr, q.tag.op, q.tag.seq, q.sig.numel,
                        q.sig.dtype); // RINGPG_TRACE
    ctx.setTrace(traced.op());
    std::vector<RequestPtr> signature = ctx.announce(); // links of bare bytes: checked on the engine
    q.fn(ctx);
    ctx.waitAll(signature);
  } catch (const c10::Error& e) {
    error = std::current_exception();
    // The op stopped part-way, so this rank's peers are out of step with it: break the
    // group with this cause (they hear it at once) rather than let the next op mismatch.
    // A request's error names the op already (throwRequestError), and a peer that the op
    // needed and that left the group (a network error) stays the cause's kind.
    const std::string op = describe(q.tag);
    const std::string what = e.what_without_backtrace();
    net_->failure->fail(what.rfind(op, 0) == 0 ? what : c10::str(op, ": ", what),
                        /*network=*/dynamic_cast<const c10::DistNetworkError*>(&e) != nullptr);
  } catch (const std::exception& e) {
    // Anything else (a std::bad_alloc, say) becomes a DistBackendError naming the op.
    const std::string msg = c10::str(describe(q.tag), ": ", e.what());
    net_->failure->fail(msg, /*network=*/false);
    try {
      throwBackend(msg);
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) {
    // The group is broken now (every error above breaks it).  Its caller learns of it
    // from this Work, so getError() must already say why, and the abort hooks must
    // have run (torch's flight recorder dumps its trace there, and a process may exit
    // on the error).  They have when the break happened on this thread; if another
    // thread (the engine's) is still running them, run them here too: a hook is
    // idempotent and blocks until its first run is done (Hooks.hpp).
    noteFailure();
    if (!abortHooksRan_) {
      runAbortHooks();
    }
  }
  finishWork(*q.work, error);
}

} // namespace ringpg
