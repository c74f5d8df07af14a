"""ReduceOps, dtypes and layouts: on the collectives, and in ringpg's reduction kernels.

* every ReduceOp on the reducing collectives (all_reduce, reduce, reduce_scatter_tensor)
  at world sizes 2 and 3, beyond the SUM/AVG/MIN/MAX/PRODUCT of harness.DTYPES that
  test_collectives.py runs: ``reduce`` to every destination rank, harness.DTYPES x
  harness.OPS; PREMUL_SUM (``dist._make_nccl_premul_sum``) with a float factor and
  with a 1-element tensor factor (reference: gloo SUM of ``factor * x``), and a float32
  tensor factor on other float dtypes (a clean refusal or the right result);
  BAND/BOR/BXOR on every integer dtype, on random bit patterns; bool under every op
  (SUM/MAX/BOR = or, MIN/PRODUCT/BAND = and, BXOR); complex64/complex128 under SUM
  and AVG; the integer dtypes gloo cannot reduce (int16, uint16, uint32, uint64) under
  SUM/AVG/MIN/MAX/PRODUCT; AVG really averaging in reduce_scatter_tensor;
* raw-byte dtypes (harness.surface.RAW_DTYPES: int16, uint16, uint32, uint64,
  float8_e4m3fn, float8_e5m2, complex64, bool) cross broadcast,
  all_gather_into_tensor, gather, scatter, all_to_all_single and send/recv bit for
  bit: random bytes (NaN and infinity patterns included for the floating types),
  compared as bytes with what the sender sent, which every rank can regenerate
  (harness.surface.random_raw);
* non-contiguous tensors (a transposed view, a strided 1-D slice, a column slice) in
  all_reduce, broadcast, the input of all_gather_into_tensor and the output of
  reduce_scatter_tensor: the result equals gloo's on a contiguous copy, and the
  elements of the underlying storage outside the view are left alone;
* the ring allreduce (sizes past the one-shot limit, tuning key ``oneshot_bytes`` x
  (world size - 1)) on uint8, int64, bool and complex64, on a numel divisible by the
  world size and an odd one that is not, on every transport; ringpg's traces
  (``RINGPG_TRACE``) must show every one of them on the ring;
* ringpg's vectorized reduction kernels (``ringpg._C.reduce_kernel``), one process, no
  group: every dtype x op they implement against torch's own element-wise ops on
  random data of awkward lengths (vector tails), exact for integers, bool and
  fp32/fp64 (one operation) and for fp16/bf16 too (both widen to fp32, combine once
  and round once to nearest-even); each compiled copy this CPU can run (x86-64:
  AVX-512 with and without the bf16 converter, AVX2, baseline; aarch64: SVE, NEON,
  baseline) by name, not only the one ringpg dispatches to, and tuning key reduce_isa.

References of the collectives come from harness.surface.ref_reduce (gloo where gloo
has the reduction, else a gloo byte all-gather and a local reduction); data are small
integers or random bits, so comparisons are exact.  AVG in reduce_scatter is compared
with SUM / world size (computed from gloo's all_reduce).

The kernel tests also run alone under emulation (scripts/test_aarch64.sh selects them
by name), where two variables adapt them: ``RINGPG_TEST_PYTHON`` is the command that
starts this Python in a child process (the emulator in front of it, as a child cannot
exec a foreign binary by itself), and ``RINGPG_TEST_EXPECT_ISAS`` the copies the
emulated CPU must be found to run.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist
from harness import (
    DTYPES,
    SHM_RING,
    TRANSPORT_ENVS,
    Checker,
    CheckReport,
    Groups,
    InitSpec,
    WorkerPool,
    assert_reports_ok,
    backend_under_test,
    data_kind,
    dtype_name,
    known_gap,
    make_data,
    oneshot_limit_bytes,
    reduce_op,
    ref_all_gather,
    ref_all_reduce,
    ref_broadcast,
    ref_reduce_scatter,
    run_workers,
    sentinel_like,
    skip_case,
    traced_algorithms,
    transport_env,
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
from harness.processes import worker_context
from harness.surface import (
    BITWISE_OPS,
    RAW_DTYPES,
    WIDE_INT_DTYPES,
    check_bits,
    error_text,
    finish,
    guarded,
    random_raw,
    ref_reduce,
    small_complex,
    small_ints,
)
from harness.transports import check_transport

try:  # the kernel tests need the built extension; the collectives' run on gloo without it
    import ringpg._C as _C
except ModuleNotFoundError:
    _C = None

ON_WS_2_3 = pytest.mark.parametrize("world_size", [2, 3], ids=lambda ws: f"ws{ws}", scope="module")
needs_C = pytest.mark.skipif(_C is None, reason="could not import 'ringpg._C'")
TRANSPORTS = tuple(TRANSPORT_ENVS)


# ============================================= every ReduceOp, world sizes 2, 3

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


@pytest.mark.multiprocess
@ON_WS_2_3
def test_reduce_every_dst(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(reduce_every_dst_worker))


def _skip_gap(feature: str) -> None:
    if known_gap(backend_under_test(), feature):
        pytest.skip(f"{backend_under_test()} lacks: {feature}")


@pytest.mark.multiprocess
@ON_WS_2_3
def test_premul_sum(shared_pool: WorkerPool) -> None:
    _skip_gap("PREMUL_SUM")
    assert_reports_ok(shared_pool.run(premul_sum_worker))


@pytest.mark.multiprocess
@ON_WS_2_3
def test_premul_sum_factor_of_other_dtype(shared_pool: WorkerPool) -> None:
    _skip_gap("PREMUL_SUM")
    assert_reports_ok(shared_pool.run(premul_sum_factor_dtype_worker))


@pytest.mark.multiprocess
@ON_WS_2_3
def test_bitwise_ops(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(bitwise_worker))


@pytest.mark.multiprocess
@ON_WS_2_3
def test_bool(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(bool_worker))


@pytest.mark.multiprocess
@ON_WS_2_3
def test_complex(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(complex_worker))


@pytest.mark.multiprocess
@ON_WS_2_3
def test_wide_integer_dtypes(shared_pool: WorkerPool) -> None:
    """SUM/MIN/MAX/PRODUCT on all four, AVG on int16 (unsigned AVG: next test)."""
    _skip_gap("wide integer dtypes")
    assert_reports_ok(shared_pool.run(wide_int_worker, (WIDE_INT_DTYPES, ("SUM", "MIN", "MAX", "PRODUCT"))))
    assert_reports_ok(shared_pool.run(wide_int_worker, ((torch.int16,), ("AVG",))))


@pytest.mark.multiprocess
@ON_WS_2_3
def test_avg_on_unsigned_wide_integers(shared_pool: WorkerPool) -> None:
    """AVG (truncating) on uint16/uint32/uint64: a separate task, as a failure may break the group."""
    _skip_gap("wide integer dtypes")
    unsigned = tuple(d for d in WIDE_INT_DTYPES if d != torch.int16)
    assert_reports_ok(shared_pool.run(wide_int_worker, (unsigned, ("AVG",))))


@pytest.mark.multiprocess
@ON_WS_2_3
def test_avg_really_averages_in_reduce_scatter(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(avg_reduce_scatter_worker))


# ============================================= raw-byte dtypes and layouts, world sizes 2, 3

RAW_SHAPES = ((0,), (1001,), (3, 7))
GLOO_RAW_DTYPES = (torch.complex64, torch.bool)  # the RAW_DTYPES gloo itself can move


def _raw_dtypes(backend: str) -> tuple[torch.dtype, ...]:
    return GLOO_RAW_DTYPES if known_gap(backend, "raw dtypes") else RAW_DTYPES


def _zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An output buffer of zero bytes (any byte value could occur in random data)."""
    return torch.zeros(shape, dtype=dtype)


# ------------------------------------------------------------------ raw bytes


def raw_dtype_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """Every raw dtype x shape through each non-reducing collective, every root."""
    chk = Checker(rank)
    g = groups.test
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    for dtype in _raw_dtypes(groups.backend):
        for shape in RAW_SHAPES:
            tag = f"dtype={dtype_name(dtype)} ws={ws} shape={shape}"
            sent = lambda src, case, shp=shape: random_raw(src, case, shp, dtype)  # noqa: E731
            stacked = (shape[0] * ws, *shape[1:])

            for src in range(ws):
                case = f"broadcast {tag} src={src}"
                y = sent(rank, case)
                guarded(chk, case, lambda: dist.broadcast(y, src=src, group=g))
                check_bits(chk, case, y, sent(src, case))

            case = f"all_gather_into_tensor {tag}"
            out = _zeros(stacked, dtype)
            guarded(chk, case, lambda: dist.all_gather_into_tensor(out, sent(rank, case), group=g))
            check_bits(chk, case, out, torch.cat([sent(i, case) for i in range(ws)]))

            for root in range(ws):
                case = f"gather {tag} dst={root}"
                if dtype.is_complex and known_gap(groups.backend, "complex gather"):
                    continue
                outs = [_zeros(shape, dtype) for _ in range(ws)] if rank == root else None
                guarded(chk, case, lambda: dist.gather(sent(rank, case), outs, dst=root, group=g))
                for i, o in enumerate(outs or []):
                    check_bits(chk, f"{case} [from {i}]", o, sent(i, case))

                case = f"scatter {tag} src={root}"
                got = _zeros(shape, dtype)
                ins = [sent(rank, f"{case} [{i}]") for i in range(ws)] if rank == root else None
                guarded(chk, case, lambda: dist.scatter(got, ins, src=root, group=g))
                check_bits(chk, case, got, sent(root, f"{case} [{rank}]"))

            case = f"all_to_all_single {tag}"
            got = _zeros(stacked, dtype)
            guarded(chk, case, lambda: dist.all_to_all_single(got, sent(rank, case, stacked), group=g))
            expected = torch.cat(
                [sent(i, case, stacked).chunk(ws)[rank] if shape[0] else sent(i, case, stacked) for i in range(ws)]
            )
            check_bits(chk, case, got, expected)

            case = f"isend/recv ring {tag}"
            got = _zeros(shape, dtype)

            def ring() -> None:
                w = dist.isend(sent(rank, case), dst=nxt, group=g)
                dist.recv(got, src=prv, group=g)
                w.wait()

            guarded(chk, case, ring)
            check_bits(chk, case, got, sent(prv, case))
    return finish(chk, groups.test)


# ------------------------------------------------------------ non-contiguous

# name -> (shape of the contiguous base, how to take a non-contiguous view of it)
TRANSPOSED = "transposed (7,5).t()"  # dense, unlike the slices, which have gaps
LAYOUTS: dict[str, tuple[tuple[int, ...], Callable[[torch.Tensor], torch.Tensor]]] = {
    TRANSPOSED: ((7, 5), lambda b: b.t()),
    "strided slice (2001,)[::2]": ((2001,), lambda b: b[::2]),
    "column slice (6,9)[:, 1::3]": ((6, 9), lambda b: b[:, 1::3]),
}
LAYOUT_DTYPES = (torch.float32, torch.int64, torch.bfloat16)


def with_view_replaced(
    base: torch.Tensor, view_fn: Callable[[torch.Tensor], torch.Tensor], value: torch.Tensor
) -> torch.Tensor:
    """A copy of ``base`` whose view region holds ``value`` and is otherwise unchanged."""
    out = base.clone()
    view_fn(out).copy_(value)
    return out


def non_contiguous_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """Non-contiguous views in all_reduce, broadcast, all_gather_into_tensor (input) and
    reduce_scatter_tensor (output), compared with gloo on contiguous copies; the whole
    base storage is checked, so writes outside the view are caught too."""
    chk = Checker(rank)
    g = groups.test
    for (name, (base_shape, view_fn)), dtype in [(item, d) for item in LAYOUTS.items() for d in LAYOUT_DTYPES]:
        tag = f"layout={name} dtype={dtype_name(dtype)} ws={ws}"
        in_place = name == TRANSPOSED or not known_gap(groups.backend, "in-place collectives on views with gaps")
        for op in ("SUM", "MAX") if in_place else ():
            case = f"all_reduce op={op} {tag}"
            base = make_data(rank, case, base_shape, dtype)
            before, view = base.clone(), view_fn(base)
            expected = ref_all_reduce(view.contiguous(), op, groups.ref)
            guarded(chk, case, lambda: dist.all_reduce(view, op=reduce_op(op), group=g))
            chk.equal(case, view, expected)
            chk.equal(case + " [whole base]", base, with_view_replaced(before, view_fn, expected))

        for src in range(ws) if in_place else ():
            case = f"broadcast src={src} {tag}"
            base = make_data(rank, case, base_shape, dtype)
            before, view = base.clone(), view_fn(base)
            expected = ref_broadcast(view.contiguous(), src, groups.ref)
            guarded(chk, case, lambda: dist.broadcast(view, src=src, group=g))
            chk.equal(case, view, expected)
            chk.equal(case + " [whole base]", base, with_view_replaced(before, view_fn, expected))

        case = f"all_gather_into_tensor non-contiguous input {tag}"
        base = make_data(rank, case, base_shape, dtype)
        before, view = base.clone(), view_fn(base)
        out = sentinel_like((view.shape[0] * ws, *view.shape[1:]), dtype)
        guarded(chk, case, lambda: dist.all_gather_into_tensor(out, view, group=g))
        chk.equal(case, out, ref_all_gather(view.contiguous(), groups.ref))
        chk.equal(case + " [input untouched]", base, before)

        for op in ("SUM", "MAX"):
            case = f"reduce_scatter_tensor non-contiguous output op={op} {tag}"
            out_base = sentinel_like(base_shape, dtype)
            out = view_fn(out_base)
            x = make_data(rank, case, (out.shape[0] * ws, *out.shape[1:]), dtype)
            expected = ref_reduce_scatter(x, op, groups.ref)
            guarded(chk, case, lambda: dist.reduce_scatter_tensor(out, x, op=reduce_op(op), group=g))
            chk.equal(case, out, expected)
            chk.equal(
                case + " [whole output base]",
                out_base,
                with_view_replaced(sentinel_like(base_shape, dtype), view_fn, expected),
            )
    return finish(chk, groups.test)


# ------------------------------------------------------------------------ tests


@pytest.mark.multiprocess
@ON_WS_2_3
def test_raw_byte_dtypes(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(raw_dtype_worker))


@pytest.mark.multiprocess
@ON_WS_2_3
def test_non_contiguous(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(non_contiguous_worker))


# ============================================= the ring allreduce on more dtypes, every transport

# (dtype, ops, data): ops gloo (or harness.surface.ref_reduce) has for the dtype.
RING_CASES: tuple[tuple[torch.dtype, tuple[str, ...], str], ...] = (
    (torch.uint8, ("SUM", "MIN", "MAX", "PRODUCT", *BITWISE_OPS), "ints"),
    (torch.int64, ("SUM", "MIN", "MAX", "PRODUCT", "AVG", *BITWISE_OPS), "ints"),
    (torch.bool, ("SUM", "MIN", "MAX", "PRODUCT", *BITWISE_OPS), "bits"),
    (torch.complex64, ("SUM",), "complex"),
)


def ring_numels(ws: int, dtype: torch.dtype) -> tuple[int, int]:
    """Past the one-shot limit: a multiple of ``ws``, and an odd numel ``ws`` does not divide."""
    first = oneshot_limit_bytes(ws) // dtype.itemsize + 1
    divisible = first + (-first) % ws
    odd = first if first % 2 else first + 1
    while odd % ws == 0:
        odd += 2
    return divisible, odd


def ring_input(rank: int, case: str, n: int, dtype: torch.dtype, op: str, data: str) -> torch.Tensor:
    if data == "bits" or op in BITWISE_OPS:
        return random_raw(rank, case, (n,), dtype)
    if data == "complex":
        return small_complex(rank, case, (n,), dtype)
    return small_ints(rank, case, (n,), dtype, "product" if op == "PRODUCT" else "small")


def ring_allreduce_worker(rank: int, ws: int, groups: Groups, transport: str) -> CheckReport:
    """all_reduce past the one-shot limit on uint8/int64/bool/complex64, exact against gloo."""
    chk = Checker(rank)
    check_transport(chk, groups, transport)
    for dtype, ops, data in RING_CASES:
        for n in ring_numels(ws, dtype):
            for op in ops:
                if skip_case(groups.backend, op, dtype):
                    continue
                case = f"ring all_reduce op={op} dtype={dtype_name(dtype)} ws={ws} numel={n} {transport}"
                x = ring_input(rank, case, n, dtype, op, data)
                got = x.clone()
                guarded(chk, case, lambda: dist.all_reduce(got, op=getattr(dist.ReduceOp, op), group=groups.test))
                chk.equal(case, got, ref_reduce(x, op, groups.ref))
    return finish(chk, groups.test)


def assert_ring_ran(trace_dir: str, ws: int, sizes: set[int]) -> None:
    """ringpg's traces show the ring, not the one-shot path, for every all_reduce of ``sizes`` bytes."""
    algorithms = traced_algorithms(trace_dir, "all_reduce")
    missing = sizes - set(algorithms)
    assert not missing, f"no traced all_reduce of {sorted(missing)} bytes; traced: {algorithms}"
    limit = oneshot_limit_bytes(ws)
    for size in sizes:
        assert size > limit and algorithms[size] == {"ring"}, (size, limit, algorithms[size])


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3], ids=lambda ws: f"ws{ws}")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_ring_allreduce_dtypes(world_size: int, transport: str, tmp_path: Any) -> None:
    """Own (traced) workers: the traces must show that every case ran the ring (on one
    host's shared memory with the arena left out: RINGPG_ALGO=ring)."""
    env = transport_env(SHM_RING if transport == "shm" else transport)
    if backend_under_test() == "ringpg":
        env = (*env, ("RINGPG_TRACE", str(tmp_path)))
    assert_reports_ok(run_workers(ring_allreduce_worker, world_size, transport, InitSpec(env=env), timeout=240))
    if backend_under_test() == "ringpg":
        sizes = {n * dtype.itemsize for dtype, _, _ in RING_CASES for n in ring_numels(world_size, dtype)}
        assert_ring_ran(str(tmp_path), world_size, sizes)


# ============================================= the reduction kernels, one process

INT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
LENGTHS = [0, 1, 7, 31, 64, 1000, 4099]
ISA_NAMES = ("avx512+bf16", "avx512", "avx2", "sve", "neon", "baseline")


def _python_cmd() -> list[str]:
    """How to start this Python in a child process."""
    cmd = os.environ.get("RINGPG_TEST_PYTHON")
    return shlex.split(cmd) if cmd else [sys.executable]


def _data(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        x = torch.randn(n, generator=g, dtype=torch.float64) * 100
        if n > 3:
            x[3] = float("nan")  # NaN on both sides
        if n > 20:
            x[16 + seed] = float("nan")  # NaN on one side only, inside a vector block
            x[17 + seed] = float("inf") if seed == 1 else -float("inf")
        if n > 40:
            # Results below float's (and bf16's) smallest normal, in the second 32-lane
            # block: hardware converters flush these, torch does not.
            x[33] = 3e-39 * seed
            x[35] = -1e-40 if seed == 1 else 1e-19
        if n > 48:
            # float16's edges, inside a 16-lane block: results that are half denormals
            # (below 6.1e-5, down to its smallest, 6e-8) and a sum past its largest, 65504.
            x[40] = 1e-5 * seed
            x[41] = -6e-8 if seed == 1 else 2e-7
            x[42] = 60000.0 if seed == 1 else 6000.0
        return x.to(dtype)
    if dtype == torch.uint64:
        return _uint64_data(n, seed, g)
    info = torch.iinfo(dtype)
    # Signed int64 stays within +-2**62 so that SUM cannot overflow (undefined in C++).
    lo, hi = max(info.min, -(2**62)), min(info.max, 2**62)
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


def _uint64_data(n: int, seed: int, g: torch.Generator) -> torch.Tensor:
    """uint64 over its whole range (wrap-around is defined for unsigned), with pairs that
    only an unsigned 64-bit comparison orders right: across 2**63, where a signed view
    flips the order, and neighbours above 2**53, which a float64 view cannot tell apart."""
    bits = torch.randint(-(2**63), 2**63 - 1, (n,), generator=g, dtype=torch.int64)
    # (seed 1, seed 2) values as int64 bit patterns: 2**64-2 vs 2**64-1, 2**63 vs
    # 2**63+1, 2**63-1 vs 2**63, 2**60+1 vs 2**60, and the extremes 0 vs 2**64-1.
    edges = [(-2, -1), (-(2**63), -(2**63) + 1), (2**63 - 1, -(2**63)), (2**60 + 1, 2**60), (0, -1)]
    for i, pair in enumerate(edges):
        if 5 + 9 * i < n:
            bits[5 + 9 * i] = pair[seed - 1]
    return bits.view(torch.uint64)


def _reference(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype == torch.bool:
        return {"SUM": a | b, "MAX": a | b, "BOR": a | b, "PRODUCT": a & b, "MIN": a & b, "BAND": a & b, "BXOR": a ^ b}[
            op
        ]
    if a.dtype == torch.uint64:
        return _uint64_reference(op, a, b)
    wide = a.dtype in (torch.uint16, torch.uint32)
    x, y = (a.to(torch.int64), b.to(torch.int64)) if wide else (a, b)
    r = {
        "SUM": lambda: x + y,
        "PRODUCT": lambda: x * y,
        "MIN": lambda: torch.minimum(x, y),
        "MAX": lambda: torch.maximum(x, y),
        "BAND": lambda: x & y,
        "BOR": lambda: x | y,
        "BXOR": lambda: x ^ y,
    }[op]()
    return r.to(a.dtype)


def _uint64_reference(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """uint64 through its int64 bit pattern: SUM, PRODUCT and the bitwise ops are the same
    bits modulo 2**64; for MIN/MAX, flipping the top bit maps unsigned order onto signed
    order exactly (no float64 rounding)."""
    x, y = a.view(torch.int64), b.view(torch.int64)
    if op in ("MIN", "MAX"):
        top = torch.tensor(-(2**63), dtype=torch.int64)
        a_first = ((x ^ top) < (y ^ top)) == (op == "MIN")
        return torch.where(a_first, x, y).view(torch.uint64)
    r = {"SUM": x + y, "PRODUCT": x * y, "BAND": x & y, "BOR": x | y, "BXOR": x ^ y}[op]
    return r.view(torch.uint64)


@pytest.mark.inprocess
@needs_C
@pytest.mark.parametrize("isa", _C.reduce_isas() if _C is not None else ["baseline"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES + [torch.bool], ids=str)
def test_kernels_match_torch(dtype: torch.dtype, isa: str) -> None:
    ops = ["SUM", "PRODUCT", "MIN", "MAX"]
    if not dtype.is_floating_point:
        ops += ["BAND", "BOR", "BXOR"]
    for op in ops:
        for n in LENGTHS:
            a, b = _data(dtype, n, 1), _data(dtype, n, 2)
            out = torch.empty_like(a)
            _C.reduce_kernel(op, out, a, b, isa=isa)
            ref = _reference(op, a, b)
            assert (
                torch.equal(out.view(torch.uint8), ref.view(torch.uint8))
                or torch.equal(out, ref)
                or (
                    dtype.is_floating_point
                    and torch.allclose(out.double(), ref.double(), equal_nan=True, rtol=0, atol=0)
                )
            ), (op, dtype, n, out[:8], ref[:8])


def _same_floats(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """The same bits, or the same values with NaN where the other has NaN (its payload
    may differ: torch's scalar and vector bf16 conversions quiet NaN differently)."""
    if torch.equal(got.view(torch.uint8), ref.view(torch.uint8)):
        return True
    nan = got.isnan()
    return torch.equal(nan, ref.isnan()) and torch.equal(got[~nan], ref[~nan])


@pytest.mark.inprocess
@needs_C
@pytest.mark.parametrize("isa", _C.reduce_isas() if _C is not None else ["baseline"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_scaling_kernels_match_torch(dtype: torch.dtype, isa: str) -> None:
    """AVG's last step and PREMUL_SUM's product on floating dtypes: ringpg's kernels give
    torch's bits (fp16 and bf16 in fp32, rounded once), by true division, by the exact
    reciprocal of a power-of-two world size, and by a factor of float64 precision; NaN,
    infinities and denormal results included, in place and out of place."""
    for n in LENGTHS:
        x = _data(dtype, n, 1)
        if n > 40:
            x[40] = torch.finfo(dtype).tiny  # a denormal quotient
            x[41] = -torch.finfo(dtype).max
        for divisor in (1, 2, 3, 4, 5, 7, 8, 12, 16, 1000):
            got = x.clone()
            _C.scale_kernel(got, got, divisor, True, isa=isa)
            assert _same_floats(got, torch.div(x, divisor)), (dtype, isa, divisor, n, got[:8])
        for factor in (0.5, 1 / 3, -2.5e-3, 3.0, 1e30):
            got = torch.empty_like(x)
            _C.scale_kernel(got, x, factor, False, isa=isa)
            assert _same_floats(got, x * factor), (dtype, isa, factor, n, got[:8])


@pytest.mark.inprocess
@needs_C
def test_in_place_accumulate_and_dispatch_name() -> None:
    a = torch.arange(1000, dtype=torch.float32)
    b = torch.ones(1000, dtype=torch.float32)
    _C.reduce_kernel("SUM", a, a, b)
    assert torch.equal(a, torch.arange(1000, dtype=torch.float32) + 1)
    assert _C.reduce_isa() in ISA_NAMES
    # What ringpg dispatches to is the best copy this CPU runs; baseline always runs.
    assert _C.reduce_isas()[0] == _C.reduce_isa() and _C.reduce_isas()[-1] == "baseline"
    with pytest.raises(RuntimeError, match="cannot run on this CPU"):
        _C.reduce_kernel("SUM", a, a, b, isa="sse9")


@pytest.mark.inprocess
@needs_C
def test_unsupported_pairs_are_refused() -> None:
    a = torch.ones(4)
    with pytest.raises(RuntimeError):
        _C.reduce_kernel("BAND", a, a, a)


def _isa_in_fresh_process(setting: str, out: Any) -> None:
    """In a process that has not loaded ringpg yet: what RINGPG_TUNING=reduce_isa=setting gives."""
    os.environ["RINGPG_TUNING"] = f"reduce_isa={setting}"
    try:
        import ringpg._C as c

        out.put((setting, True, c.reduce_isa()))
    except Exception as e:  # noqa: BLE001 - the refusal is what the test reads
        out.put((setting, False, str(e)))


def _isas_chosen(settings: list[str]) -> dict[str, tuple[bool, str]]:
    """RINGPG_TUNING is read once per process, so each setting needs a process of
    its own: forked from the harness's server, which has torch loaded and not ringpg
    (milliseconds each, where a fresh interpreter costs seconds), or, under emulation
    (RINGPG_TEST_PYTHON), interpreters started together."""
    if os.environ.get("RINGPG_TEST_PYTHON"):
        probe = "import ringpg._C as c; print(c.reduce_isa())"
        procs = {
            s: subprocess.Popen(
                [*_python_cmd(), "-c", probe],
                env=dict(os.environ, RINGPG_TUNING=f"reduce_isa={s}"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for s in settings
        }
        got = {}
        for s, p in procs.items():
            stdout, stderr = p.communicate(timeout=300)
            got[s] = (p.returncode == 0, stdout.strip() if p.returncode == 0 else stderr)
        return got
    ctx = worker_context()
    q = ctx.Queue()
    procs = [ctx.Process(target=_isa_in_fresh_process, args=(s, q)) for s in settings]
    for p in procs:
        p.start()
    try:
        return {s: (ok, what) for s, ok, what in (q.get(timeout=120) for _ in procs)}
    finally:
        for p in procs:
            p.join(timeout=10)


@pytest.mark.multiprocess
@needs_C
def test_reduce_isa_setting_pins_a_copy_or_is_refused() -> None:
    """Tuning key reduce_isa picks the copy ringpg dispatches to; one the CPU cannot run is
    refused with the choices, at the first use (a group's creation)."""
    got = _isas_chosen([*_C.reduce_isas(), "sse9"])
    for isa in _C.reduce_isas():
        assert got[isa] == (True, isa), (isa, got[isa])
    ok, why = got["sse9"]
    assert not ok and "RINGPG_TUNING reduce_isa=sse9 cannot run on this CPU" in why, why
    assert "baseline" in why


@pytest.mark.inprocess
@needs_C
def test_copies_found_for_this_cpu() -> None:
    """The copies the CPU runs, as its architecture makes them: on aarch64 NEON always
    (Advanced SIMD is part of the base ISA) and SVE where the kernel reports it
    (HWCAP_SVE); under emulation exactly those the emulated CPU offers."""
    isas = _C.reduce_isas()
    assert set(isas) <= set(ISA_NAMES) and isas[-1] == "baseline", isas
    expected = os.environ.get("RINGPG_TEST_EXPECT_ISAS")
    if expected:
        assert isas == expected.split(","), (isas, expected)
    if os.uname().machine == "aarch64":
        assert isas[-2:] == ["neon", "baseline"] and not any(i.startswith("avx") for i in isas), isas
    elif os.uname().machine == "x86_64":
        assert not {"sve", "neon"} & set(isas), isas
