"""Deterministic integer data and the exact expected result of every case, on every rank.

* **Data** (:class:`CaseBuffers`): every rank's input is a deterministic, integer-valued
  function of (rank, position) -- ``pattern[i mod P] * s_r + t_r`` with a random pattern
  of small integers and a prime period P -- so every rank can compute every rank's input,
  and therefore the exact expected output, without communication.  Values stay within
  +-64 for world sizes up to 8 (exact in bfloat16, whatever the summation order), so a
  result is either bit-exact or wrong.  This expected output is what gloo's result on the
  same inputs is; checking gloo against it too makes gloo's own ``#wrong`` meaningful.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist

from benchmarks.backends import global_rank
from benchmarks.cases import BROADCAST_ROOT, DTYPES, Case

#: Period of the data pattern (a prime, so no chunk or segment size is a multiple of it
#: below ~1M elements and misplaced data shows as wrong elements).
PATTERN_PERIOD = 1_000_003
_PATTERN_SEED = 20240611
_pattern_cache: Dict[Tuple[str, str, int], torch.Tensor] = {}


def rank_coefficients(rank: int) -> Tuple[int, int]:
    """(s_r, t_r) of rank ``rank``'s affine map; distinct for the first 15 ranks, |x| <= 8."""
    return 1 + rank % 3, (rank // 3) % 5 - 2


def _pattern(dtype: torch.dtype, device: torch.device, rank: Optional[int],
             world_size: int) -> torch.Tensor:
    """The per-rank period ``pattern * s_r + t_r`` (or the sum over ranks if rank is None)."""
    key = (str(dtype), str(device), -1 - world_size if rank is None else rank)
    t = _pattern_cache.get(key)
    if t is None:
        g = torch.Generator().manual_seed(_PATTERN_SEED)
        base = torch.randint(-2, 3, (PATTERN_PERIOD,), generator=g, dtype=torch.int32)
        if rank is None:
            s = sum(rank_coefficients(r)[0] for r in range(world_size))
            b = sum(rank_coefficients(r)[1] for r in range(world_size))
        else:
            s, b = rank_coefficients(rank)
        t = (base * s + b).to(dtype=dtype, device=device)
        _pattern_cache[key] = t
    return t


def periodic(period: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """Elements ``start .. start+length`` of the infinite periodic extension of ``period``."""
    p = period.numel()
    if length <= 0:
        return period[:0].clone()
    rolled = torch.roll(period, -(start % p)) if start % p else period
    reps = -(-length // p)
    if reps == 1:
        return rolled[:length].clone()  # never a view of the cached pattern
    return rolled.repeat(reps)[:length]  # contiguous prefix of a fresh tensor, no second copy


def _sentinel(dtype: torch.dtype) -> float:
    return float("nan") if dtype.is_floating_point else -12345


class CaseBuffers:
    """Input, output, pristine copy and exact expected result of one case on one rank.

    ``reset()`` prepares the buffers before each op (restores the in-place buffer, fills
    outputs with a sentinel so a backend that writes nothing is caught); ``run(group)``
    issues the collective synchronously; ``count_wrong()`` counts wrong output elements
    plus input elements an out-of-place op modified.
    """

    def __init__(self, case: Case, rank: int, device: torch.device) -> None:
        self.case = case
        self.rank = rank
        self.device = device
        n, dt = case.world_size, DTYPES[case.dtype]
        N, c = case.numel, case.chunk
        mine = _pattern(dt, device, rank, n)
        self.inplace = case.op in ("all_reduce", "broadcast")
        self.input: torch.Tensor
        self.output: Optional[torch.Tensor] = None
        self.pristine: Optional[torch.Tensor] = None
        if case.op == "all_reduce":
            self.pristine = periodic(mine, 0, N)
            self.input = torch.empty_like(self.pristine)
            self.expected = periodic(_pattern(dt, device, None, n), 0, N)
        elif case.op == "broadcast":
            root = _pattern(dt, device, BROADCAST_ROOT, n)
            self.expected = periodic(root, 0, N)
            self.pristine = self.expected if rank == BROADCAST_ROOT else None
            self.input = torch.empty_like(self.expected)
        elif case.op == "reduce_scatter_tensor":
            self.pristine = periodic(mine, 0, N)
            self.input = self.pristine.clone()
            self.output = torch.empty(c, dtype=dt, device=device)
            self.expected = periodic(_pattern(dt, device, None, n), rank * c, c)
        elif case.op == "all_gather_into_tensor":
            self.pristine = periodic(mine, rank * c, c)
            self.input = self.pristine.clone()
            self.output = torch.empty(N, dtype=dt, device=device)
            self.expected = torch.empty(N, dtype=dt, device=device)
            for j in range(n):
                self.expected[j * c:(j + 1) * c] = periodic(_pattern(dt, device, j, n), j * c, c)
        elif case.op == "all_to_all_single":
            self.pristine = periodic(mine, 0, N)
            self.input = self.pristine.clone()
            self.output = torch.empty(N, dtype=dt, device=device)
            self.expected = torch.empty(N, dtype=dt, device=device)
            for j in range(n):
                self.expected[j * c:(j + 1) * c] = periodic(_pattern(dt, device, j, n), rank * c, c)
        else:
            raise ValueError(case.op)
        self.reset()

    def reset(self) -> None:
        """Prepare for the next op: identical inputs for every backend and iteration."""
        if self.inplace:
            if self.pristine is not None:
                self.input.copy_(self.pristine)
            else:  # broadcast receiver
                self.input.fill_(_sentinel(self.input.dtype))
        else:
            assert self.output is not None
            self.output.fill_(_sentinel(self.output.dtype))

    def run(self, group: Any) -> None:
        """Issue the collective on ``group`` and wait for it (CUDA: caller synchronizes)."""
        op = self.case.op
        if op == "all_reduce":
            dist.all_reduce(self.input, op=dist.ReduceOp.SUM, group=group)
        elif op == "broadcast":
            dist.broadcast(self.input, src=global_rank(group, BROADCAST_ROOT), group=group)
        elif op == "reduce_scatter_tensor":
            dist.reduce_scatter_tensor(self.output, self.input, op=dist.ReduceOp.SUM, group=group)
        elif op == "all_gather_into_tensor":
            dist.all_gather_into_tensor(self.output, self.input, group=group)
        elif op == "all_to_all_single":
            dist.all_to_all_single(self.output, self.input, group=group)
        else:
            raise ValueError(op)

    def result(self) -> torch.Tensor:
        return self.input if self.inplace else self.output  # type: ignore[return-value]

    def count_wrong(self) -> int:
        """Wrong output elements, plus input elements an out-of-place op modified (restored)."""
        wrong = count_diff(self.result(), self.expected)
        if not self.inplace and self.pristine is not None:
            clobbered = count_diff(self.input, self.pristine)
            if clobbered:
                self.input.copy_(self.pristine)
            wrong += clobbered
        return wrong


def count_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many elements of ``a`` and ``b`` (same shape) differ."""
    if a.numel() == 0 or torch.equal(a, b):
        return 0
    return int(torch.count_nonzero(a != b).item())
