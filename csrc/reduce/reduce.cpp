// Runtime-dispatched reduction kernels (see reduce.h).  kernels.inc is compiled once
// per instruction set of the target architecture, each copy beyond the baseline inside
// a `#pragma GCC target` region, and reduce() jumps to the best copy the running CPU
// supports (chosen once).  x86-64: baseline, AVX2, AVX-512, AVX-512 with the bf16
// converter.  aarch64: baseline, NEON, SVE.  Other architectures: the baseline copy
// alone (not built or tested).
#include "reduce/reduce.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "common/config.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>
// The SVE copy needs the ACLE's SVE intrinsics under a target pragma (GCC 10 and later;
// built with GCC 11 and 12, tested with 12; clang builds the NEON and baseline copies).
// -DRINGPG_NO_SVE leaves it out.
#if !defined(RINGPG_NO_SVE) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10 && __has_include(<arm_sve.h>)
#define RINGPG_HAVE_SVE 1
#include <arm_sve.h>
#endif
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#ifndef HWCAP_SVE
#define HWCAP_SVE (1UL << 22)
#endif
#endif

namespace ringpg {

// IEEE binary16 as the kernels' float16 element.  GCC before 13 has no _Float16 in C++
// on aarch64; its __fp16 is the same format (arithmetic on it is done in float, and
// conversions round to nearest even, keeping denormals, through the FCVT instructions).
#if defined(__aarch64__)
using Float16 = __fp16;
#else
using Float16 = _Float16;
#endif

// The architecture's baseline: plain C++ (auto-vectorized for the target's base ISA:
// SSE2 on x86-64, NEON on aarch64).
namespace isa_baseline {
#include "reduce/kernels.inc"
} // namespace isa_baseline

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
// Hand-vectorized 8-lane paths (float16 through the F16C converters) for this copy.
#define RINGPG_KERNELS_AVX2 1
namespace isa_avx2 {
#include "reduce/kernels.inc"
} // namespace isa_avx2
#undef RINGPG_KERNELS_AVX2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi,bmi2")
// Target pragmas do not define __AVX512BW__, so the hand-vectorized paths of
// kernels.inc are switched on by name for this copy only.
#define RINGPG_KERNELS_AVX512 1
namespace isa_avx512 {
#include "reduce/kernels.inc"
} // namespace isa_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c,bmi,bmi2")
// The AVX-512 copy again, plus the CPU's bfloat16 converter for the bf16 kernels.
#define RINGPG_KERNELS_AVX512_BF16 1
namespace isa_avx512bf16 {
#include "reduce/kernels.inc"
} // namespace isa_avx512bf16
#undef RINGPG_KERNELS_AVX512_BF16
#undef RINGPG_KERNELS_AVX512
#pragma GCC pop_options

#elif defined(__aarch64__)

// Hand-vectorized 128-bit loops (kernels_neon.inc).  Advanced SIMD is part of the base
// ISA, so no target pragma: this copy runs wherever the baseline does.
#define RINGPG_KERNELS_NEON 1
namespace isa_neon {
#include "reduce/kernels.inc"
} // namespace isa_neon
#undef RINGPG_KERNELS_NEON

#if defined(RINGPG_HAVE_SVE)
#pragma GCC push_options
#pragma GCC target("+sve")
// Vector-length-agnostic predicated loops (kernels_sve.inc); the compiler may use SVE
// for the plain loops of this copy too.
#define RINGPG_KERNELS_SVE 1
namespace isa_sve {
#include "reduce/kernels.inc"
} // namespace isa_sve
#undef RINGPG_KERNELS_SVE
#pragma GCC pop_options
#endif

#endif

namespace {

using ReduceFn = bool (*)(c10::ScalarType, RedOp, void*, const void*, const void*, int64_t);
using ScaleFn = bool (*)(c10::ScalarType, void*, const void*, int64_t, double, bool);

struct Dispatch {
  ReduceFn fn;
  const char* name;
  ScaleFn scale; // scaleFloats' copy for the same instruction set
};

// Every compiled copy of the kernels this CPU can run, best first (baseline always).
std::vector<Dispatch> runnable() {
  std::vector<Dispatch> copies;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512 && __builtin_cpu_supports("avx512bf16")) {
    copies.push_back({&isa_avx512bf16::detail::reduceImpl, "avx512+bf16", &isa_avx512bf16::detail::scaleImpl});
  }
  if (avx512) {
    copies.push_back({&isa_avx512::detail::reduceImpl, "avx512", &isa_avx512::detail::scaleImpl});
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    copies.push_back({&isa_avx2::detail::reduceImpl, "avx2", &isa_avx2::detail::scaleImpl});
  }
#elif defined(__aarch64__)
  // The kernel's view of the CPU (HWCAP_SVE also means the kernel saves SVE state).
  const unsigned long hwcap = getauxval(AT_HWCAP);
#if defined(RINGPG_HAVE_SVE)
  if ((hwcap & HWCAP_SVE) != 0) {
    copies.push_back({&isa_sve::detail::reduceImpl, "sve", &isa_sve::detail::scaleImpl});
  }
#endif
  if ((hwcap & HWCAP_ASIMD) != 0) {
    copies.push_back({&isa_neon::detail::reduceImpl, "neon", &isa_neon::detail::scaleImpl});
  }
#endif
  copies.push_back({&isa_baseline::detail::reduceImpl, "baseline", &isa_baseline::detail::scaleImpl});
  return copies;
}

std::vector<std::string> namesOf(const std::vector<Dispatch>& copies) {
  std::vector<std::string> names;
  for (const Dispatch& d : copies) {
    names.emplace_back(d.name);
  }
  return names;
}

// The copy called `name` among `copies`, or null.
const Dispatch* byName(const std::vector<Dispatch>& copies, const std::string& name) {
  for (const Dispatch& d : copies) {
    if (name == d.name) {
      return &d;
    }
  }
  return nullptr;
}

// The best copy, unless the reduce_isa tuning key names another this CPU can run.
Dispatch choose() {
  const std::vector<Dispatch> copies = runnable();
  const std::string& want = Config::get().reduceIsa;
  if (want.empty() || want == "auto") {
    return copies.front();
  }
  const Dispatch* d = byName(copies, want);
  TORCH_CHECK(d, "ringpg: RINGPG_TUNING reduce_isa=", want,
              " cannot run on this CPU (it runs: ", c10::Join(", ", namesOf(copies)), "; or auto)");
  return *d;
}

const Dispatch& dispatch() {
  static const Dispatch d = choose(); // a refused setting throws here, and again on the next call
  return d;
}

} // namespace

const char* redOpName(RedOp op) {
  switch (op) {
    case RedOp::Sum:
      return "SUM";
    case RedOp::Prod:
      return "PRODUCT";
    case RedOp::Min:
      return "MIN";
    case RedOp::Max:
      return "MAX";
    case RedOp::Band:
      return "BAND";
    case RedOp::Bor:
      return "BOR";
    case RedOp::Bxor:
      return "BXOR";
  }
  return "?";
}

bool reduceSupported(c10::ScalarType dtype, RedOp op) {
  using c10::ScalarType;
  const bool bitwise = op == RedOp::Band || op == RedOp::Bor || op == RedOp::Bxor;
  switch (dtype) {
    case ScalarType::Float:
    case ScalarType::Double:
    case ScalarType::Half:
    case ScalarType::BFloat16:
      return !bitwise;
    case ScalarType::Char:
    case ScalarType::Byte:
    case ScalarType::Short:
    case ScalarType::Int:
    case ScalarType::Long:
    case ScalarType::UInt16:
    case ScalarType::UInt32:
    case ScalarType::UInt64:
    case ScalarType::Bool:
      return true;
    default:
      return false;
  }
}

void reduce(c10::ScalarType dtype, RedOp op, void* out, const void* a, const void* b, int64_t n) {
  const bool done = dispatch().fn(dtype, op, out, a, b, n);
  TORCH_INTERNAL_ASSERT(done, "ringpg: no kernel for ", dtype, " ", redOpName(op));
}

void reduceInOrder(c10::ScalarType dtype, RedOp op, void* out, const std::vector<const char*>& ins, int64_t n,
                   size_t elemSize) {
  TORCH_INTERNAL_ASSERT(!ins.empty(), "ringpg: a reduction of no operands");
  auto* dst = static_cast<char*>(out);
  if (n <= 0) {
    return;
  }
  if (ins.size() == 1) {
    if (dst != ins[0]) {
      std::memcpy(dst, ins[0], static_cast<size_t>(n) * elemSize);
    }
    return;
  }
  // Blocks of 16 KiB: the accumulator stays in L1 while the operands stream past it.
  constexpr size_t kBlockBytes = 16 * 1024;
  const int64_t block = std::max<int64_t>(1, static_cast<int64_t>(kBlockBytes / elemSize));
  for (int64_t b = 0; b < n; b += block) {
    const int64_t k = std::min(block, n - b);
    const size_t at = static_cast<size_t>(b) * elemSize;
    reduce(dtype, op, dst + at, ins[0] + at, ins[1] + at, k);
    for (size_t i = 2; i < ins.size(); ++i) {
      reduce(dtype, op, dst + at, dst + at, ins[i] + at, k);
    }
  }
}

namespace {
template <typename T>
void divideLoop(void* data, int64_t n, int64_t divisor) {
  auto* x = static_cast<T*>(data);
  const T d = static_cast<T>(divisor);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<T>(x[i] / d); // C++ integer division truncates toward zero
  }
}
} // namespace

void copyStreaming(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  // SSE2, every x86-64's: a streaming store of 16 bytes needs a 16-byte-aligned
  // destination, so the head up to that alignment and the tail under 64 bytes are
  // copied plainly.  Four stores fill a line's write-combining buffer at once.
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const size_t head = std::min(n, (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15);
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i x1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i x2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i x3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), x0);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), x1);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), x2);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), x3);
  }
  std::memcpy(d + i, s + i, n - i);
  // Streaming stores are weakly ordered: visible to a reader that synchronizes with us
  // (a request marked done, a slot released) only after this fence.
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

void divideIntegers(c10::ScalarType dtype, void* data, int64_t n, int64_t divisor) {
  using c10::ScalarType;
  switch (dtype) {
    case ScalarType::Char:
      return divideLoop<int8_t>(data, n, divisor);
    case ScalarType::Byte:
      return divideLoop<uint8_t>(data, n, divisor);
    case ScalarType::Short:
      return divideLoop<int16_t>(data, n, divisor);
    case ScalarType::Int:
      return divideLoop<int32_t>(data, n, divisor);
    case ScalarType::Long:
      return divideLoop<int64_t>(data, n, divisor);
    case ScalarType::UInt16:
      return divideLoop<uint16_t>(data, n, divisor);
    case ScalarType::UInt32:
      return divideLoop<uint32_t>(data, n, divisor);
    case ScalarType::UInt64:
      return divideLoop<uint64_t>(data, n, divisor);
    default:
      TORCH_INTERNAL_ASSERT(false, "ringpg: integer division of ", dtype);
  }
}

void scaleFloats(c10::ScalarType dtype, void* out, const void* in, int64_t n, double by, Scale how) {
  TORCH_INTERNAL_ASSERT(
      (how == Scale::Multiply || by > 0) && dispatch().scale(dtype, out, in, n, by, how == Scale::Divide),
      "ringpg: no float scaling for ", dtype);
}

void scaleFloatsWithIsa(const std::string& isa, c10::ScalarType dtype, void* out, const void* in, int64_t n, double by,
                        Scale how) {
  const std::vector<Dispatch> copies = runnable();
  const Dispatch* d = byName(copies, isa);
  TORCH_CHECK(d, "ringpg: the ", isa, " kernels cannot run on this CPU (it runs: ", c10::Join(", ", namesOf(copies)),
              ")");
  TORCH_CHECK((how == Scale::Multiply || by > 0) && d->scale(dtype, out, in, n, by, how == Scale::Divide),
              "ringpg: no float scaling for ", dtype);
}

const char* reduceIsa() {
  return dispatch().name;
}

std::vector<std::string> reduceIsas() {
  return namesOf(runnable());
}

void reduceWithIsa(const std::string& isa, c10::ScalarType dtype, RedOp op, void* out, const void* a, const void* b,
                   int64_t n) {
  const std::vector<Dispatch> copies = runnable();
  const Dispatch* d = byName(copies, isa);
  TORCH_CHECK(d, "ringpg: the ", isa, " kernels cannot run on this CPU (it runs: ", c10::Join(", ", namesOf(copies)),
              ")");
  TORCH_INTERNAL_ASSERT(d->fn(dtype, op, out, a, b, n), "ringpg: no kernel for ", dtype, " ", redOpName(op));
}

} // namespace ringpg
