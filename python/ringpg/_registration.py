"""Register the ``ringpg`` backend with torch.distributed (extended creator API).

The creator receives torch's ``_DistributedBackendOptions`` (store, group_rank,
group_size, timeout, group_id, global_ranks_in_group) and returns the C++
``RingBackend``; torch calls it once per process group, subgroups included.
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta
from typing import Any, ContextManager, Iterator, Optional, Tuple

import torch.distributed as dist

BACKEND_NAME = "ringpg"


class _GroupChoice:
    """A per-process choice (transport, algorithm) for the groups created while a
    ``with`` block of :meth:`use` is open; None outside every block.  Not per thread."""

    def __init__(self, what: str, names: Tuple[str, ...]) -> None:
        self.what = what
        self.names = names
        self.current: Optional[str] = None

    @contextmanager
    def use(self, name: str) -> Iterator[None]:
        if name not in self.names:
            raise ValueError(f"ringpg: {self.what} {name!r} is not one of {', '.join(self.names)}")
        before, self.current = self.current, name
        try:
            yield
        finally:
            self.current = before


TRANSPORTS = ("auto", "shm", "tcp", "gloo")
ALGORITHMS = ("auto", "ring", "hier", "arena")
COPIES = ("auto", "cma", "slots")
_transport = _GroupChoice("transport", TRANSPORTS)
_algorithm = _GroupChoice("algorithm", ALGORITHMS)
_copy = _GroupChoice("same-host copy", COPIES)


def use_transport(name: str) -> ContextManager[None]:
    """Groups of ringpg created inside the block use transport ``name`` (``auto``,
    ``shm``, ``tcp`` or ``gloo``), whatever ``RINGPG_TRANSPORT`` says; every rank must
    create them alike.  For comparing transports in one job (the benchmark's ``ringpg@gloo``)::

        with ringpg.use_transport("gloo"):
            g = dist.new_group(backend="ringpg")
    """
    return _transport.use(name)


def use_algorithm(name: str) -> ContextManager[None]:
    """Groups of ringpg created inside the block run algorithm ``name`` for allreduce,
    reduce-scatter and all-gather (``auto``, ``ring``: the flat ring and no host arena,
    ``hier``: the hierarchical ones where hosts hold equal numbers of ranks, ``arena``:
    the host arena for every op and size it serves), whatever ``RINGPG_ALGO``
    says; their split and shrink children keep it.  Every rank must create them alike (a
    group whose ranks disagree fails its ops).  For comparing algorithms in one job (the
    benchmark's ``ringpg/ring``)::

        with ringpg.use_algorithm("ring"):
            flat = dist.new_group(backend="ringpg")
    """
    return _algorithm.use(name)


def use_copy(name: str) -> ContextManager[None]:
    """Groups of ringpg created inside the block move their large same-host messages as
    ``name`` says, whatever ``RINGPG_CMA_BYTES`` does: ``cma`` by single copy for every op
    (as ``RINGPG_CMA_BYTES`` set), ``slots`` through the shared-memory slots (as ``0``),
    ``auto`` as the group measures per size class of op (as unset).  Single copy still
    needs every rank to ask for it and the kernel to allow it.  For comparing the two
    paths with the group's own choice in one job (the benchmark's ``ringpg%cma``)::

        with ringpg.use_copy("slots"):
            g = dist.new_group(backend="ringpg")
    """
    return _copy.use(name)


def new_ring_backend(
    store: Any,
    rank: int,
    size: int,
    timeout: timedelta,
    group_name: str,
    transport: Optional[str] = None,
    algo: Optional[str] = None,
    copy: Optional[str] = None,
) -> Any:
    """One C++ ``RingBackend`` of ``size`` ranks on ``store`` (every rank calls it alike).

    With ``RINGPG_TRANSPORT=gloo`` (or :func:`use_transport`) the collectives' data move
    over Gloo's TCP pairs: the C++ backend makes a ProcessGroupGloo of the same ranks
    on its own prefix of the group's store (it honours ``GLOO_SOCKET_IFNAME``) as part
    of its set-up (transport/connect.h).  ``transport`` overrides both.  ``algo``
    likewise overrides :func:`use_algorithm` and ``RINGPG_ALGO``, ``copy``
    :func:`use_copy` and ``RINGPG_CMA_BYTES`` (the C++ backend's own default when
    neither is given).
    """
    from ._loader import load_extension

    _C = load_extension()
    choice = transport or _transport.current or _C.transport_setting()
    return _C.RingBackend(
        store,
        rank,
        size,
        timeout,
        group_name,
        transport=choice,
        algo=algo or _algorithm.current or "",
        copy=copy or _copy.current or "",
    )


def _create_backend(dist_backend_opts: Any, pg_options: Any = None) -> Any:
    """Extended-API creator: build one RingBackend serving the tensors of ``served_devices()``,
    and tell it the group's global ranks for torch's flight recorder, which ringpg writes
    itself where it can (:func:`records_itself`)."""
    o = dist_backend_opts
    backend = new_ring_backend(o.store, o.group_rank, o.group_size, o.timeout, str(o.group_id))
    # torch passes [] for the default group, which spans the world.
    ranks = [int(r) for r in (getattr(o, "global_ranks_in_group", None) or range(o.group_size))]
    if hasattr(backend, "_set_flight_recorder_ranks") and len(ranks) == o.group_size:
        backend._set_flight_recorder_ranks(ranks, ranks[o.group_rank])
    return backend


def records_itself() -> bool:
    """Whether ringpg writes its ops into torch's flight recorder itself, as gloo does, so
    that torch attaches no per-op recording hook to its groups: from torch 2.15 (the
    extension is always built for the running torch; asked without loading it, since
    this runs inside ``import torch``)."""
    from ._features import torch_release

    return torch_release() >= (2, 15)


def is_registered() -> bool:
    return hasattr(dist.Backend, BACKEND_NAME.upper())


def served_devices() -> list[str]:
    """The device types ringpg's groups serve in this process: cpu, and cuda where the
    process sees a GPU.  Not cuda on a host without one: torch's flight recorder hook asks
    the stream of every device a group serves for an op with no tensors (barrier), and
    there the CUDA query throws and is caught on every barrier (17 us against 4 at two
    ranks; benchmarks/RESULTS.md 2026-11-28 (3)).  ``torch.cuda.device_count`` asks NVML
    first, so it leaves a GPU host's processes free to fork."""
    import torch

    try:
        seen = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - runs inside `import torch` (the entry point): never fail it
        seen = 1  # unknown: serve cuda, as before this was asked
    return ["cpu", "cuda"] if seen > 0 else ["cpu"]


def register() -> None:
    """Register "ringpg" once per process; repeated calls are no-ops."""
    if is_registered():
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=served_devices())
    # torch attaches its per-op flight recorder hook to every group of a backend outside
    # this set; ringpg records itself, so it joins gloo there.
    self_recording = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if isinstance(self_recording, set) and records_itself():
        self_recording.add(BACKEND_NAME)
