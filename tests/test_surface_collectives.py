"""The rest of the collective API surface, against gloo in the same processes.

* gather / scatter to and from every root; all_to_all_single with equal splits,
  unequal splits, zero-size splits and all-empty inputs; all_to_all on lists;
* the coalesced APIs: all_reduce_coalesced and all_gather_coalesced (deprecated,
  still exercised), ``torch.distributed._coalescing_manager`` around
  all_reduce / all_gather_into_tensor / reduce_scatter_tensor (sync and with
  ``async_ops=True``), and the functional all_gather_into_tensor_coalesced /
  reduce_scatter_tensor_coalesced;
* object collectives: all_gather_object, broadcast_object_list, gather_object,
  scatter_object_list, with objects of rank-dependent size;
* point-to-point: send/recv and isend/irecv with tags received in another order
  than sent, recv from any source (returns the sender), batch_isend_irecv rings;
* the profiler sees ``<backend>:all_reduce``.

Each case runs the same call on the group under test and on the gloo group with
the same inputs and compares exactly (integer-valued data).  Where gloo has no
such call (all-reduce inside a coalescing block, say) the reference is built from
gloo's all_reduce / all_gather (harness refs).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Optional

import pytest
import torch
import torch.distributed as dist
from harness import (
    Checker,
    CheckReport,
    Groups,
    WorkerPool,
    assert_reports_ok,
    dtype_name,
    global_rank,
    known_gap,
    make_data,
    ref_all_gather,
    sentinel_like,
)
from harness.batteries import (
    coalescing_manager_worker,
    deprecated_coalesced_worker,
    functional_coalesced_worker,
)
from harness.surface import (
    finish,
    guarded,
)

pytestmark = pytest.mark.parametrize("world_size", [2, 3], ids=lambda ws: f"ws{ws}", scope="module")

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


# ------------------------------------------------------------------- coalesced


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


def test_gather_scatter_every_root(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(gather_scatter_worker))


def test_all_to_all_single(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(all_to_all_single_worker))


def test_all_to_all_list(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(all_to_all_list_worker))


def test_deprecated_coalesced_apis(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(deprecated_coalesced_worker))


def test_coalescing_manager(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(coalescing_manager_worker))


def test_functional_coalesced(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(functional_coalesced_worker))


def test_object_collectives(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(object_collectives_worker))


def test_p2p_tags_out_of_order(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(tagged_p2p_worker))


def test_recv_any_source(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(any_source_worker))


def test_batch_isend_irecv_ring(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(batch_p2p_worker))


def test_profiler_event(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(profiler_worker))
