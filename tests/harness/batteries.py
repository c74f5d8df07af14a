"""Worker batteries that more than one test file runs: the collectives' exact checks
(all_reduce, reduce_scatter_tensor, the list all_gather) over every dtype, op and size,
the coalesced APIs, and the reducing collectives' ReduceOps.

Each is a worker task (``fn(rank, ws, groups, args) -> CheckReport``, harness.processes)
that runs the same cases on the group under test and on gloo.  The files that own the
subjects run them on shared memory (test_collectives.py, test_reduce_ops_and_dtypes.py);
test_transports.py runs them again over TCP, and test_hierarchical.py on emulated hosts.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from harness import (
    DTYPES,
    OPS,
    Checker,
    CheckReport,
    Groups,
    data_kind,
    dtype_name,
    known_gap,
    make_data,
    numels_for,
    rank_block,
    reduce_op,
    ref_all_gather,
    ref_all_reduce,
    ref_all_reduce_many,
    ref_reduce_scatter_many,
    sentinel_like,
    skip_case,
)
from harness.surface import (
    BITWISE_OPS,
    FLOAT_DTYPES,
    INT_DTYPES,
    WIDE_INT_DTYPES,
    finish,
    guarded,
    random_raw,
    ref_reduce,
)

# ---- the collectives, exactly: every dtype x op x size

MULTI_DIM_SHAPE = (3, 7)


def block_shapes(layout: str, ws: int, dtype: torch.dtype) -> list[tuple[int, ...]]:
    """Per-rank block shapes: 1-D over harness.numels_for, or the single 2-D shape."""
    if layout == "flat":
        return [(n,) for n in numels_for(ws, dtype)]
    return [MULTI_DIM_SHAPE]


def case_name(op_name: str, reduce: str, dtype: torch.dtype, ws: int, shape: Sequence[int], extra: str = "") -> str:
    r = f" op={reduce}" if reduce else ""
    return f"{op_name}{r} dtype={dtype_name(dtype)} ws={ws} shape={tuple(shape)}{extra}"


def stacked_shape(shape: Sequence[int], ws: int) -> tuple[int, ...]:
    return (shape[0] * ws, *shape[1:])


def reducing_cases(backend: str, layout: str, ws: int) -> Iterator[tuple[torch.dtype, str, list[tuple[int, ...]]]]:
    """Every (dtype, op) a reducing collective is checked on (gloo's gaps skipped in gloo
    mode), with the shapes it is checked at."""
    for dtype in DTYPES:
        for op in OPS:
            if skip_case(backend, op, dtype):
                continue
            yield dtype, op, list(block_shapes(layout, ws, dtype))


def all_reduce_worker(rank: int, ws: int, groups: Groups, layout: str) -> CheckReport:
    chk = Checker(rank)
    for dtype, op, shapes in reducing_cases(groups.backend, layout, ws):
        cases = [case_name("all_reduce", op, dtype, ws, shape) for shape in shapes]
        xs = [make_data(rank, case, shape, dtype, data_kind(op)) for case, shape in zip(cases, shapes)]
        for case, x, want in zip(cases, xs, ref_all_reduce_many(xs, op, groups.ref)):
            got = x.clone()
            dist.all_reduce(got, op=reduce_op(op), group=groups.test)
            chk.equal(case, got, want)
    return chk.report()


def reduce_scatter_tensor_worker(rank: int, ws: int, groups: Groups, layout: str) -> CheckReport:
    chk = Checker(rank)
    for dtype, op, shapes in reducing_cases(groups.backend, layout, ws):
        cases = [case_name("reduce_scatter_tensor", op, dtype, ws, shape) for shape in shapes]
        xs = [make_data(rank, c, stacked_shape(s, ws), dtype, data_kind(op)) for c, s in zip(cases, shapes)]
        for case, shape, x, want in zip(cases, shapes, xs, ref_reduce_scatter_many(xs, op, groups.ref)):
            x_before = x.clone()
            out = sentinel_like(shape, dtype)
            dist.reduce_scatter_tensor(out, x, op=reduce_op(op), group=groups.test)
            chk.equal(case, out, want)
            chk.equal(case + " [input must be left unchanged]", x, x_before)
    return chk.report()


def all_gather_list_worker(rank: int, ws: int, groups: Groups, layout: str) -> CheckReport:
    chk = Checker(rank)
    for dtype in DTYPES:
        for shape in block_shapes(layout, ws, dtype):
            case = case_name("all_gather(list)", "", dtype, ws, shape)
            x = make_data(rank, case, shape, dtype)
            outs = [sentinel_like(shape, dtype) for _ in range(ws)]
            dist.all_gather(outs, x, group=groups.test)
            expected = ref_all_gather(x, groups.ref)
            for i, o in enumerate(outs):
                chk.equal(f"{case} [output {i}]", o, expected.narrow(0, i * shape[0], shape[0]))
    return chk.report()


# ---- the coalesced APIs

COALESCED_SHAPES = ((5,), (0,), (3, 4), (1,))


def deprecated_coalesced_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """all_reduce_coalesced (SUM, MAX, AVG) and all_gather_coalesced."""
    chk = Checker(rank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for dtype in (torch.float32, torch.int64):
            for op in ("SUM", "MAX", "AVG"):
                if op == "AVG" and not dtype.is_floating_point:
                    continue
                case = f"all_reduce_coalesced op={op} dtype={dtype_name(dtype)} ws={ws}"
                xs = [make_data(rank, f"{case} [{i}]", s, dtype) for i, s in enumerate(COALESCED_SHAPES)]
                got = [x.clone() for x in xs]
                dist.all_reduce_coalesced(got, op=reduce_op(op), group=groups.test)
                for i, (g, want) in enumerate(zip(got, ref_all_reduce_many(xs, op, groups.ref))):
                    chk.equal(f"{case} [tensor {i}]", g, want)

            case = f"all_gather_coalesced dtype={dtype_name(dtype)} ws={ws}"
            xs = [make_data(rank, f"{case} [{i}]", s, dtype) for i, s in enumerate(COALESCED_SHAPES)]
            outs = [[sentinel_like(s, dtype) for s in COALESCED_SHAPES] for _ in range(ws)]
            dist.all_gather_coalesced(outs, xs, group=groups.test)
            for i, (s, x) in enumerate(zip(COALESCED_SHAPES, xs)):
                expected = ref_all_gather(x.reshape(-1), groups.ref).reshape(ws, *s)
                for r in range(ws):
                    chk.equal(f"{case} [tensor {i} of rank {r}]", outs[r][i], expected[r])
    return finish(chk, groups.test)


def coalescing_manager_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """_coalescing_manager around all_reduce, all_gather_into_tensor, reduce_scatter_tensor."""
    chk = Checker(rank)
    g = groups.test
    shapes = ((4,), (3, 5), (1,))
    for async_ops in (False, True):
        tag = f"ws={ws} async_ops={async_ops}"

        case = f"coalesced all_reduce op=MAX dtype=float32 {tag}"
        xs = [make_data(rank, f"{case} [{i}]", s, torch.float32) for i, s in enumerate(shapes)]
        got = [x.clone() for x in xs]
        with dist._coalescing_manager(group=g, async_ops=async_ops) as cm:
            for t in got:
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g)
        if async_ops:
            cm.wait()
        for i, (t, want) in enumerate(zip(got, ref_all_reduce_many(xs, "MAX", groups.ref))):
            chk.equal(f"{case} [tensor {i}]", t, want)

        # Mixed dtypes: each output only has to match its own input.
        dtypes = (torch.float32, torch.int64, torch.bfloat16)
        case = f"coalesced all_gather_into_tensor mixed dtypes {tag}"
        xs = [make_data(rank, f"{case} [{i}]", s, d) for i, (s, d) in enumerate(zip(shapes, dtypes))]
        outs = [sentinel_like((s[0] * ws, *s[1:]), d) for s, d in zip(shapes, dtypes)]
        with dist._coalescing_manager(group=g, async_ops=async_ops) as cm:
            for o, x in zip(outs, xs):
                dist.all_gather_into_tensor(o, x, group=g)
        if async_ops:
            cm.wait()
        for i, (o, x) in enumerate(zip(outs, xs)):
            chk.equal(f"{case} [tensor {i}]", o, ref_all_gather(x, groups.ref))

        for op in ("SUM", "AVG"):
            case = f"coalesced reduce_scatter_tensor op={op} dtype=float32 {tag}"
            xs = [make_data(rank, f"{case} [{i}]", (s[0] * ws, *s[1:]), torch.float32) for i, s in enumerate(shapes)]
            outs = [sentinel_like(s, torch.float32) for s in shapes]
            with dist._coalescing_manager(group=g, async_ops=async_ops) as cm:
                for o, x in zip(outs, xs):
                    dist.reduce_scatter_tensor(o, x.clone(), op=reduce_op(op), group=g)
            if async_ops:
                cm.wait()
            for i, (o, want) in enumerate(zip(outs, ref_reduce_scatter_many(xs, op, groups.ref))):
                chk.equal(f"{case} [tensor {i}]", o, want)
    return finish(chk, groups.test)


def functional_coalesced_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """funcol all_gather_into_tensor_coalesced / reduce_scatter_tensor_coalesced on the group."""
    chk = Checker(rank)
    shapes = ((4,), (2, 3), (1,))
    case = f"funcol all_gather_into_tensor_coalesced dtype=int64 ws={ws}"
    xs = [make_data(rank, f"{case} [{i}]", s, torch.int64) for i, s in enumerate(shapes)]
    outs = funcol.all_gather_into_tensor_coalesced(xs, groups.test)
    for i, (o, x) in enumerate(zip(outs, xs)):
        chk.equal(f"{case} [tensor {i}]", funcol.wait_tensor(o), ref_all_gather(x, groups.ref))
    for op in ("sum", "max"):
        case = f"funcol reduce_scatter_tensor_coalesced op={op} dtype=float32 ws={ws}"
        xs = [make_data(rank, f"{case} [{i}]", (s[0] * ws, *s[1:]), torch.float32) for i, s in enumerate(shapes)]
        outs = funcol.reduce_scatter_tensor_coalesced(xs, op, [0] * len(xs), groups.test)
        for i, (o, want) in enumerate(zip(outs, ref_reduce_scatter_many(xs, op.upper(), groups.ref))):
            chk.equal(f"{case} [tensor {i}]", funcol.wait_tensor(o), want)
    return finish(chk, groups.test)


# ---- ReduceOps on the reducing collectives (all_reduce, reduce, reduce_scatter_tensor)

REDUCING = ("all_reduce", "reduce", "reduce_scatter_tensor")


BLOCK_NUMELS = (1, 257)  # per-rank block sizes; the input has ws * numel elements


REDUCE_SHAPES = ((1,), (1000,), (3, 7))


def as_reduce_op(op: Any) -> Any:
    return getattr(dist.ReduceOp, op) if isinstance(op, str) else op


def run_reducing(coll: str, x: torch.Tensor, op: Any, group: Any, dst: int) -> Optional[torch.Tensor]:
    """Run ``coll`` on a copy of ``x`` (dim 0 = ws blocks); return this rank's result.

    all_reduce: the reduced tensor; reduce: the reduced tensor on ``dst`` (global
    rank), None elsewhere; reduce_scatter_tensor: this rank's block.
    """
    y = x.clone()
    if coll == "all_reduce":
        dist.all_reduce(y, op=as_reduce_op(op), group=group)
        return y
    if coll == "reduce":
        dist.reduce(y, dst=dst, op=as_reduce_op(op), group=group)
        return y if dist.get_rank() == dst else None
    if coll == "reduce_scatter_tensor":
        ws = dist.get_world_size(group)
        out = torch.full((x.shape[0] // ws, *x.shape[1:]), 7, dtype=x.dtype)
        dist.reduce_scatter_tensor(out, y, op=as_reduce_op(op), group=group)
        return out
    raise ValueError(coll)


def expected_of(coll: str, full: torch.Tensor, group: Any) -> torch.Tensor:
    """What ``coll`` must produce on this rank, given the full reduction ``full``."""
    return rank_block(full, group) if coll == "reduce_scatter_tensor" else full


def check_reducing(
    chk: Checker,
    groups: Groups,
    label: str,
    make: Callable[[str, tuple[int, ...]], torch.Tensor],
    op: Any,
    ref: Callable[[torch.Tensor], torch.Tensor],
    colls: tuple[str, ...] = REDUCING,
) -> None:
    """One (data, op) pair on every collective in ``colls`` and every block size.

    ``make(case, shape)`` builds this rank's input; ``ref(x)`` the full reduction
    (computed on gloo); ``op`` is a ReduceOp name or object.  ``reduce`` runs to the
    last rank (test_reduce_every_dst covers every destination).
    """
    ws = dist.get_world_size(groups.test)
    dst = ws - 1
    for coll in colls:
        for n in BLOCK_NUMELS:
            case = f"{coll} {label} ws={ws} numel={ws * n}"
            x = make(case, (ws * n,))
            got = guarded(chk, case, lambda: run_reducing(coll, x, op, groups.test, dst))
            expected = expected_of(coll, ref(x), groups.ref)
            if got is not None:
                chk.equal(case, got, expected)


def reduce_every_dst_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """dist.reduce, harness.DTYPES x harness.OPS x every dst x a few shapes."""
    chk = Checker(rank)
    for dtype in DTYPES:
        for op in OPS:
            if skip_case(groups.backend, op, dtype):
                continue
            for shape in REDUCE_SHAPES:
                for dst in range(ws):
                    case = f"reduce op={op} dtype={dtype_name(dtype)} ws={ws} shape={shape} dst={dst}"
                    x = make_data(rank, case, shape, dtype, data_kind(op))
                    got = run_reducing("reduce", x, op, groups.test, dst)
                    expected = ref_all_reduce(x, op, groups.ref)
                    if got is not None:
                        chk.equal(case, got, expected)
    return finish(chk, groups.test)


def premul_sum_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """PREMUL_SUM with float factors and a 1-element tensor factor (input dtype), against
    torch's own ``x * factor`` summed by gloo.  At two ranks also 1/3, whose products each
    dtype rounds: a sum of two is the same in either order, one of three is not."""
    chk = Checker(rank)
    for dtype in FLOAT_DTYPES:
        factors = [("float 0.5", 0.5), ("tensor [3.0]", torch.tensor([3.0], dtype=dtype))]
        if ws == 2:
            factors.append(("float 1/3", 1 / 3))
        for kind, factor in factors:
            check_reducing(
                chk,
                groups,
                f"PREMUL_SUM factor={kind} dtype={dtype_name(dtype)}",
                lambda case, shape: make_data(rank, case, shape, dtype),
                dist._make_nccl_premul_sum(factor),
                lambda x: ref_all_reduce(x * factor, "SUM", groups.ref),
            )
    return finish(chk, groups.test)


def bitwise_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """BAND/BOR/BXOR on every integer dtype and on bool, random bit patterns."""
    chk = Checker(rank)
    for dtype in (*INT_DTYPES, torch.bool):
        if dtype in WIDE_INT_DTYPES and known_gap(groups.backend, "wide integer dtypes"):
            continue
        for op in BITWISE_OPS:
            check_reducing(
                chk,
                groups,
                f"op={op} dtype={dtype_name(dtype)} random bits",
                lambda case, shape: random_raw(rank, case, shape, dtype),
                op,
                lambda x: ref_reduce(x, op, groups.ref),
            )
    return finish(chk, groups.test)
