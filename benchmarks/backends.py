"""The backends a run compares: whether a name is usable here, and what a live group says.

Plugins (ringpg) register through their ``torch.backends`` entry point when torch is
imported; :func:`ensure_registered` imports the package of that name where that did
not happen.  A ``--backends`` entry names a backend and, for ringpg, optionally its
transport and algorithm (:class:`Spec`).  ``floor`` is torch's own cost of a
collective: its call path through a backend that completes every op at once and touches
no tensor (ringpg's FloorBackend), treated by torch as ringpg is (:func:`floor_group`).  What a live group says about itself is :mod:`devkit.groups`'s,
which the tests share.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception as one line of at most ``limit`` characters (a table cell, a status)."""
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    s = text[0] if text else type(e).__name__
    return s if len(s) <= limit else s[: limit - 3] + "..."


def is_registered(name: str) -> bool:
    """Whether torch.distributed knows the backend name (built-in or plugin)."""
    return name.lower() in ("gloo", "nccl", "mpi", "ucc", "xccl") or hasattr(dist.Backend, name.upper())


def ensure_registered(name: str) -> bool:
    """Make ``name`` usable with ``new_group``/``init_process_group``.

    Plugins are expected to register through their ``torch.backends`` entry point when
    torch is imported; if that did not happen, import the package of the same name.
    Returns True if an explicit import was needed.
    """
    if is_registered(name):
        return False
    import importlib

    importlib.import_module(name)
    if not is_registered(name):
        raise RuntimeError(f"importing {name!r} did not register a torch.distributed backend {name!r}")
    return True


class Spec(NamedTuple):
    """A ``--backends`` entry ``name[@transport][/algo][%copy]``: ``ringpg@gloo`` is ringpg
    with its ring on Gloo's pairs (``ringpg.use_transport``), ``ringpg/ring`` ringpg on the
    flat ring where it would run the hierarchical algorithms (``ringpg.use_algorithm``),
    ``ringpg%cma`` ringpg moving large same-host messages by single copy whatever it
    would measure (``ringpg.use_copy``), ``ringpg@tcp/hier`` two kinds of choice."""

    name: str
    transport: Optional[str]
    algo: Optional[str]
    copy: Optional[str] = None

    def text(self) -> str:
        """The entry as written: ``name[@transport][/algo][%copy]``."""
        return (
            self.name
            + (f"@{self.transport}" if self.transport else "")
            + (f"/{self.algo}" if self.algo else "")
            + (f"%{self.copy}" if self.copy else "")
        )


def split_spec(spec: str) -> Spec:
    """A ``--backends`` entry's parts (see :class:`Spec`); None for a part not given."""
    rest, _, copy = spec.partition("%")
    head, _, algo = rest.partition("/")
    name, _, transport = head.partition("@")
    return Spec(name, transport or None, algo or None, copy or None)


def expand_specs(specs: Sequence[str], transports: Sequence[str] = (), algos: Sequence[str] = ()) -> List[str]:
    """The ``--transports`` and ``--algos`` axes: each ringpg entry that names no transport
    becomes one entry per transport, then each that names no algorithm one per algorithm
    (``ringpg,gloo`` with algos ``hier,ring``: ``ringpg/hier,ringpg/ring,gloo``)."""
    out: List[str] = []
    for spec in specs:
        sp = split_spec(spec)
        ts: Sequence[Optional[str]] = (
            transports if sp.name == "ringpg" and sp.transport is None and transports else [sp.transport]
        )
        als: Sequence[Optional[str]] = algos if sp.name == "ringpg" and sp.algo is None and algos else [sp.algo]
        out += [sp._replace(transport=t, algo=a).text() for t in ts for a in als]
    return out


# The --backends entry for torch's own cost of a collective (floor_group).
FLOOR = "floor"


def _flight_recorder_entries() -> int:
    """The flight recorder's buffer size as torch reads it: the first of
    TORCH_FR_BUFFER_SIZE and TORCH_NCCL_TRACE_BUFFER_SIZE that is set, else 2000; 0 is off."""
    for var in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = os.environ.get(var)
        if value:
            return int(value)
    return 2000


def _flight_recorder_hook() -> Any:
    """torch's FlightRecorderHook class, which torch attaches to every group of an
    out-of-tree backend from 2.15; None before, when torch records no such backend's ops."""
    try:
        from torch._C._distributed_c10d import FlightRecorderHook  # type: ignore[attr-defined]
    except ImportError:
        return None
    return FlightRecorderHook


def flight_recorder_note() -> str:
    """What torch's flight recorder does to ringpg's groups in this process: from torch
    2.15 every op is recorded (by ringpg itself, as gloo records its own; torch hooks no
    ringpg group), a per-op cost; "" before 2.15, which records none."""
    if _flight_recorder_hook() is None:
        return ""
    entries = _flight_recorder_entries()
    if entries <= 0:
        return "torch's flight recorder off"
    return f"torch's flight recorder on ({entries} entries)"


# The backend name the floor's groups are made with (ringpg's FloorBackend).
FLOOR_BACKEND = "ringpg_floor"


def _register_floor() -> None:
    """Register ringpg's FloorBackend as FLOOR_BACKEND, once per process, for the device
    types ringpg's own groups serve, so torch treats it as it treats ringpg: a flight
    recorder hook on the floor's groups exactly where torch hooks ringpg's."""
    if hasattr(dist.Backend, FLOOR_BACKEND.upper()):
        return
    from ringpg._loader import load_extension  # type: ignore[import-not-found]
    from ringpg._registration import records_itself, served_devices  # type: ignore[import-not-found]

    floor_backend = load_extension().FloorBackend

    def create(opts: Any, pg_options: Any = None) -> Any:
        return floor_backend(opts.group_rank, opts.group_size)

    dist.Backend.register_backend(FLOOR_BACKEND, create, extended_api=True, devices=served_devices())
    # Where ringpg records its own ops (and torch attaches no hook to its groups), the
    # floor gets no hook either: recording is then ringpg's own cost, not torch's.
    self_recording = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if isinstance(self_recording, set) and records_itself():
        self_recording.add(FLOOR_BACKEND)


def floor_group(timeout: Any) -> Any:
    """A group of every rank that measures torch's floor: each op goes through torch's
    Python API, the dispatcher, a backend call and a Work, as a ringpg op does, and the
    backend (ringpg's FloorBackend) completes it at once without touching a tensor, so
    its time does not grow with the size.  torch treats the group as it treats ringpg's
    (from torch 2.15 ringpg records its own ops, and neither group gets torch's hook).  Ops on it leave
    outputs as they were: never verified."""
    _register_floor()
    return dist.new_group(backend=FLOOR_BACKEND, timeout=timeout)


def new_group_of(spec: str, timeout: Any) -> Any:
    """A group of every rank for a ``--backends`` entry (see :class:`Spec`)."""
    name, transport, algo, copy = split_spec(spec)
    if name == FLOOR:
        return floor_group(timeout)
    if transport is None and algo is None and copy is None:
        return dist.new_group(backend=name, timeout=timeout)
    import ringpg  # type: ignore[import-not-found]

    with contextlib.ExitStack() as choices:
        if transport is not None:
            choices.enter_context(ringpg.use_transport(transport))
        if algo is not None:
            choices.enter_context(ringpg.use_algorithm(algo))
        if copy is not None:
            choices.enter_context(ringpg.use_copy(copy))
        return dist.new_group(backend=name, timeout=timeout)


def backend_status(spec: str, device: str) -> Tuple[bool, str]:
    """(usable, description) for a ``--backends`` entry on this machine, without creating a group."""
    name, transport, algo, copy = split_spec(spec)
    if (transport is not None or algo is not None or copy is not None) and name != "ringpg":
        return False, (
            f"{spec!r}: only ringpg takes a transport, an algorithm or a copy"
            " (ringpg@tcp, ringpg/ring, ringpg@tcp/hier, ringpg%cma)"
        )
    try:
        if name == FLOOR:
            ok, why = backend_status("ringpg", device)
            if not ok:
                return False, f"floor needs ringpg's extension: {why}"
            note = flight_recorder_note()
            return True, "torch's call path, every op completed at once (nothing moves)" + (f", {note}" if note else "")
        if name == "gloo":
            return dist.is_gloo_available(), "built into torch"
        if name == "nccl":
            ok = dist.is_nccl_available() and torch.cuda.is_available()
            ver = ".".join(map(str, torch.cuda.nccl.version())) if ok else "n/a"
            return ok, f"NCCL {ver}" if ok else "needs CUDA"
        explicit = ensure_registered(name)
        how = "registered by `import`" if explicit else "registered by entry point"
        if name == "ringpg":
            from ringpg._loader import load_extension  # type: ignore[import-not-found]

            load_extension()  # imports ringpg._C after its torch-version check
            import ringpg  # type: ignore[import-not-found]
            from ringpg._registration import ALGORITHMS, COPIES, TRANSPORTS  # type: ignore[import-not-found]

            if transport is not None and transport not in TRANSPORTS:
                return False, f"{spec!r}: ringpg's transports are {', '.join(TRANSPORTS)}"
            if algo is not None and algo not in ALGORITHMS:
                return False, f"{spec!r}: ringpg's algorithms are {', '.join(ALGORITHMS)}"
            if copy is not None and copy not in COPIES:
                return False, f"{spec!r}: ringpg's same-host copies are {', '.join(COPIES)}"
            note = flight_recorder_note()
            return True, f"ringpg {getattr(ringpg, '__version__', '?')} ({how}, _C loaded" + (
                f"; {note})" if note else ")"
            )
        return True, how
    except Exception as e:  # noqa: BLE001 - described to the user
        return False, one_line(e)


def unique_labels(names: Sequence[str]) -> List[str]:
    """Labels for the backend list: duplicates get ``#1``, ``#2`` (e.g. ``gloo,gloo``)."""
    counts: Dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    seen: Dict[str, int] = {}
    out = []
    for n in names:
        if counts[n] > 1:
            seen[n] = seen.get(n, 0) + 1
            out.append(f"{n}#{seen[n]}")
        else:
            out.append(n)
    return out


def pick_baseline(labels: Sequence[str], wanted: str = "gloo") -> str:
    """The label ratios are taken against: ``wanted`` if present, else the last label
    that is a backend (not the floor)."""
    if wanted in labels:
        return wanted
    backends = [lb for lb in labels if lb != FLOOR]
    return backends[-1] if backends else labels[-1]
