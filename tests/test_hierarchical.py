"""Hierarchical collectives on emulated hosts of other shapes than 2 x 2 (issue "Hosts x ranks").

ringpg runs allreduce, reduce_scatter_tensor and all_gather_into_tensor hierarchically
(csrc/algorithms/hierarchical.cpp: a ring over each host's ranks, one ring per local
rank across the hosts, the hierSlot chunk layout) where several hosts hold the same
number K > 1 of a group's ranks, and the flat ring where they hold different numbers.
test_transports.py covers 2 hosts x 2 ranks and 2 + 1; test_collectives.py 2 x 4.  Here,
at world size 6, hosts emulated through ``RINGPG_HOSTID`` (harness.EMULATED_LAYOUTS):

* ``3x2``: 3 hosts x 2 ranks, rank r on host r % 3 (cyclic: hierSlot is the rank, the
  all-gather runs in place);
* ``2x3``: 2 hosts x 3 ranks, numbered as torchrun does (ranks 0-2 on host 0: hierSlot
  is not the rank, so reduce-scatter and all-gather go through the kept layout);
* ``4+2``: hosts of 4 and 2 ranks (0, 2, 3, 5 and 1, 4): the flat ring, on a ring order
  that is not rank order, even with ``RINGPG_ALGO=hier`` (set there, so that its
  subgroups of one host, and of one rank per host, run the hierarchical algorithms);
* ``2x3-gloo``: 2 x 3 with every link on Gloo's pairs (``RINGPG_TRANSPORT=gloo``), the
  ops in one piece (the battery and subgroups only).

Each layout's pool (``RINGPG_TUNING`` keys ``oneshot_bytes=0``, so that every non-empty allreduce takes
the ring path rather than the one-shot exchange; ``segment_bytes=65536``, so the
larger cases span many segments and shared-memory slots; ``hier_piece_bytes=65536``,
so they also move in pieces, the rings across hosts on the op's second thread) runs,
against gloo on the same ranks and inputs:

* the battery: all_reduce (numel 0, 1, 5, 6k+5 small and large), reduce_scatter_tensor
  and all_gather_into_tensor (per-rank numel 0, 1, 7, 3001, 50001; the all-gather also
  with its input inside its output, as FSDP calls it), broadcast from every rank (a root
  on each host), for int32, float32 and bfloat16 under SUM, AVG, MAX, MIN, PRODUCT and
  PREMUL_SUM (floats; a scalar and a tensor factor).  Data are small integers, so every
  result is exact (``torch.equal``); random normal floats under SUM and AVG are checked
  within a stated bound of gloo's float64 result, and must be bit-identical on every rank;
* uint8, float16, float64, int64 and complex64 (the other element sizes) under SUM
  at an odd size;
* the coalesced forms: ``_coalescing_manager`` around all_reduce / reduce_scatter_tensor /
  all_gather_into_tensor on the same dtypes and ops, plus test_collectives.py's
  own coalesced batteries (all_reduce_coalesced, all_gather_coalesced, the manager
  with async_ops), imported;
* subgroups: one spanning 2 hosts x 2 ranks (hierarchical, whatever the world's shape,
  the 4+2 world included) and one of 2 + 1 ranks (the flat ring), each against a gloo
  subgroup of the same ranks; under 4+2 also one of 2 ranks on one host and one of one
  rank on each of 2 hosts (hierarchical only because RINGPG_ALGO=hier forces it).

``ringpg.backend(g)`` must report the layout's hosts, ranks per host, ring order and
algorithm, and ringpg's traces (``RINGPG_TRACE``) must show every non-empty allreduce,
reduce-scatter and all-gather of each group on that algorithm.  Last, a rank killed
mid-collective at 3x2 (allreduce) and 2x3 (reduce-scatter): every survivor gets a typed
error within seconds (harness.die_mid_collective, as test_faults.py's dead peers), its
4 MiB buffer in pieces: the rank may die while both threads of an op wait.

The traces must also show how the world group's large allreduce, reduce-scatter and
all-gather moved: in as many pieces as the piece size gives, on two threads, and the
small ones in one piece on one (none on unequal hosts).  And during such a two-thread op
on 2 hosts x 2 ranks, a frozen rank (over all-TCP) and rank 0's abort() (with shared
memory on each host) end every rank's op at the timeout or the abort plus a small
bound, with get_error()'s kind (TIMEOUT / REMOTE_ERROR; COMM_ERROR on the aborting
rank), and no thread of the op left running.
"""

from __future__ import annotations

import os
import re
import signal
from typing import Any, Callable, Iterator, Optional

import harness
import pytest
import torch
import torch.distributed as dist
from harness import (
    EMULATED_HOSTS_ENV,
    EMULATED_LAYOUTS,
    TRANSPORT_ENVS,
    Checker,
    CheckReport,
    Groups,
    InitSpec,
    TaskFn,
    WorkerPool,
    assert_reports_ok,
    assert_survivors_raised_fast,
    backend_under_test,
    data_kind,
    die_mid_collective,
    dtype_name,
    emulated_topology,
    expect_error,
    hier_pieces,
    hierarchical_expected,
    init_ringpg,
    known_gap,
    make_data,
    make_random_float,
    reduce_op,
    ref_all_gather,
    ref_all_reduce,
    ref_all_reduce_many,
    ref_broadcast,
    ref_reduce_scatter,
    ref_reduce_scatter_many,
    run_scenario,
    sentinel_like,
    skip_case,
    traced_ops,
    traced_pieces,
    transport_expected,
)
from harness.batteries import coalescing_manager_worker, deprecated_coalesced_worker
from harness.surface import finish, guarded

from devkit.settings import TUNING, merged_env, tuning

WS = 6
RINGPG = backend_under_test() == "ringpg"

Subgroups = tuple[tuple[tuple[int, ...], str], ...]
# (id, harness.EMULATED_LAYOUTS key, RINGPG_ALGO, (hosts, ranks per host: 0 = unequal),
#  the world's algorithm, subgroups: (world ranks, algorithm)).  4+2 runs with the
#  hierarchical algorithms forced: the world still runs the ring (its hosts hold unequal
#  numbers), while subgroups of one host (H = 1) or of one rank per host (K = 1) run them.
LAYOUTS: tuple[tuple[str, str, str, tuple[int, int], str, Subgroups], ...] = (
    ("3x2", "hosts3x2", "auto", (3, 2), "hier", (((0, 1, 3, 4), "hier"), ((0, 1, 3), "ring"))),
    ("2x3", "hosts2x3", "auto", (2, 3), "hier", (((0, 1, 3, 4), "hier"), ((0, 1, 3), "ring"))),
    (
        "4+2",
        "hosts4+2",
        "hier",
        (2, 0),
        "ring",
        (((0, 1, 2, 4), "hier"), ((0, 1, 3), "ring"), ((0, 2), "hier"), ((0, 1), "hier")),
    ),
    ("2x3-gloo", "hosts2x3", "auto", (2, 3), "hier", (((0, 1, 3, 4), "hier"), ((0, 1, 3), "ring"))),
)
# Layouts whose every link is of one transport (TRANSPORT_ENVS), not the default mix of
# shared memory within a host and ringpg's TCP between: over Gloo's pairs, the host rings
# and the rings across hosts all run on ProcessGroupGloo's send/recv, and every op in one
# piece on one thread (piecesFor: Gloo's pairs are moved by whoever posts on them, so a
# second thread gains nothing).  They run the battery and the subgroups only (time).
LAYOUT_TRANSPORT: dict[str, str] = {"2x3-gloo": "gloo"}
LAYOUT_TASKS = ("info", "battery", "subgroups")
# Pieces of 64 KiB: the large cases run in pieces, the rings across hosts on a second
# thread beside the host rings (hierarchical.h), and the small ones in one.
PIECE_BYTES = "65536"
ENV = (tuning(oneshot_bytes=0, segment_bytes=65536, hier_piece_bytes=PIECE_BYTES),)

DTYPES = (torch.int32, torch.float32, torch.bfloat16)
OPS = ("SUM", "AVG", "MAX", "MIN", "PRODUCT", "PREMUL_SUM")
# PREMUL_SUM's factors: a float and a 1-element tensor of the input's dtype (small
# integers times either stay exact in bfloat16).
PREMUL_FACTORS = ("0.5", "tensor 3")
# The ops whose large sizes run too (the rest, on the small ones only: time).
LARGE_OPS = ("SUM", "AVG", "MAX", "PREMUL_SUM")
LARGE_K = 50000  # all_reduce of 6k+5 = 300005 elements; reduce-scatter / all-gather blocks of 50001


def allreduce_numels(gs: int, large: bool) -> list[int]:
    """Empty, one, fewer than the group, and gs*k + gs-1 (no chunk split is even)."""
    ns = [0, 1, gs - 1, gs * 1000 + gs - 1]
    return ns + [gs * LARGE_K + gs - 1] if large else ns


def block_numels(large: bool) -> list[int]:
    """Per-rank numel of reduce_scatter_tensor / all_gather_into_tensor."""
    ns = [0, 1, 7, 3001]
    return ns + [LARGE_K + 1] if large else ns


# ------------------------------------------------------------------ the battery


def reductions(
    backend: str, dtype: torch.dtype
) -> Iterator[tuple[str, Callable[[], Any], Callable[[torch.Tensor], torch.Tensor], str]]:
    """(case name, a fresh ReduceOp, what the reference reduces, the reference's op)
    for every op of OPS the backend under test has for ``dtype``; PREMUL_SUM's
    reference is gloo's SUM of the premultiplied input."""
    for op in OPS:
        if op != "PREMUL_SUM":
            if not skip_case(backend, op, dtype):
                yield op, (lambda op=op: reduce_op(op)), (lambda x: x), op
            continue
        if not dtype.is_floating_point or known_gap(backend, "PREMUL_SUM"):
            continue
        for kind in PREMUL_FACTORS:
            factor: Any = 0.5 if kind == "0.5" else torch.tensor([3.0], dtype=dtype)
            yield (
                f"PREMUL_SUM factor={kind}",
                (lambda f=factor: dist._make_nccl_premul_sum(f)),
                (lambda x, f=factor: x * f),
                "SUM",
            )


def check_battery(chk: Checker, groups_backend: str, g: Any, ref: Any, tag: str, full: bool = True) -> None:
    """all_reduce, reduce_scatter_tensor, all_gather_into_tensor and broadcast on ``g``
    against the gloo group ``ref`` (same ranks), exact on small-integer data."""
    gs, me = dist.get_world_size(g), dist.get_rank()
    members = dist.get_process_group_ranks(g)
    for dtype in DTYPES:
        for name, red, pre, ref_op in reductions(groups_backend, dtype):
            kind = data_kind(ref_op)
            large = name.split()[0] in LARGE_OPS
            # gloo's results for every size in one call (its latency, not the data, is the cost).
            ns = allreduce_numels(gs, large and full)
            cases = [f"all_reduce op={name} dtype={dtype_name(dtype)} numel={n} {tag}" for n in ns]
            xs = [make_data(me, case, (n,), dtype, kind) for case, n in zip(cases, ns)]
            for case, x, want in zip(cases, xs, ref_all_reduce_many([pre(x) for x in xs], ref_op, ref)):
                got = x.clone()
                guarded(chk, case, lambda: dist.all_reduce(got, op=red(), group=g))
                chk.equal(case, got, want)
            ns = block_numels(large and full)
            cases = [f"reduce_scatter_tensor op={name} dtype={dtype_name(dtype)} numel={n * gs} {tag}" for n in ns]
            xs = [make_data(me, case, (n * gs,), dtype, kind) for case, n in zip(cases, ns)]
            for case, n, x, want in zip(cases, ns, xs, ref_reduce_scatter_many([pre(x) for x in xs], ref_op, ref)):
                inp, out = x.clone(), sentinel_like((n,), dtype)
                guarded(chk, case, lambda: dist.reduce_scatter_tensor(out, inp, op=red(), group=g))
                chk.equal(case, out, want)
                chk.equal(f"{case} [input unchanged]", inp, x)
        for n in block_numels(full):
            case = f"all_gather_into_tensor dtype={dtype_name(dtype)} numel={n} {tag}"
            x = make_data(me, case, (n,), dtype)
            inp, out = x.clone(), sentinel_like((n * gs,), dtype)
            guarded(chk, case, lambda: dist.all_gather_into_tensor(out, inp, group=g))
            expected = ref_all_gather(x, ref)
            chk.equal(case, out, expected)
            chk.equal(f"{case} [input unchanged]", inp, x)
            # The input as the output's own chunk (FSDP's call): in place, or through the
            # kept layout when hierSlot is not the rank.
            case = f"all_gather_into_tensor [input in output] dtype={dtype_name(dtype)} numel={n} {tag}"
            out = sentinel_like((n * gs,), dtype)
            own = out.narrow(0, dist.get_rank(g) * n, n)
            own.copy_(x)
            guarded(chk, case, lambda: dist.all_gather_into_tensor(out, own, group=g))
            chk.equal(case, out, expected)
        for n in (0, 5, gs * LARGE_K + gs - 1) if full else (5, gs * 1000 + gs - 1):
            for src in members:  # every rank as the root: a root on every host
                case = f"broadcast src={src} dtype={dtype_name(dtype)} numel={n} {tag}"
                x = make_data(me, case, (n,), dtype)
                got = x.clone()
                guarded(chk, case, lambda: dist.broadcast(got, src=src, group=g))
                chk.equal(case, got, ref_broadcast(x, src, ref))


# The other element sizes the algorithms see (1, 2 and 8 bytes; complex as pairs of
# reals), under SUM at an odd size that runs in pieces where the battery's large ones do.
OTHER_DTYPES = (torch.uint8, torch.float16, torch.float64, torch.int64, torch.complex64)


def check_other_dtypes(chk: Checker, g: Any, ref: Any, tag: str) -> None:
    """all_reduce, reduce_scatter_tensor and all_gather_into_tensor of OTHER_DTYPES on
    ``g`` against gloo's ``ref``, exact on small-integer data."""
    gs, me = dist.get_world_size(g), dist.get_rank()
    n = LARGE_K + 1
    for dtype in OTHER_DTYPES:
        case = f"all_reduce op=SUM dtype={dtype_name(dtype)} numel={gs * n} {tag}"
        x = make_data(me, case, (gs * n,), dtype, data_kind("SUM"))
        got = x.clone()
        guarded(chk, case, lambda: dist.all_reduce(got, group=g))
        chk.equal(case, got, ref_all_reduce(x, "SUM", ref))
        case = f"reduce_scatter_tensor op=SUM dtype={dtype_name(dtype)} numel={gs * n} {tag}"
        out = sentinel_like((n,), dtype)
        guarded(chk, case, lambda: dist.reduce_scatter_tensor(out, x.clone(), group=g))
        chk.equal(case, out, ref_reduce_scatter(x, "SUM", ref))
        case = f"all_gather_into_tensor dtype={dtype_name(dtype)} numel={n} {tag}"
        x = make_data(me, case, (n,), dtype)
        out = sentinel_like((gs * n,), dtype)
        guarded(chk, case, lambda: dist.all_gather_into_tensor(out, x, group=g))
        chk.equal(case, out, ref_all_gather(x, ref))


def check_random_floats(chk: Checker, g: Any, ref: Any, tag: str) -> None:
    """Random normal float32/bfloat16 under SUM and AVG, where the order of the
    additions shows (ringpg's host-then-cross order is not gloo's).  Tolerance: every
    element within gs * eps * R(|x|) + eps * |R(x)| of R(x), R being gloo's float64
    reduction: ringpg rounds at most once per ring step (fp16/bf16 in fp32, rounded once
    per step), each rounding at most eps/2 of a partial reduction bounded by R(|x|).
    And every rank must hold the same bits (every element reduced in one order, then
    copied)."""
    gs, me = dist.get_world_size(g), dist.get_rank()
    for dtype in (torch.float32, torch.bfloat16):
        eps = torch.finfo(dtype).eps
        for op in ("SUM", "AVG"):
            n = gs * LARGE_K + gs - 1
            case = f"all_reduce random normal op={op} dtype={dtype_name(dtype)} numel={n} {tag}"
            x = make_random_float(me, case, (n,), dtype)
            got = x.clone()
            guarded(chk, case, lambda: dist.all_reduce(got, op=reduce_op(op), group=g))
            exact = ref_all_reduce(x.double(), op, ref)
            bound = gs * eps * ref_all_reduce(x.double().abs(), op, ref) + eps * exact.abs()
            chk.within(case, got.double(), exact, bound)
            every = ref_all_gather(got, ref).view(gs, n)
            chk.equal(f"{case} [same bits on every rank]", every, got.expand(gs, n))

            case = f"reduce_scatter_tensor random normal op={op} dtype={dtype_name(dtype)} numel={gs * (LARGE_K + 1)} {tag}"
            x = make_random_float(me, case, (gs * (LARGE_K + 1),), dtype)
            out = sentinel_like((LARGE_K + 1,), dtype)
            guarded(chk, case, lambda: dist.reduce_scatter_tensor(out, x.clone(), op=reduce_op(op), group=g))
            exact = ref_reduce_scatter(x.double(), op, ref)
            bound = gs * eps * ref_reduce_scatter(x.double().abs(), op, ref) + eps * exact.abs()
            chk.within(case, out.double(), exact, bound)


def battery_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    chk = Checker(rank)
    check_battery(chk, groups.backend, groups.test, groups.ref, f"ws={ws} {args}")
    check_random_floats(chk, groups.test, groups.ref, f"ws={ws} {args}")
    check_other_dtypes(chk, groups.test, groups.ref, f"ws={ws} {args}")
    return finish(chk, groups.test)


# ------------------------------------------------------------------ coalesced

AR_SHAPES = ((6005,), (0,), (5,), (3, 7))
BLOCK_SHAPES = ((7,), (3001,), (1,), (2, 3))  # per rank; dim 0 scaled by the group size


def coalesced_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """``_coalescing_manager`` around all_reduce, reduce_scatter_tensor and
    all_gather_into_tensor (one op each on the group: allreduce_coalesced,
    reduce_scatter_tensor_coalesced, allgather_into_tensor_coalesced)."""
    chk = Checker(rank)
    g, ref = groups.test, groups.ref
    tag = f"ws={ws} {args}"
    for dtype in DTYPES:
        d = dtype_name(dtype)
        for name, red, pre, ref_op in reductions(groups.backend, dtype):
            kind = data_kind(ref_op)
            case = f"coalesced all_reduce op={name} dtype={d} {tag}"
            xs = [make_data(rank, f"{case} [{i}]", s, dtype, kind) for i, s in enumerate(AR_SHAPES)]
            got = [x.clone() for x in xs]

            def coalesced_all_reduce() -> None:
                with dist._coalescing_manager(group=g):
                    for t in got:
                        dist.all_reduce(t, op=red(), group=g)

            guarded(chk, case, coalesced_all_reduce)
            wants = ref_all_reduce_many([pre(x) for x in xs], ref_op, ref)
            for i, (t, want) in enumerate(zip(got, wants)):
                chk.equal(f"{case} [tensor {i}]", t, want)

            case = f"coalesced reduce_scatter_tensor op={name} dtype={d} {tag}"
            xs = [
                make_data(rank, f"{case} [{i}]", (s[0] * ws, *s[1:]), dtype, kind) for i, s in enumerate(BLOCK_SHAPES)
            ]
            outs = [sentinel_like(s, dtype) for s in BLOCK_SHAPES]

            def coalesced_reduce_scatter() -> None:
                with dist._coalescing_manager(group=g):
                    for o, x in zip(outs, xs):
                        dist.reduce_scatter_tensor(o, x.clone(), op=red(), group=g)

            guarded(chk, case, coalesced_reduce_scatter)
            wants = ref_reduce_scatter_many([pre(x) for x in xs], ref_op, ref)
            for i, (o, want) in enumerate(zip(outs, wants)):
                chk.equal(f"{case} [tensor {i}]", o, want)

        case = f"coalesced all_gather_into_tensor dtype={d} {tag}"
        xs = [make_data(rank, f"{case} [{i}]", s, dtype) for i, s in enumerate(BLOCK_SHAPES)]
        outs = [sentinel_like((s[0] * ws, *s[1:]), dtype) for s in BLOCK_SHAPES]

        def coalesced_all_gather() -> None:
            with dist._coalescing_manager(group=g):
                for o, x in zip(outs, xs):
                    dist.all_gather_into_tensor(o, x, group=g)

        guarded(chk, case, coalesced_all_gather)
        for i, (o, x) in enumerate(zip(outs, xs)):
            chk.equal(f"{case} [tensor {i}]", o, ref_all_gather(x, ref))
    return finish(chk, g)


# ------------------------------------------------------------------ subgroups


def group_info(g: Any) -> Optional[dict[str, Any]]:
    """What ringpg's backend of ``g`` says about its hosts and algorithm (None: not ringpg)."""
    import ringpg

    b = ringpg.backend(g)
    if b is None:
        return None
    return {
        "algorithm": b.allreduce_algorithm,
        "hosts": b.hosts,
        "ranks_per_host": b.ranks_per_host,
        "ring_order": list(b.ring_order),
        "transport": b.transport,
        "host_arena": b.arena_bytes > 0,
        "group": g.group_name,
    }


def info_worker(rank: int, ws: int, groups: Groups, args: Any) -> Optional[dict[str, Any]]:
    return group_info(groups.test)


def subgroup_worker(rank: int, ws: int, groups: Groups, subgroups: Subgroups) -> dict[str, Any]:
    """Each subgroup (created on every rank, members run it) against a gloo subgroup of
    the same ranks: a smaller battery (no large sizes), and what its backend says."""
    chk = Checker(rank)
    infos: list[Optional[dict[str, Any]]] = []
    for ranks, _ in subgroups:
        sub = dist.new_group(list(ranks))
        ref = dist.new_group(list(ranks), backend="gloo")
        if rank not in ranks:
            infos.append(None)
            continue
        infos.append(group_info(sub))
        check_battery(chk, groups.backend, sub, ref, f"subgroup={list(ranks)}", full=False)
        finish(chk, sub)  # a subgroup the failures broke: raise, so the pool restarts
    return {"report": chk.report(), "infos": infos}


# ------------------------------------------------------------------ the runs

# (name, worker, args): the tasks each layout's pool runs; the tests read their results.
TASKS: tuple[tuple[str, TaskFn, Any], ...] = (
    ("info", info_worker, None),
    ("battery", battery_worker, None),
    ("coalesced", coalesced_worker, None),
    # test_collectives.py's own: all_reduce_coalesced / all_gather_coalesced,
    # _coalescing_manager with async_ops (funcol's *_coalesced reach the same backend
    # ops as the manager's, and their first call costs seconds: not here).
    ("surface-deprecated", deprecated_coalesced_worker, None),
    ("surface-manager", coalescing_manager_worker, None),
    ("subgroups", subgroup_worker, None),  # args: the layout's subgroups
)
# The op spans of ringpg's traces whose algorithm is the hierarchical one or the ring.
HIER_OPS = (
    "all_reduce",
    "reduce_scatter_tensor",
    "all_gather_into_tensor",
    "allreduce_coalesced",
    "reduce_scatter_tensor_coalesced",
    "allgather_into_tensor_coalesced",
    "allgather_coalesced",
)

pytestmark = [
    pytest.mark.multiprocess,
    # The first test of a layout also pays its pool's run (about 20-30 s on 2 cores): so
    # every test on a layout's pool (fixture `run`) is marked slow.
    pytest.mark.timeout(300),
]


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda p: p[0])
def run(request: Any, tmp_path_factory: Any) -> dict[str, Any]:
    """One pool per layout runs every task, then shuts down (closing the trace files);
    a task that fails is recorded for its test, the next ones run on fresh workers."""
    name, key, algo, shape, world, subgroups = request.param
    trace_dir = str(tmp_path_factory.mktemp(f"hier-trace-{key}"))
    env = ((EMULATED_HOSTS_ENV, EMULATED_LAYOUTS[key]), ("RINGPG_ALGO", algo), *ENV)
    if name in LAYOUT_TRANSPORT:
        env = (*env, *TRANSPORT_ENVS[LAYOUT_TRANSPORT[name]])
    if RINGPG:
        env = (*env, ("RINGPG_TRACE", trace_dir))
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    with WorkerPool(WS, InitSpec(env=env)) as pool:
        for task, fn, _args in TASKS:
            if name in LAYOUT_TRANSPORT and task not in LAYOUT_TASKS:
                continue
            try:
                results[task] = pool.run(fn, subgroups if task == "subgroups" else name, timeout=120)
            except AssertionError as e:
                errors[task] = str(e)
    return {
        "name": name,
        "layout": EMULATED_LAYOUTS[key],
        "key": key,
        "algo": algo,
        "shape": shape,
        "world": world,
        "subgroups": subgroups,
        "trace_dir": trace_dir,
        "results": results,
        "errors": errors,
    }


def result(run: dict[str, Any], task: str) -> Any:
    if run["name"] in LAYOUT_TRANSPORT and task not in LAYOUT_TASKS:
        pytest.skip(f"layout {run['name']} runs {', '.join(LAYOUT_TASKS)} only")
    if task in run["errors"]:
        raise AssertionError(f"task {task!r} failed on layout {run['name']}:\n{run['errors'][task]}")
    return run["results"][task]


def expected_transport(run: dict[str, Any], members: Any) -> str:
    return LAYOUT_TRANSPORT.get(run["name"]) or transport_expected(run["key"], members)


def expected_algorithm(run: dict[str, Any], members: Any) -> str:
    return "hier" if hierarchical_expected(run["layout"], list(members), run["algo"]) else "ring"


HOST_ARENA_MIN_RANKS = 3  # common/thresholds.h, kArenaMinRanks


def expected_host_arena(run: dict[str, Any], members: Any) -> bool:
    """Whether each host's ranks of the group share an arena (hierarchical.h,
    hostArenaApplies): under auto (not the gloo transport) on one host, or where the
    hierarchical algorithms run with at least HOST_ARENA_MIN_RANKS ranks a host."""
    if run["algo"] not in ("auto", "arena") or expected_transport(run, members) == "gloo" or len(members) < 2:
        return False
    hosts, per_host, _ = emulated_topology(run["layout"], members)
    return hosts == 1 or (expected_algorithm(run, members) == "hier" and per_host >= HOST_ARENA_MIN_RANKS)


@pytest.mark.slow
def test_layout_is_what_the_test_means(run: dict[str, Any]) -> None:
    """The emulated layout itself: hosts and ranks per host as the layout's id says, and
    the world and each subgroup on the algorithm the table says (harness's rule)."""
    hosts, per_host, _ = emulated_topology(run["layout"], range(WS))
    assert (hosts, per_host) == run["shape"]
    assert expected_algorithm(run, range(WS)) == run["world"]
    assert [expected_algorithm(run, ranks) for ranks, _ in run["subgroups"]] == [a for _, a in run["subgroups"]]
    # Among them, one of 2 hosts x 2 ranks (hierarchical) and one of 2 + 1 (the ring).
    assert [emulated_topology(run["layout"], ranks)[:2] for ranks, _ in run["subgroups"][:2]] == [(2, 2), (2, 0)]
    # 2 x 3 runs its host phases over a host arena; 3 x 2 keeps the host rings.
    if run["name"] in ("2x3", "3x2"):
        assert expected_host_arena(run, range(WS)) == (run["name"] == "2x3")


@pytest.mark.slow
@pytest.mark.skipif(not RINGPG, reason="ringpg's topology")
def test_backend_reports_hosts_and_algorithm(run: dict[str, Any]) -> None:
    hosts, per_host, ring = emulated_topology(run["layout"], range(WS))
    want = {
        "algorithm": run["world"],
        "hosts": hosts,
        "ranks_per_host": per_host,
        "ring_order": ring,
        "transport": expected_transport(run, WS),
        "host_arena": expected_host_arena(run, range(WS)),
        "group": "0",
    }
    assert result(run, "info") == [want] * WS


@pytest.mark.slow
def test_collectives_match_gloo(run: dict[str, Any]) -> None:
    assert_reports_ok(result(run, "battery"))


@pytest.mark.slow
@pytest.mark.parametrize("task", ["coalesced", "surface-deprecated", "surface-manager"])
def test_coalesced_match_gloo(run: dict[str, Any], task: str) -> None:
    assert_reports_ok(result(run, task))


@pytest.mark.slow
def test_subgroups_match_gloo(run: dict[str, Any]) -> None:
    """The 2 x 2 subgroup runs hierarchically (whatever the world's shape), the 2 + 1 one
    on the flat ring (and, with RINGPG_ALGO=hier, those of one host or one rank per host
    hierarchically); all match gloo's subgroups of the same ranks."""
    got = result(run, "subgroups")
    members = set().union(*(ranks for ranks, _ in run["subgroups"]))
    assert_reports_ok([got[r]["report"] for r in sorted(members)])
    if not RINGPG:
        return
    for i, (ranks, algorithm) in enumerate(run["subgroups"]):
        hosts, per_host, ring = emulated_topology(run["layout"], ranks)
        want = {
            "algorithm": algorithm,
            "hosts": hosts,
            "ranks_per_host": per_host,
            "ring_order": ring,
            "transport": expected_transport(run, ranks),
            "host_arena": expected_host_arena(run, ranks),
        }
        for r in range(WS):
            info = got[r]["infos"][i]
            if r not in ranks:
                assert info is None
                continue
            assert {k: v for k, v in info.items() if k != "group"} == want, (ranks, r, info)
            assert info["group"] == got[ranks[0]]["infos"][i]["group"]


def assert_traced(trace_dir: str, group: str, algorithm: str, all_reduce_bytes: set[int], ran: tuple[str, ...]) -> None:
    """Every non-empty op of HIER_OPS of ``group`` ran ``algorithm``; every all_reduce of
    ``all_reduce_bytes`` bytes, and some op of each name in ``ran``, was traced."""
    traced = traced_ops(trace_dir, group)
    seen = {op: traced.get(op, {}) for op in HIER_OPS}
    missing = all_reduce_bytes - set(seen["all_reduce"])
    assert not missing, f"group {group}: no traced all_reduce of {sorted(missing)} bytes; traced {seen['all_reduce']}"
    for op in ran:
        assert seen[op], f"group {group}: no {op} traced"
    wrong = {op: {b: a for b, a in by_bytes.items() if b > 0 and a != {algorithm}} for op, by_bytes in seen.items()}
    assert not any(wrong.values()), f"group {group}: expected {algorithm!r}, traced {wrong}"


@pytest.mark.slow
@pytest.mark.skipif(not RINGPG, reason="RINGPG_TRACE is ringpg's")
def test_traces_show_the_algorithm(run: dict[str, Any]) -> None:
    """The traces, not only the backend's word: every non-empty allreduce, reduce-scatter
    and all-gather (coalesced too) of the world group ran hierarchically on equal hosts,
    on the ring on unequal ones; the subgroups' all-reduces likewise."""
    assert not run["errors"], f"traces incomplete after failed tasks: {sorted(run['errors'])}"
    sizes = {n * d.itemsize for d in DTYPES for n in allreduce_numels(WS, True) if n}
    ran = HIER_OPS[:3] if run["name"] in LAYOUT_TRANSPORT else HIER_OPS  # no coalesced tasks there
    assert_traced(run["trace_dir"], "0", run["world"], sizes, ran)
    infos = result(run, "subgroups")[0]["infos"]  # rank 0 is in every subgroup
    for (ranks, algorithm), info in zip(run["subgroups"], infos):
        gs = len(ranks)
        assert_traced(
            run["trace_dir"],
            info["group"],
            algorithm,
            {n * d.itemsize for d in DTYPES for n in allreduce_numels(gs, False) if n},
            HIER_OPS[:3],
        )


@pytest.mark.slow
@pytest.mark.skipif(not RINGPG, reason="RINGPG_TRACE is ringpg's")
def test_traces_show_the_pieces(run: dict[str, Any]) -> None:
    """The large all_reduce, reduce_scatter_tensor and all_gather_into_tensor of the
    world group (int32, float32, bfloat16; SUM, AVG, MAX among others) moved in as many
    pieces as tuning key hier_piece_bytes gives, on two threads, and the small ones in one
    piece on one thread (issue 31 item 1: a fall-back to one piece would pass every
    result check); on unequal hosts (the ring) no op records pieces."""
    assert not run["errors"], f"traces incomplete after failed tasks: {sorted(run['errors'])}"
    per = int(PIECE_BYTES)
    if run["name"] in LAYOUT_TRANSPORT:  # one piece, one thread, whatever the size
        per = 1 << 62
    want: dict[str, dict[int, set[tuple[int, int]]]] = {op: {} for op in HIER_OPS[:3]}
    for d in DTYPES:
        es = d.itemsize
        for n in allreduce_numels(WS, True)[-2:]:  # 6k+5 (one piece) and the large one
            want["all_reduce"][n * es] = {hier_pieces(n * es, n, per)}
        for n in block_numels(True)[-2:]:
            # Traced bytes: reduce-scatter's input, all-gather's input (one rank's block).
            want["reduce_scatter_tensor"][n * WS * es] = {hier_pieces(n * WS * es, n, per)}
            want["all_gather_into_tensor"][n * es] = {hier_pieces(n * WS * es, n, per)}
    for op, sizes in want.items():
        traced = traced_pieces(run["trace_dir"], op, "0")
        if run["world"] != "hier":
            assert not traced, (op, traced)
            continue
        got = {b: traced.get(b) for b in sizes}
        assert got == sizes, (op, got, sizes)
    if run["world"] == "hier" and run["name"] not in LAYOUT_TRANSPORT:
        assert {(1, 1), (16, 2)} <= set().union(*want["all_reduce"].values())  # what the test means


# ------------------------------------------------------------------ a dead rank


@pytest.mark.skipif(not RINGPG, reason="ringpg-specific fault handling")
@pytest.mark.parametrize(
    "key,victim,how,op",
    [
        ("hosts3x2", 1, "sigkill", "all_reduce"),
        ("hosts2x3", 4, "exit", "reduce_scatter_tensor"),
    ],
    ids=["3x2-all_reduce", "2x3-reduce_scatter"],
)
@pytest.mark.timeout(120)
def test_killed_rank_mid_hierarchical_collective(tmp_path: Any, key: str, victim: int, how: str, op: str) -> None:
    """A rank dies while the others are inside a hierarchical collective: every survivor
    (on its host's ring, on its cross-host ring, or on neither with the victim) raises a
    typed error naming the op within seconds, and later ops fail at once."""
    stamp = str(tmp_path / "died")
    res = run_scenario(
        die_mid_collective,
        WS,
        (victim, how, stamp, op),
        expect=set(range(WS)) - {victim},
        env={EMULATED_HOSTS_ENV: EMULATED_LAYOUTS[key], TUNING: f"hier_piece_bytes={PIECE_BYTES}"},
    )
    assert {r: v.get("algorithm") for r, v in res.items()} == {r: "hier" for r in res}, res
    assert_survivors_raised_fast(res, stamp, op, transport_expected(key, WS))


# ------------------------------------------------------------------ a frozen rank, a timeout, abort()
#
# During a two-thread op (issue 31 item 2): 2 hosts x 2 ranks, a 4 MiB allreduce in 16
# pieces, so every rank waits on both threads when the fault comes.

FAULT_WS = 4
FAULT_NUMEL = 1 << 20
FAULT_TIMEOUT_S = 3.0
FAULT_ABORT_AFTER_S = 0.5  # rank 0's abort(), into the op
# What a failure may take past its cause: measured 0.00-0.01 s here (the flight
# recorder's dump, which the failed op's error waits for, without stack traces as
# conftest sets); a loaded 2-core machine gets the rest.
FAULT_GRACE_S = 2.5


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _two_thread_fault(rank: int, ws: int, port: int, args: Any) -> dict:
    """``frozen``: rank ws-1 stops (SIGSTOP) before the op, the others time out.
    ``abort``: rank ws-1 joins 1 s late; meanwhile rank 0's abort() (from another
    thread) ends the op the others are inside.  Returns what each surviving rank saw,
    its get_error() kind and its threads before and after (the op's second thread and,
    after abort(), the group's threads must be gone)."""
    import threading
    import time

    import ringpg

    how, timeout_s = args
    init_ringpg(rank, ws, port, timeout_s=timeout_s)
    b = ringpg.backend()
    side = dist.new_group(backend="gloo")
    x = torch.ones(FAULT_NUMEL)
    dist.all_reduce(x)  # healthy once: the second thread came and went
    out: dict[str, Any] = {"algorithm": b.allreduce_algorithm, "threads_before": _threads()}
    dist.barrier(group=side)
    if how == "frozen" and rank == ws - 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    if how == "abort" and rank == ws - 1:
        time.sleep(1.0)
    timer = threading.Timer(FAULT_ABORT_AFTER_S, b.abort) if how == "abort" and rank == 0 else None
    if timer:
        timer.start()
    out["type"], out["msg"], out["took"] = expect_error(lambda: dist.all_reduce(x))
    if timer:
        timer.join()
    out["threads_after"] = _threads()
    out["error"] = harness.cpu_backend(dist.group.WORLD).get_error().name if ringpg.features()["get_error"] else ""
    return out


@pytest.mark.skipif(not RINGPG, reason="ringpg-specific fault handling")
# Each transport once (all four pairs pass; two keep the suite's time): the frozen rank
# over all-TCP, abort() where the host rings wait on shared memory.
@pytest.mark.parametrize("how,transport", [("frozen", "tcp"), ("abort", "shm")])
@pytest.mark.timeout(120)
def test_fault_during_a_two_thread_op(how: str, transport: str) -> None:
    env = merged_env({EMULATED_HOSTS_ENV: "2", TUNING: f"hier_piece_bytes={PIECE_BYTES}"}, TRANSPORT_ENVS[transport])
    assert hier_pieces(FAULT_NUMEL * 4, FAULT_NUMEL, int(PIECE_BYTES)) == (16, 2)  # what the test means
    timeout_s = FAULT_TIMEOUT_S if how == "frozen" else 60.0
    expect = set(range(FAULT_WS - 1)) if how == "frozen" else set(range(FAULT_WS))
    res = run_scenario(_two_thread_fault, FAULT_WS, (how, timeout_s), expect=expect, env=env)
    errors = {r: v["error"] for r, v in res.items()}
    for r, v in res.items():
        assert v["algorithm"] == "hier", v
        assert v["type"] in ("DistBackendError", "DistNetworkError"), (r, v)
        assert "ringpg::all_reduce" in v["msg"], v["msg"]
        assert v["threads_after"] <= v["threads_before"], (r, v)  # nothing left running
        if how == "frozen":
            # The rank waiting on the frozen one times out; the others may learn it from its abort.
            assert re.search(r"Timed out waiting for rank \d+ after 3000 ms ", v["msg"]) or "aborted" in v["msg"], v
            assert FAULT_TIMEOUT_S - 0.5 < v["took"] < FAULT_TIMEOUT_S + FAULT_GRACE_S, (r, v)
        else:
            assert v["took"] < FAULT_ABORT_AFTER_S + FAULT_GRACE_S, (r, v)  # abort(), not the 60 s timeout
    if not any(errors.values()):
        return  # a torch without get_error
    if how == "frozen":
        assert "TIMEOUT" in errors.values() and set(errors.values()) <= {"TIMEOUT", "REMOTE_ERROR"}, errors
    else:
        assert errors[0] == "COMM_ERROR", errors
        assert set(errors.values()) <= {"COMM_ERROR", "REMOTE_ERROR"}, errors
