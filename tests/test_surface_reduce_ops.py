"""Every ReduceOp on the reducing collectives (all_reduce, reduce, reduce_scatter_tensor).

test_collectives.py already covers SUM/AVG/MIN/MAX/PRODUCT in all_reduce and the
reduce-scatters for harness.DTYPES; this module adds

* ``reduce`` to every destination rank, harness.DTYPES x harness.OPS;
* PREMUL_SUM (``dist._make_nccl_premul_sum``) with a float factor and with a
  1-element tensor factor; reference = gloo SUM of ``factor * x``;
* BAND/BOR/BXOR on every integer dtype, on random bit patterns;
* bool tensors under every op (SUM/MAX/BOR = or, MIN/PRODUCT/BAND = and, BXOR);
* complex64/complex128 under SUM and AVG;
* the integer dtypes gloo cannot reduce (int16, uint16, uint32, uint64) under
  SUM/AVG/MIN/MAX/PRODUCT;

all on the three reducing collectives.  References come from harness.surface.ref_reduce
(gloo where gloo has the reduction, else a gloo byte all-gather plus a local
reduction); data are small integers or random bits, so comparisons are exact.
AVG in reduce_scatter is compared with SUM / world size (computed from gloo's all_reduce).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from harness import (
    DTYPES,
    Checker,
    CheckReport,
    Groups,
    WorkerPool,
    assert_reports_ok,
    backend_under_test,
    data_kind,
    dtype_name,
    known_gap,
    make_data,
    ref_all_reduce,
    skip_case,
)
from harness.batteries import (
    REDUCING,
    bitwise_worker,
    check_reducing,
    expected_of,
    premul_sum_worker,
    reduce_every_dst_worker,
    run_reducing,
)
from harness.surface import (
    WIDE_INT_DTYPES,
    error_text,
    finish,
    random_raw,
    ref_reduce,
    small_complex,
    small_ints,
)

pytestmark = pytest.mark.parametrize("world_size", [2, 3], ids=lambda ws: f"ws{ws}", scope="module")


# ---------------------------------------------------------------- worker bodies


def premul_sum_factor_dtype_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """A float32 tensor factor on float16/bfloat16/float64 inputs: a clean error or the right result.

    Either is acceptable; a silently wrong result is not (nor an out-of-bounds
    write of results in the factor's wider dtype, hence the precautionary restart
    of the workers after a failure).
    """
    chk = Checker(rank)
    factor = torch.tensor([0.5], dtype=torch.float32)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        for coll in REDUCING:
            case = f"{coll} PREMUL_SUM float32 tensor factor on dtype={dtype_name(dtype)} ws={ws}"
            x = make_data(rank, case, (ws * 257,), dtype)
            expected = expected_of(coll, ref_all_reduce((x * 0.5).to(dtype), "SUM", groups.ref), groups.ref)
            try:
                got = run_reducing(coll, x, dist._make_nccl_premul_sum(factor), groups.test, ws - 1)
            except Exception as e:  # noqa: BLE001 - a clean refusal is acceptable
                chk.true(f"{case}: refused ({error_text(e, 120)})", True)
                continue
            if got is not None:
                chk.equal(case + " [accepted, so the result must be right]", got, expected)
    return finish(chk, groups.test, restart_on_failure=True)


def bool_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """bool tensors under the arithmetic ops: SUM/MAX = or, MIN/PRODUCT = and."""
    chk = Checker(rank)
    for op in ("SUM", "MAX", "MIN", "PRODUCT"):
        check_reducing(
            chk,
            groups,
            f"op={op} dtype=bool",
            lambda case, shape: random_raw(rank, case, shape, torch.bool),
            op,
            lambda x: ref_reduce(x, op, groups.ref),
        )
    return finish(chk, groups.test)


def complex_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """complex64/complex128 under SUM and AVG."""
    chk = Checker(rank)
    colls = REDUCING
    if known_gap(groups.backend, "complex reduce and reduce_scatter"):
        colls = ("all_reduce",)
    for dtype in (torch.complex64, torch.complex128):
        for op in ("SUM", "AVG"):
            check_reducing(
                chk,
                groups,
                f"op={op} dtype={dtype_name(dtype)}",
                lambda case, shape: small_complex(rank, case, shape, dtype),
                op,
                lambda x: ref_reduce(x, op, groups.ref),
                colls,
            )
    return finish(chk, groups.test)


def wide_int_worker(
    rank: int, ws: int, groups: Groups, args: tuple[tuple[torch.dtype, ...], tuple[str, ...]]
) -> CheckReport:
    """Integer dtypes gloo cannot reduce (int16, uint16, uint32, uint64); args = (dtypes, ops)."""
    chk = Checker(rank)
    dtypes, ops = args
    for dtype in dtypes:
        for op in ops:
            check_reducing(
                chk,
                groups,
                f"op={op} dtype={dtype_name(dtype)}",
                lambda case, shape: small_ints(rank, case, shape, dtype, data_kind(op)),
                op,
                lambda x: ref_reduce(x, op, groups.ref),
            )
    return finish(chk, groups.test)


def avg_reduce_scatter_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """AVG really averages in reduce_scatter_tensor (reference: gloo SUM / ws)."""
    chk = Checker(rank)
    for dtype in DTYPES:
        if skip_case(groups.backend, "AVG", dtype):
            continue
        check_reducing(
            chk,
            groups,
            f"op=AVG dtype={dtype_name(dtype)}",
            lambda case, shape: make_data(rank, case, shape, dtype),
            "AVG",
            lambda x: ref_all_reduce(x, "AVG", groups.ref),
            ("reduce_scatter_tensor",),
        )
    return finish(chk, groups.test)


# ------------------------------------------------------------------------ tests


def test_reduce_every_dst(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(reduce_every_dst_worker))


def _skip_gap(feature: str) -> None:
    if known_gap(backend_under_test(), feature):
        pytest.skip(f"{backend_under_test()} lacks: {feature}")


def test_premul_sum(shared_pool: WorkerPool) -> None:
    _skip_gap("PREMUL_SUM")
    assert_reports_ok(shared_pool.run(premul_sum_worker))


def test_premul_sum_factor_of_other_dtype(shared_pool: WorkerPool) -> None:
    _skip_gap("PREMUL_SUM")
    assert_reports_ok(shared_pool.run(premul_sum_factor_dtype_worker))


def test_bitwise_ops(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(bitwise_worker))


def test_bool(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(bool_worker))


def test_complex(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(complex_worker))


def test_wide_integer_dtypes(shared_pool: WorkerPool) -> None:
    """SUM/MIN/MAX/PRODUCT on all four, AVG on int16 (unsigned AVG: next test)."""
    _skip_gap("wide integer dtypes")
    assert_reports_ok(shared_pool.run(wide_int_worker, (WIDE_INT_DTYPES, ("SUM", "MIN", "MAX", "PRODUCT"))))
    assert_reports_ok(shared_pool.run(wide_int_worker, ((torch.int16,), ("AVG",))))


def test_avg_on_unsigned_wide_integers(shared_pool: WorkerPool) -> None:
    """AVG (truncating) on uint16/uint32/uint64: a separate task, as a failure may break the group."""
    _skip_gap("wide integer dtypes")
    unsigned = tuple(d for d in WIDE_INT_DTYPES if d != torch.int16)
    assert_reports_ok(shared_pool.run(wide_int_worker, (unsigned, ("AVG",))))


def test_avg_really_averages_in_reduce_scatter(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(avg_reduce_scatter_worker))
