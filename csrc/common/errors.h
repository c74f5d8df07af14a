// Error reporting shared by every layer.
//
// Three kinds of failure, three mechanisms (the convention of ProcessGroupGloo/NCCL):
//   * a user error (bad root, wrong sizes, unsupported dtype/op)  -> RINGPG_CHECK (TORCH_CHECK
//     with the "ringpg::<op>: " prefix), raised in the caller's thread *before* a sequence number is taken;
//   * a peer / network failure (connection lost, corrupt frame)  -> c10::DistNetworkError;
//   * a deadline passing or a collective mismatch between ranks  -> c10::DistBackendError;
//   * a broken internal invariant                                -> TORCH_INTERNAL_ASSERT.
// Both Dist* errors arrive in Python as torch.distributed.DistNetworkError / DistBackendError.
#pragma once

#include <c10/util/Exception.h>

#include <string>

namespace ringpg {

// Where an error happened: enough for a user to find the op in their own logs.
struct OpTag {
  const char* op = "?"; // c10d name of the op, e.g. "all_reduce"
  uint64_t seq = 0;     // sequence number of the op in its group
  int rank = -1;        // this rank
};

// "ringpg::<op>": how every message about op `op` begins.
inline std::string opName(const char* op) {
  return c10::str("ringpg::", op);
}

inline std::string describe(const OpTag& t) {
  return c10::str(opName(t.op), " (seq ", t.seq, ", rank ", t.rank, ")");
}

// TORCH_CHECK for a user error in op `op`: the message reads "ringpg::<op>: <args...>".
// Like TORCH_CHECK, the message is only built when `cond` fails.
#define RINGPG_CHECK(cond, op, ...) TORCH_CHECK(cond, ::ringpg::opName(op), ": ", __VA_ARGS__)

[[noreturn]] inline void throwNetwork(const std::string& msg) {
  C10_THROW_ERROR(DistNetworkError, msg);
}

[[noreturn]] inline void throwBackend(const std::string& msg) {
  C10_THROW_ERROR(DistBackendError, msg);
}

} // namespace ringpg
