// Contiguous host memory for the algorithms: every algorithm moves bytes between host
// buffers, so a CUDA or non-contiguous user tensor travels through a host copy.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>

namespace ringpg {

// A contiguous host view of `t`: `t` itself when already contiguous on the CPU, else a
// copy (ordered after the calling thread's current stream, for a device tensor).
inline at::Tensor toHost(const at::Tensor& t) {
  if (t.device().is_cpu() && t.is_contiguous()) {
    return t;
  }
  return t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::Contiguous).contiguous();
}

// A contiguous host buffer shaped like `t`, for an output written in full: `t` itself
// when already contiguous on the CPU, else a fresh (uninitialized) one.
inline at::Tensor hostBufferFor(const at::Tensor& t) {
  if (t.device().is_cpu() && t.is_contiguous()) {
    return t;
  }
  return at::empty(t.sizes(), t.options().device(at::kCPU).memory_format(at::MemoryFormat::Contiguous));
}

// Copies a host result back into the user's tensor, unless it was written in place.
inline void writeBack(const at::Tensor& user, const at::Tensor& host) {
  if (!user.is_same(host)) {
    user.copy_(host);
  }
}

inline char* bytes(const at::Tensor& t) {
  return static_cast<char*>(t.data_ptr());
}

inline size_t nbytes(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

} // namespace ringpg
