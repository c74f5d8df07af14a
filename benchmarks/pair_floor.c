// The least time a two-rank same-host all-gather by single copy takes on this machine,
// with no library around it, and what the state of the caches does to it (issue 56).
//
// Two processes (forked: single copy reads another process's memory) each hold an input
// block and an output of two blocks.  An op: both spin on a shared counter (a barrier),
// then each copies its own block into its output (glibc memcpy) and reads the other's
// block straight from the other's input with one process_vm_readv, then both spin again;
// its time is rank 0's, from the first barrier's end to the second's.  That is
// ringpg's pair exchange (algorithms/direct.cpp, pairAllGather) and what an MPI's
// two-process all-gather does by cross-memory attach, without dispatch, Work or futex.
// Between ops, as a process running more than the op does:
//   POLLUTE=BYTES  each rank first touches BYTES of other memory (one byte a line), as
//                  the rest of a program (torch's call path, the bench's columns) may;
//   DIRTY=1        each rank first rewrites its input, so its lines are modified in its
//                  core's cache when the other reads them (a buffer computed just before
//                  the op, as gradients are).
// How the other block moves, and who reads the output:
//   PUSH=1         each rank writes its block into the other's output (process_vm_writev)
//                  instead of reading the other's block into its own (the default, as
//                  ringpg and the MPIs' cross-memory attach do);
//   READ=1         each rank reads its whole output (one byte a line) after the op,
//                  inside the timed span, as a caller that uses what it gathered does.
// And where the buffers live:
//   HUGEPAGES=1    input and output on 2 MiB-aligned memory advised MADV_HUGEPAGE before
//                  their first touch (transparent huge pages wherever the kernel grants
//                  them: sysfs `enabled` at madvise or always); else malloc's memory,
//                  4 KiB pages where THP is `madvise`, as torch's CPU tensors are by
//                  default.  process_vm_readv pins the pages it reads, one by one.
//
//   cc -O2 benchmarks/pair_floor.c -o /tmp/pair_floor
//   POLLUTE=4194304 /tmp/pair_floor [BLOCK [ITERS]]     (defaults 131072 4000)
//
// prints the median and the best op time in microseconds for the all-gather of two BLOCKs
// (the median: a spinning rank the scheduler preempts costs one op milliseconds).
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

struct shared {
  _Atomic long arrived[2]; // each rank's barrier count, on one page both map
  void* input[2];
  void* output[2]; // PUSH: where the other rank writes its block
  pid_t pid[2];
};

// `bytes` rounded up to whole 2 MiB pages, 2 MiB-aligned, advised huge before first touch.
static char* huge_alloc(size_t bytes) {
  const size_t page = (size_t)2 << 20;
  const size_t rounded = (bytes + page - 1) / page * page;
  char* p = aligned_alloc(page, rounded);
  if (p != NULL) {
    madvise(p, rounded, MADV_HUGEPAGE);
  }
  return p;
}

// Both ranks reach barrier number `n`.
static void barrier(struct shared* s, int me, long n) {
  atomic_store(&s->arrived[me], n);
  while (atomic_load(&s->arrived[1 - me]) < n) {
  }
}

int main(int argc, char** argv) {
  const size_t block = argc > 1 ? (size_t)atol(argv[1]) : 131072;
  const int iters = argc > 2 ? atoi(argv[2]) : 4000;
  const size_t pollute = getenv("POLLUTE") ? (size_t)atol(getenv("POLLUTE")) : 0;
  const int dirty = getenv("DIRTY") != NULL && atoi(getenv("DIRTY")) != 0;
  const int push = getenv("PUSH") != NULL && atoi(getenv("PUSH")) != 0;
  const int readOut = getenv("READ") != NULL && atoi(getenv("READ")) != 0;
  const int warmup = 50;
  struct shared* s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  const pid_t child = fork();
  const int me = child == 0 ? 1 : 0;
  const int huge = getenv("HUGEPAGES") != NULL && atoi(getenv("HUGEPAGES")) != 0;
  char* in = huge ? huge_alloc(block) : malloc(block);
  char* out = huge ? huge_alloc(2 * block) : malloc(2 * block);
  char* other = pollute ? malloc(pollute) : NULL;
  if (in == NULL || out == NULL || (pollute && other == NULL)) {
    perror("malloc");
    return 1;
  }
  memset(in, me + 1, block);
  memset(out, 0, 2 * block);
  if (other) {
    memset(other, 3, pollute);
  }
  s->input[me] = in;
  s->output[me] = out;
  s->pid[me] = getpid();
  barrier(s, me, 1); // both addresses published
  double* times = malloc(sizeof(double) * (size_t)iters);
  if (times == NULL) {
    perror("malloc");
    return 1;
  }
  long n = 1;
  for (int it = 0; it < warmup + iters; it++) {
    for (size_t i = 0; i < pollute; i += 64) {
      other[i]++;
    }
    if (dirty) {
      memset(in, it & 0xff, block);
    }
    barrier(s, me, ++n);
    const double t0 = now_us();
    memcpy(out + me * block, in, block);
    ssize_t moved;
    if (push) { // our block into the other's output, at our place in it
      struct iovec local = {in, block};
      struct iovec remote = {(char*)s->output[1 - me] + me * block, block};
      moved = process_vm_writev(s->pid[1 - me], &local, 1, &remote, 1, 0);
    } else { // the other's block into our output
      struct iovec local = {out + (1 - me) * block, block};
      struct iovec remote = {s->input[1 - me], block};
      moved = process_vm_readv(s->pid[1 - me], &local, 1, &remote, 1, 0);
    }
    if (moved != (ssize_t)block) {
      perror(push ? "process_vm_writev" : "process_vm_readv");
      return 1;
    }
    barrier(s, me, ++n); // PUSH: the other has written our output
    if (readOut) {
      volatile char sink = 0;
      for (size_t i = 0; i < 2 * block; i += 64) {
        sink += out[i];
      }
      (void)sink;
    }
    const double us = now_us() - t0;
    if (it >= warmup) {
      times[it - warmup] = us;
    }
  }
  if (me == 0) {
    qsort(times, (size_t)iters, sizeof(double), by_value);
    printf("all-gather of 2 x %zu B (pollute %zu B, dirty %d, hugepages %d, push %d, read %d): median %.1f us, best "
           "%.1f us over %d ops\n",
           block, pollute, dirty, huge, push, readOut, times[iters / 2], times[0], iters);
    waitpid(child, NULL, 0);
  }
  return 0;
}
