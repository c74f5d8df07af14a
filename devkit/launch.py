"""Starting ranks: a free rendezvous port, ranks that die with their launcher, torchrun's
env, local ranks as processes of one launcher (rank_context, run_ranks), and other work
beside them (busy_processes).

Shared by the benchmark launchers and the test harness (``tests/harness``).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
from typing import Any, Callable, Iterator, List, Optional, Tuple


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def proc_stat(pid: int) -> Optional[List[str]]:
    """The fields of Linux's ``/proc/<pid>/stat`` after the command name, the state first
    and the parent's pid next; None if the process is gone (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces
    except (OSError, IndexError):
        return None


def die_with_parent(expected_parent: Optional[int] = None) -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies, so that ranks
    never outlive a killed benchmark (they would sit in collectives until the timeout).
    The parent is the launcher (``expected_parent``), or the forkserver it started
    (rank_context), which exits when the launcher does."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    except (OSError, AttributeError):
        return
    parent = os.getppid()
    grandparent = (proc_stat(parent) or [None, None])[1]
    if expected_parent is not None and expected_parent not in (parent, grandparent and int(grandparent)):
        # The launcher died before prctl took effect.
        print(
            f"rank process {os.getpid()}: its launcher {expected_parent} is gone; exiting", file=sys.stderr, flush=True
        )
        os._exit(1)


def torchrun_env() -> Optional[Tuple[int, int]]:
    """(rank, world_size) when launched by torchrun (or any env:// launcher), else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def rank_context(method: str) -> Any:
    """The multiprocessing context local ranks start with: "forkserver" forks each from a
    server process that imported torch once (milliseconds a rank, where an interpreter
    and ``import torch`` cost 1-2 s of CPU); "spawn" starts a fresh interpreter each."""
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed"])
    return ctx


START_METHODS = ("forkserver", "spawn")


def add_start_argument(ap: Any, default: str = "spawn") -> None:
    """The ``--start`` option of the launchers that run local ranks (rank_context).

    Tools that time ops start fresh interpreters by default, as torchrun and mp.spawn
    start a user's ranks: a rank forked from the server shares the server's memory
    copy-on-write, and for its first thousands of ops each op's Python and torch call
    path writes to some inherited page (a fault and a page copy, tens of µs on a VM),
    so an in-process column ran slower than one in a process of its own (an MPI
    peer's) by up to half a 1 MiB all-gather's time (benchmarks/RESULTS.md,
    2026-12-06 (3)).  ``default="forkserver"``: tools that time group creation at many
    ranks, where each interpreter's start would cost more than what is measured."""
    ap.add_argument(
        "--start",
        choices=START_METHODS,
        default=default,
        help="how local ranks start: fresh interpreters (spawn: 1-2 s of CPU per rank, as a launcher "
        "starts them), or forked from a server that imported torch once (forkserver: milliseconds; its "
        "ranks' first thousands of ops pay copy-on-write faults) (default: %(default)s)",
    )


# The memory the columns' buffers live in (bench --hugepages): transparent huge pages for
# everyone, for no one, or each library's default.  numpy madvises its arrays of 4 MiB
# and more for huge pages by default (the MPI peers' buffers); torch's CPU allocator does
# so only under THP_MEM_ALLOC_ENABLE=1, read once, at a process's first allocation.  On
# the 2-core VM a 64 MiB all-gather took 20% less on huge pages (benchmarks/RESULTS.md).
HUGEPAGES = ("on", "off", "native")
THP_ENV = "THP_MEM_ALLOC_ENABLE"


def use_hugepages(choice: str) -> None:
    """Set torch's huge-page switch for every rank started from this process from now on
    (``native``: leave the environment as it is)."""
    if choice != "native":
        os.environ[THP_ENV] = "1" if choice == "on" else "0"


def hugepages_in_effect() -> str:
    """What this process's torch allocator was told: ``on``, ``off``, or ``native`` (unset)."""
    return {"1": "on", "0": "off"}.get(os.environ.get(THP_ENV, ""), "native")


def quick_reverse_lookups() -> None:
    """Makes a reverse DNS lookup that gets no answer give up after one try of 1 s, in this
    process and the ranks it starts (unless RES_OPTIONS is set): torch's c10d sockets name
    each Store connection by its peer's address, a client's IPv4-mapped IPv6 one that
    /etc/hosts does not list, and where the resolver's server does not answer each such
    lookup waits 5 s per try.  1,152 Store clients took minutes to connect that way on the
    2-core machine (before any clock starts, but a benchmark should not wait on DNS).
    Call before the first lookup: glibc reads the setting once per process."""
    os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")


def store_barrier(store: Any, key: str, n: int) -> None:
    """Counts this caller in at ``key`` of a c10d Store and returns once ``n`` callers have."""
    store.add(key, 1)
    while store.add(key, 0) < n:
        time.sleep(0.002)


def run_ranks(
    target: Callable[..., None], world_size: int, args: Tuple[Any, ...], timeout: float, method: str = "spawn"
) -> List[Any]:
    """Runs ``target(rank, world_size, port, *args, queue)`` in ``world_size`` processes
    (a fresh rendezvous port) and returns the one item each puts on ``queue``, in arrival
    order.  Nothing outlives the call: past ``timeout`` seconds the ``queue.Empty`` is
    raised, and every rank still running then is killed."""
    ctx = rank_context(method)
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world_size, port, *args, q), daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    try:
        return [q.get(timeout=max(1.0, deadline - time.monotonic())) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` processes that spin on a CPU each until the block ends: another job on
    the ranks' host, which leaves it that many CPUs short (bench and wakeups ``--busy``)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()
