"""Checking results: exact comparisons recorded per rank, and reported together.

Value mismatches are *not* exceptions in the workers: they are recorded in a
:class:`Checker` so every rank finishes every case (no rank blocks waiting for a
peer that stopped), and the parent reports all of them with
:func:`assert_reports_ok`.  :func:`smoke_checks` is a short battery of every
collective for tests where *that* a group works matters more than every case.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from devkit.groups import global_rank

from .data import data_kind, dtype_name, make_data, reduce_op
from .references import ref_all_gather, ref_all_reduce, ref_broadcast, ref_reduce_scatter, sentinel_like


def describe_mismatch(got: torch.Tensor, expected: torch.Tensor, max_items: int = 4) -> Optional[str]:
    """None if ``got`` equals ``expected`` exactly (dtype, shape, values); else a description."""
    if not isinstance(got, torch.Tensor):
        return f"got a {type(got).__name__}, expected a tensor"
    if got.dtype != expected.dtype or tuple(got.shape) != tuple(expected.shape):
        return f"got dtype={got.dtype} shape={tuple(got.shape)}, expected dtype={expected.dtype} shape={tuple(expected.shape)}"
    if torch.equal(got, expected):
        return None
    bad = (got != expected).flatten()
    return _format_bad(got, expected, bad, max_items)


def _format_bad(got: torch.Tensor, expected: torch.Tensor, bad: torch.Tensor, max_items: int) -> str:
    idx = bad.nonzero().flatten()
    first = idx[:max_items]
    g = got.flatten()[first].tolist()
    e = expected.flatten()[first].tolist()
    return f"{idx.numel()}/{got.numel()} elements differ; first at flat index {first.tolist()}: got {g} expected {e}"


@dataclass
class CheckReport:
    """What one rank checked in one task (picklable)."""

    rank: int
    n_checks: int
    failures: list[str]
    extra: Any = None


@dataclass
class Checker:
    """Records comparisons in a worker; never raises, so every rank runs every case."""

    rank: int
    n_checks: int = 0
    failures: list[str] = field(default_factory=list)

    def equal(self, what: str, got: torch.Tensor, expected: torch.Tensor) -> bool:
        """Exact comparison (dtype, shape and every value)."""
        self.n_checks += 1
        msg = describe_mismatch(got, expected)
        if msg is not None:
            self.failures.append(f"rank {self.rank}: {what}: {msg}")
        return msg is None

    def within(self, what: str, got: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> bool:
        """Elementwise ``|got - expected| <= bound`` (evaluated in float64); dtype and shape must match."""
        self.n_checks += 1
        if not isinstance(got, torch.Tensor) or got.dtype != expected.dtype or got.shape != expected.shape:
            msg = describe_mismatch(got, expected)
            self.failures.append(f"rank {self.rank}: {what}: {msg}")
            return False
        err = (got.double() - expected.double()).abs()
        bad = (~(err <= bound)).flatten()
        if bool(bad.any()):
            worst = int(torch.argmax(torch.where(bound > 0, err / bound, err).flatten()))
            self.failures.append(
                f"rank {self.rank}: {what}: {_format_bad(got, expected, bad, 4)}; "
                f"worst at {worst}: |err|={err.flatten()[worst].item():.3g} bound={bound.flatten()[worst].item():.3g}"
            )
            return False
        return True

    def true(self, what: str, cond: bool, detail: str = "") -> bool:
        """Record a boolean property."""
        self.n_checks += 1
        if not cond:
            self.failures.append(f"rank {self.rank}: {what}" + (f": {detail}" if detail else ""))
        return bool(cond)

    def report(self, extra: Any = None) -> CheckReport:
        return CheckReport(self.rank, self.n_checks, list(self.failures), extra)


_SIZE_FIELDS = re.compile(r" (shape=\([^)]*\)|numel=\d+|n=\d+)")


def _summary(failures: Sequence[str]) -> str:
    """Failures grouped by case with sizes and ranks stripped: which op/dtype/ws combos fail."""
    kinds: dict[str, int] = {}
    for line in failures:
        parts = line.split(": ", 2)  # "rank r", what, detail
        key = _SIZE_FIELDS.sub("", parts[1]) if len(parts) == 3 else line
        kinds[key] = kinds.get(key, 0) + 1
    return "\n".join(f"  {n:4d} x {k}" for k, n in kinds.items())


def assert_reports_ok(reports: Sequence[CheckReport], min_checks_per_rank: int = 1, max_lines: int = 60) -> None:
    """Fail with every recorded mismatch; also fail if a rank checked (almost) nothing."""
    lines: list[str] = []
    for rep in reports:
        if rep.n_checks < min_checks_per_rank:
            lines.append(f"rank {rep.rank}: only {rep.n_checks} checks ran (expected >= {min_checks_per_rank})")
        lines.extend(rep.failures)
    if lines:
        shown = lines[:max_lines]
        more = f"\n... and {len(lines) - max_lines} more" if len(lines) > max_lines else ""
        raise AssertionError(
            f"{len(lines)} failed checks; by case (all ranks and sizes):\n{_summary(lines)}\ndetails:\n"
            + "\n".join(shown)
            + more
        )


def smoke_checks(chk: Checker, tag: str, test_group: Any, ref_group: Any, numel: int = 1000) -> None:
    """A few of each collective on ``test_group`` vs the gloo ``ref_group`` (same ranks).

    For rendezvous, subgroup and launcher tests, where *that* the group works
    matters more than the full dtype/op battery of test_collectives.py.
    """
    rank, ws = dist.get_rank(test_group), dist.get_world_size(test_group)
    chk.true(
        f"{tag}: rank/size match the gloo group",
        (rank, ws) == (dist.get_rank(ref_group), dist.get_world_size(ref_group)),
        f"({rank}, {ws}) vs ({dist.get_rank(ref_group)}, {dist.get_world_size(ref_group)})",
    )
    grank = dist.get_rank()
    for dtype, op in ((torch.float32, "SUM"), (torch.int64, "MAX"), (torch.float32, "AVG"), (torch.int32, "PRODUCT")):
        case = f"{tag}: all_reduce op={op} dtype={dtype_name(dtype)} ws={ws} numel={numel}"
        x = make_data(grank, case, (numel,), dtype, data_kind(op))
        got = x.clone()
        dist.all_reduce(got, op=reduce_op(op), group=test_group)
        chk.equal(case, got, ref_all_reduce(x, op, ref_group))
    case = f"{tag}: reduce_scatter_tensor op=SUM dtype=float32 ws={ws} numel={numel}"
    x = make_data(grank, case, (numel * ws,), torch.float32)
    out = sentinel_like((numel,), torch.float32)
    dist.reduce_scatter_tensor(out, x, group=test_group)
    chk.equal(case, out, ref_reduce_scatter(x, "SUM", ref_group))
    case = f"{tag}: all_gather_into_tensor dtype=int64 ws={ws} numel={numel}"
    x = make_data(grank, case, (numel,), torch.int64)
    out = sentinel_like((numel * ws,), torch.int64)
    dist.all_gather_into_tensor(out, x, group=test_group)
    chk.equal(case, out, ref_all_gather(x, ref_group))
    src = global_rank(test_group, ws - 1)
    case = f"{tag}: broadcast src={src} (global) dtype=float64 ws={ws} numel={numel}"
    x = make_data(grank, case, (numel,), torch.float64)
    got = x.clone()
    dist.broadcast(got, src=src, group=test_group)
    chk.equal(case, got, ref_broadcast(x, src, ref_group))
    dist.barrier(group=test_group)
