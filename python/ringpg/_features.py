"""What ringpg can do on the running torch: the feature table of docs/support.md, in code.

ringpg builds against every torch from 2.6 on; some of what it offers rides on c10d
APIs that a torch release introduced (csrc/common/torch_compat.h says which).  On an
older torch such a feature is absent, never a crash:

* ``ringpg.features()`` says which of ringpg's features this build carries (the table
  here, read against the loaded extension by ``_loader.features``);
* ``ringpg.backend(group).<a newer torch's Backend method>`` (``shrink``,
  ``set_timeout``, ``register_abort_hook``, ...) raises :class:`FeatureUnavailable`
  (an ``AttributeError``, so ``hasattr`` stays False) naming the torch release that has
  it, instead of a bare "object has no attribute".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

import torch


class FeatureUnavailable(AttributeError):
    """A ringpg or c10d feature that the running torch does not carry."""


@dataclass(frozen=True)
class Feature:
    since: Tuple[int, int]  # the first torch release that carries it
    compat_flag: str  # its key in ringpg._C.torch_compat() (csrc/common/torch_compat.h)
    what: str
    before: str  # what ringpg does on an older torch


# ringpg's features that depend on the torch it is built for (docs/support.md: "Torch releases").
FEATURES: Dict[str, Feature] = {
    "abort_shutdown": Feature(
        (2, 7),
        "backend_abort_shutdown",
        "torch's destroy_process_group() and _abort_process_group() shut down / abort the group",
        "ringpg.backend(group).shutdown() and .abort() work (ringpg binds them itself); "
        "destroy_process_group() lets the group stop when it is freed, and _abort_process_group() "
        "only warns (it aborts NCCL groups alone)",
    ),
    "get_error": Feature(
        (2, 7),
        "backend_get_error",
        "the group's Backend.get_error() says whether it has failed and why (TIMEOUT, COMM_ERROR, "
        "REMOTE_ERROR; SUCCESS while healthy)",
        "torch's Backend has no get_error(); a failed group says why in the errors its ops raise",
    ),
    "inline_sync_ops": Feature(
        (2, 8),
        "async_op_in_all_options",
        "a synchronous op on CPU tensors runs in the caller's thread while the group is idle",
        "every op goes through the group's worker thread: same results, one thread hand-off more per op",
    ),
    "set_timeout": Feature(
        (2, 9),
        "backend_set_timeout",
        "dist.set_timeout(timeout, group), or ringpg.backend(group).set_timeout(timeout) on a torch "
        "without it, changes the group's default timeout for later ops",
        "the group keeps the timeout it was created with (an op's own timeout still applies)",
    ),
    "split_group": Feature(
        (2, 9),
        "backend_split",
        "dist.split_group(group, split_ranks) splits a ringpg group into ringpg groups of the same transport "
        "(torch 2.9 to 2.14 split only when init_process_group(device_id=...) bound the default group to an "
        "accelerator, for every backend; 2.15 splits CPU-only jobs too)",
        "dist.split_group() refuses a ringpg group; dist.new_group(ranks) makes the same groups",
    ),
    "shrink_group": Feature(
        (2, 10),
        "backend_shrink",
        "dist.distributed_c10d.shrink_group(ranks_to_exclude) gives the survivors a ringpg group "
        "without the excluded (dead) ranks, even when the group has failed",
        "torch has no shrink_group(); the survivors make a new group (dist.new_group) or restart",
    ),
    "work_timeout": Feature(
        (2, 14),
        "work_timeout",
        "Work.timeout() reports the op's timeout",
        "torch's Work has no timeout(); ringpg's waits still end at the op's deadline",
    ),
    "abort_hooks": Feature(
        (2, 14),
        "backend_abort_hooks",
        "group.register_abort_hook(id, fn): fn runs when the group fails (a timeout, a lost or aborting "
        "peer, a mismatch) or is aborted, before the failed op's error reaches its caller",
        "torch has no abort hooks to register",
    ),
    "flight_recorder": Feature(
        (2, 15),
        "native_flight_recorder",
        "ringpg writes every op into torch's flight recorder itself, as gloo does (torch attaches no "
        'per-op hook): finished ops read "completed" with their duration, and the trace is dumped when '
        "the group fails (TORCH_FR_DUMP_TEMP_FILE<rank>; read it with python -m "
        "torch.distributed.flight_recorder.fr_trace)",
        "torch records no ringpg op (2.14 has the recorder but attaches it to torchcomms only)",
    ),
}

# Methods of torch's c10d Backend (the Python class RingBackend extends) that a newer
# torch has, with the release whose Python binding first has them (checked against each
# release by tests/test_rendezvous_and_registration.py), and what ringpg makes of them
# where they exist.
_NOT_IMPLEMENTED = "ringpg does not implement it on any torch; there torch answers that the backend does not support it"
BACKEND_METHODS: Dict[str, Tuple[Tuple[int, int], str]] = {
    "supports_coalescing": ((2, 7), "ringpg answers False"),
    "set_timeout": ((2, 9), "ringpg sets the default timeout of later ops"),
    "supports_shrinking": ((2, 10), "ringpg answers True"),
    "shrink": ((2, 10), "ringpg builds the survivors' group (dist.distributed_c10d.shrink_group)"),
    "supports_reconfigure": ((2, 14), "ringpg answers False"),
    "reconfigure": ((2, 14), _NOT_IMPLEMENTED),
    "get_reconfigure_handle": ((2, 14), _NOT_IMPLEMENTED),
    "supports_window": ((2, 14), "ringpg answers False"),
    "new_window": ((2, 14), _NOT_IMPLEMENTED),
    # torch's own binding has it from 2.14; ringpg binds it itself from 2.7 (the C++ virtual).
    "get_error": ((2, 7), "ringpg says whether the group has failed and why"),
    "register_abort_hook": ((2, 14), "ringpg runs the hooks when the group fails or is aborted"),
    "unregister_abort_hook": ((2, 14), "ringpg removes the hook"),
    "supports_abort_hooks": ((2, 15), "ringpg answers True"),
    "supports_completion_hooks": ((2, 15), "ringpg answers True (torch binds no Python registration)"),
}


def torch_release(version: str = torch.__version__) -> Tuple[int, int]:
    """(major, minor) of a torch version string such as '2.8.0+cu128'."""
    major, minor = version.split("+", 1)[0].split(".")[:2]
    return int(major), int(minor)


def _fmt(release: Tuple[int, int]) -> str:
    return f"{release[0]}.{release[1]}"


def missing_backend_attribute(obj: Any, attr: str) -> Any:
    """RingBackend.__getattr__: runs only for attributes that normal lookup did not find."""
    known = BACKEND_METHODS.get(attr)
    if known is None:
        raise AttributeError(f"'{type(obj).__name__}' object has no attribute '{attr}'")
    since, note = known
    raise FeatureUnavailable(
        f"ringpg: RingBackend.{attr} is not available with torch {torch.__version__}: torch's c10d Backend "
        f"has it from torch {_fmt(since)} on ({note}). See docs/support.md in ringpg's repository."
    )


def install(ring_backend_class: type) -> None:
    """Give the compiled RingBackend class the clear error above for missing methods."""
    ring_backend_class.__getattr__ = missing_backend_attribute
