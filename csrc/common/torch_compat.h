// Every difference between the c10d APIs of the torch releases ringpg builds against
// (2.6.0 through 2.15.x), decided at compile time from torch's own version macros.
// Each entry names the release that introduced the difference; code elsewhere uses
// only what is defined here, never TORCH_VERSION_* directly.  Found by reading each
// release's headers (torch/include/torch/csrc/distributed/c10d/{Backend,Work,Types}.hpp).
//
// What a difference means for a user (a feature present or absent on their torch) is
// in docs/support.md's feature table and in ringpg.features() (python/ringpg/_features.py),
// which reads the RINGPG_HAS_* values below through ringpg._C.torch_compat().
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#define RINGPG_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if !RINGPG_TORCH_AT_LEAST(2, 6)
#error "ringpg needs torch 2.6 or newer (this is torch " TORCH_VERSION ")"
#endif

// torch 2.7: c10d::Backend gains the virtuals abort(), shutdown() and
// supportsCoalescing() (and Python's Backend.abort/shutdown/supports_coalescing);
// destroy_process_group() and _abort_process_group() call them for every backend.
// Before 2.7 RingBackend still has abort() and shutdown() (ringpg binds them itself,
// so ringpg.backend(g).abort() works), but torch never calls them.
#define RINGPG_HAS_BACKEND_ABORT_SHUTDOWN RINGPG_TORCH_AT_LEAST(2, 7)
#if RINGPG_HAS_BACKEND_ABORT_SHUTDOWN
#define RINGPG_OVERRIDE_SINCE_2_7 override
#else
#define RINGPG_OVERRIDE_SINCE_2_7
#endif

// torch 2.7: c10d::Backend gains the virtual getError() and the enum c10d::ErrorType
// (SUCCESS, TIMEOUT, COMM_ERROR, REMOTE_ERROR; Python: Backend.get_error()), which
// ringpg implements: whether the group has failed, and why (RingBackend::getError).
// torch's own default throws until 2.13 and answers SUCCESS from 2.14 on.  Before
// 2.7 a failed group says why only in the error its ops raise.
#define RINGPG_HAS_BACKEND_GET_ERROR RINGPG_TORCH_AT_LEAST(2, 7)

// torch 2.8: every op's options struct carries asyncOp (2.6 and 2.7 have it on
// broadcast, allgather, scatter and reduce_scatter only).  ringpg runs a synchronous
// op on CPU tensors in the caller's thread when the group is idle; without the flag
// every op is treated as asynchronous and goes through the worker (same results, one
// thread hand-off more per op).
#define RINGPG_HAS_ASYNC_OP_IN_ALL_OPTIONS RINGPG_TORCH_AT_LEAST(2, 8)

// torch 2.9: c10d::Backend gains the virtual setTimeout() (Python: dist.set_timeout,
// ProcessGroup.set_timeout), which ringpg implements: later ops take the new default.
// Before 2.9 a group keeps the timeout it was created with.
#define RINGPG_HAS_BACKEND_SET_TIMEOUT RINGPG_TORCH_AT_LEAST(2, 9)

// torch 2.9: c10d::Backend gains the virtuals split(store, ranks, opts) and
// getBackendOptions(), and ProcessGroup::splitGroup() calls split() on every backend of
// the parent, so dist.split_group() works for any backend whose supportsSplitting()
// is true (2.6 to 2.8 have supportsSplitting() only, and their split_group() reaches
// NCCL's own methods).  ringpg answers true from 2.9 on; before, dist.split_group()
// refuses a ringpg group (dist.new_group() makes the same groups on any release).
// torch's Python split_group() of 2.9 to 2.14 also refuses, for every backend, unless
// the default group is bound to an accelerator (init_process_group(device_id=...));
// 2.15 drops that condition (and keeps each part's rank order, which 2.9 to 2.13 sort).
#define RINGPG_HAS_BACKEND_SPLIT RINGPG_TORCH_AT_LEAST(2, 9)

// c10d::Store::clone() (a connection of its own to the same store): absent in 2.6,
// present in 2.9, where split() uses it (releases between unchecked).
#define RINGPG_HAS_STORE_CLONE RINGPG_TORCH_AT_LEAST(2, 9)

// torch 2.10: c10d::Backend gains the virtuals supportsShrinking() and
// shrink(ranks_to_exclude, shrink_flags, opts_override), and
// dist.distributed_c10d.shrink_group() calls shrink() on the survivors only.  Before
// 2.10 the survivors of a dead rank make a new group with dist.new_group() instead.
#define RINGPG_HAS_BACKEND_SHRINK RINGPG_TORCH_AT_LEAST(2, 10)

// torch 2.13: c10d::NCCLPreMulSumSupplement (PREMUL_SUM's factor) is renamed
// c10d::PreMulSumSupplement; the old name stays as an alias.
#define RINGPG_HAS_PREMUL_SUM_SUPPLEMENT RINGPG_TORCH_AT_LEAST(2, 13)

// torch 2.14: c10d::Work gains the virtual getTimeout() (Python: Work.timeout()).
// Before 2.14 RingWork keeps its timeout for its own waits only.
#define RINGPG_HAS_WORK_TIMEOUT RINGPG_TORCH_AT_LEAST(2, 14)
#if RINGPG_HAS_WORK_TIMEOUT
#define RINGPG_OVERRIDE_SINCE_2_14 override
#else
#define RINGPG_OVERRIDE_SINCE_2_14
#endif

// torch 2.14: c10d::Backend gains registerAbortHook(hook_id, AbortHook) and
// unregisterAbortHook(hook_id) (Hooks.hpp; Python: register_abort_hook), which ringpg
// implements: its abort hooks run when the group fails (a timeout, a lost or aborting
// peer, a mismatch) or is aborted.  Before 2.14 there is nothing to register them with.
#define RINGPG_HAS_BACKEND_ABORT_HOOKS RINGPG_TORCH_AT_LEAST(2, 14)

// torch 2.15: c10d::Backend gains supportsAbortHooks(), the completion hooks
// (supportsCompletionHooks, registerCompletionHook(hook_id, CompletionHook),
// unregisterCompletionHook; Hooks.hpp's CompletionHookArgs) and c10d::Work gains
// getCompletionKey().  distributed_c10d attaches torch's backend-agnostic flight
// recorder (hooks/FlightRecorderHook.hpp) to every group of a backend that does not
// record itself; with these it marks ringpg's finished ops "completed" with their
// duration, and its abort hook dumps the trace when the group fails.  On 2.14 torch
// records no ringpg op.
#define RINGPG_HAS_BACKEND_COMPLETION_HOOKS RINGPG_TORCH_AT_LEAST(2, 15)

// torch 2.15 also exports c10d::getFlightRecorder(backend) and try_dump_fr_trace_file
// (FlightRecorder.hpp): a backend outside libtorch can write entries into the recorder
// instance torch dumps, as ProcessGroupGloo does, and be listed in
// distributed_c10d._FR_SELF_RECORDING_BACKENDS so that torch attaches no per-op hook.
// ringpg records itself there (backend/flight_record.h).
#define RINGPG_HAS_NATIVE_FLIGHT_RECORDER RINGPG_TORCH_AT_LEAST(2, 15)
#if RINGPG_HAS_BACKEND_COMPLETION_HOOKS
#define RINGPG_OVERRIDE_SINCE_2_15 override
#else
#define RINGPG_OVERRIDE_SINCE_2_15
#endif

namespace ringpg::compat {

#if RINGPG_HAS_PREMUL_SUM_SUPPLEMENT
using PreMulSumSupplement = c10d::PreMulSumSupplement;
#else
using PreMulSumSupplement = c10d::NCCLPreMulSumSupplement;
#endif

// Whether the caller asked for an asynchronous op (async_op=True).  Unknown before
// torch 2.8 for most ops, so taken as asynchronous there (see above).
template <class Options>
bool asyncOp(const Options& opts) {
#if RINGPG_HAS_ASYNC_OP_IN_ALL_OPTIONS
  return opts.asyncOp;
#else
  (void)opts;
  return true;
#endif
}

} // namespace ringpg::compat
