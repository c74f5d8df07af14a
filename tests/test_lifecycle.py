"""Load and lifecycle (ringpg's own: skipped for other backends): 1000 async ops in
flight; async Works that outlive their group; many groups and create/destroy cycles
leak no threads, file descriptors or memory; torch's DETAIL checking wrapper runs
ringpg and reports mismatched collectives.
"""

from __future__ import annotations

import os
from typing import Any

import harness
import pytest
import torch
import torch.distributed as dist
from harness import (
    expect_error,
    free_port,
    run_scenario,
)
from harness import init_ringpg as _init

pytestmark = [pytest.mark.multiprocess, harness.ringpg_only("ringpg's own lifecycle")]


# ------------------------------------------------------------------ load and lifecycle


def _thousand_async(rank: int, ws: int, port: int, args: Any) -> dict:
    _init(rank, ws, port)
    tensors = [torch.full((17,), float(i + rank)) for i in range(1000)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for w in works:
        w.wait()
    bad = [i for i, t in enumerate(tensors) if not torch.equal(t, torch.full((17,), float(2 * i + 1)))]
    return {"bad": bad[:5], "n": len(works)}


def test_thousand_async_ops_in_flight() -> None:
    res = run_scenario(_thousand_async, 2)
    for v in res.values():
        assert v["n"] == 1000 and v["bad"] == [], v


def _works_outlive_group(rank: int, ws: int, port: int, args: Any) -> dict:
    """Async Works kept past their group's destruction: the ones waited on before it, and
    ones first waited on after it (the group's shutdown ran them); dropping them after
    the group is gone must neither crash nor hang.  Then Works never kept at all, whose
    last reference the worker drops, on a group destroyed right after."""
    _init(rank, ws, port)
    g = dist.new_group(backend="ringpg")
    tensors = [torch.full((1000,), float(i + rank)) for i in range(6)]
    works = [dist.all_reduce(t, group=g, async_op=True) for t in tensors]
    works[0].wait()
    works[1].wait()
    dist.destroy_process_group(g)  # drains the four not waited on yet
    for w in works[2:]:
        w.wait()  # the group is gone: nothing to run here, the Work is complete
    done = [w.is_completed() for w in works]
    bad = [i for i, t in enumerate(tensors) if not torch.equal(t, torch.full((1000,), float(2 * i + 1)))]
    del works  # the last references, after the group
    # Works never kept: the worker drops the last reference to each as it runs it.
    g2 = dist.new_group(backend="ringpg")
    fired = [torch.full((1000,), float(i + rank)) for i in range(6)]
    for f in fired:
        dist.all_reduce(f, group=g2, async_op=True)
    dist.destroy_process_group(g2)
    bad += [100 + i for i, f in enumerate(fired) if not torch.equal(f, torch.full((1000,), float(2 * i + 1)))]
    t = torch.ones(3)
    dist.all_reduce(t)  # the default group is unaffected
    return {"done": done, "bad": bad, "after": float(t[0])}


def test_works_outlive_their_group() -> None:
    res = run_scenario(_works_outlive_group, 2)
    for v in res.values():
        assert v["done"] == [True] * 6 and v["bad"] == [] and v["after"] == 2.0, v


def _counts() -> tuple[int, int]:
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _lifecycle(rank: int, ws: int, port: int, args: Any) -> dict:
    _init(rank, ws, port)
    # Many groups alive at once.
    groups = [dist.new_group(backend="ringpg") for _ in range(12)]
    sums = []
    for i, g in enumerate(groups):
        t = torch.full((5,), float(i))
        dist.all_reduce(t, group=g)
        sums.append(float(t[0]))
    for g in groups:
        dist.destroy_process_group(g)

    def cycle() -> None:
        g = dist.new_group(backend="ringpg")
        t = torch.ones(1 << 16)
        dist.all_reduce(t, group=g)
        dist.destroy_process_group(g)

    cycle()  # warm-up: lazy allocations, thread pools
    before, rss0 = _counts(), _rss_mb()
    for _ in range(15):
        cycle()
    after, rss1 = _counts(), _rss_mb()
    dist.destroy_process_group()
    # A whole new default group in the same process, on a fresh store.
    _init(rank, ws, args)
    t = torch.ones(3)
    dist.all_reduce(t)
    return {"sums": sums, "before": before, "after": after, "rss": rss1 - rss0, "reinit": float(t[0])}


def test_many_groups_and_create_destroy_cycles_leak_nothing() -> None:
    res = run_scenario(_lifecycle, 2, free_port(), timeout=150)
    for v in res.values():
        assert v["sums"] == [2.0 * i for i in range(12)], v
        assert v["after"] == v["before"], f"threads/fds before {v['before']} after {v['after']}"
        assert v["rss"] < 64, f"RSS grew {v['rss']:.1f} MiB over 15 create/destroy cycles"
        assert v["reinit"] == 2.0


# ------------------------------------------------------------------ torch's checking wrapper


def _under_detail(rank: int, ws: int, port: int, args: Any) -> dict:
    (mismatch,) = args
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    _init(rank, ws, port, timeout_s=20.0)
    wrapped = type(harness.cpu_backend(dist.group.WORLD)).__name__
    import ringpg

    seen_through = type(ringpg.backend()).__name__  # ringpg.backend() unwraps the wrapper
    x = torch.arange(10, dtype=torch.float32) + rank
    dist.all_reduce(x)
    out = torch.empty(10 * ws)
    dist.all_gather_into_tensor(out, x)
    ok = torch.equal(x, sum(torch.arange(10, dtype=torch.float32) + r for r in range(ws)))
    ok = ok and torch.equal(out, x.repeat(ws))
    kind = msg = ""
    if mismatch:
        y = torch.ones(10)
        if rank == 0:
            kind, msg, _ = expect_error(lambda: dist.all_reduce(y))
        else:
            kind, msg, _ = expect_error(lambda: dist.broadcast(y, src=0))
    return {"ok": ok, "wrapped": wrapped, "seen_through": seen_through, "type": kind, "msg": msg}


def test_runs_inside_torchs_detail_wrapper() -> None:
    res = run_scenario(_under_detail, 2, (False,))
    for v in res.values():
        assert v["ok"], v
        assert v["seen_through"] == "RingBackend", v


def test_detail_wrapper_reports_mismatched_collectives() -> None:
    res = run_scenario(_under_detail, 2, (True,))
    for r, v in res.items():
        assert v["ok"], v
        assert v["type"], f"rank {r}: a mismatched collective raised nothing"
        assert "mismatch" in v["msg"].lower() or "detected" in v["msg"].lower(), v["msg"]
