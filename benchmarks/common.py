"""Shared machinery of ``bench.py`` and ``compare.py``: cases, buffers, timing, reporting.

Everything that decides *what* a number means lives here, once:

* **Cases** (:class:`Case`): one collective (``op``) on ``numel`` elements of one dtype in
  a world of ``world_size`` ranks.  ``size`` is the full buffer in the nccl-tests
  convention (the all_reduce / broadcast buffer, the reduce_scatter input, the all_gather
  output, each rank's all_to_all buffer); ``count`` is ``size / itemsize``.
* **Data** (:class:`CaseBuffers`): every rank's input is a deterministic, integer-valued
  function of (rank, position) -- ``pattern[i mod P] * s_r + t_r`` with a random pattern
  of small integers and a prime period P -- so every rank can compute every rank's input,
  and therefore the exact expected output, without communication.  Values stay within
  +-64 for world sizes up to 8 (exact in bfloat16, whatever the summation order), so a
  result is either bit-exact or wrong.  This expected output is what gloo's result on the
  same inputs is; checking gloo against it too makes gloo's own ``#wrong`` meaningful.
* **Timing** (:func:`measure_case`): backends run in the same processes on the same
  buffers, alternating per iteration (the order flips every round so neither backend
  always goes first).  Each timed op follows a barrier of *its own* backend, so no other
  backend's threads are still finishing in it, and nothing else runs between ops:
  outputs are verified in rounds of their own (the warm-up rounds and one after the
  timed ones), not between timed ops.  Where all ranks read one monotonic clock (one
  kernel), an op's time runs from the last rank's start to the last rank's end, so the
  barrier's exit skew is not charged to it; elsewhere it is the slowest rank's own
  duration.  The reported time is the median over iterations, whose number adapts to
  the cost of a warm-up round so that every case is bounded in time.
* **Bandwidth** (:func:`bus_factor`): algbw = size / time, busbw = algbw x factor with
  the nccl-tests factors (allreduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all
  (n-1)/n; broadcast 1).
* **Reporting** (:class:`TableFormatter`), the TCP ceiling probe (:func:`tcp_probe`),
  machine facts and backend availability.
"""
from __future__ import annotations

import datetime
import math
import os
import platform
import re
import socket
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

# --------------------------------------------------------------------------------------
# Ops, dtypes, sizes
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
    "ar": "all_reduce", "allreduce": "all_reduce",
    "rs": "reduce_scatter_tensor", "reduce_scatter": "reduce_scatter_tensor",
    "reducescatter": "reduce_scatter_tensor",
    "ag": "all_gather_into_tensor", "all_gather": "all_gather_into_tensor",
    "allgather": "all_gather_into_tensor",
    "bc": "broadcast", "bcast": "broadcast",
    "a2a": "all_to_all_single", "all_to_all": "all_to_all_single", "alltoall": "all_to_all_single",
}

#: Ops whose buffer is split into ``world_size`` equal chunks (numel must divide).
CHUNKED_OPS = frozenset({"reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single"})

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
    "f32": "float32", "float": "float32", "fp32": "float32",
    "bf16": "bfloat16", "f16": "float16", "fp16": "float16", "half": "float16",
    "f64": "float64", "double": "float64", "fp64": "float64",
}

#: Root of the broadcast case.
BROADCAST_ROOT = 0


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
          "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


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


def parse_bytes(text: str) -> int:
    """Parse a byte count such as ``4096``, ``1K``, ``1KiB``, ``256MiB``, ``1G`` (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot parse size {text!r} (examples: 4096, 1KiB, 4M, 256MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n: int) -> str:
    """Human form of a byte count: ``1 KiB``, ``4 MiB``, ``1000 B``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.2f} KiB"
    return f"{n} B"


def parse_rate(text: str) -> int:
    """Parse a link rate in tc's notation (``1gbit``, ``100mbit``, ``2.5gbit``, ``500kbit``) to bit/s."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|bps)?\s*", text.lower())
    if not m:
        raise ValueError(f"cannot parse rate {text!r} (examples: 1gbit, 100mbit, 10gbit)")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    bits = float(m.group(1)) * scale
    if m.group(3) == "bps":  # tc's "bps" means bytes per second
        bits *= 8
    if bits < 8000:
        raise ValueError(f"rate {text!r} is too low to be useful")
    return int(bits)


def format_rate(bits_per_s: int) -> str:
    """``1000000000`` -> ``1gbit`` (tc notation)."""
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits_per_s % scale == 0:
            return f"{bits_per_s // scale}{unit}"
    return f"{bits_per_s}bit"


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
        return torch.empty((), dtype=DTYPES[self.dtype]).element_size()

    @property
    def size_bytes(self) -> int:
        """The nccl-tests ``size``: bytes of the full buffer."""
        return self.numel * self.itemsize

    @property
    def chunk(self) -> int:
        """Elements per rank for the chunked ops (the buffer split in world_size parts)."""
        return self.numel // self.world_size if self.op in CHUNKED_OPS else self.numel

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


def sweep_cases(ops: Sequence[str], dtypes: Sequence[str], world_size: int,
                min_bytes: int, max_bytes: int) -> List[Case]:
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
            item = torch.empty((), dtype=DTYPES[dt]).element_size()
            seen = set()
            for size in sizes:
                numel = max(1, size // item)
                if op in CHUNKED_OPS:
                    numel = max(world_size, (numel // world_size) * world_size)
                if numel not in seen:
                    seen.add(numel)
                    cases.append(Case(op, dt, numel, world_size))
    return cases


def check_cases(ops: Sequence[str], dtypes: Sequence[str], world_size: int,
                max_bytes: int = 64 << 10) -> List[Case]:
    """The ``--check`` set: 1 KiB .. ``max_bytes`` plus odd counts (0, 1, n-1, n+1, 1000, ~1M).

    For the chunked ops the odd counts are per-rank counts (total = count * n); for
    all_reduce / broadcast they are totals, so chunking remainders are exercised.  The
    ~1M-element case is large enough to span several pipeline segments of a ring.
    """
    n = world_size
    cases: List[Case] = []
    for op in ops:
        for dt in dtypes:
            item = torch.empty((), dtype=DTYPES[dt]).element_size()
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


# --------------------------------------------------------------------------------------
# Deterministic integer data and exact expected results
# --------------------------------------------------------------------------------------

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
            dist.broadcast(self.input, src=_group_src(group, BROADCAST_ROOT), group=group)
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
        wrong = _count_diff(self.result(), self.expected)
        if not self.inplace and self.pristine is not None:
            clobbered = _count_diff(self.input, self.pristine)
            if clobbered:
                self.input.copy_(self.pristine)
            wrong += clobbered
        return wrong


def _count_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    if a.numel() == 0 or torch.equal(a, b):
        return 0
    return int(torch.count_nonzero(a != b).item())


def _group_src(group: Any, group_rank: int) -> int:
    """Global rank of ``group_rank`` in ``group`` (broadcast's ``src`` is a global rank)."""
    if group is None or group is dist.group.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


# --------------------------------------------------------------------------------------
# Timing
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


@dataclass
class BackendResult:
    """One backend's figures for one case (times already reduced with MAX over ranks)."""

    label: str
    time_us: Optional[float] = None     # median over iterations
    time_min_us: Optional[float] = None
    time_max_us: Optional[float] = None
    algbw_GBps: Optional[float] = None
    busbw_GBps: Optional[float] = None
    wrong: int = 0                      # summed over ranks (worst iteration of each rank)
    iters: int = 0
    differs_from_baseline: Optional[int] = None  # only with cross_check
    error: Optional[str] = None


@dataclass
class CaseResult:
    """All backends' figures for one case."""

    case: Case
    backends: Dict[str, BackendResult] = field(default_factory=dict)
    # Per-label case where the labels ran different dtypes of one size (--pair-dtypes).
    variants: Dict[str, Case] = field(default_factory=dict)

    def to_records(self, link_GBps: Optional[float] = None,
                   ceiling_GBps: Optional[float] = None) -> List[Dict[str, Any]]:
        """Flat rows (one per backend) for CSV/JSON; with an emulated link, busbw as a
        fraction of its rate and of the TCP ring ceiling the probe measured on it."""
        rows = []
        for label, r in self.backends.items():
            case = self.variants.get(label, self.case)
            row: Dict[str, Any] = {
                "world_size": case.world_size, "op": case.op, "dtype": case.dtype,
                "size_bytes": case.size_bytes, "count": case.numel,
                "redop": case.redop, "backend": label,
            }
            fields = asdict(r)
            fields.pop("label")
            row.update(fields)
            row["busbw_link_fraction"] = _fraction(r.busbw_GBps, link_GBps)
            row["busbw_probe_fraction"] = _fraction(r.busbw_GBps, ceiling_GBps)
            rows.append(row)
        return rows


def _fraction(value: Optional[float], of: Optional[float]) -> Optional[float]:
    return value / of if of and value is not None else None


def _allreduce(values: Sequence[float], op: Any, group: Any, dtype: torch.dtype = torch.float64) -> List[float]:
    t = torch.tensor(list(values), dtype=dtype)
    if t.numel():
        dist.all_reduce(t, op=op, group=group)
    return t.tolist()


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


def ranks_share_clock(group: Any) -> bool:
    """True when every rank of ``group`` reads the same monotonic clock (collective)."""
    ids: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(ids, clock_identity(), group=group)
    return bool(ids[0]) and all(i == ids[0] for i in ids)


def op_times_ns(spans: torch.Tensor, n_ops: int, shared_clock: bool) -> torch.Tensor:
    """Time per op of each timed iteration, from ``spans[..., (start, end, end - start)]``
    already reduced with MAX over ranks.

    With a shared clock: from the last rank's start to the last rank's end -- how long
    the collective took once every rank had called it.  Without one, starts cannot be
    compared across ranks: the slowest rank's own duration, which also counts the time
    it waited for ranks that left the barrier later.
    """
    if shared_clock:
        return (spans[..., 1] - spans[..., 0]) / n_ops
    return spans[..., 2] / n_ops


def _barrier(group: Any, device: torch.device) -> None:
    # device_ids names the GPU for nccl; the other backends ignore it.
    dist.barrier(group=group, device_ids=[device.index or 0] if device.type == "cuda" else None)


def measure_case(bufs: Union[CaseBuffers, Mapping[str, CaseBuffers]], groups: Mapping[str, Any], ref_group: Any,
                 policy: IterationPolicy, *, sync: Callable[[], None] = lambda: None,
                 cross_check: bool = False, baseline: Optional[str] = None,
                 shared_clock: bool) -> CaseResult:
    """Time ``bufs.case`` on every backend of ``groups``, alternating, and verify results.

    ``bufs`` may also map each label of ``groups`` to its own buffers: cases of one size
    in bytes and different dtypes, measured side by side (``--pair-dtypes``).
    Must be called by every rank of ``ref_group`` (a gloo group spanning the same ranks)
    with the same arguments.  A backend whose op raises is skipped for the rest of the
    case and reported with its error (this stays consistent across ranks when the error
    is a validation error raised on every rank; anything else ends in the group timeout).
    With ``cross_check`` the first round's outputs of each backend are also compared with
    ``baseline``'s (``differs_from_baseline``).  ``shared_clock`` (:func:`ranks_share_clock`,
    asked once per group) chooses how op times are taken (:func:`op_times_ns`).
    """
    labels = list(groups)
    per: Mapping[str, CaseBuffers] = bufs if isinstance(bufs, Mapping) else {lb: bufs for lb in labels}
    case = per[labels[0]].case
    assert all(b.case.size_bytes == case.size_bytes and b.case.op == case.op for b in per.values()), \
        "paired cases must have one op and one size in bytes (list the widest dtype first)"
    failed: Dict[str, str] = {}
    wrong = {lb: 0 for lb in labels}
    spans: Dict[str, List[Tuple[int, int, int]]] = {lb: [] for lb in labels}
    snapshots: Dict[str, torch.Tensor] = {}

    def one_round(index: int, timed: bool, verify: bool, snapshot: bool) -> None:
        order = labels if index % 2 == 0 else labels[::-1]
        for lb in order:
            if lb in failed:
                continue
            b = per[lb]
            if verify or b.inplace:
                b.reset()  # sentinels matter only to a check; an in-place input must be restored
            sync()
            _barrier(groups[lb], b.device)
            n_ops = policy.batch if timed else 1
            t0 = time.perf_counter_ns()
            try:
                for _ in range(n_ops):
                    b.run(groups[lb])
                sync()
            except Exception as e:  # noqa: BLE001 - reported in the table
                failed[lb] = _one_line(e)
                continue
            t1 = time.perf_counter_ns()
            if timed:
                spans[lb].append((t0, t1, t1 - t0))
            if verify:
                wrong[lb] = max(wrong[lb], b.count_wrong())
            if snapshot:
                snapshots[lb] = b.result().clone()

    rounds = 0
    last_round_s = 0.0
    for w in range(policy.warmup):
        t = time.perf_counter()
        one_round(rounds, timed=False, verify=True, snapshot=cross_check and rounds == 0)
        rounds += 1
        last_round_s = _allreduce([time.perf_counter() - t], dist.ReduceOp.MAX, ref_group)[0]
        if policy.case_time_s > 0 and last_round_s >= policy.case_time_s / 2:
            break
    if rounds and last_round_s > 0:
        iters = int(math.ceil(policy.case_time_s / (last_round_s * policy.batch)))
    else:
        iters = policy.iters_min
    iters = max(policy.iters_min, min(policy.iters_max, iters))
    for i in range(iters):
        one_round(rounds, timed=True, verify=policy.verify_timed, snapshot=cross_check and rounds == 0)
        rounds += 1
    if not policy.verify_timed:
        one_round(rounds, timed=False, verify=True, snapshot=False)  # what the timed ops left behind

    # Agree on failures, wrong counts and times (MAX over ranks per iteration).
    nb = len(labels)
    flags = _allreduce([1.0 if lb in failed else 0.0 for lb in labels], dist.ReduceOp.MAX, ref_group)
    wrong_sum = _allreduce([float(wrong[lb]) for lb in labels], dist.ReduceOp.SUM, ref_group)
    smat = torch.zeros(nb, iters, 3, dtype=torch.int64)
    for k, lb in enumerate(labels):
        if lb not in failed and len(spans[lb]) == iters:
            smat[k] = torch.tensor(spans[lb], dtype=torch.int64)
    dist.all_reduce(smat, op=dist.ReduceOp.MAX, group=ref_group)
    tmat = op_times_ns(smat, policy.batch, shared_clock)
    diffs: Optional[List[float]] = None
    if cross_check:
        base = baseline if baseline in snapshots else None
        local = []
        for lb in labels:
            if base is None or lb not in snapshots:
                local.append(-1.0)
            else:
                local.append(float(_count_diff(snapshots[lb], snapshots[base])))
        lows = _allreduce(local, dist.ReduceOp.MIN, ref_group)
        sums = _allreduce([max(0.0, v) for v in local], dist.ReduceOp.SUM, ref_group)
        diffs = [s if lo >= 0 else -1.0 for s, lo in zip(sums, lows)]

    result = CaseResult(case, variants={lb: b.case for lb, b in per.items()} if isinstance(bufs, Mapping) else {})
    factor = bus_factor(case.op, case.world_size)
    for k, lb in enumerate(labels):
        r = BackendResult(label=lb, wrong=int(wrong_sum[k]), iters=iters)
        if flags[k] > 0:
            r.error = failed.get(lb, "failed on another rank")
        else:
            us = [v / 1e3 for v in tmat[k].tolist()]
            r.time_us = statistics.median(us)
            r.time_min_us, r.time_max_us = min(us), max(us)
            if r.time_us > 0:
                r.algbw_GBps = case.size_bytes / (r.time_us * 1e-6) / 1e9
                r.busbw_GBps = r.algbw_GBps * factor
        if diffs is not None and diffs[k] >= 0:
            r.differs_from_baseline = int(diffs[k])
        result.backends[lb] = r
    return result


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    s = text[0] if text else type(e).__name__
    return s if len(s) <= limit else s[: limit - 3] + "..."


# --------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------


def is_registered(name: str) -> bool:
    """Whether torch.distributed knows the backend name (built-in or plugin)."""
    return name.lower() in ("gloo", "nccl", "mpi", "ucc", "xccl") or hasattr(dist.Backend, name.upper())


def ensure_registered(name: str) -> bool:
    """Make ``name`` usable with ``new_group``/``init_process_group``.

    Plugins are expected to register through their ``torch.backends`` entry point when
    torch is imported; if that did not happen, import the package of the same name.
    Returns True if an explicit import was needed.
    """
    if is_registered(name):
        return False
    import importlib

    importlib.import_module(name)
    if not is_registered(name):
        raise RuntimeError(f"importing {name!r} did not register a torch.distributed backend {name!r}")
    return True


def backend_status(name: str, device: str) -> Tuple[bool, str]:
    """(usable, description) for a backend name on this machine, without creating a group."""
    try:
        if name == "gloo":
            return dist.is_gloo_available(), "built into torch"
        if name == "nccl":
            ok = dist.is_nccl_available() and torch.cuda.is_available()
            ver = ".".join(map(str, torch.cuda.nccl.version())) if ok else "n/a"
            return ok, f"NCCL {ver}" if ok else "needs CUDA"
        explicit = ensure_registered(name)
        how = "registered by `import`" if explicit else "registered by entry point"
        if name == "ringpg":
            from ringpg._loader import load_extension  # type: ignore[import-not-found]

            load_extension()  # imports ringpg._C after its torch-version check
            import ringpg  # type: ignore[import-not-found]

            return True, f"ringpg {getattr(ringpg, '__version__', '?')} ({how}, _C loaded)"
        return True, how
    except Exception as e:  # noqa: BLE001 - described to the user
        return False, _one_line(e)


def transport_of(group: Any, device: str) -> Optional[str]:
    """How a live group moves its ring traffic, for backends that say (ringpg: shm or tcp)."""
    try:
        import ringpg  # type: ignore[import-not-found]

        b = ringpg.backend(group, device)
    except Exception:  # noqa: BLE001 - ringpg absent or unloadable: not a ringpg group
        return None
    return b.transport if b is not None else None


def unique_labels(names: Sequence[str]) -> List[str]:
    """Labels for the backend list: duplicates get ``#1``, ``#2`` (e.g. ``gloo,gloo``)."""
    counts: Dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    seen: Dict[str, int] = {}
    out = []
    for n in names:
        if counts[n] > 1:
            seen[n] = seen.get(n, 0) + 1
            out.append(f"{n}#{seen[n]}")
        else:
            out.append(n)
    return out


def pick_baseline(labels: Sequence[str], wanted: str = "gloo") -> str:
    """The label ratios are taken against: ``wanted`` if present, else the last label."""
    return wanted if wanted in labels else labels[-1]


# --------------------------------------------------------------------------------------
# Machine facts
# --------------------------------------------------------------------------------------


def default_tcp_congestion() -> str:
    """The TCP congestion control this process's network namespace gives a new socket
    (gloo's always, ringpg's unless RINGPG_TCP_CONGESTION is set)."""
    try:
        with socket.socket() as s:
            return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()
    except (OSError, AttributeError):  # not Linux
        return "unknown"


def machine_facts(backends: Mapping[str, str], device: str, extra: Optional[Mapping[str, str]] = None
                  ) -> Dict[str, str]:
    """Facts printed first by every run: nproc, CPU, memory, torch, backends."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        model = platform.processor() or "unknown"
    mem = "unknown"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    facts = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "nproc": f"{usable} (os.cpu_count {os.cpu_count()})",
        "cpu": model,
        "memory": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device if device == "cpu" else f"{device} ({torch.cuda.get_device_name()})",
    }
    try:
        load1 = os.getloadavg()[0]
        facts["load"] = f"{load1:.2f} (1-min average)"
        if load1 > 0.5 * max(1, usable):
            facts["load"] += " -- WARNING: other processes compete for the cores; timings are unreliable"
    except OSError:
        pass
    facts["backends"] = "; ".join(f"{k}: {v}" for k, v in backends.items())
    facts["tcp cc"] = f"{default_tcp_congestion()} (what a socket gets unless it chooses)"
    knobs = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("RINGPG_"))
    facts["settings"] = " ".join(knobs) if knobs else "(no RINGPG_* variable set: defaults)"
    if extra:
        facts.update(extra)
    return facts


def format_facts(facts: Mapping[str, str]) -> str:
    width = max(len(k) for k in facts)
    return "\n".join(f"# {k:<{width}} : {v}" for k, v in facts.items())


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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


# --------------------------------------------------------------------------------------
# TCP ceiling probe
# --------------------------------------------------------------------------------------


def _stream(sock: socket.socket, seconds: float, chunk: memoryview) -> None:
    """Send ``chunk`` repeatedly for ``seconds``, then half-close."""
    deadline = time.perf_counter() + seconds
    try:
        while time.perf_counter() < deadline:
            sock.sendall(chunk)
    finally:
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _drain(sock: socket.socket, buf: bytearray) -> float:
    """Receive until EOF; return bytes/s from the first byte to EOF."""
    view = memoryview(buf)
    total = 0
    start: Optional[float] = None
    while True:
        n = sock.recv_into(view)
        if n == 0:
            break
        if start is None:
            start = time.perf_counter()
        total += n
    end = time.perf_counter()
    return total / (end - start) if start is not None and end > start else 0.0


def tcp_probe(rank: int, bind_addr: str, group: Any, seconds: float = 1.0,
              chunk_bytes: int = 1 << 20) -> Optional[Dict[str, float]]:
    """Raw TCP throughput between ranks 0 and 1 over the path the backends use.

    Collective over ``group`` (gloo; every rank calls it; ranks >= 2 only wait).  Phase 1:
    rank 1 streams to rank 0 on one socket (one direction).  Phase 2: both stream at once
    on one socket (both directions), each side measuring what it receives.  Returns, on
    rank 0, ``{"one_direction_GBps", "both_directions_each_GBps", "both_directions_total_GBps"}``.
    """
    ws = dist.get_world_size(group)
    if ws < 2:
        return None
    srv: Optional[socket.socket] = None
    port = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((bind_addr, 0))
        srv.listen(2)
        srv.settimeout(60)
        port[0] = srv.getsockname()[1]
    dist.broadcast(port, src=_group_src(group, 0), group=group)
    results = torch.zeros(3, dtype=torch.float64)
    buf = bytearray(chunk_bytes)
    payload = memoryview(bytes(chunk_bytes))
    error = torch.zeros(1)
    try:
        for phase in (1, 2):
            dist.barrier(group=group)
            conn: Optional[socket.socket] = None
            try:
                if rank == 0:
                    assert srv is not None
                    conn, _ = srv.accept()
                elif rank == 1:
                    conn = socket.create_connection((bind_addr, int(port[0])), timeout=60)
                if conn is not None:
                    conn.settimeout(seconds + 60)
                    if phase == 1:
                        if rank == 1:
                            _stream(conn, seconds, payload)
                            conn.recv(1)  # wait for rank 0's close
                        else:
                            results[0] = _drain(conn, buf)
                    else:
                        sender = threading.Thread(target=_stream, args=(conn, seconds, payload), daemon=True)
                        sender.start()
                        results[1 + rank] = _drain(conn, buf)
                        sender.join(timeout=seconds + 60)
            except OSError as e:
                print(f"# tcp probe (rank {rank}, phase {phase}) failed: {e}", file=sys.stderr)
                error[0] = 1
            finally:
                if conn is not None:
                    conn.close()
    finally:
        if srv is not None:
            srv.close()
    dist.all_reduce(results, group=group)
    dist.all_reduce(error, op=dist.ReduceOp.MAX, group=group)
    if rank != 0 or error[0] > 0:
        return None
    one, a, b = (float(x) / 1e9 for x in results)
    return {"one_direction_GBps": one, "both_directions_each_GBps": (a + b) / 2,
            "both_directions_total_GBps": a + b, "seconds_per_phase": seconds}


def _local_address_towards(addr: str) -> str:
    """This host's address on the route to ``addr`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        return str(s.getsockname()[0])


def tcp_ring_probe(rank: int, master_addr: str, group: Any, seconds: float = 1.0,
                   chunk_bytes: int = 1 << 20) -> Optional[Dict[str, float]]:
    """Raw TCP ring: every rank streams to rank + 1 and drains rank - 1, all at once.

    The ceiling of a ring collective on this path: all links busy in the same direction,
    as in a ring's steady state, and a ring moves at the pace of its slowest link.
    Collective over ``group``; returns, on rank 0, ``{"ring_slowest_GBps",
    "ring_mean_GBps"}`` (what each rank received per second).
    """
    ws = dist.get_world_size(group)
    if ws < 2:
        return None
    me = dist.get_rank(group)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    rate = torch.zeros(ws, dtype=torch.float64)
    error = torch.zeros(1)
    tx: Optional[socket.socket] = None
    rx: Optional[socket.socket] = None
    try:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((_local_address_towards(master_addr), 0))
        srv.listen(1)
        srv.settimeout(60)
        addrs: List[Any] = [None] * ws
        dist.all_gather_object(addrs, srv.getsockname(), group=group)
        try:
            # Connect first (the backlog holds it), then accept the left neighbour.
            tx = socket.create_connection(tuple(addrs[(me + 1) % ws]), timeout=60)
            rx, _ = srv.accept()
            for sock in (tx, rx):
                sock.settimeout(seconds + 60)
        except OSError as e:
            print(f"# tcp ring probe (rank {rank}) failed to connect: {e}", file=sys.stderr)
            error[0] = 1
        dist.all_reduce(error, op=dist.ReduceOp.MAX, group=group)
        if error[0] == 0 and tx is not None and rx is not None:
            dist.barrier(group=group)
            sender = threading.Thread(target=_stream, args=(tx, seconds, memoryview(bytes(chunk_bytes))), daemon=True)
            sender.start()
            rate[me] = _drain(rx, bytearray(chunk_bytes))
            sender.join(timeout=seconds + 60)
    finally:
        for sock in (tx, rx, srv):
            if sock is not None:
                sock.close()
    dist.all_reduce(rate, group=group)
    if rank != 0 or error[0] > 0:
        return None
    return {"ring_slowest_GBps": float(rate.min()) / 1e9, "ring_mean_GBps": float(rate.mean()) / 1e9}


def format_probe(probe: Optional[Mapping[str, float]], path: str, link_GBps: Optional[float] = None) -> str:
    """The ceiling lines printed next to the table."""
    if not probe:
        return "# TCP ceiling probe: not run"
    s = (f"# TCP ceiling ({path}, raw sockets, rank 0 <-> rank 1): "
         f"one direction {probe['one_direction_GBps']:.3f} GB/s; "
         f"both directions on one socket {probe['both_directions_each_GBps']:.3f} GB/s each way "
         f"({probe['both_directions_total_GBps']:.3f} GB/s total)")
    if "ring_slowest_GBps" in probe:
        s += (f"\n# TCP ring ceiling (every rank streams to the next at once): slowest link "
              f"{probe['ring_slowest_GBps']:.3f} GB/s, mean {probe['ring_mean_GBps']:.3f} GB/s")
    if link_GBps:
        s += (f"\n# emulated link rate {link_GBps:.4f} GB/s per direction; probe reaches "
              f"{probe['one_direction_GBps'] / link_GBps:.0%} one way, "
              f"{probe['both_directions_each_GBps'] / link_GBps:.0%} each way both ways")
        if "ring_slowest_GBps" in probe:
            s += f", {probe['ring_slowest_GBps'] / link_GBps:.1%} on the slowest link of a ring"
    return s


# --------------------------------------------------------------------------------------
# Table
# --------------------------------------------------------------------------------------


class TableFormatter:
    """nccl-tests style rows: size, count, type, op, redop | per backend time algbw busbw #wrong
    [busbw/link [busbw/ring probe]] | ratio per non-baseline backend (= baseline time / backend time, which is
    also backend busbw / baseline busbw)."""

    def __init__(self, labels: Sequence[str], baseline: str, link_GBps: Optional[float] = None,
                 ceiling_GBps: Optional[float] = None) -> None:
        self.labels = list(labels)
        self.baseline = baseline
        self.others = [lb for lb in self.labels if lb != baseline]
        self.link = link_GBps
        # %probe: busbw against the TCP ring ceiling measured on the emulated links.
        self.ceiling = ceiling_GBps if link_GBps else None
        self.bw = 37 + (7 if self.link else 0) + (7 if self.ceiling else 0)

    def _extra(self, link: str, probe: str) -> str:
        return (f" {link:>6}" if self.link else "") + (f" {probe:>6}" if self.ceiling else "")

    def header(self) -> str:
        left = f"{'':>12} {'':>12} {'':>9} {'':>22} {'':>5}"
        groups = "".join(f"  {lb:^{self.bw}}" for lb in self.labels)
        ratio_names = "".join(f" {lb + '/' + self.baseline:>13}" for lb in self.others)
        l1 = f"#{left[1:]}{groups}{'  busbw ratio' if self.others else ''}"
        col = f"  {'time':>9} {'algbw':>8} {'busbw':>8} {'#wrong':>7}" + self._extra("%link", "%probe")
        unit = f"  {'(us)':>9} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}" + self._extra("", "")
        l2 = f"#{'size':>11} {'count':>12} {'type':>9} {'op':>22} {'redop':>5}" + col * len(self.labels) + ratio_names
        l3 = f"#{'(B)':>11} {'(elements)':>12} {'':>9} {'':>22} {'':>5}" + unit * len(self.labels) + \
            "".join(f" {'(=time ratio)':>13}" for _ in self.others)
        return "\n".join([l1, l2, l3])

    def row(self, res: CaseResult) -> str:
        c = res.case
        paired = len({v.dtype for v in res.variants.values()}) > 1
        # Paired dtypes: the count is the first label's, the type column says "paired".
        s = f"{c.size_bytes:>12} {c.numel:>12} {'paired' if paired else c.dtype:>9} {c.op:>22} {c.redop:>5}"
        for lb in self.labels:
            r = res.backends.get(lb)
            if r is None or r.error is not None or r.time_us is None:
                s += f"  {'ERR':>9} {'-':>8} {'-':>8} {r.wrong if r else '-':>7}" + self._extra("-", "-")
                continue
            s += f"  {r.time_us:>9.1f} {r.algbw_GBps or 0:>8.3f} {r.busbw_GBps or 0:>8.3f} {r.wrong:>7}"
            busbw = r.busbw_GBps or 0
            s += self._extra(f"{busbw / self.link:.1%}" if self.link else "",
                             f"{busbw / self.ceiling:.1%}" if self.ceiling else "")
        base = res.backends.get(self.baseline)
        for lb in self.others:
            r = res.backends.get(lb)
            if base and r and base.time_us and r.time_us and base.error is None and r.error is None:
                s += f" {base.time_us / r.time_us:>12.2f}x"
            else:
                s += f" {'-':>13}"
        return s

    def errors(self, res: CaseResult) -> List[str]:
        return [f"#   ! {lb}: {r.error}" for lb, r in res.backends.items() if r.error]


class Progress:
    """One-line progress on stderr (rewritten in place on a terminal, plain lines otherwise)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self._shown = False

    def update(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            sys.stderr.write("\r\033[K" + text)
            self._shown = True
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def clear(self) -> None:
        if self.enabled and self.tty and self._shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self._shown = False


def emit(line: str, progress: Optional[Progress] = None) -> None:
    """Print a table line on stdout without garbling a progress line on the same terminal."""
    if progress is not None:
        progress.clear()
    print(line, flush=True)


def default_threads(world_size: int) -> int:
    """Intra-op threads per rank so that ranks do not oversubscribe the cores."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, world_size))


