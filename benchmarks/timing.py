"""How a case is timed: backends alternating on the same buffers, and the figures they make.

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
* **Figures** (:class:`CaseResult`, :class:`BackendResult`): time, algbw and busbw
  (:func:`benchmarks.cases.bus_factor`) and wrong elements per backend, agreed over ranks.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from benchmarks.backends import one_line
from benchmarks.cases import Case, bus_factor
from benchmarks.data import CaseBuffers, count_diff

# IterationPolicy and clock_identity are torch-free, shared with the MPI peers; offered here too.
from benchmarks.protocol import IterationPolicy, clock_identity  # noqa: F401
from benchmarks.vllm_shm import is_vllm


@dataclass
class BackendResult:
    """One backend's figures for one case (times already reduced with MAX over ranks)."""

    label: str
    time_us: Optional[float] = None  # median over iterations
    time_min_us: Optional[float] = None
    time_max_us: Optional[float] = None
    algbw_GBps: Optional[float] = None
    busbw_GBps: Optional[float] = None
    wrong: int = 0  # summed over ranks (worst iteration of each rank)
    iters: int = 0
    differs_from_baseline: Optional[int] = None  # only with cross_check
    error: Optional[str] = None
    skipped: Optional[str] = None  # why this backend did not run the case (an MPI peer's missing dtype)


@dataclass
class CaseResult:
    """All backends' figures for one case."""

    case: Case
    backends: Dict[str, BackendResult] = field(default_factory=dict)
    # Per-label case where the labels ran different dtypes of one size (--pair-dtypes).
    variants: Dict[str, Case] = field(default_factory=dict)

    def to_records(
        self, link_GBps: Optional[float] = None, ceiling_GBps: Optional[float] = None
    ) -> List[Dict[str, Any]]:
        """Flat rows (one per backend) for CSV/JSON; with an emulated link, busbw as a
        fraction of its rate and of the TCP ring ceiling the probe measured on it."""
        rows = []
        for label, r in self.backends.items():
            case = self.variants.get(label, self.case)
            row: Dict[str, Any] = {
                "world_size": case.world_size,
                "op": case.op,
                "dtype": case.dtype,
                "size_bytes": case.size_bytes,
                "count": case.numel,
                "redop": case.redop,
                "backend": label,
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
    if is_vllm(group):
        group.barrier()  # its own: vLLM's allreduce of one element
        return
    # device_ids names the GPU for nccl; the other backends ignore it.
    dist.barrier(group=group, device_ids=[device.index or 0] if device.type == "cuda" else None)


def measure_case(
    bufs: Union[CaseBuffers, Mapping[str, CaseBuffers]],
    groups: Mapping[str, Any],
    ref_group: Any,
    policy: IterationPolicy,
    *,
    sync: Callable[[], None] = lambda: None,
    cross_check: bool = False,
    baseline: Optional[str] = None,
    shared_clock: bool,
    unverified: Sequence[str] = (),
) -> CaseResult:
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
    Labels in ``unverified`` are timed only: their outputs are never checked (torch's
    floor, which moves nothing).
    """
    per: Mapping[str, CaseBuffers] = bufs if isinstance(bufs, Mapping) else {lb: bufs for lb in groups}
    case = per[next(iter(groups))].case
    # Columns without this case (vLLM's: VllmShm.cannot), the same on every rank.
    skipped = {lb: why for lb, g in groups.items() if is_vllm(g) and (why := g.cannot(case.op, per[lb].case.dtype))}
    labels = [lb for lb in groups if lb not in skipped]
    assert all(b.case.size_bytes == case.size_bytes and b.case.op == case.op for b in per.values()), (
        "paired cases must have one op and one size in bytes (list the widest dtype first)"
    )
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
            if verify or b.inplace or b.fresh:
                b.reset(verify)  # sentinels matter only to a check; an in-place input must be restored
            sync()
            _barrier(groups[lb], b.device)
            n_ops = policy.batch if timed else 1
            t0 = time.perf_counter_ns()
            try:
                for _ in range(n_ops):
                    b.run(groups[lb])
                sync()
            except Exception as e:  # noqa: BLE001 - reported in the table
                failed[lb] = one_line(e)
                continue
            t1 = time.perf_counter_ns()
            if timed:
                spans[lb].append((t0, t1, t1 - t0))
            if verify and lb not in unverified:
                wrong[lb] = max(wrong[lb], b.count_wrong())
            if snapshot and lb not in unverified:
                snapshots[lb] = b.result().clone()

    rounds = 0
    last_round_s = 0.0
    for _ in range(policy.warmup):
        t = time.perf_counter()
        one_round(rounds, timed=False, verify=True, snapshot=cross_check and rounds == 0)
        rounds += 1
        last_round_s = _allreduce([time.perf_counter() - t], dist.ReduceOp.MAX, ref_group)[0]
        if policy.warmup_done(last_round_s):
            break
    iters = policy.timed_iterations(rounds, last_round_s)
    for _ in range(iters):
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
    diffs: Optional[List[float]] = None
    if cross_check:
        base = baseline if baseline in snapshots else None
        local = []
        for lb in labels:
            if base is None or lb not in snapshots:
                local.append(-1.0)
            else:
                local.append(float(count_diff(snapshots[lb], snapshots[base])))
        lows = _allreduce(local, dist.ReduceOp.MIN, ref_group)
        sums = _allreduce([max(0.0, v) for v in local], dist.ReduceOp.SUM, ref_group)
        diffs = [s if lo >= 0 else -1.0 for s, lo in zip(sums, lows)]

    result = CaseResult(case, variants={lb: b.case for lb, b in per.items()} if isinstance(bufs, Mapping) else {})
    for k, lb in enumerate(labels):
        r = backend_result(
            lb,
            case,
            smat[k],
            int(wrong_sum[k]),
            policy.batch,
            shared_clock,
            error=failed.get(lb, "failed on another rank") if flags[k] > 0 else None,
        )
        if diffs is not None and diffs[k] >= 0:
            r.differs_from_baseline = int(diffs[k])
        result.backends[lb] = r
    for lb, why in skipped.items():
        result.backends[lb] = BackendResult(label=lb, skipped=why)
    return result


def backend_result(
    label: str, case: Case, spans: torch.Tensor, wrong: int, batch: int, shared_clock: bool, error: Optional[str] = None
) -> BackendResult:
    """One backend's figures for ``case`` from its timed iterations' ``spans`` (``iters x (start, end,
    end - start)`` in ns, already reduced with MAX over ranks; :func:`op_times_ns`): the median,
    min and max time per op, algbw and busbw (:func:`benchmarks.cases.bus_factor`).  The bench's
    groups and the MPI peers (``benchmarks.peers``) both report through here."""
    r = BackendResult(label=label, wrong=wrong, iters=int(spans.shape[0]))
    if error is not None:
        r.error = error
        return r
    us = [v / 1e3 for v in op_times_ns(spans, batch, shared_clock).tolist()]
    if not us:
        r.error = "no timed iteration"
        return r
    r.time_us = statistics.median(us)
    r.time_min_us, r.time_max_us = min(us), max(us)
    if r.time_us > 0:
        r.algbw_GBps = case.size_bytes / (r.time_us * 1e-6) / 1e9
        r.busbw_GBps = r.algbw_GBps * bus_factor(case.op, case.world_size)
    return r
