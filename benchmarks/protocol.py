"""How a case is laid out and measured, without torch: shared by the bench's ranks and the MPI peers.

``benchmarks.mpi_peer`` runs under another MPI's ``mpiexec`` in a virtual environment
that has numpy and mpi4py but no torch, and must measure a case exactly as the bench's
ranks do.  Everything that decides that lives here, once:

* **Data** (:func:`layout`, :func:`assemble`): every rank's input is ``pattern[i mod P]
  * s_r + t_r`` (a pseudo-random pattern of small integers with a prime period P, an
  affine map per rank), so every rank can compute every rank's input, and therefore the
  exact expected output, without communication.  A :class:`Layout` says which stretch
  of which rank's pattern (or of their sum) each buffer of a case holds; ``data.py``
  makes torch tensors of it, ``mpi_peer.py`` numpy arrays.  The pattern is a fixed
  integer hash of the position, so it does not depend on a library's random stream.
* **Iterations** (:class:`IterationPolicy`, :func:`timed_iterations`): warm-up rounds,
  then enough timed rounds to fill the case time, clamped.
* **Clocks** (:func:`clock_identity`): processes with equal identities read one
  monotonic clock, so an op can be timed from the last rank's start to the last rank's end.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

#: Ops whose buffer is split into ``world_size`` equal chunks (numel must divide).
CHUNKED_OPS = frozenset({"reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single"})

#: Root of the broadcast case.
BROADCAST_ROOT = 0

#: Period of the data pattern (a prime, so no chunk or segment size is a multiple of it
#: below ~1M elements and misplaced data shows as wrong elements).
PATTERN_PERIOD = 1_000_003
_PATTERN_SEED = 20240611

#: The ``source`` of a :class:`Piece` that holds the sum of every rank's pattern.
SUM_OF_RANKS = -1


def chunk_of(op: str, numel: int, world_size: int) -> int:
    """Elements per rank of a chunked op (the full buffer split in ``world_size`` parts); else ``numel``."""
    return numel // world_size if op in CHUNKED_OPS else numel


def rank_coefficients(rank: int) -> Tuple[int, int]:
    """(s_r, t_r) of rank ``rank``'s affine map; distinct for the first 15 ranks, |x| <= 8."""
    return 1 + rank % 3, (rank // 3) % 5 - 2


_base: Optional[np.ndarray] = None
_periods: Dict[Tuple[int, int], np.ndarray] = {}


def base_pattern() -> np.ndarray:
    """The period shared by every rank: integers in [-2, 2] from a fixed hash of the position."""
    global _base
    if _base is None:
        with np.errstate(over="ignore"):
            h = (np.arange(PATTERN_PERIOD, dtype=np.uint64) + np.uint64(_PATTERN_SEED)) * np.uint64(0x9E3779B97F4A7C15)
            h ^= h >> np.uint64(31)
            h *= np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(29)
        _base = ((h >> np.uint64(32)) % np.uint64(5)).astype(np.int32) - 2
    return _base


def period(source: int, world_size: int) -> np.ndarray:
    """One period of rank ``source``'s input, or of the sum over all ranks (:data:`SUM_OF_RANKS`), int32."""
    key = (source, world_size if source == SUM_OF_RANKS else 0)
    p = _periods.get(key)
    if p is None:
        if source == SUM_OF_RANKS:
            s = sum(rank_coefficients(r)[0] for r in range(world_size))
            b = sum(rank_coefficients(r)[1] for r in range(world_size))
        else:
            s, b = rank_coefficients(source)
        p = base_pattern() * np.int32(s) + np.int32(b)
        _periods[key] = p
    return p


@dataclass(frozen=True)
class Piece:
    """``length`` elements of the infinite periodic extension of ``source``'s period, from ``start``."""

    source: int
    start: int
    length: int


@dataclass(frozen=True)
class Layout:
    """What one rank's buffers of a case hold.

    ``input``: the pristine input (None for a broadcast receiver, whose buffer is only
    written); ``inplace``: the result lands in the input buffer (all_reduce, broadcast),
    else in an output of ``output_numel`` elements and the input must come back unchanged;
    ``expected``: the exact result.
    """

    inplace: bool
    input: Optional[Tuple[Piece, ...]]
    output_numel: int
    expected: Tuple[Piece, ...]


def layout(op: str, rank: int, world_size: int, numel: int) -> Layout:
    """The :class:`Layout` of ``op`` on ``numel`` elements (the nccl-tests full buffer) for ``rank``."""
    n, N = world_size, numel
    c = chunk_of(op, N, n)
    if op == "all_reduce":
        return Layout(True, (Piece(rank, 0, N),), 0, (Piece(SUM_OF_RANKS, 0, N),))
    if op == "broadcast":
        root = (Piece(BROADCAST_ROOT, 0, N),)
        return Layout(True, root if rank == BROADCAST_ROOT else None, 0, root)
    if op == "reduce_scatter_tensor":
        return Layout(False, (Piece(rank, 0, N),), c, (Piece(SUM_OF_RANKS, rank * c, c),))
    if op == "all_gather_into_tensor":
        return Layout(False, (Piece(rank, rank * c, c),), N, tuple(Piece(j, j * c, c) for j in range(n)))
    if op == "all_to_all_single":
        return Layout(False, (Piece(rank, 0, N),), N, tuple(Piece(j, rank * c, c) for j in range(n)))
    raise ValueError(op)


def assemble(pieces: Tuple[Piece, ...], world_size: int, dtype: "np.dtype | type" = np.int32) -> np.ndarray:
    """A fresh array holding ``pieces`` one after another, in ``dtype`` (values are small integers)."""
    out = np.empty(sum(p.length for p in pieces), dtype=dtype)
    at = 0
    for p in pieces:
        src = period(p.source, world_size)
        shift = p.start % src.size
        # The periodic extension from `start`: the period rotated, then repeated.
        out[at : at + p.length] = np.resize(np.concatenate((src[shift:], src[:shift])) if shift else src, p.length)
        at += p.length
    return out


# --------------------------------------------------------------------------------------
# Iterations and clocks
# --------------------------------------------------------------------------------------


@dataclass
class IterationPolicy:
    """How many iterations a case gets: ``warmup`` rounds, then enough rounds to fill
    ``case_time_s`` (estimated from the last warm-up round), clamped to [min, max]."""

    warmup: int = 2
    iters_min: int = 3
    iters_max: int = 100
    case_time_s: float = 0.75
    # Ops per timed iteration.  1: each op follows a barrier and is timed alone
    # (latency).  N > 1: N ops back to back, time = batch / N, as nccl-tests times its
    # loop.  Either way outputs are checked in rounds of their own (verify_timed aside).
    batch: int = 1
    # Also verify the output of every timed op (--check: correctness is all it wants).
    # Off for timing: the check's CPU work right before the next op slows that op when
    # ranks outnumber cores (the scheduler makes a rank that just ran wait its turn).
    verify_timed: bool = False

    def warmup_done(self, last_round_s: float) -> bool:
        """Whether a warm-up round this slow (max over ranks) ends the warm-up early."""
        return self.case_time_s > 0 and last_round_s >= self.case_time_s / 2

    def timed_iterations(self, warmup_rounds: int, last_round_s: float) -> int:
        """Timed rounds after ``warmup_rounds`` warm-up rounds, the last taking ``last_round_s`` (max over ranks)."""
        if warmup_rounds and last_round_s > 0:
            iters = int(math.ceil(self.case_time_s / (last_round_s * self.batch)))
        else:
            iters = self.iters_min
        return max(self.iters_min, min(self.iters_max, iters))


def clock_identity() -> str:
    """What identifies the monotonic clock ``time.perf_counter_ns`` reads here: the
    kernel's boot id and this process's time namespace ("" where unknown).  Processes
    with the same identity read the same clock, whatever their network namespace."""
    if "CLOCK_MONOTONIC" not in time.get_clock_info("perf_counter").implementation:
        return ""
    try:
        boot = open("/proc/sys/kernel/random/boot_id", encoding="ascii").read().strip()
    except OSError:
        return ""
    try:
        timens = os.readlink("/proc/self/ns/time")
    except OSError:
        timens = "-"  # kernels before time namespaces: one clock per boot
    return f"{boot}|{timens}"
