// How a thread waits on shared memory for a same-host peer, and how the peer wakes it:
// what the shared-memory links (shm.h) and the host arena (arena.h) both wait with.
//
// A wait looks at the shared words it waits on, spins for a while (giving way to a
// peer queued on its CPU: SpinGiveWay, common/host.h), then sleeps on a Bell, a futex
// word in the same shared memory, until a waker rings it, the look interval passes or
// the deadline does.  The bell is an event count: a sleeper counts itself in, looks
// once more, and sleeps only while the word still holds the value it read before that
// look; a waker that published something a sleeper may wait for looks for a sleeper,
// and only where there is one bumps the word and wakes.  A sleeper counts itself in
// only for the causes it waits for (BellCauses), so it is woken only by what it waits
// for, never by every movement of its peers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <type_traits>

#include <c10/util/FunctionRef.h>

#include "transport/socket.h"

namespace ringpg {

// What a sleeper waits for, as its share of a bell's `sleepers`: each cause counts its
// sleepers in 16 bits of the word of its own, so a set of causes is the sum of their
// shares (a sleeper waiting for both adds both).  At most 65,535 sleepers a cause: a
// host's ranks.
using BellCauses = uint32_t;
constexpr BellCauses kBellCauseA = 1u;       // counted in bits 0-15
constexpr BellCauses kBellCauseB = 1u << 16; // counted in bits 16-31
// The bits of `sleepers` that count the sleepers of `causes`: each share (1 or 1 << 16)
// times 0xFFFF fills its own 16 bits.
constexpr uint32_t bellCauseBits(BellCauses causes) {
  return causes * 0xFFFFu;
}

// A futex bell in shared memory (zeros: quiet, no sleeper).  Waits sleep on `seq`;
// ShmWaiter::wait is the sleeper's side, awaited()/wake()/ring() the waker's.
struct Bell {
  std::atomic<uint32_t> seq;      // the futex word: an event count, bumped once per wake
  std::atomic<uint32_t> sleepers; // sleepers counted in before their last look, by cause

  // Whether a sleeper waiting for `cause` is counted in, asked by a waker after it
  // published what such a sleeper waits for.  The fence pairs with the sleeper's
  // (ShmWaiter::wait): the sleeper counted itself in and then looks, the waker
  // published and then looks at the count, so at least one of them sees the other's
  // store: the sleeper does not sleep, or the waker wakes it.
  bool awaited(BellCauses cause) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return (sleepers.load(std::memory_order_relaxed) & bellCauseBits(cause)) != 0;
  }
  // Bumps the event count and wakes every sleeper on this bell: a sleeper whose key
  // already counts the bump sees what the waker published before it; one whose key
  // does not fails or ends its futex wait.
  void wake();
  // A waker's whole part where nothing else decides who wakes: wakes the sleepers if
  // one waits for `cause`; whether it did.  A bell with no sleeper costs the fence
  // alone: no locked write to a line peers read, no system call.
  bool ring(BellCauses cause) {
    if (!awaited(cause)) {
      return false;
    }
    wake();
    return true;
  }
};
static_assert(std::is_standard_layout_v<Bell> && std::atomic<uint32_t>::is_always_lock_free,
              "a bell must be plain memory shared between processes");

// The CPU a waiter last waited on (sched_getcpu; -1: not known, or a sandbox without
// getcpu), in shared memory: a peer's spin compares it with its own CPU, since one
// spinning on the CPU that the thread it waits for is queued on keeps that thread from
// running (SpinGiveWay).
struct CpuHint {
  std::atomic<int32_t> cpu;
  std::atomic<int32_t> tid; // the kernel's id of the thread that last waited (0: none yet)

  // Stores only on a move, so the line stays shared while the waiter stays put.
  void publish(int now);
  // Whether the waiter last waited on `mine` (never where no CPU is known).
  bool on(int mine) const { return mine >= 0 && cpu.load(std::memory_order_relaxed) == mine; }
  // Whether the kernel last ran that thread on `mine` (/proc/<tid>/stat).  Only its
  // waits write a hint, and the scheduler moves a thread that is not waiting without a
  // word, so a hint that names `mine` may be stale: moving off on it would put both
  // ranks on one CPU, which the peer then leaves on its next wait, and so on.  True
  // where the kernel cannot say (the thread in another PID namespace): the hint is all
  // there is.
  bool confirmedOn(int mine) const;
};
static_assert(std::is_standard_layout_v<CpuHint> && std::atomic<int32_t>::is_always_lock_free);

// What one look of a wait found.
enum class WaitLook : uint8_t {
  Idle,  // nothing moved: the wait may sleep
  Moved, // something moved but the wait is not over: look again before any sleep
  Done,  // the wait is over (its caller says how it ended)
};

// What a wait waits for, as its caller's calls.
struct WaitCalls {
  c10::function_ref<WaitLook()> look; // every pass, and once more before each sleep
  c10::function_ref<bool()> check;    // once a look interval: true ends the wait (Done)
  // The hint of a peer waited for that last waited on this CPU, or null.
  c10::function_ref<const CpuHint*(int)> peerOn;
  c10::function_ref<BellCauses()> causes; // what a sleep waits for, asked just before it
};

// Spin, then sleep: one per waiting side (a link, an arena member).
class ShmWaiter {
 public:
  // How often a sleeping wait looks at what no bell rings for: a broken group (its
  // sockets), an arena member that runs another op (WaitCalls::check).
  static constexpr std::chrono::milliseconds kLookEvery{10};

  // `spinMicros`: how long a wait polls before it sleeps; `spinYields`: whether a
  // spinning wait yields its core between looks (the host's ranks outnumber its CPUs).
  ShmWaiter(int spinMicros, bool spinYields) : spinMicros_(spinMicros), spinYields_(spinYields) {}
  ShmWaiter(const ShmWaiter&) = delete;
  ShmWaiter& operator=(const ShmWaiter&) = delete;

  // Looks until `calls.look` or `calls.check` ends the wait (true) or `deadline` passes
  // (false): spinning for the first spinMicros, then sleeping on `bell`; publishes in
  // `mine` the CPU this thread waits on.  Only the thread that owns this waiter calls it.
  bool wait(Bell& bell, CpuHint& mine, Deadline deadline, const WaitCalls& calls);
  // Futex waits so far (for the arena's counts()).
  uint64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }

 private:
  const int spinMicros_;
  const bool spinYields_;
  std::atomic<uint64_t> sleeps_{0}; // written by the waiting thread, read by any
};

} // namespace ringpg
