"""The backend under test, and what a live group of it says about itself.

The backend under test is ``"ringpg"`` unless the environment variable
``RINGPG_TEST_BACKEND`` names another (``RINGPG_TEST_BACKEND=gloo`` validates the
harness and the tests themselves against gloo).  gloo is always the reference.
How a ring moves its bytes (``transport_of``) is asked through
:mod:`benchmarks.backends`, which the benchmarks share.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
from typing import Any, Mapping, Optional, Sequence, Union

import torch

from devkit.settings import merged_env, tuning_value

BACKEND_ENV = "RINGPG_TEST_BACKEND"
EMULATED_HOSTS_ENV = "RINGPG_TEST_HOSTS"
# Set to "1" in a worker environment: the kernel refuses this rank's right neighbour
# any read of rank 0's memory (cross-memory attach), as Yama or a container would, so
# ringpg's probe fails on that one link and the group keeps its shared-memory slots.
REFUSE_CMA_ENV = "RINGPG_TEST_REFUSE_CMA"
REFERENCE_BACKEND = "gloo"

# Worker environments (InitSpec.env) that put ringpg's ring on each of its transports:
# shared memory is the default on one host; RINGPG_TRANSPORT=tcp keeps it on ringpg's
# own sockets; RINGPG_TRANSPORT=gloo moves it over Gloo's TCP pairs.
# "mixed" emulates two hosts on this one: rank r claims host r % 2 (RINGPG_HOSTID, set
# by apply_env), so the ring runs host by host (0, 2, ... then 1, 3, ...), its hops
# within a "host" on shared memory and those between on TCP: 'shm+tcp' from 3 ranks.
TRANSPORT_ENVS: dict[str, tuple[tuple[str, str], ...]] = {
    "shm": (),
    "tcp": (("RINGPG_TRANSPORT", "tcp"),),
    "gloo": (("RINGPG_TRANSPORT", "gloo"),),
    "mixed": ((EMULATED_HOSTS_ENV, "2"),),
}
# The same, as environment dicts (for scenarios that start their own ranks), and their names.
TRANSPORT_ENV_DICTS: dict[str, dict[str, str]] = {name: dict(env) for name, env in TRANSPORT_ENVS.items()}
TRANSPORT_NAMES: tuple[str, ...] = tuple(TRANSPORT_ENVS)
# The shared-memory links' own algorithms on one host, without the host arena
# (RINGPG_ALGO=ring): what a group on one host ran before the arena, kept under test
# beside it by the tests whose subject is the ring (transport_env, transport_expected).
SHM_RING = "shm-ring"


def transport_env(name: str) -> tuple[tuple[str, str], ...]:
    """The worker environment of TRANSPORT_ENVS's ``name``, or of SHM_RING."""
    return (("RINGPG_ALGO", "ring"),) if name == SHM_RING else TRANSPORT_ENVS[name]


# Further emulated-host layouts, for the batteries that run them on top of TRANSPORT_ENVS
# (mixed-block), and for the hierarchical collectives' shapes at world size 6
# (test_hierarchical.py): hosts x ranks per host, and hosts of 4 and 2 ranks.
EMULATED_LAYOUTS: dict[str, str] = {
    "mixed-block": "block2",
    "hosts3x2": "3",  # rank r on host r % 3: hierSlot is the rank
    "hosts2x3": "block3",  # torchrun's numbering: ranks 0-2 on host 0
    "hosts4+2": "0,1,0,0,1,0",  # unequal: host 0 holds ranks 0, 2, 3, 5
}


def emulated_host(layout: str, rank: int) -> int:
    """The emulated host of ``rank`` under ``EMULATED_HOSTS_ENV=layout``: ``"H"`` places
    rank r on host r % H (cyclic), ``"blockK"`` on host r // K (K consecutive ranks per
    host, as torchrun numbers them), and a comma-separated list names each rank's host
    in rank order (``"0,1,0,0,1,0"``: host 0 holds ranks 0, 2, 3, 5 and host 1 ranks 1, 4,
    hosts of unequal sizes, which neither other form expresses)."""
    if "," in layout:
        hosts = layout.split(",")
        if rank >= len(hosts):
            raise ValueError(f"{EMULATED_HOSTS_ENV}={layout!r} names no host for rank {rank}")
        return int(hosts[rank])
    if layout.startswith("block"):
        return rank // int(layout[len("block") :])
    return rank % int(layout)


def emulated_topology(layout: str, members: Sequence[int]) -> tuple[int, int, list[int]]:
    """What ringpg's topology (csrc/transport/topology.h) makes of a group of the world
    ranks ``members`` under ``layout``: (hosts, ranks per host or 0 when hosts hold
    different numbers, the ring order in group ranks: host by host, hosts numbered by
    first appearance, ascending within a host) -- ``ringpg.backend(g)``'s ``.hosts``,
    ``.ranks_per_host`` and ``.ring_order``."""
    host = [emulated_host(layout, r) for r in members]
    seen = list(dict.fromkeys(host))
    ring = sorted(range(len(members)), key=lambda q: (seen.index(host[q]), q))
    counts = {h: host.count(h) for h in seen}
    per_host = counts[seen[0]] if len(set(counts.values())) == 1 else 0
    return len(seen), per_host, ring


def hierarchical_expected(layout: str, members: Sequence[int], algo: str = "auto") -> bool:
    """Whether ringpg runs a group of ``members`` under ``layout`` hierarchically (docs/configuration.md,
    RINGPG_ALGO): ``auto`` where several hosts hold the same number (> 1) of its ranks,
    ``hier`` wherever they hold equal numbers, ``ring`` never."""
    hosts, per_host, _ = emulated_topology(layout, members)
    if algo == "ring" or per_host == 0 or len(members) < 2:
        return False
    return algo == "hier" or (hosts > 1 and per_host > 1)


def apply_env(env: Mapping[str, str], rank: int) -> None:
    """Sets a worker's environment (before torch.distributed starts): ``env``, and under
    ``EMULATED_HOSTS_ENV`` the host identity ``RINGPG_HOSTID`` of the rank's emulated host.
    A RINGPG_TUNING in ``env`` adds to the one the worker inherited (devkit.settings)."""
    os.environ.update(merged_env(os.environ, env))
    layout = env.get(EMULATED_HOSTS_ENV)
    if layout:
        os.environ["RINGPG_HOSTID"] = f"emulated-host-{emulated_host(layout, rank)}"
    if env.get(REFUSE_CMA_ENV) == "1":
        refuse_cross_memory_reads(rank)


def refuse_cross_memory_reads(rank: int) -> None:
    """What a hardened host does to process_vm_readv, on one link: every rank drops
    CAP_SYS_PTRACE (which lets root read anyone), and rank 0 becomes non-dumpable, which
    a process without that capability may not read.  Capabilities are per thread: the
    threads ringpg starts later (its worker) inherit the drop."""
    libc = ctypes.CDLL(None, use_errno=True)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    LINUX_CAPABILITY_VERSION_3, CAP_SYS_PTRACE, PR_SET_DUMPABLE = 0x20080522, 19, 4
    header, data = Header(LINUX_CAPABILITY_VERSION_3, 0), (Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    data[0].effective &= ~(1 << CAP_SYS_PTRACE)
    data[0].permitted &= ~(1 << CAP_SYS_PTRACE)
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    if rank == 0 and libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


def tiny_private_dev_shm() -> None:
    """Gives this process a 256 KiB /dev/shm of its own (a new mount namespace), as a
    container with a small, unshared /dev/shm has: no shared-memory region fits.  Runs
    before any thread starts (see can_make_mount_namespaces)."""
    private_dev_shm("256k")


def private_dev_shm(size: str) -> None:
    """Gives this process a /dev/shm of ``size`` (tmpfs's words: "256k", "8m") of its own,
    in a new mount namespace, as a container has; see tiny_private_dev_shm."""
    libc = ctypes.CDLL(None, use_errno=True)
    CLONE_NEWNS, MS_REC, MS_PRIVATE = 0x00020000, 0x4000, 0x40000
    if (
        libc.unshare(CLONE_NEWNS) != 0
        or libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0
        or libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, f"size={size}".encode()) != 0
    ):
        err = ctypes.get_errno()
        raise OSError(err, f"private /dev/shm: {os.strerror(err)}")


def can_make_mount_namespaces() -> bool:
    """Whether tiny_private_dev_shm can work here (root, unshare(1) permitted)."""
    tool = shutil.which("unshare")
    return (
        os.geteuid() == 0
        and tool is not None
        and subprocess.run([tool, "-m", "true"], capture_output=True).returncode == 0
    )


def transport_expected(name: str, ranks: Union[int, Sequence[int]]) -> str:
    """What ``ringpg.backend(g).transport`` reads for TRANSPORT_ENVS[name] on a group of
    ``ranks`` (the world ranks, or a world size)."""
    if name == SHM_RING:
        name = "shm"
    members = range(ranks) if isinstance(ranks, int) else ranks
    layout = dict(TRANSPORT_ENVS.get(name, ())).get(EMULATED_HOSTS_ENV) or EMULATED_LAYOUTS.get(name)
    if layout:
        hosts = [emulated_host(layout, r) for r in members]
        if len(set(hosts)) == 1:
            return "shm" if len(hosts) > 1 else "tcp"
        return "shm+tcp" if len(hosts) > len(set(hosts)) else "tcp"
    return name


def oneshot_limit_bytes(world_size: int) -> int:
    """A size (bytes) every allreduce past which runs the ring, not the one-shot exchange:
    tuning key ``oneshot_bytes`` x (world size - 1), and twice the key at two ranks, at or
    above the documented limit (the key divided by world size - 1, twice the key at two
    ranks, and in groups across hosts divided by the ranks a host holds too)."""
    per_peer = int(tuning_value("oneshot_bytes"))
    return per_peer * (world_size - 1) * (2 if world_size == 2 else 1)


def backend_under_test() -> str:
    """The backend the tests exercise: ``$RINGPG_TEST_BACKEND`` or ``"ringpg"``."""
    return os.environ.get(BACKEND_ENV, "ringpg")


def ringpg_only(reason: str) -> Any:
    """A pytest mark that skips a test (or, as ``pytestmark``, a module) whose subject is
    ringpg's own behaviour where another backend is under test."""
    import pytest

    return pytest.mark.skipif(backend_under_test() != "ringpg", reason=reason)


def cpu_backend(group: Any) -> Any:
    """The c10d Backend object serving ``group``'s CPU tensors (ringpg's RingBackend, say)."""
    return group._get_backend(torch.device("cpu"))


def traced_ops(trace_dir: str, group: Optional[str] = None) -> dict[str, dict[int, set[str]]]:
    """Op name -> bytes -> algorithms of every op span in ringpg's traces in ``trace_dir``
    (``RINGPG_TRACE``), of every group's files, or of ``group``'s only (its ``group_name``:
    ``"0"`` for the world).  An op that moved nothing (0 bytes) names no algorithm: ``"-"``.

    Read once the groups are destroyed (their files are then closed).
    """
    seen: dict[str, dict[int, set[str]]] = {}
    for name, args in _op_spans(trace_dir, group):
        by_bytes = seen.setdefault(name, {})
        by_bytes.setdefault(int(args["bytes"]), set()).add(str(args.get("algorithm", "-")))
    return seen


@functools.lru_cache(maxsize=8)
def _op_spans(trace_dir: str, group: Optional[str]) -> tuple[tuple[str, dict[str, Any]], ...]:
    """(name, args) of every op span in ringpg's traces in ``trace_dir`` (of ``group``'s
    files, or all): read once, as several checks of one run read the same closed files."""
    from ringpg import trace

    return tuple((span["name"], span["args"]) for t in trace.load(trace_dir, group) for span in t.ops())


def traced_pieces(trace_dir: str, op: str, group: Optional[str] = None) -> dict[int, set[tuple[int, int]]]:
    """Bytes -> (pieces, threads) of every hierarchical ``op`` span in ringpg's traces in
    ``trace_dir`` (see traced_ops): how many pieces it moved in and how many threads ran
    them (2: the rings across hosts on the op's second thread)."""
    seen: dict[int, set[tuple[int, int]]] = {}
    for name, a in _op_spans(trace_dir, group):
        if name == op and "pieces" in a:
            seen.setdefault(int(a["bytes"]), set()).add((int(a["pieces"]), int(a["threads"])))
    return seen


# Hierarchical pieces: at most this many per collective (hierarchical.cpp, kMaxPieces).
HIER_MAX_PIECES = 16


def hier_pieces(nbytes: int, units: int, piece_bytes: int) -> tuple[int, int]:
    """(pieces, threads) of a hierarchical collective of ``nbytes`` (its whole buffer) of
    ``units`` elements per piece dimension (the allreduce's count, a reduce-scatter's or
    all-gather's per-rank count) under tuning key hier_piece_bytes=``piece_bytes``, where the
    rings across hosts run on ringpg's TCP engine: one piece per ``piece_bytes``, at most
    HIER_MAX_PIECES and ``units``; two threads when there are several."""
    pieces = min(nbytes // piece_bytes, HIER_MAX_PIECES, units) if piece_bytes else 1
    return (pieces, 2) if pieces >= 2 else (1, 1)


def traced_algorithms(trace_dir: str, op: str, group: Optional[str] = None) -> dict[int, set[str]]:
    """Bytes -> algorithms of every ``op`` span in ringpg's traces in ``trace_dir`` (see traced_ops)."""
    return traced_ops(trace_dir, group).get(op, {})


def wait_spin_of(group: Any) -> Optional[int]:
    """Microseconds ringpg's waits poll before sleeping (tuning key spin_us or auto's choice); None for others."""
    import ringpg

    b = ringpg.backend(group)
    return b.wait_spin_us if b is not None else None


def spin_yields_of(group: Any) -> Optional[bool]:
    """Whether ringpg's waits yield the CPU while they poll (more ranks than CPUs); None for others."""
    import ringpg

    b = ringpg.backend(group)
    return b.wait_spin_yields if b is not None else None


def entry_point_installed(name: str = "ringpg") -> bool:
    """Whether a ``torch.backends`` entry point named ``name`` is installed (pip install)."""
    from importlib.metadata import entry_points

    return any(ep.name == name for ep in entry_points(group="torch.backends"))
