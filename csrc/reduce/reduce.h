// Element-wise reduction kernels: out[i] = a[i] (op) b[i], for every dtype x op pair
// ringpg reduces.  `out` may alias `a` (in-place accumulate); `b` never aliases `out`.
//
// Half precision (float16, bfloat16) is widened to fp32, combined, and rounded once
// (round-to-nearest-even), as NCCL does per step.  Integer arithmetic wraps (two's
// complement), as in torch.  Bool: SUM/MAX/BOR = or, PRODUCT/MIN/BAND = and, BXOR = xor.
// Kernels are compiled once per instruction set of the target (x86-64: baseline,
// AVX2+F16C+FMA, AVX-512, AVX-512 with the bfloat16 converter; aarch64: baseline, NEON,
// SVE) and the best the CPU supports is chosen once at start-up.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ringpg {

enum class RedOp : uint8_t { Sum, Prod, Min, Max, Band, Bor, Bxor };

const char* redOpName(RedOp op);

// True when reduce() implements (dtype, op).
bool reduceSupported(c10::ScalarType dtype, RedOp op);

// out[i] = a[i] op b[i] for i < n.  Precondition: reduceSupported(dtype, op).
void reduce(c10::ScalarType dtype, RedOp op, void* out, const void* a, const void* b, int64_t n);

// out[i] = ins[0][i] op ins[1][i] op ... op ins[last][i] for i < n, the operands in
// that order (so every caller that passes the same buffers in the same order holds the
// same bits), `elemSize`-byte elements.  Block by block, so the accumulator stays in L1
// while each operand's block streams past it.  `out` may be none of `ins` but ins[0].
void reduceInOrder(c10::ScalarType dtype, RedOp op, void* out, const std::vector<const char*>& ins, int64_t n,
                   size_t elemSize);

// data[i] /= divisor for i < n, truncating toward zero (AVG on integer dtypes).
// Precondition: dtype is an integer type (not bool).
void divideIntegers(c10::ScalarType dtype, void* data, int64_t n, int64_t divisor);
// out[i] = in[i] / by (Divide: AVG on floating dtypes, `by` the world size, > 0) or
// in[i] * by (Multiply: PREMUL_SUM's factor) for i < n on a floating dtype (float,
// double, float16, bfloat16), with the bits ATen's division or product by a scalar
// gives: `by` taken in the dtype's opmath (fp32 for fp16/bf16/float), the result
// rounded once to nearest even.  A divisor that is a power of two multiplies by its
// reciprocal: the same bits.  `out` may be `in`.
enum class Scale : uint8_t { Divide, Multiply };
void scaleFloats(c10::ScalarType dtype, void* out, const void* in, int64_t n, double by, Scale how);
// scaleFloats with the kernels of `isa` (one of reduceIsas(); for tests).
void scaleFloatsWithIsa(const std::string& isa, c10::ScalarType dtype, void* out, const void* in, int64_t n, double by,
                        Scale how);
// dst[0, n) = src[0, n) with stores that bypass the caches where the architecture has
// them (x86-64's movntdq; elsewhere a plain memcpy): for an output larger than the
// caches keep, whose lines a plain copy would first read for ownership and then see
// evicted unread.  Ordered (sfence) before it returns.  `dst` and `src` do not overlap.
void copyStreaming(void* dst, const void* src, size_t n);
// copyStreaming where `streaming`, else a plain memcpy: the choice an all-gather's own
// chunk (algorithms/ring.cpp) and the shared-memory link's copies out of its slots
// (Request::streaming) make alike.
inline void copyMaybeStreaming(void* dst, const void* src, size_t n, bool streaming) {
  if (streaming) {
    copyStreaming(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

// Name of the instruction set the kernels were dispatched to ("avx512+bf16", "avx512",
// "avx2", "sve", "neon", "baseline"): the best this CPU runs, or the one
// RINGPG_TUNING reduce_isa names.
// Throws (TORCH_CHECK) when RINGPG_TUNING reduce_isa names one the CPU cannot run.
const char* reduceIsa();

// Every instruction set whose kernels this CPU can run, best first: what reduce() picks
// is the first.  reduceWithIsa() runs one of them by name (tests compare each copy
// with torch; benchmarks compare them with each other); TORCH_CHECK if it cannot run.
std::vector<std::string> reduceIsas();
void reduceWithIsa(const std::string& isa, c10::ScalarType dtype, RedOp op, void* out, const void* a, const void* b,
                   int64_t n);

} // namespace ringpg
