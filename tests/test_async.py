"""async_op=True: Work objects, their futures and callbacks, compared against gloo.

Several collectives are put in flight on the group under test before any is
waited on; then each Work must complete (``wait()``, ``is_completed()``), produce
gloo's result, and expose a future whose value is the list of output tensors
(the tensors the op wrote, not copies).  Futures must complete on their own (a
``then`` chain is waited on without calling ``Work.wait``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist
from harness import (
    Checker,
    CheckReport,
    Groups,
    WorkerPool,
    assert_reports_ok,
    data_kind,
    dtype_name,
    known_gap,
    make_data,
    reduce_op,
    ref_all_gather,
    ref_all_reduce,
    ref_broadcast,
    ref_reduce_scatter,
    sentinel_like,
    skip_case,
)

pytestmark = pytest.mark.parametrize("world_size", [1, 3], ids=lambda ws: f"ws{ws}", scope="module")

ASYNC_TIMEOUT_S = 60.0


@dataclass
class _InFlight:
    case: str
    op_name: str  # collective name, for known_gap
    work: Any
    outputs: list[torch.Tensor]  # what the op writes; also the expected future value
    expected: list[torch.Tensor]


def _launch_all(rank: int, ws: int, groups: Groups, n: int) -> list[_InFlight]:
    """Start one async op of every kind (references computed first, on gloo)."""
    t, ref = groups.test, groups.ref
    flights: list[_InFlight] = []

    def add(
        op_name: str, case: str, expected: list[torch.Tensor], launch: Callable[[], tuple[Any, list[torch.Tensor]]]
    ) -> None:
        work, outputs = launch()
        flights.append(_InFlight(f"async {op_name} {case} ws={ws} n={n}", op_name, work, outputs, expected))

    for dtype, op in [
        (torch.float32, "SUM"),
        (torch.int64, "MAX"),
        (torch.bfloat16, "AVG"),
        (torch.int8, "PRODUCT"),
        (torch.float64, "MIN"),
        (torch.int32, "AVG"),
    ]:
        if skip_case(groups.backend, op, dtype):
            continue
        case = f"op={op} dtype={dtype_name(dtype)}"
        x = make_data(rank, "async all_reduce " + case, (n,), dtype, data_kind(op))
        y = x.clone()
        add(
            "all_reduce",
            case,
            [ref_all_reduce(x, op, ref)],
            lambda y=y, op=op: (dist.all_reduce(y, op=reduce_op(op), group=t, async_op=True), [y]),
        )

    x = make_data(rank, "async rs", (n * ws,), torch.float32)
    out = sentinel_like((n,), torch.float32)
    add(
        "reduce_scatter_tensor",
        "op=SUM dtype=float32",
        [ref_reduce_scatter(x, "SUM", ref)],
        lambda: (dist.reduce_scatter_tensor(out, x, group=t, async_op=True), [out]),
    )

    xl = make_data(rank, "async rs list", (n * ws,), torch.int32)
    out_l = sentinel_like((n,), torch.int32)
    inputs = [xl.narrow(0, i * n, n).clone() for i in range(ws)]
    add(
        "reduce_scatter",
        "op=MAX dtype=int32",
        [ref_reduce_scatter(xl, "MAX", ref)],
        lambda: (dist.reduce_scatter(out_l, inputs, op=dist.ReduceOp.MAX, group=t, async_op=True), [out_l]),
    )

    g = make_data(rank, "async ag", (n,), torch.float16)
    gout = sentinel_like((n * ws,), torch.float16)
    add(
        "all_gather_into_tensor",
        "dtype=float16",
        [ref_all_gather(g, ref)],
        lambda: (dist.all_gather_into_tensor(gout, g, group=t, async_op=True), [gout]),
    )

    gl = make_data(rank, "async ag list", (n,), torch.int64)
    gl_outs = [sentinel_like((n,), torch.int64) for _ in range(ws)]
    add(
        "all_gather",
        "dtype=int64",
        list(ref_all_gather(gl, ref).split(n)) if n else [gl.clone() for _ in range(ws)],
        lambda: (dist.all_gather(gl_outs, gl, group=t, async_op=True), gl_outs),
    )

    b = make_data(rank, "async bcast", (n,), torch.float64)
    add(
        "broadcast",
        f"src={ws - 1} dtype=float64",
        [ref_broadcast(b, ws - 1, ref)],
        lambda: (dist.broadcast(b, src=ws - 1, group=t, async_op=True), [b]),
    )
    return flights


def _check_future_value(
    chk: Checker, case: str, value: Any, outputs: list[torch.Tensor], expected: list[torch.Tensor]
) -> None:
    """The future's value must be the list of output tensors (same storage) with gloo's values."""
    if not chk.true(
        f"{case}: future value is a list of {len(outputs)} tensors",
        isinstance(value, list) and len(value) == len(outputs),
        f"got {type(value).__name__} of length {len(value) if isinstance(value, list) else '-'}",
    ):
        return
    for i, (v, o, e) in enumerate(zip(value, outputs, expected)):
        chk.equal(f"{case}: future value[{i}]", v, e)
        if isinstance(v, torch.Tensor):
            chk.true(
                f"{case}: future value[{i}] is the output tensor (same storage)",
                v.data_ptr() == o.data_ptr() or o.numel() == 0,
                f"data_ptr {v.data_ptr():#x} != output {o.data_ptr():#x}",
            )


def many_in_flight_worker(rank: int, ws: int, groups: Groups, n: int) -> CheckReport:
    """All op kinds in flight at once, plus 12 all_reduces of growing sizes; waited in reverse."""
    chk = Checker(rank)
    flights = _launch_all(rank, ws, groups, n)
    extra: list[_InFlight] = []
    for k in range(12):
        x = make_data(rank, f"async burst {k}", (n + 97 * k,), torch.float32)
        y = x.clone()
        expected = ref_all_reduce(x, "SUM", groups.ref)
        extra.append(
            _InFlight(
                f"async all_reduce burst #{k} n={n + 97 * k}",
                "all_reduce",
                dist.all_reduce(y, group=groups.test, async_op=True),
                [y],
                [expected],
            )
        )
    for f in reversed(flights + extra):
        f.work.wait()
        gap = known_gap(groups.backend, f"future of {f.op_name}")
        if not gap:
            chk.true(f"{f.case}: is_completed() after wait()", f.work.is_completed())
        for i, (o, e) in enumerate(zip(f.outputs, f.expected)):
            chk.equal(f"{f.case} output {i}", o, e)
        if not gap:
            _check_future_value(chk, f.case, f.work.get_future().wait(), f.outputs, f.expected)
    return chk.report()


def futures_worker(rank: int, ws: int, groups: Groups, n: int) -> CheckReport:
    """Futures complete by themselves: then() chains and torch.futures.wait_all, no Work.wait()."""
    chk = Checker(rank)
    flights = [f for f in _launch_all(rank, ws, groups, n) if not known_gap(groups.backend, f"future of {f.op_name}")]
    # Chain attached while the op is (probably) still running.
    chained = [
        f.work.get_future().then(lambda fut: fut.value()[0] * 2).then(lambda fut: fut.value() + 1) for f in flights
    ]
    for f, c in zip(flights, chained):
        got = c.wait()
        chk.equal(f"{f.case}: then(x*2).then(+1)", got, f.expected[0] * 2 + 1)
    values = torch.futures.wait_all([f.work.get_future() for f in flights])
    for f, v in zip(flights, values):
        _check_future_value(chk, f.case + " [wait_all]", v, f.outputs, f.expected)
        chk.true(f"{f.case}: is_completed() after its future completed", f.work.is_completed())
    return chk.report()


def async_barrier_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    chk = Checker(rank)
    works = [dist.barrier(group=groups.test, async_op=True) for _ in range(3)]
    for i, w in enumerate(works):
        w.wait()
        chk.true(f"async barrier #{i}: is_completed() after wait()", w.is_completed())
    return chk.report()


@pytest.mark.parametrize("n", [1000, 2**18], ids=lambda n: f"n{n}")
def test_many_in_flight(pool: WorkerPool, n: int) -> None:
    assert_reports_ok(pool.run(many_in_flight_worker, n, timeout=ASYNC_TIMEOUT_S))


@pytest.mark.parametrize("n", [0, 2**18], ids=lambda n: f"n{n}")
def test_futures_then_and_wait_all(pool: WorkerPool, n: int) -> None:
    assert_reports_ok(pool.run(futures_worker, n, timeout=ASYNC_TIMEOUT_S))


def test_async_barrier(pool: WorkerPool) -> None:
    assert_reports_ok(pool.run(async_barrier_worker, timeout=ASYNC_TIMEOUT_S))
