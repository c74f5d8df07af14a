// Contiguous host memory for the algorithms: every algorithm moves bytes between host
// buffers, so a CUDA or non-contiguous user tensor travels through a host copy.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>

namespace ringpg {

// Where a host copy of `t` lives.  A CUDA tensor's goes to pinned memory from torch's
// caching host allocator: the copies run at DMA speed, and the blocks are reused from op
// to op.  Pageable copies were the slow part: glibc maps any block over 32 MiB afresh
// (its largest mmap threshold), so every op faulted its staging pages in again
// (docs/internals.md, "Why these constants").
inline at::TensorOptions hostOptionsFor(const at::Tensor& t) {
  return t.options().device(at::kCPU).memory_format(at::MemoryFormat::Contiguous).pinned_memory(t.is_cuda());
}

// A contiguous host view of `t`: `t` itself when already contiguous on the CPU, else a
// copy (ordered after the calling thread's current stream, for a device tensor).
inline at::Tensor toHost(const at::Tensor& t) {
  if (t.device().is_cpu()) {
    return t.is_contiguous() ? t : t.contiguous();
  }
  at::Tensor host = at::empty(t.sizes(), hostOptionsFor(t));
  host.copy_(t); // blocking: the host reads it next
  return host;
}

// A contiguous host buffer shaped like `t`, for an output written in full: `t` itself
// when already contiguous on the CPU, else a fresh (uninitialized) one.
inline at::Tensor hostBufferFor(const at::Tensor& t) {
  if (t.device().is_cpu() && t.is_contiguous()) {
    return t;
  }
  return at::empty(t.sizes(), hostOptionsFor(t));
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
