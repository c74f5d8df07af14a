"""ringpg's ring transports, each compared with gloo in the same processes.

Every rank of the test suite runs on one host, so ringpg's ring moves through
shared memory by default (csrc/transport/shm.h); ``RINGPG_TRANSPORT=tcp`` keeps it
on its own TCP sockets, the path ranks on different hosts take, and
``RINGPG_TRANSPORT=gloo`` on Gloo's TCP pairs (csrc/transport/gloo_link.h).  All run here, and the
shared-memory ring also with ``RINGPG_SEGMENT_BYTES=65536`` (64 KiB slots), so that
segments, whole-buffer messages of the direct algorithms and the one-shot allreduce
all span several slot fragments and wrap the slot ring many times.  Both transports
also run with a long ``RINGPG_SPIN_US``, so that waits end while their thread polls
(over TCP the waiting thread then reads its peer's socket itself, beside the engine's
progress thread; over shared memory ws 3 and 4 spin on more ranks than this machine
may have cores); the TCP one with ``RINGPG_TCP_CONGESTION=reno`` too.

Each configuration checks which transport the group really uses, which congestion
control its sockets run, that no named
shared-memory region is left behind once the group is up, and every collective
that sends to a ring neighbour, on sizes around the slot and chunk boundaries.
Data are small integers, so results are exact in every dtype (``torch.equal``).
"""

from __future__ import annotations

import os
from typing import Any, Iterator

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
    WorkerPool,
    assert_reports_ok,
    backend_under_test,
    data_kind,
    default_tcp_congestion,
    dtype_name,
    emulated_host,
    emulated_topology,
    hierarchical_expected,
    make_data,
    reduce_op,
    ref_all_gather,
    ref_all_reduce,
    ref_broadcast,
    ref_reduce_scatter,
    sentinel_like,
    skip_case,
    transport_expected,
    transport_of,
    wait_spin_of,
)

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
        (("RINGPG_SEGMENT_BYTES", str(SMALL_SLOT)), ("RINGPG_WORK_CACHE_BYTES", "4096"), ("RINGPG_CMA_BYTES", "0")),
        "shm",
    ),
    # Single copy from 4 KiB, so most messages of the battery go straight from the
    # sender's buffer, into the receiver's or through its reducing stage (the default
    # "shm" runs single copy from 64 KiB).
    ("shm-spin-cma-4k", (("RINGPG_SPIN_US", SPIN), ("RINGPG_CMA_BYTES", "4096")), "shm"),
    # reno: the one congestion control every Linux kernel has and lets anyone choose.
    (
        "tcp-spin-reno",
        (("RINGPG_TRANSPORT", "tcp"), ("RINGPG_SPIN_US", SPIN), ("RINGPG_TCP_CONGESTION", "reno")),
        "tcp",
    ),
    # The portable kernels pinned: every reduction below through the plain copy; and
    # single copy from 4 KiB asked for, but the kernel refuses rank 1 reads of rank 0's
    # memory, so the whole group agrees on the slots.
    (
        "shm-baseline-kernels-cma-refused",
        (("RINGPG_REDUCE_ISA", "baseline"), (REFUSE_CMA_ENV, "1"), ("RINGPG_CMA_BYTES", "4096")),
        "shm",
    ),
]
AUTO_SHM_SPIN_US = 100  # Config::kAutoShmSpinMicros


def expected_spin_us(env: tuple[tuple[str, str], ...], transport: str, ws: int, rank: int) -> int:
    """The documented rule for RINGPG_SPIN_US (docs/configuration.md): a set value everywhere; auto spins only on ranks
    with a shared-memory link, and only when their host's ranks do not outnumber this
    process's CPUs."""
    given = dict(env).get("RINGPG_SPIN_US", os.environ.get("RINGPG_SPIN_US", "auto"))
    if given != "auto":
        return int(given)
    if transport in ("tcp", "gloo"):
        return 0
    local = ws
    layout = dict(env).get(EMULATED_HOSTS_ENV)
    if layout:  # emulated hosts: the ranks of this rank's
        local = len([q for q in range(ws) if emulated_host(layout, q) == emulated_host(layout, rank)])
        if local == 1:
            return 0  # no shared-memory link on this rank
    import ringpg._C  # affinity mask lowered by a CFS quota (tests/test_host.py)

    return AUTO_SHM_SPIN_US if local <= ringpg._C.usable_cpus() else 0


DTYPES = (torch.float32, torch.bfloat16, torch.int32, torch.int8)
REDUCE_OPS = ("SUM", "AVG", "MAX")


def numels(ws: int, dtype: torch.dtype) -> list[int]:
    """Around the edges: empty, fewer than ws, one slot of 64 KiB +- 1, many slots."""
    per_slot = SMALL_SLOT // dtype.itemsize
    return [0, 1, ws - 1, 1000, per_slot - 1, per_slot * ws + 1, 5 * per_slot * ws + 7]


pytestmark = [
    pytest.mark.parametrize("world_size", [2, 3, 4], ids=lambda ws: f"ws{ws}", scope="module"),
    pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c[0], scope="module"),
]


@pytest.fixture(scope="module")
def tpool(world_size: int, config: tuple[str, tuple[tuple[str, str], ...], str]) -> Iterator[WorkerPool]:
    p = WorkerPool(world_size, InitSpec(env=config[1]))
    yield p
    p.close()


def transport_worker(rank: int, ws: int, groups: Groups, args: Any) -> dict[str, Any]:
    prefix = f"ringpg-{os.getpid()}-"
    leftover = [n for n in os.listdir("/dev/shm") if n.startswith(prefix)] if os.path.isdir("/dev/shm") else []
    import ringpg
    import ringpg._C

    b = ringpg.backend(groups.test)
    return {
        "transport": transport_of(groups.test),
        "leftover": leftover,
        "spin": wait_spin_of(groups.test),
        "isa": ringpg._C.reduce_isa(),
        "isas": ringpg._C.reduce_isas(),
        "cc": b.tcp_congestion if b is not None else None,
        "host_cc": default_tcp_congestion(),
        "allreduce": b.allreduce_algorithm if b is not None else None,
        "copy": b.same_host_copy if b is not None else None,
        "hosts": (b.hosts, b.ranks_per_host, b.ring_order) if b is not None else None,
    }


def collectives_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    chk = Checker(rank)
    g, ref = groups.test, groups.ref
    for dtype in DTYPES:
        for n in numels(ws, dtype):
            tag = f"dtype={dtype_name(dtype)} ws={ws} numel={n}"
            for op in REDUCE_OPS:
                if skip_case(groups.backend, op, dtype):
                    continue
                case = f"all_reduce op={op} {tag}"
                x = make_data(rank, case, (n,), dtype, data_kind(op))
                got = x.clone()
                dist.all_reduce(got, op=reduce_op(op), group=g)
                chk.equal(case, got, ref_all_reduce(x, op, ref))

                case = f"reduce_scatter_tensor op={op} {tag}"
                x = make_data(rank, case, (n * ws,), dtype, data_kind(op))
                out = sentinel_like((n,), dtype)
                dist.reduce_scatter_tensor(out, x.clone(), op=reduce_op(op), group=g)
                chk.equal(case, out, ref_reduce_scatter(x, op, ref))

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
    return chk.report()


def test_transport_in_use(tpool: WorkerPool, config: tuple[str, Any, str], world_size: int) -> None:
    """The group runs on the transport its configuration asks for, waits spin as the
    README says, its data sockets run the congestion control asked for (else the
    host's), and the group leaves no names in /dev/shm."""
    results = tpool.run(transport_worker)
    if backend_under_test() == "ringpg":
        layout = dict(config[1]).get(EMULATED_HOSTS_ENV)
        transport = transport_expected(config[2], world_size) if layout else config[2]
        assert [r["transport"] for r in results] == [transport] * len(results)
        spin = [expected_spin_us(config[1], transport, world_size, r) for r in range(world_size)]
        assert [r["spin"] for r in results] == spin
        isa = dict(config[1]).get("RINGPG_REDUCE_ISA", results[0]["isas"][0])  # pinned, else the best
        assert [r["isa"] for r in results] == [isa] * len(results)
        chosen = dict(config[1]).get("RINGPG_TCP_CONGESTION", os.environ.get("RINGPG_TCP_CONGESTION", ""))
        cc = results[0]["host_cc"] if chosen in ("", "default") else chosen  # as config.cpp reads it
        assert [r["cc"] for r in results] == [cc] * len(results)
        # Emulated hosts: the ring runs host by host, and the large collectives are
        # hierarchical where several hosts hold two ranks each, unless forced flat.
        if layout:
            members = range(world_size)
            assert [r["hosts"] for r in results] == [emulated_topology(layout, members)] * world_size
            hier = hierarchical_expected(layout, members, dict(config[1]).get("RINGPG_ALGO", "auto"))
            assert [r["allreduce"] for r in results] == ["hier" if hier else "ring"] * world_size
        else:
            assert [r["allreduce"] for r in results] == ["ring"] * world_size
        assert [r["copy"] for r in results] == expected_copy(config[1], transport, world_size)
    assert all(not r["leftover"] for r in results), results


def expected_copy(env: tuple[tuple[str, str], ...], transport: str, ws: int) -> list[str]:
    """The documented rule for ``same_host_copy``: none on a rank without a shared-memory link;
    else single copy ("cma") unless RINGPG_CMA_BYTES=0 or the kernel refuses a read."""
    settings = dict(env)
    if transport in ("tcp", "gloo"):
        return [""] * ws
    layout = settings.get(EMULATED_HOSTS_ENV)
    host = [emulated_host(layout, r) if layout else 0 for r in range(ws)]
    shared = [host.count(host[r]) > 1 for r in range(ws)]
    slots = settings.get("RINGPG_CMA_BYTES") == "0" or settings.get(REFUSE_CMA_ENV) == "1"
    return [("slots" if slots else "cma") if shared[r] else "" for r in range(ws)]


def test_collectives_match_gloo(tpool: WorkerPool) -> None:
    assert_reports_ok(tpool.run(collectives_worker, timeout=240))
