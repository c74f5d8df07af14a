// What a sleeping wait costs on this machine, with no library around it (issue 59 item 2).
//
// ringpg's same-host waits spin for a while (RINGPG_SPIN_US, default 100 us) and then
// sleep on a futex until a peer wakes them (transport/shm_wait.h); an MPI rank polls and
// never sleeps.  Where a wake takes long (a guest whose idle vCPUs halt, and each wake
// is an interrupt sent through the hypervisor), every step a rank sleeps through costs
// that long; a ring of 16 ranks has 30 such steps an allreduce.  This prints, for
// processes forked on this host:
//
//   spin ping-pong   two processes hand a token back and forth by spinning on a shared
//                    word: one hand-off (half a round trip), the floor of any wait;
//   futex ping-pong  the same, each waiting asleep on a futex and woken by the other:
//                    one hand-off, a wake of a sleeping process on another CPU, each
//                    round 50 us after the last (the sleeper's CPU idle that long);
//   ... back to back the rounds with no gap, as ranks running op after op do (a wake
//                    can find the sleeper not yet asleep);
//   futex fan-out    one process wakes N-1 sleepers with one FUTEX_WAKE (the host
//                    arena's last arrival): until the waker's call returns (the kernel
//                    wakes the sleepers one by one inside it), and until the first and
//                    the last of them runs.
//
// The processes pin themselves to the CPUs of the mask round robin (the ping-pong's two to
// the first two), so each wake crosses CPUs.  Medians and 90th percentiles in
// microseconds, over ITERS rounds each; the times come from CLOCK_MONOTONIC, which every
// process of a host shares.  On a guest whose idle vCPUs halt at once (haltpoll's
// guest_halt_poll_ns 0), a wake is an interrupt sent through the hypervisor to a halted
// vCPU: the 2-vCPU Xeon guest of RESULTS.md 2026-12-07 (1) read 42 us for it against
// 0.1 us for the spinning hand-off.
//
//   cc -O2 benchmarks/wake_latency.c -o /tmp/wake_latency
//   /tmp/wake_latency [N [ITERS]]      (defaults 2 2000; N: the fan-out's processes)
#define _GNU_SOURCE
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_PROCS 512

struct shared {
  _Alignas(64) _Atomic uint32_t token;    // ping-pong: whose turn (round * 2 + side)
  _Alignas(64) _Atomic uint32_t gen;      // fan-out: the round the leader woke for
  _Alignas(64) _Atomic uint32_t arrived;  // fan-out: sleepers that ran this round
  _Alignas(64) _Atomic uint32_t asleep;   // fan-out: sleepers about to sleep this round
  _Atomic int64_t ran[MAX_PROCS];         // fan-out: when each sleeper ran, ns
};

// The CPUs this process may run on, in order; the processes pin themselves to them round
// robin, so that a wake crosses CPUs as between ranks that each have a core (left to
// itself the scheduler may run both ends of a ping-pong on one CPU).
static int cpus[CPU_SETSIZE];
static int ncpus;

static void pin(int k) {
  if (ncpus > 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[k % ncpus], &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void futex_wait(_Atomic uint32_t* w, uint32_t expected) {
  syscall(SYS_futex, (uint32_t*)w, FUTEX_WAIT, expected, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t* w) {
  syscall(SYS_futex, (uint32_t*)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static void report(const char* what, double* us, int n) {
  qsort(us, n, sizeof(double), cmp);
  printf("%-34s median %8.2f us   p90 %8.2f us\n", what, us[n / 2], us[n * 9 / 10]);
}

// Waits until `token` holds `want`: spinning, or asleep on the futex.
static void await_token(struct shared* s, uint32_t want, int sleep) {
  for (;;) {
    const uint32_t t = atomic_load(&s->token);
    if (t == want) {
      return;
    }
    if (sleep) {
      futex_wait(&s->token, t);
    }
  }
}

// Two processes: the parent (side 0) passes the token to the child and waits for it back;
// one hand-off is half the parent's round trip.
static void ping_pong(struct shared* s, int iters, int sleep, int gap_us, const char* what) {
  atomic_store(&s->token, 0);
  const pid_t child = fork();
  if (child == 0) {
    pin(1);
    for (int i = 0; i < iters; ++i) {
      await_token(s, 2u * i + 1, sleep);
      atomic_store(&s->token, 2u * i + 2);
      if (sleep) {
        futex_wake(&s->token);
      }
    }
    _exit(0);
  }
  pin(0);
  double* us = malloc(sizeof(double) * iters);
  for (int i = 0; i < iters; ++i) {
    const int64_t t0 = now_ns();
    atomic_store(&s->token, 2u * i + 1);
    if (sleep) {
      futex_wake(&s->token);
    }
    await_token(s, 2u * i + 2, sleep);
    us[i] = (now_ns() - t0) / 2e3;
    if (sleep && gap_us > 0) {
      usleep(gap_us); // the child is asleep again before the next round
    }
  }
  waitpid(child, NULL, 0);
  report(what, us, iters);
  free(us);
}

// N - 1 sleepers on `gen`; the leader waits until all are asleep, bumps `gen`, wakes
// them with one call, and spins until each has run.
static void fan_out(struct shared* s, int nprocs, int iters) {
  const int sleepers = nprocs - 1;
  pid_t kids[MAX_PROCS];
  atomic_store(&s->gen, 0);
  for (int k = 0; k < sleepers; ++k) {
    kids[k] = fork();
    if (kids[k] == 0) {
      pin(k + 1);
      for (uint32_t g = 0; g < (uint32_t)iters; ++g) {
        atomic_fetch_add(&s->asleep, 1);
        while (atomic_load(&s->gen) == g) {
          futex_wait(&s->gen, g);
        }
        atomic_store(&s->ran[k], now_ns());
        atomic_fetch_add(&s->arrived, 1);
      }
      _exit(0);
    }
  }
  pin(0);
  double* first = malloc(sizeof(double) * iters);
  double* last = malloc(sizeof(double) * iters);
  double* call = malloc(sizeof(double) * iters);
  for (int i = 0; i < iters; ++i) {
    while (atomic_load(&s->asleep) < (uint32_t)sleepers) {
    }
    usleep(50); // the sleepers are in futex_wait, not just counted in
    atomic_store(&s->asleep, 0);
    atomic_store(&s->arrived, 0);
    const int64_t t0 = now_ns();
    atomic_fetch_add(&s->gen, 1);
    futex_wake(&s->gen);
    call[i] = (now_ns() - t0) / 1e3;
    while (atomic_load(&s->arrived) < (uint32_t)sleepers) {
    }
    int64_t lo = INT64_MAX, hi = 0;
    for (int k = 0; k < sleepers; ++k) {
      const int64_t t = atomic_load(&s->ran[k]);
      lo = t < lo ? t : lo;
      hi = t > hi ? t : hi;
    }
    first[i] = (lo - t0) / 1e3;
    last[i] = (hi - t0) / 1e3;
  }
  for (int k = 0; k < sleepers; ++k) {
    waitpid(kids[k], NULL, 0);
  }
  char what[64];
  snprintf(what, sizeof(what), "futex fan-out to %d, the wake call", sleepers);
  report(what, call, iters);
  snprintf(what, sizeof(what), "futex fan-out to %d, first runs", sleepers);
  report(what, first, iters);
  snprintf(what, sizeof(what), "futex fan-out to %d, last runs", sleepers);
  report(what, last, iters);
  free(first);
  free(last);
  free(call);
}

int main(int argc, char** argv) {
  const int nprocs = argc > 1 ? atoi(argv[1]) : 2;
  const int iters = argc > 2 ? atoi(argv[2]) : 2000;
  if (nprocs < 2 || nprocs > MAX_PROCS || iters < 1) {
    fprintf(stderr, "usage: %s [N (2-%d) [ITERS (>= 1)]]\n", argv[0], MAX_PROCS);
    return 2;
  }
  struct shared* s = mmap(NULL, sizeof(struct shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &mask)) {
        cpus[ncpus++] = c;
      }
    }
  }
  printf("# %d CPUs to run on, processes pinned round robin; %d processes in the fan-out, %d rounds each\n", ncpus, nprocs,
         iters);
  ping_pong(s, iters, 0, 0, "spin ping-pong, one hand-off");
  ping_pong(s, iters, 1, 50, "futex ping-pong, one hand-off");
  ping_pong(s, iters, 1, 0, "futex ping-pong back to back");
  fan_out(s, nprocs, iters);
  return 0;
}
