"""Blind spots of the suite (issue #23), second batch; against gloo in the same processes.

* #23 bad input on ONE rank only: a wrong-sized output to all_gather_into_tensor or
  reduce_scatter_tensor, an out-of-range root to broadcast or reduce, on rank 1 of
  3.  That rank gets a local error naming the op; the others a typed error naming
  it, from ringpg's frame check well within the group's 5 s timeout, unless they
  never needed rank 1 (a broadcast rank holding the root's whole payload, a reduce
  rank that only sends).  ringpg then fails the group for good:
  the next all_reduce raises a typed error on every rank, and what it leaves in its
  buffer is never another collective's bytes: each element is the rank's input or a
  partial sum of that same all_reduce over ranks that ran it (a ring writes as it
  goes; no collective is ever matched with a peer's other one), and a new group in the
  same processes agrees with gloo (:func:`test_bad_input_on_one_rank`);
* clean refusals: all_reduce with complex64 MIN, bool AVG, float8_e4m3fn SUM, int32
  PREMUL_SUM, through torch.distributed and through ringpg's Backend directly, raise
  naming op and dtype on every rank, and the group keeps working; complex64
  PREMUL_SUM equals factor x (gloo's SUM) (:func:`test_refusals_keep_the_group`);
* numel 0: all_reduce and reduce (to group rank 1) under SUM, PREMUL_SUM,
  BAND/BOR/BXOR (int32), SUM (complex64), MAX (bool), MIN (int64, uint64) leave
  empty tensors of unchanged shape, like gloo where gloo has the case
  (:func:`test_numel_zero`);
* a peer SIGKILLed while the survivors are blocked in recv, reduce_scatter_tensor,
  broadcast (from the dead rank) or an all_reduce on a subgroup {0, 2} of 3: typed
  error naming the op within 10 s under a 30 s timeout (:func:`test_dead_peer`);
* subgroup {0, 2} of 3: all_to_all_single (equal and unequal splits), gather to the
  subgroup's second rank, all_reduce_coalesced, an async all_reduce's future
  (:func:`test_subgroup_0_2`).

Everything runs on both transports (shared memory, and TCP via ``RINGPG_TRANSPORT=tcp``).
"""

from __future__ import annotations

import os
import re
import signal
import time
import warnings
from datetime import timedelta
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist
from harness import (
    TRANSPORT_ENVS,
    Checker,
    CheckReport,
    Groups,
    WorkerPool,
    assert_reports_ok,
    backend_under_test,
    cpu_backend,
    dtype_name,
    expect_error,
    global_rank,
    known_gap,
    make_data,
    ref_all_gather,
    ref_all_reduce,
    run_scenario,
    sentinel_like,
    transport_expected,
    transport_of,
)
from harness.surface import ref_reduce, small_complex
from harness.transports import a2a_split, check_transport, on_transports

TRANSPORTS = tuple(TRANSPORT_ENVS)
TYPED = ("DistBackendError", "DistNetworkError")
ringpg_only = pytest.mark.skipif(backend_under_test() != "ringpg", reason="ringpg's own errors and fault handling")


# ------------------------------------------------------- bad input on one rank

BAD_RANK = 1
BAD_TIMEOUT_S = 5.0


def _root_call(g: Any, op: str, x: torch.Tensor, root: int) -> None:
    """broadcast / reduce with a group-rank root, through the Backend (torch's layer checks src first)."""
    backend = cpu_backend(g)
    if op == "broadcast":
        bopts = dist.BroadcastOptions()
        bopts.rootRank = root
        backend.broadcast([x], bopts).wait()
    else:
        ropts = dist.ReduceOptions()
        ropts.rootRank = root
        backend.reduce([x], ropts).wait()


def bad_input(case: str, rank: int, ws: int) -> torch.Tensor:
    """The (4,) float32 input of ``case`` on ``rank``; a broadcast's is the root's payload."""
    return make_data(rank, case, (4,), torch.float32)


def bad_call(case: str, rank: int, ws: int, g: Any, x: torch.Tensor) -> None:
    """``case`` on every rank; only BAD_RANK's arguments are wrong."""
    bad = rank == BAD_RANK
    if case == "all_gather_into_tensor":
        dist.all_gather_into_tensor(torch.empty(4 * ws + bad), x, group=g)
    elif case == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(
            torch.empty(2 if bad else 4), make_data(rank, case, (4 * ws,), torch.float32), group=g
        )
    else:  # broadcast / reduce: root ws - 1 (not rank 0, not BAD_RANK at ws 3), 7 on BAD_RANK
        _root_call(g, case, x, 7 if bad else ws - 1)


def bad_input_worker(rank: int, ws: int, groups: Groups, args: tuple[str, str]) -> dict:
    case, transport = args
    g = dist.new_group(backend=groups.backend, timeout=timedelta(seconds=BAD_TIMEOUT_S))
    x = bad_input(case, rank, ws)
    first = expect_error(lambda: bad_call(case, rank, ws, g, x))
    y0 = make_data(rank, f"{case} after", (5,), torch.int64)
    y = y0.clone()
    after = expect_error(lambda: dist.all_reduce(y, group=g))
    summed = ref_all_reduce(y0, "SUM", groups.ref)
    fresh = dist.new_group(backend=groups.backend)
    z = y0.clone()
    dist.all_reduce(z, group=fresh)
    # Sums of the ranks' inputs over every set of ranks that holds this one: what the
    # failed all_reduce may have left in y, element by element (the input itself first).
    inputs = [make_data(q, f"{case} after", (5,), torch.int64) for q in range(ws)]
    others = [q for q in range(ws) if q != rank]
    partial = [
        y0 + sum((inputs[q] for q in others if mask >> others.index(q) & 1), torch.zeros_like(y0))
        for mask in range(2 ** len(others))
    ]
    return {
        "transport": transport_of(g),
        "first": first,
        "after": after,
        "y_partial": bool(torch.stack([y == s for s in partial]).any(dim=0).all()),
        "y_summed": torch.equal(y, summed),
        "fresh_ok": torch.equal(z, summed),
        "has_root_payload": torch.equal(x, bad_input(case, ws - 1, ws)),
    }


def may_finish(case: str, rank: int, ws: int, v: dict) -> bool:
    """Whether ``rank`` may finish ``case`` without hearing from BAD_RANK: a broadcast rank
    that got the root's whole payload (the root itself, or a rank it sends to first),
    a reduce rank that is not the root (it only sends)."""
    if case == "broadcast":
        return bool(v["has_root_payload"])
    return case == "reduce" and rank != ws - 1


@ringpg_only
@on_transports(*TRANSPORTS, world_sizes=(3,))
@pytest.mark.parametrize("case", ["all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "reduce"])
def test_bad_input_on_one_rank(bpool: WorkerPool, transport: str, case: str) -> None:
    res = bpool.run(bad_input_worker, (case, transport), timeout=60)
    bound = BAD_TIMEOUT_S + 1.0
    for r, v in enumerate(res):
        assert v["transport"] == transport_expected(transport, len(res)), v
        kind, msg, took = v["first"]
        if r == BAD_RANK:  # refused locally, before taking a sequence number
            assert kind in ("RuntimeError", "ValueError") and f"ringpg::{case}" in msg, (r, v)
            assert took < 1.0, (r, v)
        elif kind or not may_finish(case, r, bpool.world_size, v):
            assert kind in TYPED and f"ringpg::{case}" in msg, (r, v)
            assert took < bound, (r, v)  # within the group's timeout, not after it
        # The group is failed for good: the next all_reduce raises everywhere and leaves
        # no other collective's bytes (only its own partial sums, or the input).
        kind, msg, took = v["after"]
        assert kind in TYPED and "ringpg::all_reduce" in msg and took < bound, (r, v)
        # The cause, in one of its words: the frame check ("mismatch"; "disagree" when a
        # rank that finished the first op meets BAD_RANK's all_reduce under the same
        # sequence number), or the failure of the first op reaching this one.
        assert re.search("mismatch|disagree|aborted|failed earlier|connection", msg, re.I), (r, msg)
        assert v["y_partial"] and not v["y_summed"], (r, v)
        assert v["fresh_ok"], (r, v)  # a new group in the same processes agrees with gloo


# ------------------------------------------------------------ clean refusals

# (name, dtype, op factory, what the message must match besides the op)
REFUSALS: tuple[tuple[str, torch.dtype, Callable[[], Any], str], ...] = (
    ("complex64 MIN", torch.complex64, lambda: dist.ReduceOp.MIN, r"complex"),
    ("bool AVG", torch.bool, lambda: dist.ReduceOp.AVG, r"\bbool\b"),
    ("float8_e4m3fn SUM", torch.float8_e4m3fn, lambda: dist.ReduceOp.SUM, r"float8_e4m3fn"),
    ("int32 PREMUL_SUM", torch.int32, lambda: dist._make_nccl_premul_sum(2.0), r"\bint(32)?\b"),
)
PREMUL_FACTOR = 2.0


def refusals_worker(rank: int, ws: int, groups: Groups, transport: str) -> CheckReport:
    chk = Checker(rank)
    check_transport(chk, groups, transport)
    g = groups.test
    for name, dtype, op, words in REFUSALS:
        for via in ("torch.distributed", "Backend"):
            case = f"all_reduce {name} via {via} ws={ws} {transport}"
            t = torch.zeros(6, dtype=dtype)
            if via == "Backend":
                opts = dist.AllreduceOptions()
                opts.reduceOp = op()
                kind, msg, _ = expect_error(lambda: cpu_backend(g).allreduce([t], opts).wait())
            else:
                kind, msg, _ = expect_error(lambda: dist.all_reduce(t, op=op(), group=g))
            # torch's own layer may answer first (complex MIN); the Backend must answer itself.
            op_word = "ringpg::all_reduce" if via == "Backend" else "all_?reduce"
            chk.true(
                f"{case}: refused naming op and dtype",
                bool(kind) and bool(re.search(op_word, msg)) and bool(re.search(words, msg, re.I)),
                f"{kind}: {msg[:300]}",
            )
            x = make_data(rank, f"{case} after", (7,), torch.int64)
            y = x.clone()
            kind, msg, _ = expect_error(lambda: dist.all_reduce(y, group=g))
            chk.true(f"{case}: the next all_reduce runs", not kind, f"{kind}: {msg[:300]}")
            chk.equal(f"{case}: the next all_reduce", y, ref_all_reduce(x, "SUM", groups.ref))
    for n in (1, 1000):
        case = f"all_reduce complex64 PREMUL_SUM({PREMUL_FACTOR}) ws={ws} numel={n} {transport}"
        x = small_complex(rank, case, (n,), torch.complex64)
        got = x.clone()
        dist.all_reduce(got, op=dist._make_nccl_premul_sum(PREMUL_FACTOR), group=g)
        chk.equal(case, got, ref_reduce(x, "SUM", groups.ref) * PREMUL_FACTOR)
    return chk.report()


@ringpg_only
@on_transports(*TRANSPORTS)
def test_refusals_keep_the_group(bpool: WorkerPool, transport: str) -> None:
    assert_reports_ok(bpool.run(refusals_worker, transport, timeout=120))


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


# ------------------------------------------------------------------ dead peer

DEAD_TIMEOUT_S = 30.0
DETECT_S = 10.0
DEAD_WS = 3
VICTIM = {"recv": 1, "reduce_scatter_tensor": 1, "broadcast": 1, "subgroup all_reduce": 2}
SUBGROUP = [0, 2]


def _dead_peer(rank: int, ws: int, port: int, args: tuple[str, str]) -> dict:
    """The survivors block in ``op``; the victim, which never joins it, SIGKILLs itself 1 s later."""
    import ringpg  # noqa: F401

    op, stamp = args
    victim = VICTIM[op]
    torch.set_num_threads(1)
    dist.init_process_group(
        "ringpg",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=ws,
        timeout=timedelta(seconds=DEAD_TIMEOUT_S),
    )
    side = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))
    sub = dist.new_group(ranks=SUBGROUP, backend="ringpg", timeout=timedelta(seconds=DEAD_TIMEOUT_S))
    warm = torch.ones(8)
    dist.all_reduce(warm)  # the connections are up: what follows tests a death, not the rendezvous
    dist.barrier(group=side)
    if rank == victim:
        time.sleep(1.0)
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    x = torch.ones(1 << 12)
    calls: dict[str, Callable[[], Any]] = {
        "recv": lambda: dist.recv(x, src=victim),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            torch.empty(x.numel() // ws), x[: x.numel() // ws * ws]
        ),
        "broadcast": lambda: dist.broadcast(x, src=victim),
        "subgroup all_reduce": lambda: dist.all_reduce(x, group=sub),
    }
    if op == "recv" and rank != 0 or op == "subgroup all_reduce" and rank not in SUBGROUP:
        # A bystander: its exit would close its own links and fail the survivors' group
        # for that reason instead; it stays until the parent kills it.
        time.sleep(DEAD_TIMEOUT_S + DETECT_S)
        return {}
    kind, msg, took = expect_error(calls[op])
    return {"type": kind, "msg": msg, "t": time.time(), "took": took, "transport": transport_of(dist.group.WORLD)}


@ringpg_only
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("op", list(VICTIM))
def test_dead_peer(tmp_path: Any, op: str, transport: str) -> None:
    stamp = str(tmp_path / "died")
    # recv: rank 0 waits on the victim; the subgroup: its other member (rank 1 is not in it).
    survivors = {0} if op in ("recv", "subgroup all_reduce") else set(range(DEAD_WS)) - {VICTIM[op]}
    res = run_scenario(
        _dead_peer, DEAD_WS, (op, stamp), expect=survivors, timeout=90, env=dict(TRANSPORT_ENVS[transport])
    )
    died = float(open(stamp).read())
    name = "all_reduce" if op.startswith("subgroup") else op
    for r in survivors:
        v = res[r]
        assert v["transport"] == transport_expected(transport, DEAD_WS), v
        assert v["type"] in TYPED, (r, v)
        assert f"ringpg::{name}" in v["msg"], (r, v["msg"])
        assert v["t"] - died < DETECT_S, (r, v["t"] - died, v["msg"])


# --------------------------------------------------------- subgroup {0, 2} of 3

SUB_RANKS = [0, 2]


def subgroup_worker(rank: int, ws: int, groups: Groups, transport: str) -> CheckReport:
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
    assert_reports_ok(bpool.run(subgroup_worker, transport, timeout=120))
