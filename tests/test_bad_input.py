"""Bad input and ranks that disagree (ringpg's own checks: skipped for other backends).

* bad input is refused before it takes a sequence number (an invalid root, output
  sizes, sparse and meta tensors, a negative tag, an unsupported op/dtype).  Bad input
  on ONE rank only (a wrong-sized output to all_gather_into_tensor or
  reduce_scatter_tensor, an out-of-range root to broadcast or reduce, on rank 1 of 3):
  that rank gets a local error naming the op, the others a typed error naming it from
  ringpg's frame check, well within the group's 5 s timeout, unless they never needed
  rank 1 (a broadcast rank holding the root's whole payload, a reduce rank that only
  sends).  ringpg then fails the group for good: the next all_reduce raises a typed
  error on every rank, and what it leaves in its buffer is never another collective's
  bytes: each element is the rank's input or a partial sum of that same all_reduce
  over ranks that ran it (a ring writes as it goes; no collective is ever matched with
  a peer's other one), and a new group in the same processes agrees with gloo.  Clean
  refusals (all_reduce with complex64 MIN, bool AVG, float8_e4m3fn SUM, int32
  PREMUL_SUM, through torch.distributed and through ringpg's Backend) name op and dtype
  on every rank and keep the group working; complex64 PREMUL_SUM equals factor x
  (gloo's SUM);
* ranks that disagree: different sizes, dtypes, collectives or ReduceOps raise one
  clear error instead of overrunning; a rank alone on its transport, or without shared
  memory under ``RINGPG_TRANSPORT=shm``, fails every rank clearly.

Scenarios spawn their own ranks (``harness.run_scenario``); the bad input on one rank
and the refusals run on ``bpool`` workers, on every transport.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Any, Callable

import harness
import pytest
import torch
import torch.distributed as dist
from harness import (
    KILL_DETECT_S,
    TRANSPORT_NAMES,
    Checker,
    CheckReport,
    Groups,
    WorkerPool,
    assert_reports_ok,
    cpu_backend,
    expect_error,
    make_data,
    ref_all_reduce,
    run_scenario,
    transport_expected,
    transport_of,
)
from harness import TRANSPORT_ENV_DICTS as TRANSPORTS
from harness import TYPED_ERRORS as TYPED
from harness import init_ringpg as _init
from harness.surface import ref_reduce, small_complex
from harness.transports import check_transport, on_transports

pytestmark = [pytest.mark.multiprocess, harness.ringpg_only("ringpg's own input checks")]


# ------------------------------------------------------------------ bad input


def _bad_inputs(rank: int, ws: int, port: int, args: Any) -> dict:
    _init(rank, ws, port)
    gloo = dist.new_group(backend="gloo")
    backend = harness.cpu_backend(dist.group.WORLD)
    t = torch.arange(6, dtype=torch.float32) + rank
    errors: dict[str, str] = {}

    def attempt(name: str, fn: Callable[[], Any]) -> None:
        kind, msg, _ = expect_error(fn)
        errors[name] = f"{kind}: {msg}"
        # The refused call took no sequence number: a real collective still agrees with gloo.
        a, b = t.clone(), t.clone()
        dist.all_reduce(a)
        dist.all_reduce(b, group=gloo)
        assert torch.equal(a, b), (name, a, b)

    opts = dist.BroadcastOptions()
    opts.rootRank = 7
    attempt("invalid root", lambda: backend.broadcast([t], opts).wait())
    attempt("output list length", lambda: dist.all_gather([torch.empty(6) for _ in range(ws + 1)], t))
    attempt("mismatched sizes", lambda: dist.all_gather_into_tensor(torch.empty(5), t))
    attempt("sparse", lambda: dist.all_reduce(t.to_sparse()))
    # torch answers meta tensors itself, so this one goes to the backend directly.
    attempt("meta device", lambda: backend.allreduce([torch.empty(6, device="meta")], dist.AllreduceOptions()))
    attempt("negative tag", lambda: dist.send(t, (rank + 1) % ws, tag=-1))
    attempt("unsupported op/dtype", lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND))
    return {"errors": errors, "seq": backend._get_sequence_number_for_group()}


def test_bad_input_is_refused_before_taking_a_sequence_number() -> None:
    res = run_scenario(_bad_inputs, 2)
    for v in res.values():
        for name, err in v["errors"].items():
            assert err and not err.startswith(": "), (name, "no error raised")
            if name not in ("sparse", "output list length"):  # torch's own layer may answer first
                assert "ringpg::" in err, (name, err)
    assert res[0]["seq"] == res[1]["seq"]


def _mismatch(rank: int, ws: int, port: int, args: Any) -> dict:
    (what,) = args
    _init(rank, ws, port, timeout_s=20.0)
    if what == "numel":  # small: the one-shot exchange
        x = torch.ones(1000 if rank == 0 else 3000)
    elif what == "numel-ring":  # large: the pipelined ring
        x = torch.ones((1 << 20) if rank == 0 else (3 << 20))
    else:
        x = torch.ones(1000, dtype=torch.float32 if rank == 0 else torch.float64)
    kind, msg, took = expect_error(lambda: dist.all_reduce(x))
    return {"type": kind, "msg": msg, "took": took, "transport": transport_of(dist.group.WORLD)}


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
@pytest.mark.parametrize("what", ["numel", "numel-ring", "dtype"])
def test_ranks_calling_different_sizes_raise_instead_of_overrunning(what: str, transport: str) -> None:
    res = run_scenario(_mismatch, 2, (what,), env=TRANSPORTS[transport])
    for v in res.values():
        assert v["transport"] == harness.transport_expected(transport, 2), v
        assert v["type"] in ("DistBackendError", "DistNetworkError"), v
        assert "mismatch" in v["msg"] or "aborted" in v["msg"], v["msg"]
        assert v["took"] < KILL_DETECT_S, v


def _one_rank_on(rank: int, ws: int, port: int, args: Any) -> dict:
    (transport,) = args
    if rank == 0:
        os.environ["RINGPG_TRANSPORT"] = transport  # read when the first group is made
    kind, msg, took = expect_error(lambda: _init(rank, ws, port, timeout_s=20.0))
    return {"type": kind, "msg": msg, "took": took}


@pytest.mark.parametrize("transport", ["gloo", "shm"])
def test_a_rank_alone_on_its_transport_fails_every_rank_clearly(transport: str) -> None:
    """Gloo's pairs need a Gloo group on every rank: one rank alone would wait for the
    others until the timeout; shm refuses a group without shared memory, which must
    reach every rank alike.  The ranks compare choices through the store first."""
    res = run_scenario(_one_rank_on, 3, (transport,))
    for v in res.values():
        assert v["type"] == "ValueError", v
        assert f"disagree on RINGPG_TRANSPORT (rank 0: {transport}, rank 1: auto, rank 2: auto)" in v["msg"], v
        assert v["took"] < KILL_DETECT_S, v


def _shm_on_separate_hosts(rank: int, ws: int, port: int, args: Any) -> dict:
    """RINGPG_TRANSPORT=shm on emulated hosts: ranks 0 and 2 share one, rank 1 is alone
    on the other (no same-host neighbour: nothing to set up, TCP both ways)."""
    os.environ["RINGPG_TRANSPORT"] = "shm"
    os.environ["RINGPG_HOSTID"] = f"host-{rank % 2}"
    _init(rank, ws, port, timeout_s=20.0)
    out = {"transport": transport_of(dist.group.WORLD)}
    x = torch.arange(10.0) + rank
    dist.all_reduce(x)
    out["sum_ok"] = bool(torch.equal(x, torch.arange(10.0) * ws + sum(range(ws))))
    return out


def test_shm_transport_runs_shared_memory_where_ranks_share_a_host() -> None:
    """RINGPG_TRANSPORT=shm on three ranks of two emulated hosts: shared memory within the
    host of ranks 0 and 2, TCP to rank 1; a correct sum."""
    res = run_scenario(_shm_on_separate_hosts, 3)
    for r, v in res.items():
        assert v == {"transport": "shm+tcp", "sum_ok": True}, (r, v)


def _shm_without_dev_shm(rank: int, ws: int, port: int, args: Any) -> dict:
    os.environ["RINGPG_TRANSPORT"] = "shm"
    if rank == 0:
        harness.tiny_private_dev_shm()
    kind, msg, took = expect_error(lambda: _init(rank, ws, port, timeout_s=20.0))
    return {"type": kind, "msg": msg, "took": took}


@pytest.mark.skipif(not harness.can_make_mount_namespaces(), reason="needs root and mount namespaces")
def test_shm_transport_without_shared_memory_fails_every_rank_clearly() -> None:
    """Where one rank cannot create its region, RINGPG_TRANSPORT=shm fails the group's
    creation on every rank (auto would fall back to TCP), naming the cause."""
    res = run_scenario(_shm_without_dev_shm, 2)
    for v in res.values():
        assert v["type"] == "RuntimeError", v
        assert "RINGPG_TRANSPORT=shm" in v["msg"] and "cannot use shared memory" in v["msg"], v
        assert v["took"] < KILL_DETECT_S, v


def _different_calls(rank: int, ws: int, port: int, args: Any) -> dict:
    """Rank 0 and the others call different collectives (or ReduceOps) on buffers of one
    size, with no TORCH_DISTRIBUTED_DEBUG wrapper: ringpg's own frame check must name both."""
    (what, numel) = args
    _init(rank, ws, port, timeout_s=20.0)
    x = torch.ones(numel)
    if what == "collective":
        if rank == 0:
            call = lambda: dist.all_reduce(x)  # noqa: E731
        else:
            call = lambda: dist.all_gather_into_tensor(torch.empty(numel), x[: numel // ws])  # noqa: E731
    else:  # the same collective, another reduction
        call = lambda: dist.all_reduce(x, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)  # noqa: E731
    kind, msg, took = expect_error(call)
    return {"type": kind, "msg": msg, "took": took, "transport": transport_of(dist.group.WORLD)}


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
@pytest.mark.parametrize(
    "what,numel,names",
    [
        ("collective", 1 << 20, ("op=allreduce", "op=_allgather_base")),  # the ring: c10d OpType names
        ("reduce-op", 1000, ("reduce_op=SUM", "reduce_op=MAX")),  # one-shot
        ("reduce-op", 1 << 20, ("reduce_op=SUM", "reduce_op=MAX")),  # the ring
    ],
)
def test_ranks_calling_different_collectives_get_one_clear_error(
    what: str, numel: int, names: tuple, transport: str
) -> None:
    res = run_scenario(_different_calls, 2, (what, numel), env=TRANSPORTS[transport])
    for r, v in res.items():
        assert v["transport"] == harness.transport_expected(transport, 2), v
        assert v["type"] in ("DistBackendError", "DistNetworkError"), (r, v)
        assert v["took"] < KILL_DETECT_S, v
    # The rank that saw it first names both calls.  The other hears it through that
    # rank's Abort frame ("aborted the group: <the same words>"), or, when the abort
    # could not follow a frame half written on that link, as a closed connection.
    naming = [
        v["msg"] for v in res.values() if "mismatch" in v["msg"] and all(n.lower() in v["msg"].lower() for n in names)
    ]
    assert naming, {r: v["msg"] for r, v in res.items()}


# ------------------------------------------------------- bad input on one rank only

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


@on_transports(*TRANSPORT_NAMES, world_sizes=(3,))
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


@on_transports(*TRANSPORT_NAMES)
def test_refusals_keep_the_group(bpool: WorkerPool, transport: str) -> None:
    assert_reports_ok(bpool.run(refusals_worker, transport, timeout=120))
