"""Blind spots of the suite (issue #23), each against gloo in the same processes.

* #23 point 1: scatter, gather, all_to_all_single and list all_gather leave their
  *inputs* unchanged (a clone kept before the call is compared after it), besides
  their outputs matching gloo's (:func:`test_inputs_unchanged`);
* point 2: the ring allreduce (sizes past the one-shot limit,
  ``RINGPG_ONESHOT_BYTES`` x (world size - 1)) on uint8, int64, bool and complex64,
  on a numel divisible by the world size and an odd one that is not; ringpg's
  traces (``RINGPG_TRACE``) must show every one of them on the ring
  (:func:`test_ring_allreduce_dtypes`);
* point 3: over TCP, batteries that otherwise run only on shared memory, imported
  from their modules: reduce to every root, all_reduce and reduce_scatter_tensor
  under SUM/AVG/MIN/MAX/PRODUCT, PREMUL_SUM, BAND/BOR/BXOR, list all_gather
  (test_collectives.py, test_surface_reduce_ops.py) and the coalesced APIs
  (test_surface_collectives.py) (:func:`test_tcp_surface`);
* point 5: world size 8, more ranks than cores: all_reduce (one-shot and ring),
  reduce_scatter_tensor and all_gather_into_tensor, the traces telling the ring and
  one-shot all_reduces apart (:func:`test_world_size_8`).

(Point 4, AVG reduce-scatter in gloo, is settled in harness/gloo_gaps.py.)

Every test runs on both transports (shared memory, and TCP through
``RINGPG_TRANSPORT=tcp``) except the TCP-only point 3.  Data are small integers or
random bits, so every comparison is exact.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
import torch
import torch.distributed as dist
from harness import (
    TRANSPORT_ENVS,
    Checker,
    CheckReport,
    Groups,
    InitSpec,
    TaskFn,
    WorkerPool,
    assert_reports_ok,
    backend_under_test,
    dtype_name,
    global_rank,
    hier_pieces,
    known_gap,
    make_data,
    oneshot_limit_bytes,
    ref_all_gather,
    ref_all_reduce,
    ref_reduce_scatter,
    run_workers,
    sentinel_like,
    skip_case,
    traced_algorithms,
    traced_pieces,
)
from harness.batteries import (
    all_gather_list_worker,
    all_reduce_worker,
    bitwise_worker,
    coalescing_manager_worker,
    deprecated_coalesced_worker,
    functional_coalesced_worker,
    premul_sum_worker,
    reduce_every_dst_worker,
    reduce_scatter_tensor_worker,
)
from harness.surface import BITWISE_OPS, finish, guarded, random_raw, ref_reduce, small_complex, small_ints
from harness.transports import a2a_split, check_transport, on_transports, transport_worker

TRANSPORTS = tuple(TRANSPORT_ENVS)


# ----------------------------------------------------- point 1: inputs unchanged

UNCHANGED_DTYPES = (torch.int64, torch.float32, torch.uint8)
# (1000,) fits one message; (3, 43691) spans several 512 KiB shared-memory slots in
# float32 and int64 (all_to_all_single moves ws times that: 3 MiB at ws 3).
UNCHANGED_SHAPES: tuple[tuple[int, ...], ...] = ((1,), (1000,), (3, 43691))


def check_unchanged(
    chk: Checker, case: str, tensors: Optional[list[torch.Tensor]], kept: Optional[list[torch.Tensor]]
) -> None:
    """Every tensor in ``tensors`` still equals its clone in ``kept``."""
    for i, (t, k) in enumerate(zip(tensors or [], kept or [])):
        chk.equal(f"{case} [input {i} unchanged]", t, k)


def clones(tensors: Optional[list[torch.Tensor]]) -> Optional[list[torch.Tensor]]:
    return None if tensors is None else [t.clone() for t in tensors]


def inputs_unchanged_worker(rank: int, ws: int, groups: Groups, transport: str) -> CheckReport:
    """scatter/gather from every root, all_to_all_single (equal and unequal splits), list all_gather."""
    chk = Checker(rank)
    check_transport(chk, groups, transport)
    g, ref = groups.test, groups.ref
    for dtype in UNCHANGED_DTYPES:
        for shape in UNCHANGED_SHAPES:
            tag = f"dtype={dtype_name(dtype)} ws={ws} shape={shape} {transport}"
            for root in range(ws):
                case = f"gather {tag} dst={root}"
                x = make_data(rank, case, shape, dtype)
                kept = x.clone()
                outs = [sentinel_like(shape, dtype) for _ in range(ws)] if rank == root else None
                guarded(chk, case, lambda: dist.gather(x, outs, dst=global_rank(g, root), group=g))
                check_unchanged(chk, case, [x], [kept])
                expected = ref_all_gather(kept.reshape(-1), ref).reshape(ws, *shape)
                for i, o in enumerate(outs or []):
                    chk.equal(f"{case} [from rank {i}]", o, expected[i])

                case = f"scatter {tag} src={root}"
                inputs = [make_data(rank, f"{case} [{i}]", shape, dtype) for i in range(ws)] if rank == root else None
                kept_in = clones(inputs)
                got = sentinel_like(shape, dtype)
                guarded(chk, case, lambda: dist.scatter(got, inputs, src=global_rank(g, root), group=g))
                check_unchanged(chk, case, inputs, kept_in)
                want = sentinel_like(shape, dtype)
                dist.scatter(want, kept_in, src=global_rank(ref, root), group=ref)
                chk.equal(case, got, want)

            numel = 1
            for s in shape:
                numel *= s
            for splits in ("equal", "unequal"):
                case = f"all_to_all_single splits={splits} {tag}"
                if splits == "equal":
                    in_splits = out_splits = None
                    n_in = n_out = numel * ws
                else:
                    in_splits = [a2a_split(rank, j, ws, numel) for j in range(ws)]
                    out_splits = [a2a_split(j, rank, ws, numel) for j in range(ws)]
                    n_in, n_out = sum(in_splits), sum(out_splits)
                x = make_data(rank, case, (n_in,), dtype)
                kept = x.clone()
                got = sentinel_like((n_out,), dtype)
                guarded(chk, case, lambda: dist.all_to_all_single(got, x, out_splits, in_splits, group=g))
                check_unchanged(chk, case, [x], [kept])
                want = sentinel_like((n_out,), dtype)
                dist.all_to_all_single(want, kept, out_splits, in_splits, group=ref)
                chk.equal(case, got, want)

            case = f"all_gather(list) {tag}"
            x = make_data(rank, case, shape, dtype)
            kept = x.clone()
            outs = [sentinel_like(shape, dtype) for _ in range(ws)]
            guarded(chk, case, lambda: dist.all_gather(outs, x, group=g))
            check_unchanged(chk, case, [x], [kept])
            want = [sentinel_like(shape, dtype) for _ in range(ws)]
            dist.all_gather(want, kept, group=ref)
            for i in range(ws):
                chk.equal(f"{case} [from rank {i}]", outs[i], want[i])
    return finish(chk, g)


@on_transports(*TRANSPORTS)
def test_inputs_unchanged(bpool: WorkerPool, transport: str) -> None:
    assert_reports_ok(bpool.run(inputs_unchanged_worker, transport, timeout=240))


# ------------------------------------------------- point 2: ring allreduce dtypes

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


@pytest.mark.parametrize("world_size", [2, 3], ids=lambda ws: f"ws{ws}")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_ring_allreduce_dtypes(world_size: int, transport: str, tmp_path: Any) -> None:
    """Own (traced) workers: the traces must show that every case ran the ring."""
    env = TRANSPORT_ENVS[transport]
    if backend_under_test() == "ringpg":
        env = (*env, ("RINGPG_TRACE", str(tmp_path)))
    assert_reports_ok(run_workers(ring_allreduce_worker, world_size, transport, InitSpec(env=env), timeout=240))
    if backend_under_test() == "ringpg":
        sizes = {n * dtype.itemsize for dtype, _, _ in RING_CASES for n in ring_numels(world_size, dtype)}
        assert_ring_ran(str(tmp_path), world_size, sizes)


# ------------------------------------------- point 3: the surface batteries on TCP

# (id, worker, args, the gloo gap that skips it in RINGPG_TEST_BACKEND=gloo runs).
# The workers are the shared-memory suite's own (imported, not copied).
TCP_BATTERIES: tuple[tuple[str, TaskFn, Any, Optional[str]], ...] = (
    # reduce to every root (non-zero ones included), harness.DTYPES x SUM/AVG/MIN/MAX/PRODUCT
    ("reduce_every_dst", reduce_every_dst_worker, None, None),
    # all_reduce, every dtype x SUM/AVG/MIN/MAX/PRODUCT x numels up to 2**20+3
    ("all_reduce_ops", all_reduce_worker, "flat", None),
    ("reduce_scatter_ops", reduce_scatter_tensor_worker, "flat", None),
    ("premul_sum", premul_sum_worker, None, "PREMUL_SUM"),
    ("bitwise", bitwise_worker, None, None),
    ("all_gather_list", all_gather_list_worker, "flat", None),
    # all_reduce_coalesced / all_gather_coalesced
    ("deprecated_coalesced", deprecated_coalesced_worker, None, None),
    # _coalescing_manager around all_reduce / all_gather_into_tensor / reduce_scatter_tensor
    ("coalescing_manager", coalescing_manager_worker, None, None),
    # funcol all_gather_into_tensor_coalesced / reduce_scatter_tensor_coalesced
    ("functional_coalesced", functional_coalesced_worker, None, None),
)


@on_transports("tcp")
@pytest.mark.parametrize("battery", TCP_BATTERIES, ids=lambda b: b[0])
def test_tcp_surface(bpool: WorkerPool, battery: tuple[str, TaskFn, Any, Optional[str]]) -> None:
    """A battery of the API-surface suite (run there on shared memory only) over TCP."""
    _, worker, args, gap = battery
    if gap is not None and known_gap(backend_under_test(), gap):
        pytest.skip(f"{backend_under_test()} lacks: {gap}")
    if backend_under_test() == "ringpg":
        assert bpool.run(transport_worker) == ["tcp"] * bpool.world_size
    assert_reports_ok(bpool.run(worker, args, timeout=240))


# ------------------------------------------------------- point 5: world size 8

WS8 = 8
# A smaller one-shot limit (64 KiB x 7 peers = 448 KiB), so that a 1 MiB all_reduce
# runs the ring at world size 8 without tensors past 1 MiB.
WS8_ONESHOT_BYTES = 65536
WS8_RING_NUMEL = 2**18 - 5  # int32: just under 1 MiB, not a multiple of 8
# int32, 2000 B: one-shot, also across the emulated hosts of "mixed", where a host's 4
# ranks share its link (2000 B x 7 peers x 4 ranks <= 64 KiB; README, RINGPG_ONESHOT_BYTES).
WS8_SMALL_NUMEL = 500
# int32, 4000 B: one-shot on one host (x 7 peers <= 64 KiB), but not across the emulated
# hosts (x 4 ranks sharing a link > 64 KiB): hierarchical there.
WS8_SHARED_LINK_NUMEL = 1000
WS8_BLOCKS = (3, 2**15)  # per-rank blocks of reduce_scatter / all_gather (whole: 96 B, 1 MiB)


# On "mixed" (two emulated hosts of four ranks: hierarchical), the big cases move in
# pieces of 64 KiB, the rings across hosts on the op's second thread (hierarchical.h),
# on every dtype the hierarchical reductions distinguish and under SUM, AVG and MAX.
WS8_PIECE_BYTES = 65536
WS8_MIXED_DTYPES = (torch.int32, torch.float32, torch.bfloat16)
WS8_MIXED_OPS = ("SUM", "AVG", "MAX")


def world_size_8_worker(rank: int, ws: int, groups: Groups, transport: str) -> CheckReport:
    """all_reduce (one-shot and ring), reduce_scatter_tensor, all_gather_into_tensor;
    int32 under SUM and MAX (on "mixed" also float32 and bfloat16, and AVG); the inputs
    of reduce_scatter_tensor and all_gather_into_tensor left unchanged."""
    chk = Checker(rank)
    check_transport(chk, groups, transport)
    mixed = transport == "mixed"
    chk.true(
        "the big all_reduce is past the one-shot limit",
        WS8_RING_NUMEL * 4 > oneshot_limit_bytes(ws),
        f"limit {oneshot_limit_bytes(ws)} B",
    )
    for dtype in WS8_MIXED_DTYPES if mixed else (torch.int32,):
        d = dtype_name(dtype)
        for op in WS8_MIXED_OPS if mixed else ("SUM", "MAX"):
            if skip_case(backend_under_test(), op, dtype):
                continue
            for n in (WS8_SMALL_NUMEL, WS8_SHARED_LINK_NUMEL, WS8_RING_NUMEL):
                case = f"all_reduce op={op} dtype={d} ws={ws} numel={n} {transport}"
                x = make_data(rank, case, (n,), dtype)
                got = x.clone()
                guarded(chk, case, lambda: dist.all_reduce(got, op=getattr(dist.ReduceOp, op), group=groups.test))
                chk.equal(case, got, ref_all_reduce(x, op, groups.ref))
            for block in WS8_BLOCKS:
                case = f"reduce_scatter_tensor op={op} dtype={d} ws={ws} numel={block * ws} {transport}"
                x = make_data(rank, case, (block * ws,), dtype)
                inp, out = x.clone(), sentinel_like((block,), dtype)
                guarded(
                    chk,
                    case,
                    lambda: dist.reduce_scatter_tensor(out, inp, op=getattr(dist.ReduceOp, op), group=groups.test),
                )
                chk.equal(case, out, ref_reduce_scatter(x, op, groups.ref))
                chk.equal(f"{case} [input unchanged]", inp, x)
        for block in WS8_BLOCKS:
            case = f"all_gather_into_tensor dtype={d} ws={ws} numel={block} {transport}"
            x = make_data(rank, case, (block,), dtype)
            inp, out = x.clone(), sentinel_like((block * ws,), dtype)
            guarded(chk, case, lambda: dist.all_gather_into_tensor(out, inp, group=groups.test))
            chk.equal(case, out, ref_all_gather(x, groups.ref))
            chk.equal(f"{case} [input unchanged]", inp, x)
    return finish(chk, groups.test)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_world_size_8(transport: str, tmp_path: Any) -> None:
    """Eight ranks on a machine with fewer cores: every wait must yield, nothing may hang.

    The traces must show the big all_reduce on the ring (hierarchical on the emulated
    hosts of "mixed": two hosts of four ranks) and the small ones one-shot (but for one
    past the limit of a link that four ranks share, hierarchical on "mixed"; and on the ring
    over shared memory, where only ring neighbours share memory), and reduce-scatter
    and all-gather on the ring (likewise hierarchical on "mixed").
    """
    env = (*TRANSPORT_ENVS[transport], ("RINGPG_ONESHOT_BYTES", str(WS8_ONESHOT_BYTES)))
    if transport == "mixed":
        env = (*env, ("RINGPG_HIER_PIECE_BYTES", str(WS8_PIECE_BYTES)))
    if backend_under_test() == "ringpg":
        env = (*env, ("RINGPG_TRACE", str(tmp_path)))
    assert_reports_ok(run_workers(world_size_8_worker, WS8, transport, InitSpec(env=env), timeout=120))
    if backend_under_test() == "ringpg":
        algorithms = traced_algorithms(str(tmp_path), "all_reduce")
        big = "hier" if transport == "mixed" else "ring"
        assert algorithms.get(WS8_RING_NUMEL * 4) == {big}, algorithms
        if transport == "mixed":
            assert_ws8_pieces(str(tmp_path))
        # Reduce-scatter and all-gather, too, run hierarchically across the emulated hosts.
        for op in ("reduce_scatter_tensor", "all_gather_into_tensor"):
            seen = set().union(*traced_algorithms(str(tmp_path), op).values())
            assert seen == {big}, (op, seen)
        # One-shot where every rank reaches every other over the same kind of link; on
        # one host over shared memory only ring neighbours share memory, so the ring.
        small = "ring" if transport == "shm" else "one_shot"
        assert algorithms.get(WS8_SMALL_NUMEL * 4) == {small}, algorithms
        shared_link = "hier" if transport == "mixed" else small
        assert algorithms.get(WS8_SHARED_LINK_NUMEL * 4) == {shared_link}, algorithms


def assert_ws8_pieces(trace_dir: str) -> None:
    """The traces of "mixed" (2 hosts x 4 ranks): every big all_reduce, reduce-scatter and
    all-gather moved in as many pieces as RINGPG_HIER_PIECE_BYTES gives, on two threads
    (issue 31 item 1: a silent fall-back to one piece would pass every result check)."""
    want: dict[str, dict[int, set[tuple[int, int]]]] = {
        "all_reduce": {},
        "reduce_scatter_tensor": {},
        "all_gather_into_tensor": {},
    }
    for dtype in WS8_MIXED_DTYPES:
        es = dtype.itemsize
        want["all_reduce"][WS8_RING_NUMEL * es] = {hier_pieces(WS8_RING_NUMEL * es, WS8_RING_NUMEL, WS8_PIECE_BYTES)}
        # Traced bytes: reduce-scatter's input, all-gather's input (one rank's block).
        block = WS8_BLOCKS[-1]
        pieces = {hier_pieces(block * WS8 * es, block, WS8_PIECE_BYTES)}
        want["reduce_scatter_tensor"][block * WS8 * es] = pieces
        want["all_gather_into_tensor"][block * es] = pieces
    for op, sizes in want.items():
        traced = traced_pieces(trace_dir, op)
        got = {b: traced.get(b) for b in sizes}
        assert got == sizes, (op, got, sizes)
        assert all(p[0] > 1 and p[1] == 2 for v in sizes.values() for p in v), sizes  # what the test means
