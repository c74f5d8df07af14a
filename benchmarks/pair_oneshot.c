// The least time a small two-rank allreduce takes on this machine, back to back, with no
// library around it (issue 56): what ringpg's two-rank one-shot exchange
// (algorithms/direct.cpp, oneShotAllreduce over transport/shm.cpp's slots) does per op,
// and nothing else.
//
// Two processes (forked), each with a bfloat16 buffer and a ring of slots in memory both
// map.  An op, on each: wait for a free slot of its own (the peer released it), copy the
// buffer into it, publish it (a head counter), fence (the bell's fence a waker pays,
// transport/shm_wait.h), spin until the peer's next slot is published, add the peer's
// slot into the buffer (fp32, rounded once to bf16), release the peer's slot, fence.  No
// Python, torch, Work, recorder, request or wait loop.  The figure is rank 0's mean time
// per op over ITERS back-to-back ops after 1000 untimed ones: set it beside ringpg's
// `benchmarks.backtoback` figure minus the floor's (each rank's work there, plus torch's
// recorder, plus ringpg's own).
//
//   cc -O3 -march=native benchmarks/pair_oneshot.c -o /tmp/pair_oneshot
//   /tmp/pair_oneshot [BYTES [ITERS]]          (defaults 4096 200000)
//
// x86-64 only (the bf16 add is AVX-512); elsewhere it says so and exits.
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>

#define SLOTS 8
#define SLOT_BYTES 65536

struct side {
  _Alignas(64) _Atomic unsigned long head; // slots this rank has published
  _Alignas(64) _Atomic unsigned long tail; // slots of this rank's the peer has released
  _Alignas(64) char slots[SLOTS][SLOT_BYTES];
};

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

// a[i] += b[i], bfloat16 widened to fp32 and truncated back (the rounding mode does not
// change the time); n a multiple of 16.
static void add_bf16(uint16_t* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const __m512i x = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(a + i))), 16);
    const __m512i y = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(b + i))), 16);
    const __m512 sum = _mm512_add_ps(_mm512_castsi512_ps(x), _mm512_castsi512_ps(y));
    _mm256_storeu_si256((__m256i*)(a + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(sum), 16)));
  }
}

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? (size_t)atol(argv[1]) : 4096;
  const long iters = argc > 2 ? atol(argv[2]) : 200000;
  const long warmup = 1000;
  if (bytes == 0 || bytes > SLOT_BYTES || bytes % 32 != 0) {
    fprintf(stderr, "BYTES: a multiple of 32 up to %d\n", SLOT_BYTES);
    return 1;
  }
  struct side* s = mmap(NULL, 2 * sizeof(struct side), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memset(s, 0, 2 * sizeof(struct side));
  const pid_t child = fork();
  const int me = child == 0;
  struct side* mine = &s[me];
  struct side* peer = &s[1 - me];
  uint16_t* data = aligned_alloc(64, bytes);
  for (size_t i = 0; i < bytes / 2; i++) {
    data[i] = 0x3f80; // 1.0
  }
  double t0 = 0;
  for (long it = 0; it < warmup + iters; it++) {
    if (it == warmup) {
      t0 = now_us();
    }
    // Send: a free slot of our own, the buffer copied in, published, the bell's fence.
    const unsigned long h = atomic_load_explicit(&mine->head, memory_order_relaxed);
    while (h - atomic_load_explicit(&mine->tail, memory_order_acquire) >= SLOTS) {
      _mm_pause();
    }
    memcpy(mine->slots[h % SLOTS], data, bytes);
    atomic_store_explicit(&mine->head, h + 1, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    // Receive: the peer's next slot, reduced into the buffer, released, the bell's fence.
    const unsigned long t = atomic_load_explicit(&peer->tail, memory_order_relaxed);
    while (atomic_load_explicit(&peer->head, memory_order_acquire) == t) {
      _mm_pause();
    }
    add_bf16(data, (const uint16_t*)peer->slots[t % SLOTS], bytes / 2);
    atomic_store_explicit(&peer->tail, t + 1, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
  }
  const double us = (now_us() - t0) / (double)iters;
  if (me == 0) {
    printf("two-rank one-shot allreduce of %zu B (bfloat16) back to back: %.3f us an op over %ld ops\n", bytes, us,
           iters);
    waitpid(child, NULL, 0);
  }
  return 0;
}

#else
int main(void) {
  fprintf(stderr, "pair_oneshot: x86-64 with AVX-512 only (cc -march=native on such a CPU)\n");
  return 1;
}
#endif
