"""Deterministic integer data and the exact expected result of every case, on every rank.

* **Data** (:class:`CaseBuffers`): every rank's input is a deterministic, integer-valued
  function of (rank, position) -- ``pattern[i mod P] * s_r + t_r`` with a pseudo-random
  pattern of small integers and a prime period P -- so every rank can compute every rank's
  input, and therefore the exact expected output, without communication.  Which stretch of
  which rank's pattern each buffer holds is :func:`benchmarks.protocol.layout`, shared with
  the MPI peers (``mpi_peer.py``), which build the same buffers in numpy.  Values stay within
  +-64 for world sizes up to 8 (exact in bfloat16, whatever the summation order), so a
  result is either bit-exact or wrong.  This expected output is what gloo's result on the
  same inputs is; checking gloo against it too makes gloo's own ``#wrong`` meaningful.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.distributed as dist

from benchmarks.cases import DTYPES, Case
from benchmarks.protocol import BROADCAST_ROOT, Piece, assemble, layout
from benchmarks.vllm_shm import is_vllm
from devkit.groups import global_rank


def _sentinel(dtype: torch.dtype) -> float:
    return float("nan") if dtype.is_floating_point else -12345


class CaseBuffers:
    """Input, output, pristine copy and exact expected result of one case on one rank.

    ``reset()`` prepares the buffers before each op (restores the in-place buffer, fills
    outputs with a sentinel so a backend that writes nothing is caught); ``run(group)``
    issues the collective synchronously; ``count_wrong()`` counts wrong output elements
    plus input elements an out-of-place op modified.

    ``fresh``: new tensors for every op, as user code makes them.  ``reset()`` makes a
    new input (a copy of the pristine one; a broadcast receiver's buffer is allocated
    like an input), which the caller does before its barrier, so outside the timed
    region, as a user's input comes out of earlier compute; ``run()`` allocates the
    output (``torch.empty``) right before the op, inside the timed region, because that
    allocation, its page faults included, is what a user pays per collective.  Rounds
    that verify allocate it with ``torch.full(sentinel)`` instead.
    """

    def __init__(self, case: Case, rank: int, device: torch.device, fresh: bool = False) -> None:
        self.case = case
        self.rank = rank
        self.device = device
        self.fresh = fresh
        self.dtype = DTYPES[case.dtype]
        lay = layout(case.op, rank, case.world_size, case.numel)
        self.inplace = lay.inplace
        self.output_numel = lay.output_numel
        self.expected = self._tensor(lay.expected)
        self.pristine: Optional[torch.Tensor] = self._tensor(lay.input) if lay.input is not None else None
        self.input: torch.Tensor = torch.empty_like(self.expected) if self.inplace else self.pristine.clone()  # type: ignore[union-attr]
        self.output: Optional[torch.Tensor] = None if self.inplace else self._new_output(sentinel=True)
        self._sentinel_output = True
        self.reset()

    def _tensor(self, pieces: Tuple[Piece, ...]) -> torch.Tensor:
        data = assemble(pieces, self.case.world_size)  # int32: exact in every dtype measured
        return torch.from_numpy(data).to(dtype=self.dtype, device=self.device)

    def _new_output(self, sentinel: bool) -> torch.Tensor:
        if sentinel:
            return torch.full((self.output_numel,), _sentinel(self.dtype), dtype=self.dtype, device=self.device)
        return torch.empty(self.output_numel, dtype=self.dtype, device=self.device)

    def reset(self, verify: bool = True) -> None:
        """Prepare for the next op: identical inputs for every backend and iteration
        (``fresh``: new ones; ``verify``: its output will be checked, so sentinels)."""
        if self.fresh:
            if self.pristine is not None:
                self.input = self.pristine.clone()
            elif verify:
                self.input = torch.full_like(self.expected, _sentinel(self.dtype))
            else:
                self.input = torch.empty_like(self.expected)
            self._sentinel_output = verify
        elif self.inplace:
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
        if self.fresh and not self.inplace:
            self.output = self._new_output(self._sentinel_output)
        if is_vllm(group):
            group.run(op, self.input, self.output)
        elif op == "all_reduce":
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
