"""Starting ranks: a free rendezvous port, ranks that die with their launcher, torchrun's env.

Shared by the benchmark launchers and the test harness (``tests/harness``).
"""
from __future__ import annotations

import os
import socket
import sys
from typing import Optional, Tuple


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
