"""The collectives of the backend under test against gloo, in the same processes.

* all_reduce, reduce_scatter (tensor and list), all_gather (into a tensor and into a
  list) and broadcast at world sizes 1..5, one pool of workers per world size, each
  test a whole battery: every dtype x op x numel in {0, 1, ws-1, ws, 1000} (plus
  2**20+3 for float32 and int32 only, to keep the runtime reasonable; see
  harness.numels_for), on flat tensors and on 2-D ones of shape (3, 7); an all_gather
  input that is a view of its own output; barrier with one rank late each round;
  random floats under stated tolerances;
* the rest of the API surface at world sizes 2 and 3: gather and scatter to and from
  every root; all_to_all_single with equal, unequal and zero-size splits and
  all-empty inputs, all_to_all on lists; the coalesced APIs (all_reduce_coalesced and
  all_gather_coalesced, deprecated but still exercised, ``_coalescing_manager`` around
  all_reduce / all_gather_into_tensor / reduce_scatter_tensor, sync and with
  ``async_ops=True``, and the functional all_gather_into_tensor_coalesced /
  reduce_scatter_tensor_coalesced); the object collectives with objects of
  rank-dependent size; point-to-point (tags received in another order than sent, recv
  from any source, batch_isend_irecv rings); the profiler's ``<backend>:all_reduce``;
* ``async_op=True`` at world sizes 1 and 3: ops of every kind in flight before any is
  waited on; each Work completes (``wait()``, ``is_completed()``) with gloo's result
  and a future whose value is the list of output tensors (the tensors the op wrote,
  not copies); futures complete on their own (``then`` chains and
  ``torch.futures.wait_all``, no ``Work.wait``);
* subgroups at world size 4: ``dist.new_group`` of a non-contiguous pair ([1, 3]) and
  a prefix ([0, 1, 2]) with non-members getting NON_GROUP_MEMBER, and
  ``dist.new_subgroups(group_size=2)`` running at the same time; on each,
  harness.smoke_checks plus reduce to a global destination, scatter, object
  collectives and a point-to-point ring by group rank; the world group still works
  once they are destroyed;
* on every transport of harness.TRANSPORT_ENVS (shared memory, ringpg's TCP, Gloo's
  pairs, emulated hosts): scatter, gather, all_to_all_single and list all_gather
  leave their *inputs* unchanged; numel 0 (all_reduce and reduce to group rank 1
  under SUM, PREMUL_SUM, BAND/BOR/BXOR, complex64 SUM, bool MAX, int64 and uint64
  MIN) leaves empty tensors of unchanged shape, like gloo where gloo has the case;
  the subgroup {0, 2} of 3 (all_to_all_single, gather to its second rank,
  all_reduce_coalesced, an async all_reduce's future); world size 8, more ranks than
  cores (all_reduce one-shot and on the ring, reduce_scatter_tensor,
  all_gather_into_tensor), ringpg's traces telling the algorithms apart.

Data are small integers (harness.make_data) or random bits, so every result but the
random floats' is exact and compared with ``torch.equal``.  AVG is compared with
gloo's SUM divided by the world size in the same dtype (truncating for integer
dtypes).  Reduce-scatter references come from a gloo all_reduce, so they do not depend
on gloo's reduce_scatter; where gloo has no such call (all-reduce inside a coalescing
block, say) the reference is built from gloo's all_reduce / all_gather (harness refs).
"""

from __future__ import annotations

import itertools
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Optional

import pytest
import torch
import torch.distributed as dist
from harness import (
    DTYPES,
    OPS,
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
    expect_error,
    global_rank,
    hier_pieces,
    known_gap,
    make_data,
    make_random_float,
    oneshot_limit_bytes,
    reduce_op,
    ref_all_gather,
    ref_all_reduce,
    ref_broadcast,
    ref_reduce_scatter,
    ref_reduce_scatter_many,
    run_workers,
    sentinel_like,
    skip_case,
    smoke_checks,
    traced_algorithms,
    traced_pieces,
    transport_env,
    transport_expected,
    transport_of,
)
from harness.batteries import (
    all_gather_list_worker,
    all_reduce_worker,
    block_shapes,
    case_name,
    coalescing_manager_worker,
    deprecated_coalesced_worker,
    functional_coalesced_worker,
    reduce_scatter_tensor_worker,
    reducing_cases,
    stacked_shape,
)
from harness.surface import finish, guarded
from harness.transports import a2a_split, check_transport, on_transports

from devkit.settings import with_tuning

pytestmark = pytest.mark.multiprocess

# The world sizes of each part below (module scope: pytest groups the tests by world
# size, and each pool of workers starts once per size).
ON_WS_1_TO_5 = pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5], ids=lambda ws: f"ws{ws}", scope="module")
ON_WS_2_3 = pytest.mark.parametrize("world_size", [2, 3], ids=lambda ws: f"ws{ws}", scope="module")
ON_WS_1_3 = pytest.mark.parametrize("world_size", [1, 3], ids=lambda ws: f"ws{ws}", scope="module")
ON_WS_4 = pytest.mark.parametrize("world_size", [4], ids=lambda ws: f"ws{ws}", scope="module")
TRANSPORTS = tuple(TRANSPORT_ENVS)


# ============================================= the main collectives, world sizes 1..5

# ---------------------------------------------------------------- worker bodies


def reduce_scatter_list_worker(rank: int, ws: int, groups: Groups, layout: str) -> CheckReport:
    chk = Checker(rank)
    for dtype, op, shapes in reducing_cases(groups.backend, layout, ws):
        cases = [case_name("reduce_scatter(list)", op, dtype, ws, shape) for shape in shapes]
        xs = [make_data(rank, c, stacked_shape(s, ws), dtype, data_kind(op)) for c, s in zip(cases, shapes)]
        for case, shape, x, want in zip(cases, shapes, xs, ref_reduce_scatter_many(xs, op, groups.ref)):
            inputs = [x.narrow(0, i * shape[0], shape[0]).clone() for i in range(ws)]
            out = sentinel_like(shape, dtype)
            dist.reduce_scatter(out, inputs, op=reduce_op(op), group=groups.test)
            chk.equal(case, out, want)
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


@ON_WS_1_TO_5
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


@ON_WS_1_TO_5
@pytest.mark.parametrize("where", ["own", "next"])
def test_all_gather_input_inside_output(pool: WorkerPool, where: str) -> None:
    """An input that aliases the output is read before the ring overwrites it."""
    assert_reports_ok(pool.run(all_gather_aliased_worker, where))


@ON_WS_1_TO_5
def test_barrier(pool: WorkerPool) -> None:
    reports = pool.run(barrier_worker)
    ws = len(reports)
    for i in range(BARRIER_ROUNDS):
        late = i % ws
        last_enter = reports[late].extra[i][0]
        early_leavers = [r.rank for r in reports if r.extra[i][1] < last_enter]
        assert not early_leavers, f"barrier round {i}: ranks {early_leavers} left before rank {late} entered"


@ON_WS_1_TO_5
def test_random_floats_with_tolerance(pool: WorkerPool) -> None:
    assert_reports_ok(pool.run(random_float_worker))


# ============================================= the rest of the API surface, world sizes 2, 3

ROOTED_DTYPES = (torch.float32, torch.int64, torch.bfloat16, torch.uint8)
ROOTED_SHAPES = ((0,), (1,), (1000,), (3, 7))

# ------------------------------------------------------------ gather / scatter


def gather_scatter_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """gather to and scatter from every root, several dtypes and shapes."""
    chk = Checker(rank)
    for dtype in ROOTED_DTYPES:
        for shape in ROOTED_SHAPES:
            for root in range(ws):
                case = f"gather dtype={dtype_name(dtype)} ws={ws} shape={shape} dst={root}"
                x = make_data(rank, case, shape, dtype)
                outs: Optional[list[torch.Tensor]] = (
                    [sentinel_like(shape, dtype) for _ in range(ws)] if rank == root else None
                )
                dist.gather(x, outs, dst=global_rank(groups.test, root), group=groups.test)
                expected = ref_all_gather(x.reshape(-1), groups.ref).reshape(ws, *shape)
                if outs is not None:
                    for i, o in enumerate(outs):
                        chk.equal(f"{case} [from rank {i}]", o, expected[i])

                case = f"scatter dtype={dtype_name(dtype)} ws={ws} shape={shape} src={root}"
                inputs = [make_data(rank, f"{case} [{i}]", shape, dtype) for i in range(ws)] if rank == root else None
                got = sentinel_like(shape, dtype)
                dist.scatter(got, inputs, src=global_rank(groups.test, root), group=groups.test)
                ref = sentinel_like(shape, dtype)
                dist.scatter(ref, inputs, src=global_rank(groups.ref, root), group=groups.ref)
                chk.equal(case, got, ref)
    return finish(chk, groups.test)


# ------------------------------------------------------------------ all-to-all

# Rows rank r sends to rank j, per pattern; None means equal splits (no split args).
SPLIT_PATTERNS: dict[str, Optional[Callable[[int, int], int]]] = {
    "equal": None,
    "unequal with zeros": lambda r, j: (r + 2 * j) % 3,
    "rank 0 sends nothing": lambda r, j: 0 if r == 0 else j + 1,
    "nothing at all": lambda r, j: 0,
}
EQUAL_ROWS = 2  # rows per destination for the "equal" pattern


def all_to_all_single_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """all_to_all_single, every split pattern x 1-D and 2-D rows x a few dtypes."""
    chk = Checker(rank)
    for name, rows in SPLIT_PATTERNS.items():
        if rows is None:
            in_splits = out_splits = None
            n_in = n_out = EQUAL_ROWS * ws
        else:
            in_splits = [rows(rank, j) for j in range(ws)]
            out_splits = [rows(j, rank) for j in range(ws)]
            n_in, n_out = sum(in_splits), sum(out_splits)
        for dtype in (torch.float32, torch.int64, torch.bfloat16):
            for row_shape in ((), (3,)):
                case = f"all_to_all_single splits={name} dtype={dtype_name(dtype)} ws={ws} row={row_shape}"
                x = make_data(rank, case, (n_in, *row_shape), dtype)
                got = sentinel_like((n_out, *row_shape), dtype)
                ref = sentinel_like((n_out, *row_shape), dtype)
                guarded(chk, case, lambda: dist.all_to_all_single(got, x, out_splits, in_splits, group=groups.test))
                dist.all_to_all_single(ref, x, out_splits, in_splits, group=groups.ref)
                chk.equal(case, got, ref)
    return finish(chk, groups.test)


def ref_all_to_all_list(
    inputs: list[torch.Tensor], out_shapes: list[tuple[int, ...]], ref_group: Any
) -> list[torch.Tensor]:
    """all_to_all on lists, from gloo's all_to_all_single on the flattened concatenation.

    (gloo's own list all_to_all requires every tensor to have the same size.)
    """
    dtype = inputs[0].dtype
    flat_in = torch.cat([t.reshape(-1) for t in inputs])
    out_numels = [int(torch.Size(s).numel()) for s in out_shapes]
    flat_out = torch.empty(sum(out_numels), dtype=dtype)
    dist.all_to_all_single(flat_out, flat_in, out_numels, [t.numel() for t in inputs], group=ref_group)
    return [p.reshape(s) for p, s in zip(flat_out.split(out_numels), out_shapes)]


# Rows rank src sends to rank dst in all_to_all on lists.
A2A_LIST_SIZES: dict[str, Callable[[int, int], int]] = {
    "equal": lambda src, dst: 2,
    "unequal": lambda src, dst: (src + 2 * dst) % 4,  # some empty
}


def all_to_all_list_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """all_to_all on lists of tensors of pair-dependent sizes (some empty)."""
    chk = Checker(rank)
    for (sizes, size), dtype in itertools.product(A2A_LIST_SIZES.items(), (torch.float32, torch.int32)):
        if sizes == "unequal" and known_gap(groups.backend, "unequal all_to_all lists"):
            continue
        case = f"all_to_all(list) sizes={sizes} dtype={dtype_name(dtype)} ws={ws}"
        inputs = [make_data(rank, f"{case} [to {j}]", (size(rank, j), 2), dtype) for j in range(ws)]
        out_shapes = [(size(j, rank), 2) for j in range(ws)]
        got = [sentinel_like(s, dtype) for s in out_shapes]
        dist.all_to_all(got, inputs, group=groups.test)
        ref = ref_all_to_all_list(inputs, out_shapes, groups.ref)
        for j in range(ws):
            chk.equal(f"{case} [from {j}]", got[j], ref[j])
    return finish(chk, groups.test)


# ---------------------------------------------------------- object collectives


def make_object(rank: int, tag: str) -> dict[str, Any]:
    """A picklable object whose pickled size depends on ``rank`` (exercises size padding)."""
    return {
        "rank": rank,
        "tag": tag,
        "text": "ringpg-" * (1 + 300 * rank),
        "nested": [rank, (rank, "a"), {"half": rank * 0.5}, None],
        "tensor": torch.arange(3 + rank, dtype=torch.int64) * (rank + 1),
    }


def check_object(chk: Checker, what: str, got: Any, expected: dict[str, Any]) -> None:
    """Equality of :func:`make_object` objects (the tensor by value)."""
    ok = isinstance(got, dict) and got.keys() == expected.keys()
    if ok:
        ok = all(torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v for k, v in expected.items())
    chk.true(what, ok, f"got {got!r:.200} expected {expected!r:.200}")


def object_collectives_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """The four object collectives, every root; each result also compared with gloo's."""
    chk = Checker(rank)
    for tag, g in (("test", groups.test), ("gloo", groups.ref)):
        what = f"[{tag} group] ws={ws}"
        gathered: list[Any] = [None] * ws
        dist.all_gather_object(gathered, make_object(rank, "ago"), group=g)
        for r in range(ws):
            check_object(chk, f"all_gather_object {what} [from {r}]", gathered[r], make_object(r, "ago"))
        for root in range(ws):
            objs: list[Any] = [make_object(rank, "bol"), rank] if rank == root else [None, None]
            dist.broadcast_object_list(objs, src=global_rank(g, root), group=g)
            check_object(chk, f"broadcast_object_list {what} src={root}", objs[0], make_object(root, "bol"))
            chk.true(f"broadcast_object_list {what} src={root} [int]", objs[1] == root, repr(objs[1]))

            glist: Optional[list[Any]] = [None] * ws if rank == root else None
            dist.gather_object(make_object(rank, "go"), glist, dst=global_rank(g, root), group=g)
            if glist is not None:
                for r in range(ws):
                    check_object(chk, f"gather_object {what} dst={root} [from {r}]", glist[r], make_object(r, "go"))

            out: list[Any] = [None]
            ins = [make_object(100 * root + r, "sol") for r in range(ws)] if rank == root else None
            dist.scatter_object_list(out, ins, src=global_rank(g, root), group=g)
            check_object(chk, f"scatter_object_list {what} src={root}", out[0], make_object(100 * root + rank, "sol"))
    return finish(chk, groups.test)


# ------------------------------------------------------------- point-to-point

P2P_NUMEL = 1000


def sent_by(src: int, case: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What rank ``src`` sends in ``case`` (every rank can compute it)."""
    return make_data(src, case, (P2P_NUMEL,), dtype)


def tagged_p2p_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """Ring send/recv with two tags; the receiver takes the later tag first.

    Blocking and non-blocking receives both; each run on the group under test and
    on gloo, compared with what the sender sent and with gloo's result.
    """
    chk = Checker(rank)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    for mode in ("recv", "irecv"):
        results: dict[str, list[torch.Tensor]] = {}
        for tag, g in (("test", groups.test), ("gloo", groups.ref)):
            case = f"tags mode={mode} ws={ws}"
            sends = [dist.isend(sent_by(rank, f"{case} tag {t}"), dst=nxt, group=g, tag=t) for t in (11, 22)]
            r22, r11 = torch.zeros(P2P_NUMEL), torch.zeros(P2P_NUMEL)
            if mode == "recv":
                dist.recv(r22, src=prv, group=g, tag=22)
                dist.recv(r11, src=prv, group=g, tag=11)
            else:
                works = [dist.irecv(r22, src=prv, group=g, tag=22), dist.irecv(r11, src=prv, group=g, tag=11)]
                for w in works:
                    w.wait()
            for w in sends:
                w.wait()
            results[tag] = [r11, r22]
            chk.equal(f"{case} [{tag} group] tag 11", r11, sent_by(prv, f"{case} tag 11"))
            chk.equal(f"{case} [{tag} group] tag 22", r22, sent_by(prv, f"{case} tag 22"))
        for i in range(2):
            chk.equal(f"tags mode={mode} ws={ws} [test vs gloo, message {i}]", results["test"][i], results["gloo"][i])
    return finish(chk, groups.test)


def any_source_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """dist.recv(t) with no src: rank 0 receives one message from every other rank.

    dist.recv returns the sender's rank; rank 0 then echoes each message back to the
    sender it named, so every sender also checks that its own message arrived.
    """
    chk = Checker(rank)
    for tag, g in (("test", groups.test), ("gloo", groups.ref)):
        case = f"recv any source ws={ws} [{tag} group]"
        if rank == 0:
            seen: list[int] = []
            for _ in range(ws - 1):
                t = torch.zeros(P2P_NUMEL)
                src = dist.recv(t, group=g)
                seen.append(src)
                chk.equal(f"{case} [message from {src}]", t, sent_by(src, case))
                dist.send(t, dst=src, group=g)
            chk.true(f"{case}: sources", sorted(seen) == list(range(1, ws)), f"got {seen}")
        else:
            dist.send(sent_by(rank, case), dst=0, group=g)
            echo = torch.zeros(P2P_NUMEL)
            dist.recv(echo, src=0, group=g)
            chk.equal(f"{case} [echo of own message]", echo, sent_by(rank, case))
    return finish(chk, groups.test)


def batch_p2p_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """batch_isend_irecv: a ring exchange of two tensors (different dtypes) each way."""
    chk = Checker(rank)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    results: dict[str, list[torch.Tensor]] = {}
    for tag, g in (("test", groups.test), ("gloo", groups.ref)):
        case = f"batch_isend_irecv ring ws={ws}"
        to_next = [sent_by(rank, f"{case} a"), sent_by(rank, f"{case} b", torch.int64)]
        to_prev = sent_by(rank, f"{case} c")
        from_prev = [torch.zeros(P2P_NUMEL), torch.zeros(P2P_NUMEL, dtype=torch.int64)]
        from_next = torch.zeros(P2P_NUMEL)
        ops = [
            dist.P2POp(dist.irecv, from_prev[0], prv, g),
            dist.P2POp(dist.isend, to_next[0], nxt, g),
            dist.P2POp(dist.isend, to_next[1], nxt, g),
            dist.P2POp(dist.irecv, from_prev[1], prv, g),
        ]
        if ws > 2:  # at ws 2 prev == next: a second pair of messages would race on matching
            ops += [dist.P2POp(dist.isend, to_prev, prv, g), dist.P2POp(dist.irecv, from_next, nxt, g)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        chk.equal(f"{case} [{tag} group] a", from_prev[0], sent_by(prv, f"{case} a"))
        chk.equal(f"{case} [{tag} group] b", from_prev[1], sent_by(prv, f"{case} b", torch.int64))
        if ws > 2:
            chk.equal(f"{case} [{tag} group] c", from_next, sent_by(nxt, f"{case} c"))
        results[tag] = [*from_prev, from_next]
    for i, (a, b) in enumerate(zip(results["test"], results["gloo"])):
        chk.equal(f"batch_isend_irecv ring ws={ws} [test vs gloo, tensor {i}]", a, b)
    return finish(chk, groups.test)


# -------------------------------------------------------------------- profiler


def profiler_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """An all_reduce under torch.profiler records an event named ``<backend>:all_reduce``."""
    from torch.profiler import ProfilerActivity, profile

    chk = Checker(rank)
    t = torch.ones(16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dist.all_reduce(t, group=groups.test)
    names = sorted({e.name for e in prof.events()})
    want = f"{groups.backend}:all_reduce"
    chk.true(f"profiler event containing {want!r}", any(want in n for n in names), f"events: {names[:30]}")
    chk.equal("all_reduce under the profiler", t, torch.full((16,), float(ws)))
    return finish(chk, groups.test)


# ------------------------------------------------------------------------ tests


@ON_WS_2_3
def test_gather_scatter_every_root(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(gather_scatter_worker))


@ON_WS_2_3
def test_all_to_all_single(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(all_to_all_single_worker))


@ON_WS_2_3
def test_all_to_all_list(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(all_to_all_list_worker))


@ON_WS_2_3
def test_deprecated_coalesced_apis(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(deprecated_coalesced_worker))


@ON_WS_2_3
def test_coalescing_manager(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(coalescing_manager_worker))


@pytest.mark.parametrize(
    "world_size", [2, pytest.param(3, marks=pytest.mark.slow)], ids=lambda ws: f"ws{ws}", scope="module"
)  # ON_WS_2_3, with 3 ranks slow (more than 5 s on 2 cores)
def test_functional_coalesced(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(functional_coalesced_worker))


@ON_WS_2_3
def test_object_collectives(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(object_collectives_worker))


@ON_WS_2_3
def test_p2p_tags_out_of_order(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(tagged_p2p_worker))


@ON_WS_2_3
def test_recv_any_source(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(any_source_worker))


@ON_WS_2_3
def test_batch_isend_irecv_ring(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(batch_p2p_worker))


@ON_WS_2_3
def test_profiler_event(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(profiler_worker))


# ============================================= async_op=True, world sizes 1, 3

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


@ON_WS_1_3
@pytest.mark.parametrize("n", [1000, 2**18], ids=lambda n: f"n{n}")
def test_many_in_flight(pool: WorkerPool, n: int) -> None:
    assert_reports_ok(pool.run(many_in_flight_worker, n, timeout=ASYNC_TIMEOUT_S))


@ON_WS_1_3
@pytest.mark.parametrize("n", [0, 2**18], ids=lambda n: f"n{n}")
def test_futures_then_and_wait_all(pool: WorkerPool, n: int) -> None:
    assert_reports_ok(pool.run(futures_worker, n, timeout=ASYNC_TIMEOUT_S))


@ON_WS_1_3
def test_async_barrier(pool: WorkerPool) -> None:
    assert_reports_ok(pool.run(async_barrier_worker, timeout=ASYNC_TIMEOUT_S))


def waited_at_once_worker(rank: int, ws: int, groups: Groups, n: int) -> CheckReport:
    """Async ops waited on at once, which the waiting thread may run itself: every kind
    of op and the orders around it (one op queued behind another and waited first, a
    wait with a timeout of its own, a wait from another thread, a late peer)."""
    chk = Checker(rank)
    t, ref = groups.test, groups.ref
    for k in range(3):
        # Each kind, issued and waited on at once, three times over (the first rounds
        # find the worker asleep, later ones just back from an op).
        x = make_data(rank, f"at once ar {k}", (n,), torch.float32)
        y = x.clone()
        w = dist.all_reduce(y, group=t, async_op=True)
        w.wait()
        chk.true(f"all_reduce #{k}: is_completed() after wait()", w.is_completed())
        chk.equal(f"all_reduce #{k}", y, ref_all_reduce(x, "SUM", ref))
        _check_future_value(chk, f"all_reduce #{k}", w.get_future().wait(), [y], [ref_all_reduce(x, "SUM", ref)])
        xr = make_data(rank, f"at once rs {k}", (n * ws,), torch.float32)
        out = sentinel_like((n,), torch.float32)
        dist.reduce_scatter_tensor(out, xr, group=t, async_op=True).wait()
        chk.equal(f"reduce_scatter_tensor #{k}", out, ref_reduce_scatter(xr, "SUM", ref))
        g = make_data(rank, f"at once ag {k}", (n,), torch.int32)
        gout = sentinel_like((n * ws,), torch.int32)
        dist.all_gather_into_tensor(gout, g, group=t, async_op=True).wait()
        chk.equal(f"all_gather_into_tensor #{k}", gout, ref_all_gather(g, ref))
        b = make_data(rank, f"at once bcast {k}", (n,), torch.float64)
        want = ref_broadcast(b, k % ws, ref)
        dist.broadcast(b, src=k % ws, group=t, async_op=True).wait()
        chk.equal(f"broadcast src={k % ws} #{k}", b, want)
        dist.barrier(group=t, async_op=True).wait()

    # Two in flight, the second waited on first: it is not next, so it waits its turn.
    a = make_data(rank, "queued a", (n,), torch.float32)
    b = make_data(rank, "queued b", (n,), torch.int64)
    ya, yb = a.clone(), b.clone()
    wa = dist.all_reduce(ya, group=t, async_op=True)
    wb = dist.all_reduce(yb, op=dist.ReduceOp.MAX, group=t, async_op=True)
    wb.wait()
    chk.true("second of two: the first completed before it", wa.is_completed())
    wa.wait()
    chk.equal("first of two, waited second", ya, ref_all_reduce(a, "SUM", ref))
    chk.equal("second of two, waited first", yb, ref_all_reduce(b, "MAX", ref))

    # A wait with its own timeout leaves the op to the worker.
    c = make_data(rank, "own timeout", (n,), torch.float32)
    yc = c.clone()
    dist.all_reduce(yc, group=t, async_op=True).wait(timeout=timedelta(seconds=30))
    chk.equal("waited with a timeout of its own", yc, ref_all_reduce(c, "SUM", ref))

    # Waited on from another thread than the one that issued it.
    d = make_data(rank, "other thread", (n,), torch.float32)
    yd = d.clone()
    wd = dist.all_reduce(yd, group=t, async_op=True)
    waiter = threading.Thread(target=wd.wait)
    waiter.start()
    waiter.join(ASYNC_TIMEOUT_S)
    chk.true("waited from another thread: returned", not waiter.is_alive())
    chk.equal("waited from another thread", yd, ref_all_reduce(d, "SUM", ref))

    # A late peer: the waiter's op waits for it within the op's deadline.
    e = make_data(rank, "late peer", (n,), torch.float32)
    ye = e.clone()
    if rank == ws - 1:
        time.sleep(0.2)
    dist.all_reduce(ye, group=t, async_op=True).wait()
    chk.equal("one rank 0.2 s late", ye, ref_all_reduce(e, "SUM", ref))
    return chk.report()


@ON_WS_2_3
@pytest.mark.parametrize("n", [1, 1000, 2**18], ids=lambda n: f"n{n}")
def test_async_waited_at_once(pool: WorkerPool, n: int) -> None:
    assert_reports_ok(pool.run(waited_at_once_worker, n, timeout=ASYNC_TIMEOUT_S))


# ============================================= subgroups, world size 4


def subgroup_extra_checks(chk: Checker, tag: str, test_group: Any, ref_group: Any) -> None:
    """reduce, scatter, object collectives and a group-rank p2p ring on a subgroup."""
    me, n = dist.get_rank(test_group), dist.get_world_size(test_group)
    grank = dist.get_rank()
    first, last = dist.get_global_rank(test_group, 0), dist.get_global_rank(test_group, n - 1)

    case = f"{tag}: reduce op=SUM dtype=float32 dst={last} (global)"
    x = make_data(grank, case, (100,), torch.float32)
    got = x.clone()
    dist.reduce(got, dst=last, group=test_group)
    expected = ref_all_reduce(x, "SUM", ref_group)
    if grank == last:
        chk.equal(case, got, expected)

    case = f"{tag}: scatter dtype=int64 src={first} (global)"
    ins = [make_data(first, f"{case} [{i}]", (7,), torch.int64) for i in range(n)] if grank == first else None
    out = sentinel_like((7,), torch.int64)
    dist.scatter(out, ins, src=first, group=test_group)
    chk.equal(case, out, make_data(first, f"{case} [{me}]", (7,), torch.int64))

    objs: list[Any] = [None] * n
    dist.all_gather_object(objs, {"global": grank, "text": "x" * (10 * grank)}, group=test_group)
    members = dist.get_process_group_ranks(test_group)
    chk.true(
        f"{tag}: all_gather_object", objs == [{"global": r, "text": "x" * (10 * r)} for r in members], repr(objs)[:200]
    )

    case = f"{tag}: p2p ring by group rank"
    sent = lambda r: make_data(r, case, (50,), torch.float32)  # noqa: E731 - by global rank
    recv = torch.zeros(50)
    nxt, prv = (me + 1) % n, (me - 1) % n
    if n > 1:
        w = dist.isend(sent(grank), group=test_group, group_dst=nxt)
        dist.recv(recv, group=test_group, group_src=prv)
        w.wait()
        chk.equal(case, recv, sent(dist.get_global_rank(test_group, prv)))
    dist.barrier(group=test_group)


def subgroups_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    chk = Checker(rank)
    backend = groups.backend
    created: list[Any] = []
    for ranks in ([1, 3], [0, 1, 2]):
        tag = f"new_group(ranks={ranks}, backend={backend!r})"
        test_group = dist.new_group(ranks=ranks, backend=backend)
        ref_group = dist.new_group(ranks=ranks, backend="gloo")
        created += [test_group, ref_group]
        if rank in ranks:
            chk.true(f"{tag}: backend name", dist.get_backend(test_group) == backend, str(dist.get_backend(test_group)))
            chk.true(
                f"{tag}: ranks",
                dist.get_process_group_ranks(test_group) == ranks,
                str(dist.get_process_group_ranks(test_group)),
            )
            smoke_checks(chk, tag, test_group, ref_group)
            subgroup_extra_checks(chk, tag, test_group, ref_group)
        else:
            chk.true(f"{tag}: non-member", test_group == dist.GroupMember.NON_GROUP_MEMBER, repr(test_group))

    tag = f"new_subgroups(group_size=2, backend={backend!r})"
    cur, subgroups = dist.new_subgroups(group_size=2, backend=backend)
    cur_ref, ref_subgroups = dist.new_subgroups(group_size=2, backend="gloo")
    created += [*subgroups, *ref_subgroups]
    mine = [rank - rank % 2, rank - rank % 2 + 1]
    chk.true(f"{tag}: own subgroup", dist.get_process_group_ranks(cur) == mine, str(dist.get_process_group_ranks(cur)))
    chk.true(f"{tag}: number of subgroups", len(subgroups) == ws // 2, str(len(subgroups)))
    smoke_checks(chk, tag, cur, cur_ref)
    subgroup_extra_checks(chk, tag, cur, cur_ref)

    for g in created:
        if g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)
    dist.barrier(group=groups.ref)
    probe = torch.ones(3)
    dist.all_reduce(probe, group=groups.test)
    chk.equal("world group after destroying the subgroups", probe, torch.full((3,), float(ws)))
    return finish(chk, groups.test)


@ON_WS_4
def test_subgroups(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(subgroups_worker))


# ============================================= on every transport

# ------------------------------------------------------------ inputs unchanged

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


# ----------------------------------------------------------------- numel 0

# (dtype, op name); PREMUL_SUM is a factory call, not a ReduceOp attribute.
ZERO_CASES: tuple[tuple[torch.dtype, str], ...] = (
    (torch.float32, "SUM"),
    (torch.float32, "PREMUL_SUM"),
    (torch.int32, "BAND"),
    (torch.int32, "BOR"),
    (torch.int32, "BXOR"),
    (torch.complex64, "SUM"),
    (torch.bool, "MAX"),
    (torch.int64, "MIN"),
    (torch.uint64, "MIN"),
)
ZERO_SHAPE = (0, 3)
PREMUL_FACTOR = 2.0


def _zero_op(op: str) -> Any:
    return dist._make_nccl_premul_sum(PREMUL_FACTOR) if op == "PREMUL_SUM" else getattr(dist.ReduceOp, op)


def _gloo_has(dtype: torch.dtype, op: str) -> bool:
    return op != "PREMUL_SUM" and dtype != torch.uint64


def numel_zero_worker(rank: int, ws: int, groups: Groups, transport: str) -> CheckReport:
    chk = Checker(rank)
    check_transport(chk, groups, transport)
    backend = groups.backend
    dst = global_rank(groups.test, 1)
    for dtype, op in ZERO_CASES:
        if (
            op == "PREMUL_SUM"
            and known_gap(backend, "PREMUL_SUM")
            or dtype == torch.uint64
            and known_gap(backend, "wide integer dtypes")
        ):
            continue
        for coll in ("all_reduce", "reduce"):
            case = f"{coll} op={op} dtype={dtype_name(dtype)} numel=0 shape={ZERO_SHAPE} ws={ws} {transport}"

            def call(t: torch.Tensor, g: Any) -> None:
                if coll == "all_reduce":
                    dist.all_reduce(t, op=_zero_op(op), group=g)
                else:
                    dist.reduce(t, dst=dst, op=_zero_op(op), group=g)

            got = torch.empty(ZERO_SHAPE, dtype=dtype)
            kind, msg, _ = expect_error(lambda: call(got, groups.test))
            chk.true(f"{case}: no error", not kind, f"{kind}: {msg[:300]}")
            want = torch.empty(ZERO_SHAPE, dtype=dtype)
            if _gloo_has(dtype, op):
                call(want, groups.ref)
            chk.equal(case, got, want)
        x = make_data(rank, f"after {op} {dtype_name(dtype)}", (9,), torch.int32)
        y = x.clone()
        kind, msg, _ = expect_error(lambda: dist.all_reduce(y, group=groups.test))
        chk.true(f"all_reduce after the empty {op} {dtype_name(dtype)}: runs", not kind, f"{kind}: {msg[:300]}")
        chk.equal(f"all_reduce after the empty {op} {dtype_name(dtype)}", y, ref_all_reduce(x, "SUM", groups.ref))
    return chk.report()


@on_transports(*TRANSPORTS)
def test_numel_zero(bpool: WorkerPool, transport: str) -> None:
    assert_reports_ok(bpool.run(numel_zero_worker, transport, timeout=120))


# --------------------------------------------------------- subgroup {0, 2} of 3

SUB_RANKS = [0, 2]


def subgroup_0_2_worker(rank: int, ws: int, groups: Groups, transport: str) -> CheckReport:
    chk = Checker(rank)
    check_transport(chk, groups, transport)
    sub = dist.new_group(ranks=SUB_RANKS, backend=groups.backend)
    ref = dist.new_group(ranks=SUB_RANKS, backend="gloo")
    if rank not in SUB_RANKS:
        chk.true("non-member", sub == dist.GroupMember.NON_GROUP_MEMBER, repr(sub))
        return chk.report()
    if groups.backend == "ringpg":
        want = transport_expected(transport, SUB_RANKS)
        chk.true(f"subgroup runs on {want}", transport_of(sub) == want, str(transport_of(sub)))
    me, n = dist.get_rank(sub), dist.get_world_size(sub)
    tag = f"subgroup {SUB_RANKS} {transport}"
    for dtype in (torch.int64, torch.float32):
        numel = 10
        for splits in ("equal", "unequal"):
            case = f"{tag}: all_to_all_single splits={splits} dtype={dtype_name(dtype)}"
            ins = [a2a_split(me, j, n, numel) for j in range(n)] if splits == "unequal" else None
            outs = [a2a_split(j, me, n, numel) for j in range(n)] if splits == "unequal" else None
            x = make_data(rank, case, (sum(ins) if ins else numel * n,), dtype)
            n_out = sum(outs) if outs else numel * n
            got, want = sentinel_like((n_out,), dtype), sentinel_like((n_out,), dtype)
            dist.all_to_all_single(got, x, outs, ins, group=sub)
            dist.all_to_all_single(want, x, outs, ins, group=ref)
            chk.equal(case, got, want)

        dst = SUB_RANKS[1]  # the subgroup's second rank, by global rank
        case = f"{tag}: gather dst={dst} (global) dtype={dtype_name(dtype)}"
        x = make_data(rank, case, (11,), dtype)
        gathered = [sentinel_like((11,), dtype) for _ in range(n)] if rank == dst else None
        dist.gather(x, gathered, dst=dst, group=sub)
        expected = ref_all_gather(x, ref).reshape(n, 11)
        for i, o in enumerate(gathered or []):
            chk.equal(f"{case} [from group rank {i}]", o, expected[i])

        case = f"{tag}: all_reduce_coalesced op=MAX dtype={dtype_name(dtype)}"
        xs = [make_data(rank, f"{case} [{i}]", s, dtype) for i, s in enumerate(((5,), (2, 3), (1,)))]
        got_list = [t.clone() for t in xs]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            dist.all_reduce_coalesced(got_list, op=dist.ReduceOp.MAX, group=sub)
        for i, (g, t) in enumerate(zip(got_list, xs)):
            chk.equal(f"{case} [tensor {i}]", g, ref_all_reduce(t, "MAX", ref))

        case = f"{tag}: async all_reduce future dtype={dtype_name(dtype)}"
        x = make_data(rank, case, (1000,), dtype)
        got = x.clone()
        work = dist.all_reduce(got, group=sub, async_op=True)
        value = work.get_future().wait()
        expected = ref_all_reduce(x, "SUM", ref)
        chk.true(f"{case}: future value is [tensor]", isinstance(value, list) and len(value) == 1, repr(type(value)))
        if isinstance(value, list) and value:
            chk.equal(f"{case} [future value]", value[0], expected)
        work.wait()  # gloo may complete the future a moment before its Work
        chk.true(f"{case}: completed", work.is_completed())
        chk.equal(case, got, expected)
    return chk.report()


@on_transports(*TRANSPORTS, world_sizes=(3,))
def test_subgroup_0_2(bpool: WorkerPool, transport: str) -> None:
    assert_reports_ok(bpool.run(subgroup_0_2_worker, transport, timeout=120))


# ----------------------------------------------------------------- world size 8

WS8 = 8
# A smaller one-shot limit (64 KiB x 7 peers = 448 KiB), so that a 1 MiB all_reduce
# runs the ring at world size 8 without tensors past 1 MiB.
WS8_ONESHOT_BYTES = 65536
WS8_RING_NUMEL = 2**18 - 5  # int32: just under 1 MiB, not a multiple of 8
# int32, 2000 B: one-shot, also across the emulated hosts of "mixed", where a host's 4
# ranks share its link (2000 B x 7 peers x 4 ranks <= 64 KiB; docs/configuration.md, oneshot_bytes).
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


@pytest.mark.parametrize("transport", (*TRANSPORTS, SHM_RING))
def test_world_size_8(transport: str, tmp_path: Any) -> None:
    """Eight ranks on a machine with fewer cores: every wait must yield, nothing may hang.

    The traces must show the big all_reduce on the ring (hierarchical on the emulated
    hosts of "mixed": two hosts of four ranks) and the small ones one-shot (but for one
    past the limit of a link that four ranks share, hierarchical on "mixed"; and on the ring
    over shared memory, where only ring neighbours share memory), and reduce-scatter
    and all-gather on the ring (likewise hierarchical on "mixed").
    """
    env = with_tuning(transport_env(transport), oneshot_bytes=WS8_ONESHOT_BYTES)
    if transport == "mixed":
        env = with_tuning(env, hier_piece_bytes=WS8_PIECE_BYTES)
    if backend_under_test() == "ringpg":
        env = (*env, ("RINGPG_TRACE", str(tmp_path)))
    assert_reports_ok(run_workers(world_size_8_worker, WS8, transport, InitSpec(env=env), timeout=120))
    if backend_under_test() == "ringpg":
        algorithms = traced_algorithms(str(tmp_path), "all_reduce")
        # One host with its arena: every op there (the one-shot where what each rank
        # reads of the others is small); across the emulated hosts, hierarchical.
        big = {"mixed": "hier", "shm": "arena"}.get(transport, "ring")
        assert algorithms.get(WS8_RING_NUMEL * 4) == {big}, algorithms
        if transport == "mixed":
            assert_ws8_pieces(str(tmp_path))
        # Reduce-scatter and all-gather, too, run hierarchically across the emulated hosts.
        for op in ("reduce_scatter_tensor", "all_gather_into_tensor"):
            seen = set().union(*traced_algorithms(str(tmp_path), op).values())
            assert seen == {big}, (op, seen)
        # One-shot where every rank reaches every other over the same kind of link; on
        # one host over shared memory links only ring neighbours share memory, so the ring.
        small = {"shm": "arena_oneshot", SHM_RING: "ring"}.get(transport, "oneshot")
        assert algorithms.get(WS8_SMALL_NUMEL * 4) == {small}, algorithms
        shared_link = "hier" if transport == "mixed" else small
        assert algorithms.get(WS8_SHARED_LINK_NUMEL * 4) == {shared_link}, algorithms


def assert_ws8_pieces(trace_dir: str) -> None:
    """The traces of "mixed" (2 hosts x 4 ranks): every big all_reduce, reduce-scatter and
    all-gather moved in as many pieces as tuning key hier_piece_bytes gives, on two threads
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
