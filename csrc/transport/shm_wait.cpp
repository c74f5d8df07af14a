#include "transport/shm_wait.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "common/host.h"

namespace ringpg {
namespace {

// Sleeps while `*word` == `expected`, at most `timeout`.  Shared (not FUTEX_PRIVATE):
// the word lives in memory several processes map.  A wake, a change of the word
// (EAGAIN), a signal (EINTR) and the timeout all return alike: callers look again.
void futexWaitShared(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  const timespec ts{static_cast<time_t>(timeout.count() / 1000000000), static_cast<long>(timeout.count() % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

} // namespace

void CpuHint::publish(int now) {
  if (cpu.load(std::memory_order_relaxed) != now) {
    cpu.store(now, std::memory_order_relaxed);
  }
  const int32_t self = currentThreadId();
  if (tid.load(std::memory_order_relaxed) != self) {
    tid.store(self, std::memory_order_relaxed);
  }
}

bool CpuHint::confirmedOn(int mine) const {
  const int32_t t = tid.load(std::memory_order_relaxed);
  if (t <= 0) {
    return true;
  }
  char path[48];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", t);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return true; // gone, or in another PID namespace
  }
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) {
    return true;
  }
  buf[n] = '\0';
  // Field 39 (processor: the CPU the thread last ran on), counted from the field after
  // the command's closing parenthesis (the 3rd), since a command may hold spaces.
  const char* at = std::strrchr(buf, ')');
  for (int field = 2; at != nullptr && field < 39; ++field) {
    at = std::strchr(at + 1, ' ');
  }
  return at == nullptr || std::atoi(at + 1) == mine;
}

void Bell::wake() {
  // Release (seq_cst): what the waker published before is visible to a sleeper whose
  // key (read with acquire) already counts this bump.
  seq.fetch_add(1, std::memory_order_seq_cst);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool ShmWaiter::wait(Bell& bell, CpuHint& mine, Deadline deadline, const WaitCalls& calls) {
  const auto start = Clock::now();
  const auto spinEnd = start + std::chrono::microseconds(spinMicros_);
  auto nextCheck = start + kLookEvery;
  SpinGiveWay giveWay(spinYields_);
  int refuted = -1; // a CPU the peer's hint named but the kernel ran the peer elsewhere
  mine.publish(::sched_getcpu()); // the vDSO or rseq's cpu_id: no system call
  while (true) {
    if (calls.look() == WaitLook::Done) {
      return true;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      return false;
    }
    if (now >= nextCheck) {
      if (calls.check()) {
        return true;
      }
      nextCheck = now + kLookEvery;
    }
    if (now < spinEnd) {
      // Pause, not yield, where this host's ranks each have a core (spinYields_ false:
      // transport/connect.cpp): the peer we wait for is running, and a yield would hand
      // the core to any other runnable thread (a compiler, a data loader) for up to a
      // scheduler tick, far longer than the wait.  Where they do not (spinYields_), the
      // peer may need this very core; and so it may where it last waited on this CPU:
      // a busy host (other work on the other cores) can queue both on one, and each
      // pausing spin then costs the other its whole length.  The CPU is published on
      // every look, so a peer that is spinning too never reads a CPU we have left.
      //
      // Where each rank could have a core, two queued on one CPU are the scheduler's
      // doing (a wakeup placed one beside the other: gloo's socket thread waking a rank
      // from its barrier), and they stay there for the whole op.  Neither a yield nor a
      // sleep moved them; so the waiter moves itself to another CPU of its mask
      // (moveOffCpu), which the scheduler might equally have chosen, and its mask stays
      // what it was.  A mask with nowhere else to go (a rank pinned to the CPU its
      // unpinned peer shares) refuses the move: asked once per wait, not on every look
      // (two system calls each), it yields for the rest of the wait (SpinGiveWay).
      // The figures: docs/internals.md, "Why these constants".
      const int cpu = ::sched_getcpu();
      mine.publish(cpu);
      const CpuHint* peer = cpu == refuted ? nullptr : calls.peerOn(cpu);
      // Before moving off on a hint, the kernel is asked once a wait (a read of /proc)
      // whether the peer really ran here last (CpuHint::confirmedOn).
      if (peer != nullptr && !spinYields_ && !peer->confirmedOn(cpu)) {
        refuted = cpu;
        peer = nullptr;
      }
      if (giveWay.pause(cpu, peer != nullptr)) {
        mine.publish(::sched_getcpu());
      }
      continue;
    }
    // Count ourselves in, then look once more: a waker that publishes after that look
    // sees the count (the fences) and bumps `seq`.  A bump before we read the key made
    // what it published visible to this look (the key's acquire reads the bump's
    // release); a bump after it fails the futex wait (the word moved) or ends it.
    const BellCauses causes = calls.causes();
    bell.sleepers.fetch_add(causes, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst); // pairs with Bell::awaited's
    const uint32_t key = bell.seq.load(std::memory_order_seq_cst);
    const WaitLook last = calls.look();
    if (last == WaitLook::Idle) {
      // Bounded: what no bell rings for (a broken group, WaitCalls::check) is looked at
      // within kLookEvery.
      sleeps_.fetch_add(1, std::memory_order_relaxed);
      futexWaitShared(&bell.seq, key, std::min(deadline, nextCheck) - now);
    }
    // Relaxed: a count that lingers only makes a waker look (and perhaps wake) once more.
    bell.sleepers.fetch_sub(causes, std::memory_order_relaxed);
    if (last == WaitLook::Done) {
      return true;
    }
    mine.publish(::sched_getcpu()); // woken, perhaps elsewhere
  }
}

} // namespace ringpg
