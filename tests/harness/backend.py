"""The backend under test, and what a live group of it says about itself.

The backend under test is ``"ringpg"`` unless the environment variable
``RINGPG_TEST_BACKEND`` names another (``RINGPG_TEST_BACKEND=gloo`` validates the
harness and the tests themselves against gloo).  gloo is always the reference.
How a ring moves its bytes (``transport_of``) is asked through
:mod:`benchmarks.backends`, which the benchmarks share.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import torch

BACKEND_ENV = "RINGPG_TEST_BACKEND"
REFERENCE_BACKEND = "gloo"

# Worker environments (InitSpec.env) that put ringpg's ring on each of its transports:
# shared memory is the default on one host; RINGPG_TRANSPORT=tcp keeps it on ringpg's
# own sockets; RINGPG_TRANSPORT=gloo moves it over Gloo's TCP pairs.
TRANSPORT_ENVS: dict[str, tuple[tuple[str, str], ...]] = {
    "shm": (),
    "tcp": (("RINGPG_TRANSPORT", "tcp"),),
    "gloo": (("RINGPG_TRANSPORT", "gloo"),),
}
ONESHOT_BYTES_DEFAULT = 262144  # README: RINGPG_ONESHOT_BYTES


def oneshot_limit_bytes(world_size: int) -> int:
    """Largest allreduce (bytes) that ringpg runs one-shot rather than on the ring (README's rule)."""
    per_peer = int(os.environ.get("RINGPG_ONESHOT_BYTES", ONESHOT_BYTES_DEFAULT))
    return per_peer * (world_size - 1)


def backend_under_test() -> str:
    """The backend the tests exercise: ``$RINGPG_TEST_BACKEND`` or ``"ringpg"``."""
    return os.environ.get(BACKEND_ENV, "ringpg")


def cpu_backend(group: Any) -> Any:
    """The c10d Backend object serving ``group``'s CPU tensors (ringpg's RingBackend, say)."""
    return group._get_backend(torch.device("cpu"))


def traced_algorithms(trace_dir: str, op: str) -> dict[int, set[str]]:
    """Bytes -> algorithms of every ``op`` span in ringpg's traces in ``trace_dir`` (``RINGPG_TRACE``).

    Read once the groups are destroyed (their files are then closed).
    """
    from ringpg import trace

    seen: dict[int, set[str]] = {}
    for t in trace.load(trace_dir):
        for span in t.ops():
            if span["name"] == op:
                seen.setdefault(int(span["args"]["bytes"]), set()).add(str(span["args"]["algorithm"]))
    return seen


def wait_spin_of(group: Any) -> Optional[int]:
    """Microseconds ringpg's waits poll before sleeping (RINGPG_SPIN_US or auto's choice); None for others."""
    import ringpg

    b = ringpg.backend(group)
    return b.wait_spin_us if b is not None else None


def entry_point_installed(name: str = "ringpg") -> bool:
    """Whether a ``torch.backends`` entry point named ``name`` is installed (pip install)."""
    from importlib.metadata import entry_points

    return any(ep.name == name for ep in entry_points(group="torch.backends"))
