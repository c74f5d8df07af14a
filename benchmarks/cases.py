"""What is measured: the collectives, dtypes and cases of a run, and their bandwidth factors.

* **Cases** (:class:`Case`): one collective (``op``) on ``numel`` elements of one dtype in
  a world of ``world_size`` ranks.  ``size`` is the full buffer in the nccl-tests
  convention (the all_reduce / broadcast buffer, the reduce_scatter input, the all_gather
  output, each rank's all_to_all buffer); ``count`` is ``size / itemsize``.
* **Bandwidth** (:func:`bus_factor`): algbw = size / time, busbw = algbw x factor with
  the nccl-tests factors (allreduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all
  (n-1)/n; broadcast 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch

# BROADCAST_ROOT and CHUNKED_OPS are defined with the data layout (torch-free) and offered here too.
from benchmarks.protocol import BROADCAST_ROOT, CHUNKED_OPS, chunk_of  # noqa: F401
from benchmarks.units import format_bytes

# --------------------------------------------------------------------------------------
# Ops and dtypes
# --------------------------------------------------------------------------------------

#: The measured collectives, by their torch.distributed names, in report order.
OPS: Tuple[str, ...] = (
    "all_reduce",
    "reduce_scatter_tensor",
    "all_gather_into_tensor",
    "broadcast",
    "all_to_all_single",
)

#: Short aliases accepted on the command line.
OP_ALIASES: Dict[str, str] = {
    "ar": "all_reduce",
    "allreduce": "all_reduce",
    "rs": "reduce_scatter_tensor",
    "reduce_scatter": "reduce_scatter_tensor",
    "reducescatter": "reduce_scatter_tensor",
    "ag": "all_gather_into_tensor",
    "all_gather": "all_gather_into_tensor",
    "allgather": "all_gather_into_tensor",
    "bc": "broadcast",
    "bcast": "broadcast",
    "a2a": "all_to_all_single",
    "all_to_all": "all_to_all_single",
    "alltoall": "all_to_all_single",
}

#: Each measured collective's name in ringpg's ``algorithm_for``.
RINGPG_OP: Dict[str, str] = {
    "all_reduce": "allreduce",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_gather_into_tensor": "all_gather",
    "broadcast": "broadcast",
    "all_to_all_single": "all_to_all",
}

#: Reduction op column (nccl-tests prints "none" for non-reducing collectives).
REDOP: Dict[str, str] = {
    "all_reduce": "sum",
    "reduce_scatter_tensor": "sum",
    "all_gather_into_tensor": "none",
    "broadcast": "none",
    "all_to_all_single": "none",
}

DTYPES: Dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}

DTYPE_ALIASES: Dict[str, str] = {
    "f32": "float32",
    "float": "float32",
    "fp32": "float32",
    "bf16": "bfloat16",
    "f16": "float16",
    "fp16": "float16",
    "half": "float16",
    "f64": "float64",
    "double": "float64",
    "fp64": "float64",
}


def dtype_itemsize(dtype: str) -> int:
    """Bytes per element of the dtype named ``dtype`` (a key of :data:`DTYPES`)."""
    return torch.empty((), dtype=DTYPES[dtype]).element_size()


def canonical_op(name: str) -> str:
    """Return the torch name of an op given its name or alias; raise ValueError if unknown."""
    key = name.strip().lower()
    if key in OPS:
        return key
    if key in OP_ALIASES:
        return OP_ALIASES[key]
    raise ValueError(f"unknown op {name!r}; choose from {', '.join(OPS)} (or ar, rs, ag, bc, a2a)")


def canonical_dtype(name: str) -> str:
    """Return the canonical dtype name given a name or alias; raise ValueError if unknown."""
    key = name.strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}")
    return key


# --------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One measured collective: ``op`` over ``numel`` elements (the full buffer, see module doc)."""

    op: str
    dtype: str
    numel: int
    world_size: int

    @property
    def itemsize(self) -> int:
        return dtype_itemsize(self.dtype)

    @property
    def size_bytes(self) -> int:
        """The nccl-tests ``size``: bytes of the full buffer."""
        return self.numel * self.itemsize

    @property
    def chunk(self) -> int:
        """Elements per rank for the chunked ops (the buffer split in world_size parts)."""
        return chunk_of(self.op, self.numel, self.world_size)

    @property
    def redop(self) -> str:
        return REDOP[self.op]

    def describe(self) -> str:
        return f"{self.op} {self.dtype} {format_bytes(self.size_bytes)} ws={self.world_size}"


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw * factor (algbw = size / time)."""
    n = world_size
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(op)


def sweep_cases(
    ops: Sequence[str], dtypes: Sequence[str], world_size: int, min_bytes: int, max_bytes: int
) -> List[Case]:
    """Power-of-two sizes from ``min_bytes`` to ``max_bytes`` for every op and dtype.

    For the chunked ops the element count is rounded down to a multiple of the world size
    (as nccl-tests does), so the reported size can be slightly below the power of two.
    """
    cases: List[Case] = []
    sizes: List[int] = []
    s = 1 << max(0, (max(1, min_bytes) - 1).bit_length())  # first power of two >= min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s <<= 1
    for op in ops:
        for dt in dtypes:
            item = dtype_itemsize(dt)
            seen = set()
            for size in sizes:
                numel = max(1, size // item)
                if op in CHUNKED_OPS:
                    numel = max(world_size, (numel // world_size) * world_size)
                if numel not in seen:
                    seen.add(numel)
                    cases.append(Case(op, dt, numel, world_size))
    return cases


def check_cases(ops: Sequence[str], dtypes: Sequence[str], world_size: int, max_bytes: int = 64 << 10) -> List[Case]:
    """The ``--check`` set: 1 KiB .. ``max_bytes`` plus odd counts (0, 1, n-1, n+1, 1000, ~1M).

    For the chunked ops the odd counts are per-rank counts (total = count * n); for
    all_reduce / broadcast they are totals, so chunking remainders are exercised.  The
    ~1M-element case is large enough to span several pipeline segments of a ring.
    """
    n = world_size
    cases: List[Case] = []
    for op in ops:
        for dt in dtypes:
            item = dtype_itemsize(dt)
            odd = [0, 1, n - 1, n + 1, 1000]
            odd += [333_337] if op in CHUNKED_OPS else [1_000_003]
            numels = []
            size = 1 << 10
            while size <= max_bytes:
                c = size // item
                numels.append((c // n) * n if op in CHUNKED_OPS else c)
                size <<= 1
            numels += [c * n for c in odd] if op in CHUNKED_OPS else odd
            for numel in sorted(set(numels)):
                cases.append(Case(op, dt, numel, n))
    return cases
