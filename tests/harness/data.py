"""Deterministic test data: integer-valued, so every reduction is exact in every dtype.

Every rank derives its data from (rank, case name) alone (:func:`case_seed`), so any
rank, and any rerun, can rebuild any rank's input; the dtypes, reduction ops and
sizes the batteries sweep are defined here too.
"""

from __future__ import annotations

import zlib
from typing import Any, Sequence

import torch
import torch.distributed as dist

DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
)
OPS: tuple[str, ...] = ("SUM", "AVG", "MIN", "MAX", "PRODUCT")
# The 2**20+3 case runs only for these dtypes to keep the suite's runtime reasonable.
BIG_NUMEL = 2**20 + 3
BIG_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.int32)


def case_seed(rank: int, case: str) -> int:
    """Deterministic seed from (rank, case); independent of PYTHONHASHSEED."""
    return zlib.crc32(case.encode()) * 1024 + rank


def make_data(rank: int, case: str, shape: Sequence[int], dtype: torch.dtype, kind: str = "small") -> torch.Tensor:
    """Deterministic integer-valued data so every reduction is exact in every dtype.

    kind ``"small"``: values in [-4, 4] (signed) or [0, 4] (unsigned);
    kind ``"product"``: values in {-1, 1, 2} (signed) or {1, 2} (unsigned), so
    |product| <= 2**5 at world size 5.
    """
    g = torch.Generator().manual_seed(case_seed(rank, case))
    signed = dtype != torch.uint8
    if kind == "small":
        lo = -4 if signed else 0
        vals = torch.randint(lo, 5, tuple(shape), generator=g, dtype=torch.int64)
    elif kind == "product":
        choices = torch.tensor([-1, 1, 2] if signed else [1, 2], dtype=torch.int64)
        vals = choices[torch.randint(0, len(choices), tuple(shape), generator=g)]
    else:
        raise ValueError(f"unknown data kind {kind!r}")
    return vals.to(dtype)


def make_random_float(
    rank: int, case: str, shape: Sequence[int], dtype: torch.dtype, kind: str = "normal"
) -> torch.Tensor:
    """Deterministic random floats, exactly representable in ``dtype``.

    kind ``"normal"``: standard normal; kind ``"product"``: random sign times a
    magnitude uniform in [0.5, 2) (no underflow in a product of 5 factors).
    """
    g = torch.Generator().manual_seed(case_seed(rank, case))
    if kind == "normal":
        x = torch.randn(tuple(shape), generator=g, dtype=torch.float64)
    elif kind == "product":
        mag = 0.5 + 1.5 * torch.rand(tuple(shape), generator=g, dtype=torch.float64)
        sign = torch.randint(0, 2, tuple(shape), generator=g).to(torch.float64) * 2 - 1
        x = sign * mag
    else:
        raise ValueError(f"unknown data kind {kind!r}")
    return x.to(dtype)


def data_kind(op: str) -> str:
    """The :func:`make_data` kind a reduction op needs (``"product"`` keeps products small)."""
    return "product" if op == "PRODUCT" else "small"


def numels_for(ws: int, dtype: torch.dtype) -> list[int]:
    """{0, 1, ws-1, ws, 1000} plus 2**20+3 for BIG_DTYPES only (runtime)."""
    ns = sorted({0, 1, ws - 1, ws, 1000})
    if dtype in BIG_DTYPES:
        ns.append(BIG_NUMEL)
    return ns


def reduce_op(name: str) -> Any:
    """The ``dist.ReduceOp`` named ``name`` (``"SUM"``, ``"AVG"``, ...)."""
    return getattr(dist.ReduceOp, name)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``, for case names."""
    return str(dtype).replace("torch.", "")
