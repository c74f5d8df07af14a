"""Collectives of the backend under test compared against gloo, in the same processes.

For every world size 1..5 one pool of workers runs, per test, a whole battery of
cases: every dtype x op x numel in {0, 1, ws-1, ws, 1000} (plus 2**20+3 for
float32 and int32 only, to keep the runtime reasonable; see harness.numels_for),
and the same batteries on 2-D tensors of shape (3, 7).

Data are small integers (harness.make_data), so every result is exact in every
dtype and the comparison is ``torch.equal``; a separate test uses random floats
with stated tolerances.  AVG is compared with gloo's SUM divided by the world size
in the same dtype (truncating for integer dtypes).  Reduce-scatter references come
from a gloo all_reduce, so they do not depend on gloo's reduce_scatter.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from harness import (
    DTYPES,
    OPS,
    Checker,
    CheckReport,
    Groups,
    WorkerPool,
    assert_reports_ok,
    data_kind,
    make_data,
    make_random_float,
    reduce_op,
    ref_all_gather,
    ref_all_reduce,
    ref_broadcast,
    ref_reduce_scatter,
    sentinel_like,
)
from harness.batteries import (
    all_gather_list_worker,
    all_reduce_worker,
    block_shapes,
    case_name,
    reduce_scatter_tensor_worker,
    reducing_cases,
    stacked_shape,
)

pytestmark = pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5], ids=lambda ws: f"ws{ws}", scope="module")


# ---------------------------------------------------------------- worker bodies


def reduce_scatter_list_worker(rank: int, ws: int, groups: Groups, layout: str) -> CheckReport:
    chk = Checker(rank)
    for dtype, op, shape in reducing_cases(groups.backend, layout, ws):
        case = case_name("reduce_scatter(list)", op, dtype, ws, shape)
        x = make_data(rank, case, stacked_shape(shape, ws), dtype, data_kind(op))
        inputs = [x.narrow(0, i * shape[0], shape[0]).clone() for i in range(ws)]
        out = sentinel_like(shape, dtype)
        dist.reduce_scatter(out, inputs, op=reduce_op(op), group=groups.test)
        chk.equal(case, out, ref_reduce_scatter(x, op, groups.ref))
    return chk.report()


def all_gather_into_tensor_worker(rank: int, ws: int, groups: Groups, layout: str) -> CheckReport:
    chk = Checker(rank)
    for dtype in DTYPES:
        for shape in block_shapes(layout, ws, dtype):
            case = case_name("all_gather_into_tensor", "", dtype, ws, shape)
            x = make_data(rank, case, shape, dtype)
            x_before = x.clone()
            out = sentinel_like(stacked_shape(shape, ws), dtype)
            dist.all_gather_into_tensor(out, x, group=groups.test)
            chk.equal(case, out, ref_all_gather(x_before, groups.ref))
            chk.equal(case + " [input must be left unchanged]", x, x_before)
    return chk.report()


def all_gather_aliased_worker(rank: int, ws: int, groups: Groups, where: str) -> CheckReport:
    """all_gather_into_tensor whose input is a view of its own output: the own chunk
    (as FSDP passes it; ``where="own"``) or the next rank's chunk (``"next"``)."""
    chk = Checker(rank)
    slot = rank if where == "own" else (rank + 1) % ws
    for dtype in DTYPES:
        for (n,) in block_shapes("flat", ws, dtype):
            case = case_name("all_gather_into_tensor", "", dtype, ws, (n,), f" input=output[{where} chunk]")
            x = make_data(rank, case, (n,), dtype)
            out = sentinel_like((n * ws,), dtype)
            view = out.narrow(0, slot * n, n)
            view.copy_(x)
            dist.all_gather_into_tensor(out, view, group=groups.test)
            chk.equal(case, out, ref_all_gather(x, groups.ref))
    return chk.report()


def broadcast_worker(rank: int, ws: int, groups: Groups, layout: str) -> CheckReport:
    chk = Checker(rank)
    for dtype in DTYPES:
        for shape in block_shapes(layout, ws, dtype):
            for src in range(ws):
                case = case_name("broadcast", "", dtype, ws, shape, f" src={src}")
                x = make_data(rank, case, shape, dtype)  # differs on every rank
                got = x.clone()
                dist.broadcast(got, src=src, group=groups.test)
                chk.equal(case, got, ref_broadcast(x, src, groups.ref))
    return chk.report()


BARRIER_ROUNDS = 3
BARRIER_DELAY_S = 0.3


def barrier_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """Each round one rank arrives late; returns (enter, leave) wall times per round."""
    times: list[tuple[float, float]] = []
    for i in range(BARRIER_ROUNDS):
        dist.barrier(group=groups.ref)  # align the ranks before the round
        if rank == i % ws:
            time.sleep(BARRIER_DELAY_S)
        enter = time.time()
        dist.barrier(group=groups.test)
        times.append((enter, time.time()))
    return Checker(rank, n_checks=1).report(extra=times)


# Random-float tolerances (relative to sum(|x|) over ranks, elementwise).  Both sides
# obey the summation bound |fl(sum) - sum| <= (ws-1) * u * sum|x| (u = unit roundoff),
# so they differ by at most 2 * 4 * u * sum|x| at ws <= 5: float32 4.8e-7, float64
# 8.9e-16, float16 3.9e-3 -> 1e-5 / 1e-12 / 1e-2 hold with margin.  bfloat16 (u = 2**-8)
# needs 3.1e-2, so its tolerance is 4e-2, not 1e-2.  PRODUCT uses the same factors
# relative to |result|.  MIN and MAX are exact even on random data.
FLOAT_RTOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 1e-2, torch.bfloat16: 4e-2}
FLOAT_NUMELS = (1000, 2**16 + 1)


def random_float_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """all_reduce and reduce_scatter_tensor on random floats, all ops."""
    chk = Checker(rank)
    for dtype, rtol in FLOAT_RTOL.items():
        for op in OPS:
            kind = "product" if op == "PRODUCT" else "normal"
            for n in FLOAT_NUMELS:
                for coll in ("all_reduce", "reduce_scatter_tensor"):
                    case = case_name(coll, op, dtype, ws, (n,), " random")
                    in_shape = (n,) if coll == "all_reduce" else (n * ws,)
                    x = make_random_float(rank, case, in_shape, dtype, kind)
                    if coll == "all_reduce":
                        got = x.clone()
                        dist.all_reduce(got, op=reduce_op(op), group=groups.test)
                        ref = ref_all_reduce(x, op, groups.ref)
                        abs_sum = ref_all_reduce(x.double().abs(), "SUM", groups.ref)
                    else:
                        got = sentinel_like((n,), dtype)
                        dist.reduce_scatter_tensor(got, x.clone(), op=reduce_op(op), group=groups.test)
                        ref = ref_reduce_scatter(x, op, groups.ref)
                        abs_sum = ref_reduce_scatter(x.double().abs(), "SUM", groups.ref)
                    if op in ("MIN", "MAX"):
                        chk.equal(case, got, ref)
                    elif op == "PRODUCT":
                        chk.within(f"{case} rtol={rtol}", got, ref, rtol * ref.double().abs())
                    else:
                        chk.within(f"{case} rtol={rtol} (x sum|x|)", got, ref, rtol * abs_sum)
    return chk.report()


# ------------------------------------------------------------------------ tests


@pytest.mark.parametrize(
    "worker",
    [
        all_reduce_worker,
        reduce_scatter_tensor_worker,
        reduce_scatter_list_worker,
        all_gather_into_tensor_worker,
        all_gather_list_worker,
        broadcast_worker,
    ],
    ids=lambda fn: fn.__name__.removesuffix("_worker"),
)
@pytest.mark.parametrize("layout", ["flat", "2d"])
def test_matches_gloo(pool: WorkerPool, worker: Any, layout: str) -> None:
    """Each collective, every dtype x op x numel case, against gloo in the same processes."""
    assert_reports_ok(pool.run(worker, layout))


@pytest.mark.parametrize("where", ["own", "next"])
def test_all_gather_input_inside_output(pool: WorkerPool, where: str) -> None:
    """An input that aliases the output is read before the ring overwrites it."""
    assert_reports_ok(pool.run(all_gather_aliased_worker, where))


def test_barrier(pool: WorkerPool) -> None:
    reports = pool.run(barrier_worker)
    ws = len(reports)
    for i in range(BARRIER_ROUNDS):
        late = i % ws
        last_enter = reports[late].extra[i][0]
        early_leavers = [r.rank for r in reports if r.extra[i][1] < last_enter]
        assert not early_leavers, f"barrier round {i}: ranks {early_leavers} left before rank {late} entered"


def test_random_floats_with_tolerance(pool: WorkerPool) -> None:
    assert_reports_ok(pool.run(random_float_worker))
