"""ringpg's transports, each compared with gloo in the same processes, and the CPU count
that decides whether their waits spin.

Every rank of the test suite runs on one host, so ringpg's ring moves through shared
memory by default (csrc/transport/shm.h); ``RINGPG_TRANSPORT=tcp`` keeps it on its own
TCP sockets, the path ranks on different hosts take, and ``RINGPG_TRANSPORT=gloo`` on
Gloo's TCP pairs (csrc/transport/gloo_link.h); emulated hosts (``mixed``) put shared
memory within a host and TCP between hosts.  All run here at world sizes 2 to 4, and
the shared-memory ring also with ``segment_bytes=65536`` (64 KiB slots), so
that segments, whole-buffer messages of the direct algorithms and the one-shot
allreduce all span several slot fragments and wrap the slot ring many times.  Both
transports also run with a long ``spin_us``, so that waits end while their
thread polls (over TCP the waiting thread then reads its peer's socket itself, beside
the engine's progress thread; over shared memory ws 3 and 4 spin on more ranks than
this machine may have cores); the TCP one with ``tcp_congestion=reno`` too.

Each configuration checks which transport the group really uses, which congestion
control its sockets run, that no named shared-memory region is left behind once the
group is up, and every collective that sends to a ring neighbour, on sizes around the
slot and chunk boundaries.  Over TCP, the batteries that otherwise run only on shared
memory run as well: reduce to every root, all_reduce and reduce_scatter_tensor under
SUM/AVG/MIN/MAX/PRODUCT, PREMUL_SUM, BAND/BOR/BXOR, list all_gather and the coalesced
APIs (harness.batteries, the workers of test_collectives.py and
test_reduce_ops_and_dtypes.py).  Data are small integers, so results are exact in
every dtype (``torch.equal``).

How ringpg counts the CPUs it may use (csrc/common/host.h) decides whether waits spin
by default (``spin_us=auto``; the decision itself is checked per configuration
above).  A container's CPU limit is usually a CFS quota rather than a cpuset, so the
affinity mask alone overstates it: cgroup v2 writes the limit as ``cpu.max`` = "QUOTA
PERIOD" (or "max PERIOD" without a limit), and a limit of 1.5 CPUs must count as 2.  A
limit binds every cgroup below it, so the quota is looked up along the process's cgroup
path (from /proc/self/cgroup) up to the hierarchy's root; the lookups here run on real
directory trees laid out as cgroupfs lays them out.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import pytest
import torch
import torch.distributed as dist
from harness import (
    EMULATED_HOSTS_ENV,
    EMULATED_LAYOUTS,
    REFUSE_CMA_ENV,
    TRANSPORT_ENVS,
    Checker,
    CheckReport,
    Groups,
    InitSpec,
    TaskFn,
    WorkerPool,
    assert_reports_ok,
    backend_under_test,
    data_kind,
    default_tcp_congestion,
    dtype_name,
    emulated_host,
    emulated_topology,
    hierarchical_expected,
    known_gap,
    make_data,
    reduce_op,
    ref_all_gather,
    ref_all_reduce,
    ref_all_reduce_many,
    ref_broadcast,
    ref_reduce_scatter_many,
    run_workers,
    sentinel_like,
    skip_case,
    spin_yields_of,
    transport_expected,
    transport_of,
    wait_spin_of,
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
from harness.transports import on_transports, transport_worker

from devkit.settings import merged_env, tuning, tuning_value

try:  # the CPU-count tests need the built extension; the transports' run on gloo without it
    import ringpg._C as _C
except ModuleNotFoundError:
    _C = None

needs_C = pytest.mark.skipif(_C is None, reason="could not import 'ringpg._C'")


# ============================================= every configuration, world sizes 2 to 4

SMALL_SLOT = 65536
# A spin longer than a small op, so that many waits end while their thread still polls
# (over TCP: the waiting thread reads its peer's socket itself, alongside the engine's).
SPIN = "500"
# (name, environment, expected transport)
CONFIGS = [
    ("shm", TRANSPORT_ENVS["shm"], "shm"),
    ("tcp", TRANSPORT_ENVS["tcp"], "tcp"),
    ("gloo", TRANSPORT_ENVS["gloo"], "gloo"),
    ("mixed", TRANSPORT_ENVS["mixed"], "mixed"),
    # The same emulated hosts with the flat ring forced (at ws 4 auto runs the
    # hierarchical allreduce: host rings, then rings across hosts).
    ("mixed-flat", (*TRANSPORT_ENVS["mixed"], ("RINGPG_ALGO", "ring")), "mixed"),
    # Two ranks per emulated host, numbered as torchrun does (0, 1 on one host): the
    # hierarchical reduce-scatter and all-gather lay chunks out in another order.
    ("mixed-block", ((EMULATED_HOSTS_ENV, EMULATED_LAYOUTS["mixed-block"]),), "mixed-block"),
    # ...and reduce-scatter's partial sums in a buffer of their own per op past 4 KiB
    # (the kept workspace is what every other configuration runs); every message
    # through the slots (two copies), as where single copy is off.
    (
        "shm-64k-slots",
        (tuning(segment_bytes=SMALL_SLOT, work_cache_bytes=4096), ("RINGPG_CMA_BYTES", "0")),
        "shm",
    ),
    # Single copy from 4 KiB, so most messages of the battery go straight from the
    # sender's buffer, into the receiver's or through its reducing stage (the default
    # "shm" runs single copy from 64 KiB).
    ("shm-spin-cma-4k", (tuning(spin_us=SPIN), ("RINGPG_CMA_BYTES", "4096")), "shm"),
    # reno: the one congestion control every Linux kernel has and lets anyone choose.
    (
        "tcp-spin-reno",
        (("RINGPG_TRANSPORT", "tcp"), tuning(spin_us=SPIN, tcp_congestion="reno")),
        "tcp",
    ),
    # The portable kernels pinned: every reduction below through the plain copy; and
    # single copy from 4 KiB asked for, but the kernel refuses rank 1 reads of rank 0's
    # memory, so the whole group agrees on the slots.
    (
        "shm-baseline-kernels-cma-refused",
        (tuning(reduce_isa="baseline"), (REFUSE_CMA_ENV, "1"), ("RINGPG_CMA_BYTES", "4096")),
        "shm",
    ),
]
AUTO_SHM_SPIN_US = 100  # Config::kAutoShmSpinMicros


def expected_spin(env: tuple[tuple[str, str], ...], transport: str, ws: int, rank: int) -> tuple[int, bool]:
    """The documented rule for tuning key spin_us (docs/configuration.md): (microseconds,
    whether the spin yields).  A set value everywhere; auto spins on ranks with a
    shared-memory link, TCP waits not at all; a shared-memory spin yields where its
    host's ranks outnumber this process's CPUs."""
    given = tuning_value("spin_us", merged_env(os.environ, env))
    local = ws
    layout = dict(env).get(EMULATED_HOSTS_ENV)
    if layout:  # emulated hosts: the ranks of this rank's
        local = len([q for q in range(ws) if emulated_host(layout, q) == emulated_host(layout, rank)])
    shm = transport not in ("tcp", "gloo") and local > 1  # a shared-memory link on this rank
    import ringpg._C  # affinity mask lowered by a CFS quota (the CPU-count tests below)

    yields = shm and local > ringpg._C.usable_cpus()
    if given != "auto":
        return int(given), yields
    return (AUTO_SHM_SPIN_US if shm else 0), yields


DTYPES = (torch.float32, torch.bfloat16, torch.int32, torch.int8)
REDUCE_OPS = ("SUM", "AVG", "MAX")


def numels(ws: int, dtype: torch.dtype) -> list[int]:
    """Around the edges: empty, fewer than ws, one slot of 64 KiB +- 1, many slots."""
    per_slot = SMALL_SLOT // dtype.itemsize
    return [0, 1, ws - 1, 1000, per_slot - 1, per_slot * ws + 1, 5 * per_slot * ws + 7]


ON_WS_2_TO_4 = pytest.mark.parametrize("world_size", [2, 3, 4], ids=lambda ws: f"ws{ws}", scope="module")
ON_CONFIGS = pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c[0], scope="module")


@pytest.fixture(scope="module")
def tpool(world_size: int, config: tuple[str, tuple[tuple[str, str], ...], str]) -> Iterator[WorkerPool]:
    p = WorkerPool(world_size, InitSpec(env=config[1]))
    yield p
    p.close()


def transport_state_worker(rank: int, ws: int, groups: Groups, args: Any) -> dict[str, Any]:
    prefix = f"ringpg-{os.getpid()}-"
    leftover = [n for n in os.listdir("/dev/shm") if n.startswith(prefix)] if os.path.isdir("/dev/shm") else []
    import ringpg
    import ringpg._C

    b = ringpg.backend(groups.test)
    return {
        "transport": transport_of(groups.test),
        "leftover": leftover,
        "spin": wait_spin_of(groups.test),
        "yields": spin_yields_of(groups.test),
        "isa": ringpg._C.reduce_isa(),
        "isas": ringpg._C.reduce_isas(),
        "cc": b.tcp_congestion if b is not None else None,
        "host_cc": default_tcp_congestion(),
        "allreduce": b.allreduce_algorithm if b is not None else None,
        "copy": b.same_host_copy if b is not None else None,
        "copy_probe": b.same_host_copy_probe if b is not None else None,
        "hosts": (b.hosts, b.ranks_per_host, b.ring_order) if b is not None else None,
    }


def check_reductions(
    chk: Checker, rank: int, ws: int, groups: Groups, dtype: torch.dtype, ns: Sequence[int], ops: tuple[str, ...]
) -> None:
    """all_reduce of each of ``ns`` elements and reduce_scatter_tensor to as many per rank
    under each of ``ops`` (gloo's gaps skipped), against gloo on the same inputs (one gloo
    call an op for every size: its latency, not the data, is the cost)."""
    g, ref = groups.test, groups.ref
    tags = [f"dtype={dtype_name(dtype)} ws={ws} numel={n}" for n in ns]
    for op in ops:
        if skip_case(groups.backend, op, dtype):
            continue
        cases = [f"all_reduce op={op} {tag}" for tag in tags]
        xs = [make_data(rank, case, (n,), dtype, data_kind(op)) for case, n in zip(cases, ns)]
        for case, x, want in zip(cases, xs, ref_all_reduce_many(xs, op, ref)):
            got = x.clone()
            dist.all_reduce(got, op=reduce_op(op), group=g)
            chk.equal(case, got, want)

        cases = [f"reduce_scatter_tensor op={op} {tag}" for tag in tags]
        xs = [make_data(rank, case, (n * ws,), dtype, data_kind(op)) for case, n in zip(cases, ns)]
        for case, n, x, want in zip(cases, ns, xs, ref_reduce_scatter_many(xs, op, ref)):
            out = sentinel_like((n,), dtype)
            dist.reduce_scatter_tensor(out, x.clone(), op=reduce_op(op), group=g)
            chk.equal(case, out, want)


def collectives_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    chk = Checker(rank)
    g, ref = groups.test, groups.ref
    for dtype in DTYPES:
        check_reductions(chk, rank, ws, groups, dtype, numels(ws, dtype), REDUCE_OPS)
        for n in numels(ws, dtype):
            tag = f"dtype={dtype_name(dtype)} ws={ws} numel={n}"

            case = f"all_gather_into_tensor {tag}"
            x = make_data(rank, case, (n,), dtype)
            out = sentinel_like((n * ws,), dtype)
            dist.all_gather_into_tensor(out, x, group=g)
            chk.equal(case, out, ref_all_gather(x, ref))

            src = (n + 1) % ws
            case = f"broadcast src={src} {tag}"
            x = make_data(rank, case, (n,), dtype)
            got = x.clone()
            dist.broadcast(got, src=src, group=g)
            chk.equal(case, got, ref_broadcast(x, src, ref))

            case = f"all_to_all_single {tag}"
            x = make_data(rank, case, (n * ws,), dtype)
            got = sentinel_like((n * ws,), dtype)
            expected = sentinel_like((n * ws,), dtype)
            dist.all_to_all_single(got, x, group=g)
            dist.all_to_all_single(expected, x, group=ref)
            chk.equal(case, got, expected)

        # Async ops waited on at once, which the waiting thread may run itself, and the
        # second of two waited on first, which must wait its turn.
        n = numels(ws, dtype)[-1]
        tag = f"dtype={dtype_name(dtype)} ws={ws} numel={n}"
        a, b = (make_data(rank, f"async waited at once {i} {tag}", (n,), dtype) for i in (0, 1))
        ya, yb = a.clone(), b.clone()
        dist.all_reduce(ya, group=g, async_op=True).wait()
        chk.equal(f"all_reduce async waited at once {tag}", ya, ref_all_reduce(a, "SUM", ref))
        ya = a.clone()
        wa = dist.all_reduce(ya, group=g, async_op=True)
        dist.all_reduce(yb, op=dist.ReduceOp.MAX, group=g, async_op=True).wait()
        wa.wait()
        chk.equal(f"all_reduce async, first of two waited second {tag}", ya, ref_all_reduce(a, "SUM", ref))
        chk.equal(f"all_reduce async, second of two waited first {tag}", yb, ref_all_reduce(b, "MAX", ref))
    return chk.report()


@pytest.mark.multiprocess
@ON_CONFIGS
@ON_WS_2_TO_4
def test_transport_in_use(tpool: WorkerPool, config: tuple[str, Any, str], world_size: int) -> None:
    """The group runs on the transport its configuration asks for, waits spin as the
    README says, its data sockets run the congestion control asked for (else the
    host's), and the group leaves no names in /dev/shm."""
    results = tpool.run(transport_state_worker)
    if backend_under_test() == "ringpg":
        layout = dict(config[1]).get(EMULATED_HOSTS_ENV)
        transport = transport_expected(config[2], world_size) if layout else config[2]
        assert [r["transport"] for r in results] == [transport] * len(results)
        spin = [expected_spin(config[1], transport, world_size, r) for r in range(world_size)]
        assert [(r["spin"], r["yields"]) for r in results] == spin
        run_env = merged_env(os.environ, config[1])
        isa = tuning_value("reduce_isa", run_env)
        isa = results[0]["isas"][0] if isa == "auto" else isa  # pinned, else the best
        assert [r["isa"] for r in results] == [isa] * len(results)
        chosen = tuning_value("tcp_congestion", run_env)
        cc = results[0]["host_cc"] if chosen == "default" else chosen
        assert [r["cc"] for r in results] == [cc] * len(results)
        # Emulated hosts: the ring runs host by host, and the large collectives are
        # hierarchical where several hosts hold two ranks each, unless forced flat.
        if layout:
            members = range(world_size)
            assert [r["hosts"] for r in results] == [emulated_topology(layout, members)] * world_size
            hier = hierarchical_expected(layout, members, dict(config[1]).get("RINGPG_ALGO", "auto"))
            assert [r["allreduce"] for r in results] == ["hier" if hier else "ring"] * world_size
        else:
            # One host: the host arena from three ranks on (at two the links' exchange),
            # unless the links were asked for.
            algo = dict(config[1]).get("RINGPG_ALGO", "auto")
            arena = transport == "shm" and world_size > 2 and algo in ("auto", "arena")
            assert [r["allreduce"] for r in results] == ["arena" if arena else "ring"] * world_size
        assert_copy_as_documented(config[1], transport, results)
    assert all(not r["leftover"] for r in results), results


# Single copy is kept for a size class only where it measured this much faster than
# the slots (docs/configuration.md, RINGPG_CMA_BYTES: "a clear win").
CLEAR_WIN = 0.9


def documented_copy(probe: dict[str, float]) -> str:
    """``same_host_copy`` as docs/configuration.md derives it from ``same_host_copy_probe``:
    each size class (buffers in the caches, buffers cold) single copy on a clear win, the
    two joined by "+" where they differ."""
    classes = [
        "cma" if probe[cma] < CLEAR_WIN * probe[slots] else "slots"
        for cma, slots in (("cma_us", "slots_us"), ("cold_cma_us", "cold_slots_us"))
    ]
    return classes[0] if classes[0] == classes[1] else "+".join(classes)


def same_host_links_expected(settings: dict[str, str], ws: int, layout: Optional[str]) -> bool:
    """Whether a group maps its same-host links (docs/internals.md, "The plan of an op"):
    not on one host from three ranks, where the host arena runs every collective (the
    algorithm and all-to-all left to the plan, an arena made)."""
    env = merged_env(os.environ, settings)
    arena_runs_all = (
        layout is None
        and ws >= 3
        and env.get("RINGPG_ALGO", "auto") in ("auto", "arena")
        and tuning_value("alltoall", env) == "auto"
        and env.get("RINGPG_ARENA_BYTES", "") != "0"
    )
    return not arena_runs_all


def assert_copy_as_documented(env: tuple[tuple[str, str], ...], transport: str, results: list[dict[str, Any]]) -> None:
    """The documented rule for ``same_host_copy`` (docs/configuration.md, RINGPG_CMA_BYTES),
    checked on every rank's ``transport_state_worker`` result: none on a rank without a
    shared-memory link; the slots where RINGPG_CMA_BYTES=0 or the kernel refuses a read;
    single copy where RINGPG_CMA_BYTES is set; unset, each size class as the group
    measured it, the measurement the same on every rank that has a link."""
    settings = dict(env)
    ws = len(results)
    layout = settings.get(EMULATED_HOSTS_ENV)
    host = [emulated_host(layout, r) if layout else 0 for r in range(ws)]
    links = same_host_links_expected(settings, ws, layout)
    shared = [links and transport not in ("tcp", "gloo") and host.count(host[r]) > 1 for r in range(ws)]
    copies = [r["copy"] for r in results]
    probes = [r["copy_probe"] for r in results]
    if settings.get("RINGPG_CMA_BYTES") == "0" or settings.get(REFUSE_CMA_ENV) == "1":
        want, measured = "slots", False
    elif "RINGPG_CMA_BYTES" in settings:
        want, measured = "cma", False
    else:
        linked = [p for p, s in zip(probes, shared) if s]
        measured = any(shared)
        assert all(p == linked[0] for p in linked), probes
        p = linked[0] if linked else None
        assert p is not None or not measured, probes
        want = documented_copy(p) if p is not None else "slots"
        if p is not None:
            assert all(v > 0 for v in p.values()), p
            # Cold: what a two-rank op of the streaming class's smallest size sends a step.
            assert p["cold_bytes"] == max(p["bytes"], _C.streaming_op_bytes() // 2), p
    assert copies == [want if s else "" for s in shared], (copies, probes)
    assert [p is not None for p in probes] == [measured and s for s in shared], probes


@pytest.mark.multiprocess
@ON_CONFIGS
@ON_WS_2_TO_4
def test_collectives_match_gloo(tpool: WorkerPool) -> None:
    assert_reports_ok(tpool.run(collectives_worker, timeout=240))


# ============================================= a ring of two's large reduce steps

# A ring of two lends its reduce steps once the op moves this much (algorithms/ring.cpp,
# kLentReduceFrom): the receiver reduces them in pieces read straight from the sender's
# memory (ShmLink::readLeftInto), which the battery's sizes above never reach.
LENT_REDUCE_BYTES = 4 << 20
# (id, world size, environment): single copy; the kernel refusing it (the slots); and
# emulated hosts of two ranks each, whose hierarchical collectives run host rings of two
# on pieces below that size (tuning key hier_piece_bytes), so their reduce steps stay copied.
LARGE_REDUCE_CONFIGS = [
    ("cma", 2, (*TRANSPORT_ENVS["shm"], ("RINGPG_CMA_BYTES", "65536"))),
    ("cma-refused", 2, (*TRANSPORT_ENVS["shm"], (REFUSE_CMA_ENV, "1"))),
    ("mixed-block", 4, ((EMULATED_HOSTS_ENV, EMULATED_LAYOUTS["mixed-block"]),)),
]


def large_reduce_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """all_reduce and reduce_scatter_tensor past LENT_REDUCE_BYTES, in odd sizes (a short
    last segment and a short last piece), against gloo; and which copy the group uses."""
    chk = Checker(rank)
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        check_reductions(chk, rank, ws, groups, dtype, [LENT_REDUCE_BYTES // dtype.itemsize + 7], ("SUM", "MAX"))
    return chk.report()


@pytest.mark.multiprocess
@pytest.mark.parametrize("config", LARGE_REDUCE_CONFIGS, ids=lambda c: c[0])
def test_large_reduce_steps_match_gloo_with_and_without_single_copy(config: tuple[str, int, Any]) -> None:
    """A ring of two's reduce steps of a large op go by single copy where the kernel
    allows it (read and reduced in pieces) and through the slots where it refuses;
    both give gloo's results, and the group reports which it used."""
    _, ws, env = config
    pool = WorkerPool(ws, InitSpec(env=env))
    try:
        if backend_under_test() == "ringpg":
            assert_copy_as_documented(env, "shm", pool.run(transport_state_worker))
        assert_reports_ok(pool.run(large_reduce_worker, timeout=240))
    finally:
        pool.close()


# ============================================= single copy by the op's size class

# (id, environment): the group's measurement (each size class as measured, small ops
# below streaming_op_bytes()); and tuning key cma_op_bytes, which lends from the size it
# names and measures nothing.
SIZE_CLASS_CONFIGS = [
    ("measured", TRANSPORT_ENVS["shm"]),
    ("cma_op_bytes", (tuning(cma_op_bytes=2 << 20),)),
]


def size_class_worker(rank: int, ws: int, groups: Groups, args: Any) -> dict[str, Any]:
    """all_gather_into_tensor and all_reduce on both sides of the size-class boundary
    (``args``: the op bytes from which the second class applies), each against gloo; per
    op, how many messages this rank lent (single copy) while it ran."""
    import ringpg

    chk = Checker(rank)
    g, ref = groups.test, groups.ref
    b = ringpg.backend(g)
    lent: dict[str, int] = {}
    for nbytes in (args // 2, args):
        n = nbytes // 4
        case = f"all_gather_into_tensor float32 output_bytes={nbytes}"
        x = make_data(rank, case, (n // ws,), torch.float32)
        out = sentinel_like((n // ws * ws,), torch.float32)
        before = b.same_host_lent
        dist.all_gather_into_tensor(out, x, group=g)
        lent[case] = b.same_host_lent - before
        chk.equal(case, out, ref_all_gather(x, ref))
        case = f"all_reduce float32 bytes={nbytes}"
        x = make_data(rank, case, (n,), torch.float32)
        got = x.clone()
        before = b.same_host_lent
        dist.all_reduce(got, group=g)
        lent[case] = b.same_host_lent - before
        chk.equal(case, got, ref_all_reduce(x, "SUM", ref))
    return {"report": chk.report(), "lent": lent, "copy": b.same_host_copy}


@pytest.mark.multiprocess
@pytest.mark.parametrize("config", SIZE_CLASS_CONFIGS, ids=lambda c: c[0])
def test_single_copy_follows_the_size_class_of_the_op(config: tuple[str, Any]) -> None:
    """Two ranks: an op lends its same-host messages exactly where its size class says
    (``same_host_copy``: below the boundary, then from it), and every op matches gloo."""
    if backend_under_test() != "ringpg":
        pytest.skip("ringpg's own copy choice")
    name, env = config
    boundary = 2 << 20 if name == "cma_op_bytes" else _C.streaming_op_bytes()
    results = run_workers(size_class_worker, 2, boundary, InitSpec(env=env), timeout=240)
    assert_reports_ok([r["report"] for r in results])
    copy = results[0]["copy"]
    assert [r["copy"] for r in results] == [copy] * 2
    if name == "cma_op_bytes":
        assert copy == "slots+cma"
    classes = copy.split("+") * (2 if "+" not in copy else 1)
    for r in results:
        for case, count in r["lent"].items():
            big = int(case.rsplit("=", 1)[1]) >= boundary
            assert (count > 0) == (classes[big] == "cma"), (case, count, copy)


def use_copy_worker(rank: int, ws: int, groups: Groups, args: Any) -> dict[str, Any]:
    """A group under each ringpg.use_copy choice: what it reports, and whether a 1 MiB
    all-gather (512 KiB messages) lent any, its result against gloo."""
    import ringpg

    chk = Checker(rank)
    out: dict[str, Any] = {}
    for choice in ("cma", "slots", "auto"):
        with ringpg.use_copy(choice):
            g = dist.new_group(backend="ringpg")
        b = ringpg.backend(g)
        case = f"all_gather_into_tensor float32 copy={choice}"
        x = make_data(rank, case, ((1 << 18) // ws,), torch.float32)
        got = sentinel_like((x.numel() * ws,), torch.float32)
        before = b.same_host_lent
        dist.all_gather_into_tensor(got, x, group=g)
        out[choice] = (b.same_host_copy, b.same_host_lent - before)
        out[f"{choice}_probe"] = b.same_host_copy_probe
        chk.equal(case, got, ref_all_gather(x, groups.ref))
        dist.destroy_process_group(g)
    out["report"] = chk.report()
    return out


@pytest.mark.multiprocess
def test_use_copy_picks_a_groups_same_host_copy() -> None:
    """ringpg.use_copy: "cma" lends every op's large messages, "slots" none, both without a
    measurement; "auto" does what its own group measured (the documented rule on its
    probe: two groups' measurements may differ, so not another group's choice); each
    matches gloo."""
    if backend_under_test() != "ringpg":
        pytest.skip("ringpg's own copy choice")
    results = run_workers(use_copy_worker, 2, None, InitSpec(env=TRANSPORT_ENVS["shm"]), timeout=240)
    assert_reports_ok([r["report"] for r in results])
    for r in results:
        assert r["cma"][0] == "cma" and r["cma"][1] > 0, r
        assert r["slots"] == ("slots", 0), r
        assert not r["cma_probe"] and not r["slots_probe"], r
        probe = r["auto_probe"]
        assert probe, r
        assert r["auto"][0] == documented_copy(probe), r
        # 512 KiB messages of a 1 MiB op: the first (cached) size class decides.
        assert (r["auto"][1] > 0) == (r["auto"][0].split("+")[0] == "cma"), r


# ============================================= two ranks' all-gather as a pair

# (id, environment, what a two-rank group runs for an all-gather past the arena's volume):
# single copy for every op, so one message each way, read straight from the peer's tensor
# (algorithms/direct.h, pairAllGather); the kernel refusing single copy, and the flat ring
# asked for: the ring, with the same results.
PAIR_CONFIGS = [
    ("cma", (*TRANSPORT_ENVS["shm"], ("RINGPG_CMA_BYTES", "4096")), "pair"),
    ("cma-refused", (*TRANSPORT_ENVS["shm"], ("RINGPG_CMA_BYTES", "4096"), (REFUSE_CMA_ENV, "1")), "ring"),
    ("ring", (("RINGPG_CMA_BYTES", "4096"), ("RINGPG_ALGO", "ring")), "ring"),
]


def pair_worker(rank: int, ws: int, groups: Groups, args: Any) -> dict[str, Any]:
    """all_gather_into_tensor (out of place, in place, async) and all_gather into a list,
    odd sizes past the arena's volume in three dtypes, against gloo; what the group says
    it runs, and how many messages each out-of-place op lent."""
    import ringpg

    chk = Checker(rank)
    g, ref = groups.test, groups.ref
    b = ringpg.backend(g)
    lent: list[int] = []
    copied: list[int] = []  # the same, for outputs a pair copies through the slots (pair_copied_most_bytes)
    for dtype in (torch.float32, torch.bfloat16, torch.int8):
        small = _C.pair_copied_most_bytes() // (2 * dtype.itemsize) - 5  # past the arena's band, copied
        for n in (small, 40001, (1 << 19) // dtype.itemsize + 3):
            tag = f"dtype={dtype_name(dtype)} numel={n}"
            case = f"all_gather_into_tensor {tag}"
            x = make_data(rank, case, (n,), dtype)
            out = sentinel_like((n * ws,), dtype)
            before = b.same_host_lent
            dist.all_gather_into_tensor(out, x, group=g)
            (copied if n == small else lent).append(b.same_host_lent - before)
            chk.equal(case, out, ref_all_gather(x, ref))

            case = f"all_gather_into_tensor in place {tag}"
            x = make_data(rank, case, (n,), dtype)
            out = sentinel_like((n * ws,), dtype)
            out.narrow(0, rank * n, n).copy_(x)
            dist.all_gather_into_tensor(out, out.narrow(0, rank * n, n), group=g)
            chk.equal(case, out, ref_all_gather(x, ref))

            case = f"all_gather_into_tensor async {tag}"
            x = make_data(rank, case, (n,), dtype)
            out = sentinel_like((n * ws,), dtype)
            dist.all_gather_into_tensor(out, x, group=g, async_op=True).wait()
            chk.equal(case, out, ref_all_gather(x, ref))

            case = f"all_gather {tag}"
            outs = [sentinel_like((n,), dtype) for _ in range(ws)]
            dist.all_gather(outs, x, group=g)
            chk.equal(case, torch.cat(outs), ref_all_gather(x, ref))
    algos = {b.algorithm_for("all_gather", nbytes) for nbytes in (1 << 20, 1 << 26)}
    copied_algo = b.algorithm_for("all_gather", _C.pair_copied_most_bytes())
    return {
        "report": chk.report(),
        "algos": algos,
        "small": b.algorithm_for("all_gather", 1 << 17),
        "lent": lent,
        "copied": copied,
        "copied_algo": copied_algo,
    }


@pytest.mark.multiprocess
@pytest.mark.parametrize("config", PAIR_CONFIGS, ids=lambda c: c[0])
def test_two_ranks_all_gather_as_a_pair_matches_gloo(config: tuple[str, Any, str]) -> None:
    """Where both ranks lend, a two-rank all-gather is one message each way (the group
    says ``pair`` and lends exactly one message an op); where the kernel refuses single
    copy or the ring is asked for, the ring runs (or, single copy refused, the arena up to
    its two-rank reach); every form matches gloo."""
    name, env, want = config
    results = run_workers(pair_worker, 2, None, InitSpec(env=env), timeout=240)
    assert_reports_ok([r["report"] for r in results])
    if backend_under_test() != "ringpg":
        return
    # Past the arena's two-rank reach (arena_pair_all_gather_bytes) the pair or the ring;
    # below it, where single copy is refused, the arena's one round instead of the ring.
    small = "arena" if name == "cma-refused" else want
    assert (1 << 17) <= _C.arena_pair_all_gather_bytes() < (1 << 20)
    for r in results:
        assert r["algos"] == {want}, (name, r["algos"])
        assert r["small"] == small, (name, r["small"])
        # Past the arena's two-rank band and small enough to copy: a pair that lends nothing.
        if name != "ring":
            assert r["copied_algo"] == "pair" and not any(r["copied"]), (name, r["copied_algo"], r["copied"])
        if want == "pair":
            assert r["lent"] == [1] * len(r["lent"]), r["lent"]
        elif name == "cma-refused":
            assert not any(r["lent"]), r["lent"]
        else:
            assert all(r["lent"]), r["lent"]


# ============================================= two ranks' reduce-scatter as a pair

# (id, environment, what a two-rank group runs for a reduce-scatter past the arena's
# two-rank band and below lent_reduce_from): one message each way, copied through the slots and
# reduced straight out of them (algorithms/direct.h, pairReduceScatter), whatever the copy;
# the flat ring asked for: the ring, with the same results.
PAIR_RS_CONFIGS = [
    ("shm", TRANSPORT_ENVS["shm"], "pair"),
    ("cma", (*TRANSPORT_ENVS["shm"], ("RINGPG_CMA_BYTES", "4096")), "pair"),
    ("ring", (*TRANSPORT_ENVS["shm"], ("RINGPG_ALGO", "ring")), "ring"),
]


def pair_reduce_scatter_worker(rank: int, ws: int, groups: Groups, args: Any) -> dict[str, Any]:
    """reduce_scatter_tensor out of place, in place (the output this rank's chunk of the
    input), into the peer's chunk of the input (the output overlaps the input elsewhere),
    async, and reduce_scatter from a list; odd chunks past the arena's volume in three
    dtypes and three ops, against gloo; what the group says it runs."""
    import ringpg

    chk = Checker(rank)
    g, ref = groups.test, groups.ref
    peer = 1 - rank
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        for name in ("SUM", "MAX", "AVG") if dtype.is_floating_point else ("SUM", "MIN"):
            op = reduce_op(name)
            for n in (_C.arena_pair_bytes() // (2 * dtype.itemsize) + 7, 40001, (1 << 20) // dtype.itemsize + 3):
                tag = f"dtype={dtype_name(dtype)} op={name} chunk={n}"
                case = f"reduce_scatter_tensor {tag}"
                x = make_data(rank, case, (n * ws,), dtype)
                want = ref_reduce_scatter_many([x], name, ref)[0]
                out = sentinel_like((n,), dtype)
                dist.reduce_scatter_tensor(out, x, op=op, group=g)
                chk.equal(case, out, want)
                chk.equal(f"{case}: input untouched", x, make_data(rank, case, (n * ws,), dtype))

                for where, at in (("in place", rank), ("into the peer's chunk", peer)):
                    case = f"reduce_scatter_tensor {where} {tag}"
                    x = make_data(rank, case, (n * ws,), dtype)
                    want = ref_reduce_scatter_many([x], name, ref)[0]
                    dist.reduce_scatter_tensor(x.narrow(0, at * n, n), x, op=op, group=g)
                    chk.equal(case, x.narrow(0, at * n, n), want)

                case = f"reduce_scatter_tensor async {tag}"
                x = make_data(rank, case, (n * ws,), dtype)
                want = ref_reduce_scatter_many([x], name, ref)[0]
                out = sentinel_like((n,), dtype)
                dist.reduce_scatter_tensor(out, x, op=op, group=g, async_op=True).wait()
                chk.equal(case, out, want)

                case = f"reduce_scatter {tag}"
                x = make_data(rank, case, (n * ws,), dtype)
                want = ref_reduce_scatter_many([x], name, ref)[0]
                out = sentinel_like((n,), dtype)
                dist.reduce_scatter(out, list(x.chunk(ws)), op=op, group=g)
                chk.equal(case, out, want)
    b = ringpg.backend(g)
    band = _C.arena_pair_bytes()
    algos = {b.algorithm_for("reduce_scatter", nbytes) for nbytes in (band + 4, 1 << 20, _C.lent_reduce_from() - 4)}
    return {"report": chk.report(), "algos": algos, "lent": b.algorithm_for("reduce_scatter", _C.lent_reduce_from())}


@pytest.mark.multiprocess
@pytest.mark.parametrize("config", PAIR_RS_CONFIGS, ids=lambda c: c[0])
def test_two_ranks_reduce_scatter_as_a_pair_matches_gloo(config: tuple[str, Any, str]) -> None:
    """A two-rank reduce-scatter past the arena's volume and below the lent reduce is one
    message each way (the group says ``pair``), by the slots or with single copy on; the
    ring where asked for, and from lent_reduce_from; every form matches gloo."""
    name, env, want = config
    results = run_workers(pair_reduce_scatter_worker, 2, None, InitSpec(env=env), timeout=240)
    assert_reports_ok([r["report"] for r in results])
    if backend_under_test() != "ringpg":
        return
    for r in results:
        assert r["algos"] == {want}, (name, r["algos"])
        assert r["lent"] == "ring", (name, r["lent"])


# ============================================= all-gather written past the caches

# An all-gather whose output reaches tuning key stream_bytes writes it with streaming stores
# (reduce.h, copyStreaming): its own chunk and every segment out of the slots.  Asked
# for from 1 byte here, so odd sizes put chunk boundaries at every alignment (int8, odd
# numels) and short tails; through the slots, and by single copy (whose receives the
# kernel writes, the own chunk still streamed).  all_gather into a list gathers into a
# buffer it reads back, so it keeps plain stores: checked alongside.
STREAM_CONFIGS = [
    ("slots", 2, (tuning(stream_bytes=1), ("RINGPG_CMA_BYTES", "0"))),
    ("slots", 3, (tuning(stream_bytes=1), ("RINGPG_CMA_BYTES", "0"))),
    ("cma", 2, (tuning(stream_bytes=1), ("RINGPG_CMA_BYTES", "4096"))),
]


def streamed_all_gather_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    chk = Checker(rank)
    g, ref = groups.test, groups.ref
    for dtype in (torch.float32, torch.bfloat16, torch.int8):
        per_slot = SMALL_SLOT // dtype.itemsize
        for n in (1, 63, 1001, 3 * per_slot + 17, (1 << 20) // dtype.itemsize + 5):
            tag = f"dtype={dtype_name(dtype)} ws={ws} numel={n}"
            case = f"all_gather_into_tensor {tag}"
            x = make_data(rank, case, (n,), dtype)
            out = sentinel_like((n * ws,), dtype)
            dist.all_gather_into_tensor(out, x, group=g)
            chk.equal(case, out, ref_all_gather(x, ref))
            case = f"all_gather {tag}"
            outs = [sentinel_like((n,), dtype) for _ in range(ws)]
            dist.all_gather(outs, x, group=g)
            chk.equal(case, torch.cat(outs), ref_all_gather(x, ref))
    return chk.report()


@pytest.mark.multiprocess
@pytest.mark.parametrize("config", STREAM_CONFIGS, ids=lambda c: f"{c[0]}-ws{c[1]}")
def test_all_gather_written_past_the_caches_matches_gloo(config: tuple[str, int, Any]) -> None:
    _, ws, env = config
    assert_reports_ok(run_workers(streamed_all_gather_worker, ws, None, InitSpec(env=env), timeout=240))


# ============================================= the two-rank one-shot allreduce, in place or not

# The two-rank one-shot allreduce reduces the peer's buffer straight into the caller's
# where its own send went into the slots at once (the message fits the ring's 8 slots),
# else into a scratch area copied back after the send (algorithms/direct.cpp).  Slots of
# 64 KiB and a one-shot limit of 1 MiB reach both sides of that line.
ONESHOT_SLOTS_ENV = (tuning(segment_bytes=SMALL_SLOT, oneshot_bytes=1 << 20),)
SHM_SLOTS = 8  # transport/shm.cpp, kSlots


def oneshot_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    chk = Checker(rank)
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        per_slot = SMALL_SLOT // dtype.itemsize
        ns = (1000, SHM_SLOTS * per_slot, SHM_SLOTS * per_slot + 1, (SHM_SLOTS + 4) * per_slot + 3)
        check_reductions(chk, rank, ws, groups, dtype, ns, REDUCE_OPS)
    return chk.report()


@pytest.mark.multiprocess
def test_two_rank_one_shot_in_place_and_through_scratch_match_gloo() -> None:
    assert_reports_ok(run_workers(oneshot_worker, 2, None, InitSpec(env=ONESHOT_SLOTS_ENV), timeout=240))


# ============================================= the surface batteries over TCP, world sizes 2, 3

# (id, worker, args, the gloo gap that skips it in RINGPG_TEST_BACKEND=gloo runs).
# The workers are the shared-memory tests' own (harness.batteries).
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


@pytest.mark.multiprocess
@on_transports("tcp")
@pytest.mark.parametrize("battery", TCP_BATTERIES, ids=lambda b: b[0])
def test_tcp_surface(bpool: WorkerPool, battery: tuple[str, TaskFn, Any, Optional[str]]) -> None:
    """A battery of the API-surface tests (run there on shared memory only) over TCP."""
    _, worker, args, gap = battery
    if gap is not None and known_gap(backend_under_test(), gap):
        pytest.skip(f"{backend_under_test()} lacks: {gap}")
    if backend_under_test() == "ringpg":
        assert bpool.run(transport_worker) == ["tcp"] * bpool.world_size
    assert_reports_ok(bpool.run(worker, args, timeout=240))


# ============================================= the CPUs ringpg may use, one process


@pytest.mark.inprocess
@needs_C
@pytest.mark.parametrize(
    "text, cpus",
    [
        ("max 100000\n", None),  # no limit
        ("200000 100000\n", 2),
        ("150000 100000", 2),  # 1.5 CPUs: a rank may still run on 2 at once
        ("50000 100000", 1),  # under one CPU still counts one
        ("400000 50000", 8),
        ("", None),
        ("junk", None),
        ("12x 100000", None),
        ("100000", None),
        ("-1 100000", None),
    ],
)
def test_cpu_max_is_read_as_the_ceiling_of_quota_over_period(text: str, cpus: int | None) -> None:
    assert _C.cpus_from_cpu_max(text) == cpus


@pytest.mark.inprocess
@needs_C
@pytest.mark.parametrize(
    "text, size",
    [
        ("32768K\n", 32 << 20),  # sysfs's index3/size
        ("48K", 48 << 10),
        ("1M", 1 << 20),
        ("2G", 2 << 30),
        ("512", 512),
        ("", None),
        ("K", None),
        ("12Q", None),
        ("-4K", None),
        ("4K 8K", None),
    ],
)
def test_cache_size_text_is_read_in_bytes(text: str, size: int | None) -> None:
    assert _C.cache_bytes_from_text(text) == size


@pytest.mark.inprocess
@needs_C
@pytest.mark.parametrize(
    "cache, start",
    [
        (0, 0),  # unknown: never
        (4 << 20, 2 << 20),
        (32 << 20, 16 << 20),  # the 2-vCPU EPYC guests' L3: half of it
        (64 << 20, 32 << 20),
        (480 << 20, 32 << 20),  # a whole socket's L3 as a 2-vCPU Xeon guest reports it: capped
    ],
)
def test_auto_streaming_starts_at_half_the_cache_and_at_most_32_mib(cache: int, start: int) -> None:
    assert _C.auto_stream_from(cache) == start


@pytest.mark.inprocess
@needs_C
def test_last_level_cache_is_the_kernels_highest_level_data_cache() -> None:
    """The size all-gather streams from by default (auto_stream_from of it) is the
    kernel's highest-level data or unified cache of CPU 0, where sysfs lists one."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    caches = []
    for d in sorted(base.glob("index*")) if base.is_dir() else []:
        try:
            level, kind, size = ((d / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            break
        if kind != "Instruction" and _C.cache_bytes_from_text(size) is not None:
            caches.append((int(level), _C.cache_bytes_from_text(size)))
    if not caches:
        pytest.skip("sysfs lists no cache sizes here")
    assert _C.last_level_cache_bytes() == max(caches)[1]


@pytest.mark.inprocess
@needs_C
def test_usable_cpus_never_exceeds_the_affinity_mask() -> None:
    n = _C.usable_cpus()
    assert 1 <= n <= len(os.sched_getaffinity(0))


@pytest.mark.inprocess
@needs_C
@pytest.mark.parametrize(
    "shares, cpus",
    [
        (["0;-", "1;-"], 2),  # two ranks, each pinned to a CPU of its own
        (["3;-", "3;-"], 1),  # both pinned to one CPU
        (["0-1;-", "0-1;-"], 2),  # unpinned on two CPUs: the masks overlap
        (["0,2-3,7;-"], 4),  # runs and single CPUs
        (["0-7;2", "0-7;2"], 2),  # one container's quota caps the union
        (["0-7;2", "8;-"], 9),  # a rank without a quota lifts the cap
        (["0-1;1", "0-1;3"], 2),  # the largest quota caps
        (["junk", "1-;x", "3-1;-", ""], 1),  # unreadable shares count no CPU, at least 1
    ],
)
def test_cpus_together_is_the_union_of_masks_capped_by_the_largest_quota(shares: list[str], cpus: int) -> None:
    assert _C.cpus_together(shares) == cpus


@pytest.mark.inprocess
@needs_C
def test_cpu_share_text_lists_this_process_mask() -> None:
    mask, quota = _C.cpu_share_text().split(";")
    assert _C.cpus_together([f"{mask};-"]) == len(os.sched_getaffinity(0))
    assert quota == "-" or int(quota) >= 1


@pytest.mark.inprocess
@needs_C
def test_a_cpu_hint_is_confirmed_only_where_the_kernel_last_ran_its_thread() -> None:
    """A waiter moves off its CPU only where the peer's hint names it *and* the kernel last
    ran the peer's thread there (``/proc/<tid>/stat``): a hint is written only by its
    thread's waits, so one the scheduler has made stale must not move anyone (the whole
    cases at 3-11x of RESULTS 2026-12-06).  A thread pinned to one CPU is confirmed there
    and refuted on the other; a thread the kernel does not know is taken at its hint."""
    import threading

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    here, there = cpus[0], cpus[1]
    ready, done = threading.Event(), threading.Event()
    tid: list[int] = []

    def spin_on_here() -> None:
        os.sched_setaffinity(0, {here})  # this thread only
        tid.append(threading.get_native_id())
        ready.set()
        while not done.is_set():
            pass

    t = threading.Thread(target=spin_on_here)
    t.start()
    try:
        assert ready.wait(10)
        assert _C.cpu_hint_confirms(tid=tid[0], cpu=here)
        assert not _C.cpu_hint_confirms(tid=tid[0], cpu=there)
    finally:
        done.set()
        t.join()
    assert _C.cpu_hint_confirms(tid=0, cpu=there)  # no thread has waited: the hint is all there is
    assert _C.cpu_hint_confirms(tid=(1 << 31) - 1, cpu=there)  # beyond any pid: the kernel cannot say
    # The hint carries the publishing thread's id, asked again in a child a fork made.
    assert _C.cpu_hint_published_tid() == threading.get_native_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own id, not the parent's cached one
        os.write(write, str(_C.cpu_hint_published_tid() == os.getpid()).encode())
        os._exit(0)
    os.close(write)
    assert os.read(read, 16) == b"True"
    os.close(read)
    os.waitpid(pid, 0)


def pinned_group_worker(rank: int, ws: int, groups: Groups, args: Any) -> dict[str, Any]:
    """Pins this rank to one CPU (its own, or the first for every rank when ``args``),
    creates a ringpg group there, and reports its spin and an allreduce against gloo."""
    import ringpg

    mask = os.sched_getaffinity(0)
    cpus = sorted(mask)
    os.sched_setaffinity(0, {cpus[0] if args else cpus[rank % len(cpus)]})
    try:
        g = dist.new_group(backend="ringpg")
        x = torch.arange(5000, dtype=torch.int64) * (rank + 1)
        got, ref = x.clone(), x.clone()
        dist.all_reduce(got, group=g)
        dist.all_reduce(ref, group=groups.ref)
        b = ringpg.backend(g)
        spin = (b.wait_spin_us, b.wait_spin_yields)
        dist.destroy_process_group(g)
        return {"spin": spin, "equal": torch.equal(got, ref)}
    finally:
        os.sched_setaffinity(0, mask)


@pytest.mark.multiprocess
@pytest.mark.parametrize("shared_cpu", [False, True], ids=["own-cpu", "one-cpu"])
def test_ranks_pinned_to_cpus_of_their_own_spin(shared_cpu: bool) -> None:
    """Ranks pinned one to a CPU (taskset, numactl, an MPI launcher's binding) each see
    one CPU in their own mask, yet the host's ranks have a CPU each: auto spins there,
    pausing, as unpinned (sleeping instead made small ops 2-3x slower: RESULTS 2026-11-27
    (5)).  Ranks pinned to one CPU together spin too, yielding it on every look
    (sleeping at once was slower there as well: RESULTS 2026-11-28 (1))."""
    ws = 2
    if backend_under_test() != "ringpg":
        pytest.skip("ringpg's wait spin")
    if not shared_cpu and len(os.sched_getaffinity(0)) < ws:
        pytest.skip(f"needs {ws} CPUs")
    given = tuning_value("spin_us")
    spin = (int(given) if given != "auto" else AUTO_SHM_SPIN_US, shared_cpu)
    results = run_workers(pinned_group_worker, ws, shared_cpu, InitSpec(env=TRANSPORT_ENVS["shm"]))
    assert results == [{"spin": spin, "equal": True}] * ws, results


def colocated_worker(rank: int, ws: int, groups: Groups, args: Any) -> dict[str, Any]:
    """``args`` times: the ranks wait on one CPU together (pinned there for an op and a gloo
    barrier), are freed to their whole mask, and run a small allreduce at once, still
    queued on that CPU.  Reports on how many of those ops the ranks ended on different
    CPUs, whether this thread's mask came back as it was, and the results against gloo."""
    import ctypes

    sched_getcpu = ctypes.CDLL(None).sched_getcpu
    mask = os.sched_getaffinity(0)
    first = min(mask)
    x = torch.arange(1000, dtype=torch.int64) * (rank + 1)
    apart, masks_kept, equal = 0, True, True
    for _ in range(args):
        os.sched_setaffinity(0, {first})
        dist.all_reduce(x.clone(), group=groups.test)  # each rank's waits publish that CPU
        dist.barrier(group=groups.ref)
        os.sched_setaffinity(0, mask)  # a wider mask migrates no one: both stay queued there
        got = x.clone()
        dist.all_reduce(got, group=groups.test)
        cpus: list[Any] = [None] * ws
        dist.all_gather_object(cpus, sched_getcpu(), group=groups.ref)
        apart += len(set(cpus)) == ws
        masks_kept &= os.sched_getaffinity(0) == mask
        ref = x.clone()
        dist.all_reduce(ref, group=groups.ref)
        equal &= torch.equal(got, ref)
    os.sched_setaffinity(0, mask)
    return {"apart": apart, "masks_kept": masks_kept, "equal": equal}


COLOCATED_TRIALS = 12


@pytest.mark.multiprocess
def test_a_waiter_queued_with_its_neighbour_on_one_cpu_moves_off_it() -> None:
    """Ranks that could each have a core but were queued on one CPU (a wakeup put one
    beside the other) stay there for the op, each spin costing the other its length:
    the waiter moves itself to another CPU of its mask, and its mask stays as it was
    (transport/shm.cpp, ShmLink::waitUntil; RESULTS 2026-11-27 (6))."""
    ws = 2
    if backend_under_test() != "ringpg":
        pytest.skip("ringpg's wait spin")
    if len(os.sched_getaffinity(0)) < ws:
        pytest.skip(f"needs {ws} CPUs")
    if tuning_value("spin_us") == "0":
        pytest.skip("spin_us=0: no spin notices the neighbour")
    results = run_workers(colocated_worker, ws, COLOCATED_TRIALS, InitSpec(env=TRANSPORT_ENVS["shm"]))
    assert all(r["masks_kept"] and r["equal"] for r in results), results
    # Without the move the two ranks end nearly every one of these ops on one CPU; the
    # scheduler may still separate a pair now and then, or put one back.
    assert results[0]["apart"] >= COLOCATED_TRIALS // 2, results


PROC_SELF_CGROUP_V1 = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n2:cpuacct:/other\n0::/init.scope\n"


@pytest.mark.inprocess
@needs_C
@pytest.mark.parametrize(
    "text, controller, path",
    [
        (PROC_SELF_CGROUP_V1, "cpu", "/docker/abc"),  # co-mounted controllers, comma list
        (PROC_SELF_CGROUP_V1, "cpuacct", "/docker/abc"),  # the first hierarchy that has it
        (PROC_SELF_CGROUP_V1, "", "/init.scope"),  # v2: id 0, no controllers
        (PROC_SELF_CGROUP_V1, "pids", None),
        ("0::/user.slice/a:b.scope\n", "", "/user.slice/a:b.scope"),  # ':' inside the path
        ("2:cpuacct:/x\n", "cpu", None),  # no prefix match
        ("", "", None),
        ("garbage\n", "cpu", None),
    ],
)
def test_cgroup_path_is_parsed_from_proc_self_cgroup(text: str, controller: str, path: str | None) -> None:
    assert _C.cgroup_path(text, controller) == path


def _write(d: Path, files: dict[str, str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)


@pytest.mark.inprocess
@needs_C
def test_v2_quota_is_the_tightest_along_the_path(tmp_path: Path) -> None:
    _write(tmp_path / "kubepods" / "pod1" / "ctr", {"cpu.max": "max 100000\n"})
    _write(tmp_path / "kubepods" / "pod1", {"cpu.max": "250000 100000\n"})  # 2.5 CPUs
    _write(tmp_path / "kubepods", {"cpu.max": "800000 100000\n"})
    root = str(tmp_path)
    assert _C.quota_cpus_along(root, "/kubepods/pod1/ctr", True) == 3
    assert _C.quota_cpus_along(root, "/kubepods/pod1/ctr/", True) == 3
    assert _C.quota_cpus_along(root, "/kubepods", True) == 8
    assert _C.quota_cpus_along(root, "/", True) is None  # no cpu.max at the root
    # A path the mount does not show (a container sees only its own subtree): the
    # levels that exist still count.
    assert _C.quota_cpus_along(str(tmp_path / "kubepods"), "/kubepods/pod1/ctr", True) == 8


@pytest.mark.inprocess
@needs_C
def test_v1_quota_reads_quota_and_period_and_ignores_minus_one(tmp_path: Path) -> None:
    _write(tmp_path, {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"})
    _write(tmp_path / "docker" / "abc", {"cpu.cfs_quota_us": "150000\n", "cpu.cfs_period_us": "100000\n"})
    _write(tmp_path / "docker", {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"})
    root = str(tmp_path)
    assert _C.quota_cpus_along(root, "/docker/abc", False) == 2
    assert _C.quota_cpus_along(root, "/docker", False) is None
    assert _C.quota_cpus_along(root, "/docker/abc", True) is None  # v2 files absent
