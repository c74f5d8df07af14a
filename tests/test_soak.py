"""A soak: 4 ranks issuing random collectives for a while on three overlapping groups.

The world group and two overlapping subgroups (ranks [0, 1, 2] and [1, 2, 3], made with
``dist.new_group(backend=<backend under test>)``) take bursts of 1 to 5 ops, each on a
group, op (all_reduce, reduce_scatter_tensor, all_gather_into_tensor, broadcast,
all_to_all_single, reduce), reduction (SUM, MAX, MIN), dtype (float32, int32, bfloat16,
int64) and size (0 to ~1 MiB, log-uniform) drawn from one seed that every rank shares,
so every rank issues the same sequence (a rank outside an op's group skips it).  A burst
of several ops is put in flight with ``async_op=True`` and then waited; a single op runs
synchronously.  Every op gets fresh tensors of integer-valued data (``make_data``: any
rank can rebuild any rank's input), and every result is compared exactly with the
expectation computed locally.  The ranks agree on when to stop over the gloo group.

Each rank reports its open file descriptors and resident memory from ``/proc/self``:
before the subgroups exist, after a warm-up (a burst of every op on every group at the
largest size, so caches and shared-memory regions exist), halfway, at the end, and after
the subgroups are destroyed.  Asserted: no fd growth during the soak beyond
:data:`FD_SLACK`, fds back to their start value (within :data:`FD_SLACK`) once the
subgroups are gone, and RSS growth after the warm-up below :data:`RSS_GROWTH_LIMIT_MB`.

Duration: ``RINGPG_SOAK_SECONDS`` (default 10 s of ops; ~30 s with start-up on a loaded 2-core machine);
e.g. ``RINGPG_SOAK_SECONDS=600 pytest tests/test_soak.py -s`` for a long run (``-s``
shows the per-rank report, which is also printed on failure).  Run it with
``RINGPG_TEST_BACKEND=gloo`` to validate the test itself.
"""

from __future__ import annotations

import gc
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest
import torch
import torch.distributed as dist
from harness import Checker, CheckReport, Groups, WorkerPool, assert_reports_ok, make_data, rss_mb

SOAK_SECONDS = float(os.environ.get("RINGPG_SOAK_SECONDS", "10"))
SEED = int(os.environ.get("RINGPG_SOAK_SEED", "20261126"))
WORLD = 4
SUBGROUPS = ([0, 1, 2], [1, 2, 3])
OPS = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast", "all_to_all_single", "reduce")
REDUCING = frozenset({"all_reduce", "reduce_scatter_tensor", "reduce"})
REDUCTIONS = ("SUM", "MAX", "MIN")
DTYPES = (torch.float32, torch.int32, torch.bfloat16, torch.int64)
MAX_BYTES = 1 << 20
MAX_BURST = 5
#: Open fds may differ by this many from the reference count (lazily opened files of torch, a
#: socket being closed); a leak of one per op or per burst exceeds it within seconds.
FD_SLACK = 4
#: Resident memory may grow by this much after the warm-up (allocator caches, fragmentation);
#: generous on purpose: a leak of the tensors of each op exceeds it in a long run.
RSS_GROWTH_LIMIT_MB = 300.0

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(int(SOAK_SECONDS) + 240)]


@dataclass(frozen=True)
class Op:
    """One drawn op: on ``group`` (index: 0 = world, 1, 2 = SUBGROUPS), ``root`` a group rank."""

    index: int
    group: int
    name: str
    reduction: str
    dtype: torch.dtype
    numel: int  # the full buffer (chunked ops: chunk * group size)
    root: int


def draw_op(
    rng: random.Random, index: int, largest: bool = False, name: Optional[str] = None, group: Optional[int] = None
) -> Op:
    """The next op of the shared sequence (every rank draws the same; ``largest``: ~1 MiB)."""
    g = rng.randrange(3) if group is None else group
    size = len(SUBGROUPS[g - 1]) if g else WORLD
    op = rng.choice(OPS) if name is None else name
    dtype = rng.choice(DTYPES)
    item = torch.empty((), dtype=dtype).element_size()
    nbytes = MAX_BYTES if largest else (0 if rng.random() < 0.05 else int(2 ** rng.uniform(0, math.log2(MAX_BYTES))))
    numel = nbytes // item
    if op in ("reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single"):
        numel = numel // size * size
    return Op(index, g, op, rng.choice(REDUCTIONS), dtype, numel, rng.randrange(size))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@dataclass
class _Flight:
    op: Op
    work: Any
    members: list[int]
    inputs: dict[int, torch.Tensor]  # every member's input, by global rank (rebuilt locally)
    tensor: torch.Tensor  # the in-place buffer, or the input of an out-of-place op
    output: Optional[torch.Tensor]


def _input(op: Op, grank: int, numel: int) -> torch.Tensor:
    return make_data(grank, f"soak {SEED} op {op.index}", (numel,), op.dtype)


def _reduce(op: Op, tensors: list[torch.Tensor]) -> torch.Tensor:
    stack = torch.stack([t.to(torch.int64) for t in tensors])
    out = {"SUM": stack.sum(0), "MAX": stack.amax(0), "MIN": stack.amin(0)}[op.reduction]
    return out.to(op.dtype)


def _issue(op: Op, grank: int, members: list[int], pg: Any, async_op: bool) -> _Flight:
    """Fresh tensors for ``op`` and the op itself on this rank (a member of ``pg``)."""
    n = len(members)
    per_rank = op.numel // n if op.name == "all_gather_into_tensor" else op.numel
    inputs = {r: _input(op, r, per_rank) for r in members}
    x = inputs[grank].clone()
    red = getattr(dist.ReduceOp, op.reduction)
    out: Optional[torch.Tensor] = None
    if op.name == "all_reduce":
        work = dist.all_reduce(x, op=red, group=pg, async_op=async_op)
    elif op.name == "reduce":
        work = dist.reduce(x, dst=members[op.root], op=red, group=pg, async_op=async_op)
    elif op.name == "broadcast":
        work = dist.broadcast(x, src=members[op.root], group=pg, async_op=async_op)
    elif op.name == "reduce_scatter_tensor":
        out = torch.full((op.numel // n,), 77, dtype=op.dtype)
        work = dist.reduce_scatter_tensor(out, x, op=red, group=pg, async_op=async_op)
    elif op.name == "all_gather_into_tensor":
        out = torch.full((op.numel,), 77, dtype=op.dtype)
        work = dist.all_gather_into_tensor(out, x, group=pg, async_op=async_op)
    elif op.name == "all_to_all_single":
        out = torch.full((op.numel,), 77, dtype=op.dtype)
        work = dist.all_to_all_single(out, x, group=pg, async_op=async_op)
    else:
        raise ValueError(op.name)
    return _Flight(op, work, members, inputs, x, out)


def _check(chk: Checker, f: _Flight, grank: int) -> None:
    """``f``'s result against the expectation computed from every member's input."""
    op, members, inputs = f.op, f.members, f.inputs
    n, k = len(members), members.index(grank)
    what = (
        f"op {op.index} {op.name} {op.reduction if op.name in REDUCING else ''} "
        f"dtype={op.dtype} numel={op.numel} group={members}"
    )
    every = [inputs[r] for r in members]
    if op.name == "all_reduce":
        chk.equal(what, f.tensor, _reduce(op, every))
    elif op.name == "reduce":
        if grank == members[op.root]:
            chk.equal(what, f.tensor, _reduce(op, every))
    elif op.name == "broadcast":
        chk.equal(what, f.tensor, inputs[members[op.root]])
    elif op.name == "reduce_scatter_tensor":
        c = op.numel // n
        chk.equal(what, f.output, _reduce(op, [t[k * c : (k + 1) * c] for t in every]))
    elif op.name == "all_gather_into_tensor":
        chk.equal(what, f.output, torch.cat(every))
    elif op.name == "all_to_all_single":
        c = op.numel // n
        chk.equal(what, f.output, torch.cat([t[k * c : (k + 1) * c] for t in every]))
    if op.name in ("reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single"):
        chk.equal(f"{what}: input unchanged", f.tensor, inputs[grank])


@dataclass
class SoakReport:
    """What one rank saw (picklable); fds and RSS at start, after warm-up, halfway, at the end, after destroy."""

    rank: int
    ops: int = 0
    bursts: int = 0
    seconds: float = 0.0
    fds: dict[str, int] = field(default_factory=dict)
    rss_mb: dict[str, float] = field(default_factory=dict)
    check: Optional[CheckReport] = None


def soak(rank: int, ws: int, groups: Groups, seconds: float) -> SoakReport:
    """The worker side: subgroups, warm-up, random bursts until the time is up, destroy."""
    rep = SoakReport(rank)
    chk = Checker(rank)

    def sample(when: str) -> None:
        rep.fds[when], rep.rss_mb[when] = _fds(), rss_mb()

    sample("start")
    pgs = [groups.test] + [dist.new_group(ranks=r, backend=groups.backend) for r in SUBGROUPS]
    members = [list(range(ws))] + [list(r) for r in SUBGROUPS]
    rng = random.Random(SEED)
    index = 0

    def burst(ops: list[Op]) -> None:
        nonlocal index
        mine = [op for op in ops if rank in members[op.group]]
        flights = [_issue(op, rank, members[op.group], pgs[op.group], async_op=len(ops) > 1) for op in mine]
        for f in flights:
            if f.work is not None:
                f.work.wait()
        for f in flights:
            _check(chk, f, rank)
        rep.ops += len(flights)
        rep.bursts += 1

    # Warm-up: every op on every group at the largest size (caches, shared-memory regions).
    for g in range(3):
        ops = []
        for name in OPS:
            ops.append(draw_op(rng, index, largest=True, name=name, group=g))
            index += 1
        burst(ops)
    dist.barrier(group=groups.ref)
    sample("warm")
    start = time.monotonic()
    stop = torch.zeros(1)
    while True:
        ops = []
        for _ in range(rng.randint(1, MAX_BURST)):
            ops.append(draw_op(rng, index))
            index += 1
        burst(ops)
        # Every rank must stop after the same burst: agree over the gloo group.
        elapsed = time.monotonic() - start
        stop[0] = float(elapsed >= seconds)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX, group=groups.ref)
        if stop[0] > 0:
            break
        if "mid" not in rep.rss_mb and elapsed >= seconds / 2:
            sample("mid")  # growth that goes on in the second half is a leak, not a cache filling up
    rep.seconds = time.monotonic() - start
    dist.barrier(group=groups.ref)
    sample("end")
    for pg in pgs[1:]:
        dist.destroy_process_group(pg)
    del pg
    pgs.clear()  # the last references (burst() shares the list): the groups and their sockets go now
    gc.collect()
    dist.barrier(group=groups.ref)
    sample("destroyed")
    rep.check = chk.report()
    return rep


def test_soak_random_collectives_on_overlapping_groups() -> None:
    with WorkerPool(WORLD) as pool:
        reports: list[SoakReport] = pool.run(soak, SOAK_SECONDS, timeout=SOAK_SECONDS + 180)
    lines = [
        f"soak: {pool.backend}, {WORLD} ranks, groups world + {list(SUBGROUPS)}, seed {SEED}, "
        f"{reports[0].seconds:.1f} s"
    ]
    lines.append(
        f"{'rank':>4} {'ops':>6} {'bursts':>6}   fds start/warm/end/destroyed   "
        f"RSS MB start/warm/mid/end/destroyed   RSS growth: warm-up..mid, mid..end"
    )
    for r in reports:
        fds = "/".join(str(r.fds[k]) for k in ("start", "warm", "end", "destroyed"))
        mid = r.rss_mb.get("mid", r.rss_mb["end"])
        rss = "/".join(
            f"{v:.0f}" for v in (r.rss_mb["start"], r.rss_mb["warm"], mid, r.rss_mb["end"], r.rss_mb["destroyed"])
        )
        lines.append(
            f"{r.rank:>4} {r.ops:>6} {r.bursts:>6}   {fds:>26}   {rss:>35}   "
            f"{mid - r.rss_mb['warm']:+.1f} MB, {r.rss_mb['end'] - mid:+.1f} MB"
        )
    report = "\n".join(lines)
    print(report)
    assert_reports_ok([r.check for r in reports if r.check is not None], min_checks_per_rank=10)
    for r in reports:
        assert r.ops > 0 and r.check is not None, report
        assert abs(r.fds["end"] - r.fds["warm"]) <= FD_SLACK, f"fds grew during the soak\n{report}"
        assert abs(r.fds["destroyed"] - r.fds["start"]) <= FD_SLACK, f"fds not back after destroy\n{report}"
        assert r.rss_mb["end"] - r.rss_mb["warm"] < RSS_GROWTH_LIMIT_MB, f"RSS grew too much\n{report}"
