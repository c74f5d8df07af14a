"""Scale (issue 33): connections made on first use, failure news that reaches ranks never
connected to the failed one, the small allreduce of many ranks, and the all-to-all in
log N rounds (Bruck's).

A group connects its rings' neighbours at creation and every other peer the first time
an op needs it (``RINGPG_TUNING=connect=all``: every peer at creation); ``connected_peers``
says which.  Results are compared with gloo on the same ranks and inputs.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from harness import (
    KILL_DETECT_S,
    TRANSPORT_ENVS,
    Checker,
    CheckReport,
    Groups,
    InitSpec,
    assert_reports_ok,
    backend_under_test,
    cpu_backend,
    data_kind,
    dtype_name,
    expect_error,
    init_ringpg,
    make_data,
    ref_all_reduce,
    run_scenario,
    run_workers,
    skip_case,
    traced_algorithms,
    transport_expected,
    transport_of,
)

from devkit.settings import tuning, with_tuning

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(backend_under_test() != "ringpg", reason="ringpg's connections and algorithms"),
]

# One host's transports (the "mixed" emulated hosts reorder the ring; test_hierarchical.py
# covers their creation-time links through every op).
ONE_HOST = ("shm", "tcp", "gloo")
# 1 MiB of float32: past the one-shot allreduce's limit at 5 ranks, so the ring.
RING_NUMEL = 1 << 18


def ring_neighbours(b: Any, rank: int) -> list[int]:
    ring = list(b.ring_order)
    at = ring.index(rank)
    return sorted({ring[at - 1], ring[(at + 1) % len(ring)]} - {rank})


def first_use_worker(rank: int, ws: int, groups: Groups, transport: str) -> CheckReport:
    """Neighbours at creation; a ring allreduce adds none; a send to a far rank connects
    that pair both ways; an all-to-all connects the rest (on the links; one host's arena
    connects nobody).  Results equal gloo's."""
    chk = Checker(rank)
    b = cpu_backend(groups.test)
    chk.true("transport", transport_of(groups.test) == transport_expected(transport, ws), transport_of(groups.test))
    near = ring_neighbours(b, rank)
    chk.true("only the ring's neighbours at creation", b.connected_peers == near, f"{b.connected_peers} != {near}")
    # (Each look at the connections comes before any rank's next op on the group, which
    # may dial this rank: the gloo barriers.)
    dist.barrier(group=groups.ref)

    x = make_data(rank, "first use ring", (RING_NUMEL,), torch.float32)
    got = x.clone()
    dist.all_reduce(got, group=groups.test)
    chk.equal("ring all_reduce", got, ref_all_reduce(x, "SUM", groups.ref))
    chk.true("a ring all_reduce connects nothing more", b.connected_peers == near, str(b.connected_peers))
    dist.barrier(group=groups.ref)

    # Two ranks two steps apart on the ring: never connected until this send.
    ring = list(b.ring_order)
    src, dst = ring[0], ring[2]
    payload = torch.arange(7, dtype=torch.int64) + 100
    if rank == src:
        dist.send(payload, dst, group=groups.test)
    elif rank == dst:
        into = torch.zeros(7, dtype=torch.int64)
        dist.recv(into, src, group=groups.test)
        chk.equal("send to a rank never connected", into, payload)
    dist.barrier(group=groups.ref)
    if rank in (src, dst):
        other = dst if rank == src else src
        chk.true("the pair is connected after its first use", other in b.connected_peers, str(b.connected_peers))
    before = b.connected_peers
    dist.barrier(group=groups.ref)
    inp = make_data(rank, "first use a2a", (ws * 3,), torch.int32)
    out, ref = torch.empty_like(inp), torch.empty_like(inp)
    dist.all_to_all_single(out, inp, group=groups.test)
    dist.all_to_all_single(ref, inp, group=groups.ref)
    chk.equal("all_to_all_single", out, ref)
    # Over Gloo's pairs the collectives' data bypasses ringpg's engine (its control and
    # point-to-point links stay as they were); on one host's arena it moves in shared
    # memory, with no socket at all.
    in_arena = b.algorithm_for("all_to_all", 0) == "arena"
    chk.true("one host's all-to-all runs in its arena", in_arena == (transport == "shm"), str(in_arena))
    want = before if transport == "gloo" or in_arena else [q for q in range(ws) if q != rank]
    chk.true("an all-to-all connects every peer it sends to", b.connected_peers == want, str(b.connected_peers))
    return chk.report()


@pytest.mark.parametrize("transport", ONE_HOST)
def test_peers_are_connected_on_first_use(transport: str) -> None:
    spec = InitSpec(env=TRANSPORT_ENVS[transport])
    assert_reports_ok(run_workers(first_use_worker, 5, transport, spec, timeout=120))


def connect_all_worker(rank: int, ws: int, groups: Groups, _: Any) -> CheckReport:
    chk = Checker(rank)
    b = cpu_backend(groups.test)
    everyone = [q for q in range(ws) if q != rank]
    want = everyone if rank == 0 else sorted(set(ring_neighbours(b, rank)) | {0})
    chk.true("connections at creation", b.connected_peers == want, f"{b.connected_peers} != {want}")
    dist.barrier(group=groups.ref)  # every rank has looked before the one-shot connects everyone
    x = make_data(rank, "connect all", (1000,), torch.int64)
    got = x.clone()
    dist.all_reduce(got, group=groups.test)
    chk.equal("all_reduce", got, ref_all_reduce(x, "SUM", groups.ref))
    return chk.report()


def test_connect_all_on_one_rank_connects_it_to_everyone() -> None:
    """Tuning connect=all on rank 0 alone: it dials every peer at creation, each dials it
    back, and the others keep to their neighbours otherwise (the setting may differ)."""
    spec = InitSpec(env=TRANSPORT_ENVS["tcp"], rank0_env=(tuning(connect="all"),))
    assert_reports_ok(run_workers(connect_all_worker, 5, None, spec, timeout=120))


# ------------------------------------------------------------------ failure news

VICTIM = 2  # at 5 ranks on one host: the ring 0-1-2-3-4, so rank 0 and rank 4 are not its neighbours


def _die_before_first_use(rank: int, ws: int, port: int, args: Any) -> dict:
    stamp, far_op = args
    init_ringpg(rank, ws, port)
    import ringpg

    b = ringpg.backend()
    x = torch.ones(RING_NUMEL)
    dist.all_reduce(x)  # the ring: rank 0 and the victim stay unconnected
    peers = b.connected_peers
    if rank == VICTIM:
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        os._exit(1)
    if rank == 0:
        time.sleep(0.5)  # the victim is gone before rank 0's first use of it
        if far_op == "send":
            kind, msg, _ = expect_error(lambda: dist.send(torch.ones(4), VICTIM))
            if not kind:  # the bytes fit the socket: the next op learns of the loss
                kind, msg, _ = expect_error(lambda: dist.all_reduce(x))
        else:
            kind, msg, _ = expect_error(lambda: dist.all_reduce(x))
    else:
        kind, msg, _ = expect_error(lambda: dist.all_reduce(x))
    return {"peers": peers, "type": kind, "msg": msg, "t": time.time(), "transport": transport_of(dist.group.WORLD)}


@pytest.mark.parametrize("transport", ("shm", "tcp"))
@pytest.mark.parametrize("far_op", ("send", "all_reduce"))
def test_a_death_reaches_ranks_never_connected_to_it(tmp_path: Any, transport: str, far_op: str) -> None:
    """The victim dies; rank 0, never connected to it, either dials it (send: refused, or
    the loss comes with the next op) or waits in the ring (all_reduce: the news comes
    along the ring).  Every survivor raises a typed error naming the victim, fast."""
    stamp = str(tmp_path / "died")
    ws = 5
    res = run_scenario(
        _die_before_first_use,
        ws,
        (stamp, far_op),
        expect={r for r in range(ws) if r != VICTIM},
        env=dict(TRANSPORT_ENVS[transport]),
    )
    with open(stamp) as f:
        died = float(f.read())
    assert VICTIM not in res[0]["peers"] and VICTIM not in res[4]["peers"], res
    for r, v in res.items():
        assert v["transport"] == transport_expected(transport, ws), (r, v)
        assert v["type"] in ("DistNetworkError", "DistBackendError"), (r, v)
        assert f"rank {VICTIM}" in v["msg"] and f"rank {r}" in v["msg"], (r, v["msg"])
        assert v["t"] - died < KILL_DETECT_S, (r, v["t"] - died, v["msg"])


# ------------------------------------------------------------------ many ranks, small allreduce

WS_DOUBLING = 9  # past one-shot's eight ranks, and not a power of two (one rank folds in)
DOUBLING_CASES = (
    (torch.int32, ("SUM", "MAX", "MIN", "PRODUCT")),
    (torch.float32, ("SUM",)),
    (torch.bfloat16, ("SUM", "MAX")),
)


def doubling_worker(rank: int, ws: int, groups: Groups, _: Any) -> CheckReport:
    """Small all_reduces at 9 ranks over TCP equal gloo's (integer-valued data: exact),
    and every rank holds the same bits."""
    chk = Checker(rank)
    b = cpu_backend(groups.test)
    for dtype, ops in DOUBLING_CASES:
        for op in ops:
            if skip_case(backend_under_test(), op, dtype):
                continue
            for n in (0, 1, ws - 1, 1000):
                case = f"all_reduce op={op} dtype={dtype_name(dtype)} numel={n}"
                x = make_data(rank, case, (n,), dtype, data_kind(op))
                got = x.clone()
                dist.all_reduce(got, op=getattr(dist.ReduceOp, op), group=groups.test)
                chk.equal(case, got, ref_all_reduce(x, op, groups.ref))
    y = torch.randn(333, generator=torch.Generator().manual_seed(rank))
    dist.all_reduce(y, group=groups.test)
    every = [torch.empty_like(y) for _ in range(ws)]
    dist.all_gather(every, y, group=groups.ref)
    chk.true("random floats: the same bits on every rank", all(torch.equal(every[0], t) for t in every))
    # Neighbours and at most log2(8) + 1 partners: O(log N) connections, not all N - 1.
    # (Rank 0 aside: under RINGPG_TRACE every rank syncs its clock with rank 0, which is
    # connected to all; the others count it once.)
    if rank != 0:
        chk.true("connections", len(set(b.connected_peers) - {0}) <= 2 + 4, str(b.connected_peers))
    return chk.report()


def test_small_allreduce_of_many_ranks_doubles_recursively(tmp_path: Any) -> None:
    env = (*TRANSPORT_ENVS["tcp"], ("RINGPG_TRACE", str(tmp_path)))
    assert_reports_ok(run_workers(doubling_worker, WS_DOUBLING, None, InitSpec(env=env), timeout=180))
    algorithms = traced_algorithms(str(tmp_path), "all_reduce")
    assert algorithms.get(1000 * 4) == {"doubling"}, algorithms
    assert algorithms.get(333 * 4) == {"doubling"}, algorithms


# ------------------------------------------------------------------ all-to-all in log N rounds

WS_BRUCK = 6  # three rounds (bits 1, 2, 4), and not a power of two
# Rows rank src sends rank dst in all_to_all_single (None: equal parts).
BRUCK_SPLITS = {
    "equal": None,
    "uneven with zeros": lambda src, dst: (src + 2 * dst) % 3,
    "only to the next rank": lambda src, dst: 2 if dst == (src + 1) % WS_BRUCK else 0,
    "nothing at all": lambda src, dst: 0,
}


def bruck_worker(rank: int, ws: int, groups: Groups, _: Any) -> CheckReport:
    """all_to_all_single and list all_to_all under tuning alltoall=bruck equal gloo's, every
    split pattern, a few dtypes and row shapes; blocks of every size travel with their
    sizes, so uneven and empty ones arrive whole."""
    chk = Checker(rank)
    for name, rows in BRUCK_SPLITS.items():
        ins = None if rows is None else [rows(rank, j) for j in range(ws)]
        outs = None if rows is None else [rows(j, rank) for j in range(ws)]
        n_in = 2 * ws if ins is None else sum(ins)
        n_out = 2 * ws if outs is None else sum(outs)
        for dtype in (torch.int64, torch.bfloat16, torch.uint8):
            for row in ((), (3,)):
                case = f"all_to_all_single splits={name} dtype={dtype_name(dtype)} row={row}"
                x = make_data(rank, case, (n_in, *row), dtype)
                got = torch.full((n_out, *row), 7, dtype=dtype)
                ref = torch.empty_like(got)
                dist.all_to_all_single(got, x, outs, ins, group=groups.test)
                dist.all_to_all_single(ref, x, outs, ins, group=groups.ref)
                chk.equal(case, got, ref)
    # Lists of pair-dependent sizes; gloo's list form wants equal sizes, so its reference
    # is all_to_all_single over the concatenation.
    sizes = [(rank + 2 * j) % 4 for j in range(ws)]
    from_sizes = [(j + 2 * rank) % 4 for j in range(ws)]
    inputs = [make_data(rank, f"list to {j}", (n, 2), torch.int32) for j, n in enumerate(sizes)]
    got_list = [torch.full((n, 2), 7, dtype=torch.int32) for n in from_sizes]
    dist.all_to_all(got_list, inputs, group=groups.test)
    flat = torch.empty(2 * sum(from_sizes), dtype=torch.int32)
    in_numels, out_numels = [2 * n for n in sizes], [2 * n for n in from_sizes]
    dist.all_to_all_single(flat, torch.cat([t.reshape(-1) for t in inputs]), out_numels, in_numels, group=groups.ref)
    chk.equal("all_to_all(list) uneven", torch.cat([t.reshape(-1) for t in got_list]), flat)
    return chk.report()


@pytest.mark.parametrize("transport", TRANSPORT_ENVS)  # "mixed": two emulated hosts, the ring by host
def test_bruck_all_to_all_equals_gloo(tmp_path: Any, transport: str) -> None:
    env = (*with_tuning(TRANSPORT_ENVS[transport], alltoall="bruck"), ("RINGPG_TRACE", str(tmp_path)))
    assert_reports_ok(run_workers(bruck_worker, WS_BRUCK, None, InitSpec(env=env), timeout=180))
    algorithms = traced_algorithms(str(tmp_path), "all_to_all_single")  # (traced as 0 bytes)
    assert set().union(*algorithms.values()) == {"bruck"}, algorithms


def _bruck_mismatch(rank: int, ws: int, port: int, _: Any) -> dict:
    """Rank 1 expects two rows from rank 0, which sends one."""
    init_ringpg(rank, ws, port)
    ins = [1] * ws
    outs = [2 if (rank, j) == (1, 0) else 1 for j in range(ws)]
    out = torch.zeros(sum(outs))
    kind, msg, _ = expect_error(lambda: dist.all_to_all_single(out, torch.ones(ws), outs, ins))
    if not kind:  # a rank whose blocks all matched learns of the failure with its next op
        kind, msg, _ = expect_error(lambda: dist.all_reduce(torch.ones(4)))
    return {"type": kind, "msg": msg}


def test_bruck_ranks_that_disagree_on_splits_raise() -> None:
    res = run_scenario(_bruck_mismatch, 3, env=dict((tuning(alltoall="bruck"),)))
    assert res[1]["type"] == "DistBackendError" and "disagree on the split sizes" in res[1]["msg"], res[1]
    assert "rank 1 expected 8 bytes from rank 0, which sent 4" in res[1]["msg"], res[1]
    # The others hear it through an Abort frame (the same words), or, where the abort
    # could not follow a frame half written on a link, as a closed connection (as
    # test_bad_input's mismatched collectives): each raises a typed error naming its rank.
    for r, v in res.items():
        assert v["type"] in ("DistNetworkError", "DistBackendError"), (r, v)
        assert f"rank {r}" in v["msg"], (r, v)
        assert "collective mismatch" in v["msg"] or "Connection closed by peer" in v["msg"], (r, v)
