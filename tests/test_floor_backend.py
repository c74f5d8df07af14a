"""The bench's floor (``benchmarks.backends.floor_group``): ringpg's FloorBackend, a c10d
backend whose every op completes at once and touches no tensor, so that a backend's
time minus the floor's is that backend's own work at every size (issue 56 item 2).

Two ranks on a ringpg world group: every op the bench times returns a completed Work
whose outputs are exactly as they were (a sentinel survives all-gather, reduce-scatter,
allreduce, broadcast and all-to-all, which torch's fake group would have written), its
Future carries the op's output tensors, a barrier returns, and torch treats the group as
it treats ringpg's own: where torch attaches its flight recorder hook to ringpg's group
it attaches one to the floor's too.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import harness
import pytest
import torch
import torch.distributed as dist

pytestmark = [pytest.mark.multiprocess, harness.ringpg_only("the floor is ringpg's FloorBackend")]

SENTINEL = -7.0


def _floor_ops(rank: int, ws: int, port: int, args: Any) -> dict:
    from benchmarks.backends import FLOOR_BACKEND, floor_group

    harness.init_ringpg(rank, ws, port)
    floor = floor_group(timedelta(seconds=30))
    out: dict[str, Any] = {"backend": dist.get_backend(floor)}
    n = 1 << 12
    inp = torch.arange(n, dtype=torch.float32) + rank
    untouched = {}
    gathered = torch.full((ws * n,), SENTINEL)
    dist.all_gather_into_tensor(gathered, inp, group=floor)
    untouched["all_gather"] = bool((gathered == SENTINEL).all())
    scattered = torch.full((n // ws,), SENTINEL)
    dist.reduce_scatter_tensor(scattered, inp, group=floor)
    untouched["reduce_scatter"] = bool((scattered == SENTINEL).all())
    x = torch.full((n,), SENTINEL)
    work = dist.all_reduce(x, group=floor, async_op=True)
    out["completed_at_once"] = work.is_completed()
    value = work.get_future().wait()
    out["future_is_output"] = len(value) == 1 and value[0].data_ptr() == x.data_ptr()
    untouched["all_reduce"] = bool((x == SENTINEL).all())
    b = torch.full((n,), SENTINEL + rank)
    dist.broadcast(b, src=0, group=floor)
    untouched["broadcast"] = bool((b == SENTINEL + rank).all())
    a2a = torch.full((n,), SENTINEL)
    dist.all_to_all_single(a2a, inp, group=floor)
    untouched["all_to_all"] = bool((a2a == SENTINEL).all())
    dist.barrier(group=floor)
    out["untouched"] = untouched
    world = dist.distributed_c10d._world
    hooks = getattr(world, "pg_flight_recorder_hooks", None)
    if hooks is not None:
        out["hooked"] = {"ringpg": dist.group.WORLD in hooks, "floor": floor in hooks}
    out["floor_name"] = FLOOR_BACKEND
    dist.barrier()
    dist.destroy_process_group()
    return out


def test_the_floor_completes_every_op_at_once_and_touches_no_tensor() -> None:
    res = harness.run_scenario(_floor_ops, 2)
    for r, v in res.items():
        assert "crash" not in v, (r, v)
        assert v["backend"] == v["floor_name"], v
        assert v["untouched"] == dict.fromkeys(v["untouched"], True) and len(v["untouched"]) == 5, (r, v)
        assert v["completed_at_once"] and v["future_is_output"], (r, v)
        if "hooked" in v:
            # torch records the floor's ops as it records ringpg's (or neither's).
            assert v["hooked"]["floor"] == v["hooked"]["ringpg"], (r, v)
