"""Reference results from gloo, over the same ranks as the group under test.

Each reference runs the gloo op on a copy of the input; AVG is SUM divided by the
group size (gloo has no AVG), and reduce_scatter's reference is a block of a gloo
all_reduce, so it does not depend on gloo's reduce_scatter.  :func:`ref_all_reduce_many`
reduces many inputs of one dtype in one gloo call.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from .data import reduce_op


def divide_by_world(x: torch.Tensor, n: int) -> torch.Tensor:
    """AVG from SUM in the same dtype (truncating division for integer dtypes)."""
    if x.dtype.is_floating_point:
        return torch.div(x, n)
    return torch.div(x, n, rounding_mode="trunc")


def ref_all_reduce(x: torch.Tensor, op: str, group: Any) -> torch.Tensor:
    """all_reduce of a copy of ``x`` on the gloo ``group``; AVG as SUM / group size."""
    out = x.clone()
    dist.all_reduce(out, op=reduce_op("SUM" if op == "AVG" else op), group=group)
    if op == "AVG":
        out = divide_by_world(out, dist.get_world_size(group))
    return out


def ref_all_reduce_many(xs: Sequence[torch.Tensor], op: str, group: Any) -> list[torch.Tensor]:
    """:func:`ref_all_reduce` of each of ``xs`` (one dtype), in one gloo all_reduce of them
    end to end: the reduction is elementwise, so each comes out as its own call would give
    it, and a battery of many small cases pays gloo's latency once (12 ms an op at 7 ranks
    on 2 cores, where the ops under test take 2)."""
    if not xs:
        return []
    flat = ref_all_reduce(torch.cat([x.reshape(-1) for x in xs]), op, group)
    return [part.reshape(x.shape) for part, x in zip(flat.split([x.numel() for x in xs]), xs)]


def ref_reduce_scatter(full_input: torch.Tensor, op: str, group: Any) -> torch.Tensor:
    """This rank's block of the reduction of ``full_input`` (dim 0 split in group-size blocks).

    Computed from a gloo all_reduce, so it does not depend on gloo's reduce_scatter.
    """
    return rank_block(ref_all_reduce(full_input, op, group), group)


def ref_reduce_scatter_many(full_inputs: Sequence[torch.Tensor], op: str, group: Any) -> list[torch.Tensor]:
    """:func:`ref_reduce_scatter` of each of ``full_inputs`` (one dtype), in one gloo call."""
    return [rank_block(r, group) for r in ref_all_reduce_many(full_inputs, op, group)]


def ref_all_gather(x: torch.Tensor, group: Any) -> torch.Tensor:
    """gloo all_gather_into_tensor of ``x``, concatenated along dim 0."""
    ws = dist.get_world_size(group)
    out = torch.empty((x.shape[0] * ws, *x.shape[1:]), dtype=x.dtype)
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def ref_broadcast(x: torch.Tensor, src: int, group: Any) -> torch.Tensor:
    """gloo broadcast of a copy of ``x`` from global rank ``src``."""
    out = x.clone()
    dist.broadcast(out, src=src, group=group)
    return out


def sentinel_like(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Output buffer pre-filled with a value the data never contains (77)."""
    return torch.full(tuple(shape), 77, dtype=dtype)


def rank_block(full: torch.Tensor, group: Any) -> torch.Tensor:
    """This rank's block of ``full`` split along dim 0 into group-size equal blocks."""
    block = full.shape[0] // dist.get_world_size(group)
    return full.narrow(0, dist.get_rank(group) * block, block).clone()
