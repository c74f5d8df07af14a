"""Starting ranks: a free rendezvous port, ranks that die with their launcher, torchrun's
env, and local ranks as processes of one launcher (rank_context, run_ranks).

Shared by the benchmark launchers and the test harness (``tests/harness``).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import time
from typing import Any, Callable, List, Optional, Tuple


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def die_with_parent(expected_parent: Optional[int] = None) -> None:
    """Linux: have the kernel SIGKILL this process when its launcher dies, so that ranks
    never outlive a killed benchmark (they would sit in collectives until the timeout)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)  # the launcher died before prctl took effect


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


def run_ranks(target: Callable[..., None], world_size: int, args: Tuple[Any, ...], timeout: float,
              method: str = "spawn") -> List[Any]:
    """Runs ``target(rank, world_size, port, *args, queue)`` in ``world_size`` processes
    (a fresh rendezvous port) and returns the one item each puts on ``queue``, in arrival
    order.  Nothing outlives the call: past ``timeout`` seconds the ``queue.Empty`` is
    raised, and every rank still running then is killed."""
    ctx = rank_context(method)
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world_size, port, *args, q), daemon=True)
             for r in range(world_size)]
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
