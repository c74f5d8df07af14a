// The least time a two-rank same-host all-gather through shared memory takes on this
// machine, with no library around it: issue 30's lower bound.
//
// Without cross-memory attach a rank can reach its neighbour's bytes only through memory
// both map, so each of two ranks makes three copies of its chunk: into a shared slot,
// into its own output, and its neighbour's chunk out of the neighbour's slot.  Here two
// threads pinned to two CPUs (threads share caches as processes do) make exactly those
// copies with glibc's memcpy (Intel MPI's copies are `rep movsb` too), through a ring of
// slots of SEG bytes with a head and a tail counter per direction, and nothing else:
// no dispatch, no Work, no futex.  An op starts after a spinning barrier; its time is the
// slower thread's.  The result is a figure to set beside the MPIs' whole op and
// torch's floor in `python -m benchmarks.bench --backends ringpg,floor --peers ...`.
//
//   cc -O2 -pthread benchmarks/three_copies.c -o /tmp/three_copies
//   /tmp/three_copies [SEG [SLOTS [ITERS [ORDER]]]]      (defaults 131072 8 2000 chunk)
//
// prints, for an all-gather output of 128 KiB to 4 MiB (the bench's size: both chunks),
// the median and tenth percentile of the op's time in microseconds.  ORDER says when a
// rank copies its own chunk into its output: `chunk`, all of it before the first slot
// copy; `segment`, each segment right after it went into a slot, from the cache (what
// ringpg's copySend does, algorithms/ring.cpp).
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define RELAX() _mm_pause()
#else
#define RELAX() ((void)0)
#endif

enum { kMaxIters = 100000 };

// One direction: the writer's slots, its head (slots filled) and the reader's tail (slots
// emptied), each counter on a line of its own so the two threads do not share one.
typedef struct {
  _Alignas(64) _Atomic uint64_t head;
  _Alignas(64) _Atomic uint64_t tail;
  char* slots;
} Direction;

static size_t chunkBytes, segBytes;
static uint64_t slotCount;
static int iters;
static int bySegment; // ORDER: the own chunk copied segment by segment (1) or whole first (0)
static int cpus[2];
static Direction dirs[2]; // dirs[r]: rank r's slots, read by 1 - r
static _Alignas(64) _Atomic uint64_t arrived[2];
static double opNs[2][kMaxIters];

// aligned_alloc wants a multiple of the alignment.
static char* pageAlloc(size_t bytes) { return aligned_alloc(4096, (bytes + 4095) / 4096 * 4096); }

static double nowNs(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static void* rank(void* arg) {
  const int me = (int)(intptr_t)arg;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpus[me], &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  char* in = pageAlloc(chunkBytes);
  char* out = pageAlloc(2 * chunkBytes);
  memset(in, me + 1, chunkBytes);
  memset(out, 0, 2 * chunkBytes);
  Direction* mine = &dirs[me];
  Direction* theirs = &dirs[1 - me];
  const size_t segs = (chunkBytes + segBytes - 1) / segBytes;
  for (int it = 0; it < iters; ++it) {
    atomic_store(&arrived[me], (uint64_t)it + 1); // barrier: both ranks start together
    while (atomic_load(&arrived[1 - me]) < (uint64_t)it + 1) RELAX();
    const double t0 = nowNs();
    if (!bySegment) {
      memcpy(out + me * chunkBytes, in, chunkBytes); // copy 1: own chunk
    }
    uint64_t head = atomic_load_explicit(&mine->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&theirs->tail, memory_order_relaxed);
    size_t pushed = 0, pulled = 0;
    while (pushed < segs || pulled < segs) {
      const size_t pushLen = pushed + 1 == segs ? chunkBytes - pushed * segBytes : segBytes;
      if (pushed < segs && head - atomic_load_explicit(&mine->tail, memory_order_acquire) < slotCount) {
        memcpy(mine->slots + (head % slotCount) * segBytes, in + pushed * segBytes, pushLen); // copy 2
        if (bySegment) {
          memcpy(out + me * chunkBytes + pushed * segBytes, in + pushed * segBytes, pushLen); // copy 1
        }
        atomic_store_explicit(&mine->head, ++head, memory_order_release);
        ++pushed;
      } else if (pulled < segs && atomic_load_explicit(&theirs->head, memory_order_acquire) > tail) {
        const size_t pullLen = pulled + 1 == segs ? chunkBytes - pulled * segBytes : segBytes;
        memcpy(out + (1 - me) * chunkBytes + pulled * segBytes, theirs->slots + (tail % slotCount) * segBytes,
               pullLen); // copy 3
        atomic_store_explicit(&theirs->tail, ++tail, memory_order_release);
        ++pulled;
      } else {
        RELAX();
      }
    }
    opNs[me][it] = nowNs() - t0;
  }
  free(in);
  free(out);
  return NULL;
}

static int byValue(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  segBytes = argc > 1 ? strtoull(argv[1], NULL, 0) : 131072;
  slotCount = argc > 2 ? strtoull(argv[2], NULL, 0) : 8;
  iters = argc > 3 ? atoi(argv[3]) : 2000;
  const char* order = argc > 4 ? argv[4] : "chunk";
  bySegment = strcmp(order, "segment") == 0;
  if (segBytes == 0 || slotCount == 0 || iters <= 0 || iters > kMaxIters ||
      (!bySegment && strcmp(order, "chunk") != 0)) {
    fprintf(stderr, "usage: %s [SEG>0 [SLOTS>0 [ITERS 1..%d [chunk|segment]]]]\n", argv[0], kMaxIters);
    return 2;
  }
  cpu_set_t allowed;
  sched_getaffinity(0, sizeof allowed, &allowed);
  for (int c = 0, found = 0; c < CPU_SETSIZE && found < 2; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus[found++] = c;
  }
  printf("# two threads on CPUs %d and %d, segments of %zu bytes, %llu slots, %d ops a size, own chunk by %s\n",
         cpus[0], cpus[1], segBytes, (unsigned long long)slotCount, iters, bySegment ? "segment" : "chunk");
  printf("# %10s %12s %12s\n", "output (B)", "median (us)", "p10 (us)");
  for (size_t output = 128 << 10; output <= 4 << 20; output *= 2) {
    chunkBytes = output / 2;
    for (int r = 0; r < 2; ++r) {
      dirs[r].slots = pageAlloc(segBytes * slotCount);
      memset(dirs[r].slots, 0, segBytes * slotCount);
      atomic_store(&dirs[r].head, 0);
      atomic_store(&dirs[r].tail, 0);
      atomic_store(&arrived[r], 0);
    }
    pthread_t threads[2];
    for (int r = 0; r < 2; ++r) pthread_create(&threads[r], NULL, rank, (void*)(intptr_t)r);
    for (int r = 0; r < 2; ++r) pthread_join(threads[r], NULL);
    static double slower[kMaxIters];
    for (int i = 0; i < iters; ++i) slower[i] = opNs[0][i] > opNs[1][i] ? opNs[0][i] : opNs[1][i];
    qsort(slower, iters, sizeof slower[0], byValue);
    printf("  %12zu %12.1f %12.1f\n", output, slower[iters / 2] / 1e3, slower[iters / 10] / 1e3);
    for (int r = 0; r < 2; ++r) free(dirs[r].slots);
  }
  return 0;
}
