"""Splitting and shrinking ringpg groups (torch >= 2.9 / >= 2.10; issue #19 item 3).

* ``dist.split_group`` (torch >= 2.15 here: 2.9 to 2.14 split only when the default
  group is bound to an accelerator) of a 4-rank ringpg group into two halves, and into one pair
  with two ranks in no part, on each transport (the parent's transport is made with
  ``ringpg.use_transport``): the children are ringpg groups of the parent's transport,
  rank = position in the part; their collectives match gloo groups of the same ranks
  (harness.smoke_checks); non-members get no group; the parent still works after.
* ``dist.distributed_c10d.shrink_group`` after a rank is killed: the three survivors
  build the shrunk group (on every transport, after their group failed, and with
  SHRINK_ABORT before they noticed the death) and its all_reduce / all_gather give
  exact results.
* ``RingBackend.shrink`` refuses bad arguments (no rendezvous started).

Skipped where the running torch lacks the API (``ringpg.features()``).
"""

from __future__ import annotations

import inspect
import os
import time
from datetime import timedelta
from typing import Any, Optional

import harness
import pytest
import torch
import torch.distributed as dist
from harness import Checker, CheckReport, Groups, WorkerPool, assert_reports_ok, make_data, smoke_checks
from harness.surface import finish

pytestmark = [
    pytest.mark.skipif(harness.backend_under_test() != "ringpg", reason="ringpg's own split and shrink"),
    pytest.mark.parametrize("world_size", [4], ids=lambda ws: f"ws{ws}", scope="module"),
]

PG_TIMEOUT = timedelta(seconds=20)  # short: a broken split or shrink fails the test quickly


def _features() -> dict[str, bool]:
    import ringpg

    return ringpg.features()


def _needs(feature: str) -> None:
    if not _features()[feature]:
        from ringpg import _features as f

        pytest.skip(f"{feature} needs torch >= {'.'.join(map(str, f.FEATURES[feature].since))}")


def _non_member(g: Any) -> bool:
    # torch 2.9 returns None, later releases GroupMember.NON_GROUP_MEMBER.
    return g is None or g == dist.GroupMember.NON_GROUP_MEMBER


# ------------------------------------------------------------------------- split


def _gloo_groups_like(members: Optional[list[int]], parts: list[list[int]], everyone: Any) -> Any:
    """Gloo groups of each part's ranks in the order its split child gave them (torch
    2.15 keeps the caller's order, older releases sort): this rank's, or None."""
    orders: list[Any] = [None] * dist.get_world_size(everyone)
    dist.all_gather_object(orders, members, group=everyone)
    mine = None
    for part in parts:
        order = next(o for o in orders if o is not None and sorted(o) == sorted(part))
        if "sort_ranks" in inspect.signature(dist.new_group).parameters:
            g = dist.new_group(order, backend="gloo", sort_ranks=False)
        else:  # torch sorts: the comparison fails unless the child's order is sorted too
            g = dist.new_group(order, backend="gloo")
        mine = g if members is not None and sorted(members) == sorted(part) else mine
    return mine


def split_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    import ringpg

    chk = Checker(rank)
    created: list[Any] = []
    for transport in ("auto", "tcp", "gloo"):
        with ringpg.use_transport(transport):
            parent = dist.new_group(backend="ringpg", timeout=PG_TIMEOUT)
        created.append(parent)
        parent_transport = ringpg.backend(parent).transport
        # dist.new_group() calls this on non-members of a splitting backend whose default
        # group has a bound device: ringpg needs nothing from them.
        chk.true(
            "perform_nocolor_split is a no-op",
            ringpg.backend(parent).perform_nocolor_split(torch.device("cpu")) is None,
            "",
        )
        # Halves in a caller's order; then one pair, ranks 0 and 2 in no part.
        for parts in ([[1, 0], [2, 3]], [[3, 1]]):
            tag = f"split_group({parts}) of a {parent_transport} group"
            child = dist.split_group(parent, split_ranks=parts, timeout=PG_TIMEOUT)
            mine = next((p for p in parts if rank in p), None)
            members = None if _non_member(child) else dist.get_process_group_ranks(child)
            ref = _gloo_groups_like(members, parts, groups.ref)
            created += [child, ref]
            if mine is None:
                chk.true(f"{tag}: non-member", _non_member(child), repr(child))
                continue
            b = ringpg.backend(child)
            chk.true(f"{tag}: members", sorted(members) == sorted(mine), str(members))
            chk.true(f"{tag}: a ringpg child", b is not None and dist.get_backend(child) == "ringpg", repr(b))
            if b is None:
                continue
            # torch 2.15 keeps the caller's order, 2.9 to 2.14 sort: either way the
            # child's rank is this rank's position in the group torch records.
            chk.true(
                f"{tag}: rank/size",
                (b.rank(), b.size()) == (members.index(rank), len(mine)),
                f"{(b.rank(), b.size())} vs members {members}",
            )
            chk.true(f"{tag}: transport", b.transport == parent_transport, f"{b.transport} vs {parent_transport}")
            chk.true(f"{tag}: one backend for cpu and cuda", ringpg.backend(child, "cuda") is b, "two")
            smoke_checks(chk, tag, child, ref, numel=257)
        # The parent still works after its splits.
        x = make_data(rank, f"parent {transport}", (100,), torch.int64)
        got = x.clone()
        dist.all_reduce(got, group=parent)
        expected = x.clone()
        dist.all_reduce(expected, group=groups.ref)
        chk.equal(f"all_reduce on the {parent_transport} parent after its splits", got, expected)
    for g in created:
        if g is not None and not _non_member(g):
            dist.destroy_process_group(g)
    return finish(chk, groups.test)


def test_split_group_children_match_gloo(shared_pool: WorkerPool) -> None:
    _needs("split_group")
    from ringpg import _features as f

    if f.torch_release() < (2, 15):
        # torch 2.9 to 2.14 refuse ("No device associated with the default pg") for any
        # backend unless init_process_group(device_id=<accelerator>) bound one.
        pytest.skip("dist.split_group needs the default group bound to an accelerator before torch 2.15")
    assert_reports_ok(shared_pool.run(split_worker))


# ------------------------------------------------------------- split across hosts

# Issue 31 item 4: 3 emulated hosts x 2 ranks (rank r on host r % 3), the world
# hierarchical; the children of a split recompute their topology and algorithm from their
# own members: [0, 1, 3, 4] is 2 hosts x 2 ranks (hierarchical, shm+tcp), [2, 5] one host
# (the ring on shm).  Every allreduce takes the ring path (no one-shot), in segments and
# 64 KiB pieces at smoke_checks' size.
SPLIT_HOSTS_KEY = "hosts3x2"
SPLIT_HOSTS_ENV = (
    (harness.EMULATED_HOSTS_ENV, harness.EMULATED_LAYOUTS[SPLIT_HOSTS_KEY]),
    ("RINGPG_ONESHOT_BYTES", "0"),
    ("RINGPG_SEGMENT_BYTES", "65536"),
    ("RINGPG_HIER_PIECE_BYTES", "65536"),
)
SPLIT_PARTS = [[0, 1, 3, 4], [2, 5]]


def _topology_of(b: Any) -> tuple[int, int, str, str]:
    return b.hosts, b.ranks_per_host, b.allreduce_algorithm, b.transport


def _topology_expected(members: list[int]) -> tuple[int, int, str, str]:
    layout = harness.EMULATED_LAYOUTS[SPLIT_HOSTS_KEY]
    hosts, per_host, _ = harness.emulated_topology(layout, members)
    algo = "hier" if harness.hierarchical_expected(layout, members) else "ring"
    return hosts, per_host, algo, harness.transport_expected(SPLIT_HOSTS_KEY, members)


def split_across_hosts_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    import ringpg

    chk = Checker(rank)
    parent = ringpg.backend(groups.test)
    chk.true(
        "the world: 3 hosts x 2, hierarchical",
        _topology_of(parent) == _topology_expected(list(range(ws))),
        str(_topology_of(parent)),
    )
    child = dist.split_group(groups.test, split_ranks=SPLIT_PARTS, timeout=PG_TIMEOUT)
    members = dist.get_process_group_ranks(child)
    ref = _gloo_groups_like(members, SPLIT_PARTS, groups.ref)
    tag = f"split child {sorted(members)} across hosts"
    b = ringpg.backend(child)
    chk.true(
        f"{tag}: topology and algorithm",
        _topology_of(b) == _topology_expected(sorted(members)),
        f"{_topology_of(b)} vs {_topology_expected(sorted(members))}",
    )
    smoke_checks(chk, tag, child, ref, numel=50001)
    for g in (child, ref):
        dist.destroy_process_group(g)
    return finish(chk, groups.test)


def test_split_children_across_hosts_recompute_topology_and_match_gloo(world_size: int) -> None:
    # Six ranks, whatever the module's world size (3 hosts x 2 needs them).
    _needs("split_group")
    from ringpg import _features as f

    if f.torch_release() < (2, 15):
        pytest.skip("dist.split_group needs the default group bound to an accelerator before torch 2.15")
    # What the test means: one child hierarchical, the other the ring on one host.
    assert [_topology_expected(p)[2:] for p in SPLIT_PARTS] == [("hier", "shm+tcp"), ("ring", "shm")]
    assert_reports_ok(
        harness.run_workers(split_across_hosts_worker, 6, spec=harness.InitSpec(env=SPLIT_HOSTS_ENV), timeout=180)
    )


# ------------------------------------------------------------------- shrink checks


def shrink_arguments_worker(rank: int, ws: int, groups: Groups, args: Any) -> dict[str, str]:
    import ringpg

    b = ringpg.backend(groups.test)
    other = (rank + 1) % ws
    out = {}
    for name, call in (
        ("self", lambda: b.shrink([rank])),
        ("out of range", lambda: b.shrink([ws])),
        ("repeated", lambda: b.shrink([other, other])),
        ("empty", lambda: b.shrink([])),
        ("flags", lambda: b.shrink([other], 4)),
    ):
        kind, msg, _ = harness.expect_error(call)
        out[name] = f"{kind}: {msg.splitlines()[0] if msg else ''}"
    probe = torch.ones(4)
    dist.all_reduce(probe, group=groups.test)  # the group is untouched
    out["after"] = str(probe.tolist())
    return out


def test_shrink_refuses_bad_arguments(shared_pool: WorkerPool) -> None:
    _needs("shrink_group")
    for rank, v in enumerate(shared_pool.run(shrink_arguments_worker)):
        for name in ("self", "out of range", "repeated", "empty", "flags"):
            assert v[name].startswith("ValueError: ") and "ringpg::shrink" in v[name], (rank, name, v[name])
        assert "only the survivors call shrink" in v["self"], v
        assert v["after"] == str([4.0] * 4), v


# ---------------------------------------------------------- shrink after a death


def _shrink_after_death(rank: int, ws: int, port: int, args: Any) -> dict:
    import ringpg
    from torch.distributed.distributed_c10d import SHRINK_ABORT, SHRINK_DEFAULT, shrink_group

    victim, abort_first = args
    torch.set_num_threads(1)
    dist.init_process_group(
        "ringpg", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws, timeout=PG_TIMEOUT
    )
    x = torch.ones(1024)
    dist.all_reduce(x)
    parent_algorithm = ringpg.backend(dist.group.WORLD).allreduce_algorithm
    # Every rank is past that all_reduce before the victim dies (through the Store: a
    # rank that aborts early must not fail another's last op).
    store = dist.distributed_c10d._get_default_store()
    store.add("past first op", 1)
    while store.add("past first op", 0) < ws:
        time.sleep(0.01)
    if rank == victim:
        os._exit(1)
    failed = ""
    if not abort_first:
        # The survivors see the death: the group has failed for good.
        kind, msg, _ = harness.expect_error(lambda: dist.all_reduce(torch.ones(1 << 16)))
        failed = f"{kind}: {msg[:200]}"
    t0 = time.monotonic()
    new = shrink_group([victim], shrink_flags=SHRINK_ABORT if abort_first else SHRINK_DEFAULT)
    took = time.monotonic() - t0
    survivors = [r for r in range(ws) if r != victim]
    b = ringpg.backend(new)
    res_algo = None if b is None else (b.hosts, b.ranks_per_host, b.allreduce_algorithm)
    res: dict[str, Any] = {
        "failed": failed,
        "took": took,
        "rank_size": (new.rank(), new.size(), dist.get_rank(), dist.get_world_size()),
        "expected_rank": survivors.index(rank),
        "is_default": new is dist.group.WORLD,
        "transport": None if b is None else b.transport,
        "parent_algorithm": parent_algorithm,
        "topology": res_algo,
    }
    # Exact integer results, computed here from every survivor's deterministic data.
    case = "all_reduce after shrink"
    x = make_data(rank, case, (1000,), torch.int64)
    dist.all_reduce(x, group=new)
    res["all_reduce"] = torch.equal(x, sum(make_data(r, case, (1000,), torch.int64) for r in survivors))
    case = "large all_reduce after shrink"  # many segments (RINGPG_SEGMENT_BYTES in the across-hosts case)
    x = make_data(rank, case, (50001,), torch.int32)
    dist.all_reduce(x, group=new)
    res["large_all_reduce"] = torch.equal(x, sum(make_data(r, case, (50001,), torch.int32) for r in survivors))
    case = "all_gather after shrink"
    out = torch.full((3 * 333,), -99, dtype=torch.int32)
    dist.all_gather_into_tensor(out, make_data(rank, case, (333,), torch.int32), group=new)
    res["all_gather"] = torch.equal(out, torch.cat([make_data(r, case, (333,), torch.int32) for r in survivors]))
    dist.barrier(group=new)
    return res


# "mixed": 2 emulated hosts x 2 ranks (hierarchical); the victim leaves 2 + 1 survivors,
# which must fall back to the flat ring (on shm+tcp), at sizes that run the ring.
ACROSS_HOSTS_ENV = {"RINGPG_ONESHOT_BYTES": "0", "RINGPG_SEGMENT_BYTES": "65536", "RINGPG_HIER_PIECE_BYTES": "65536"}


@pytest.mark.parametrize(
    "transport,abort_first",
    [("shm", False), ("tcp", False), ("gloo", False), ("shm", True), ("mixed", False)],
    ids=[
        "shm-after-failure",
        "tcp-after-failure",
        "gloo-after-failure",
        "shm-shrink-abort",
        "across-hosts-after-failure",
    ],
)
def test_survivors_shrink_after_a_rank_dies(transport: str, abort_first: bool, world_size: int) -> None:
    _needs("shrink_group")
    victim = 2  # not rank 0: its process hosts the Store
    env = dict(harness.TRANSPORT_ENVS[transport])
    if transport == "mixed":
        env.update(ACROSS_HOSTS_ENV)
    res = harness.run_scenario(
        _shrink_after_death,
        world_size,
        (victim, abort_first),
        expect={r for r in range(world_size) if r != victim},
        env=env,
        timeout=120.0,
    )
    survivors = [r for r in range(world_size) if r != victim]
    for r, v in res.items():
        assert "crash" not in v, (r, v.get("crash"))
        if not abort_first:
            assert v["failed"].startswith(("DistNetworkError", "DistBackendError")), (r, v["failed"])
        assert v["rank_size"] == (v["expected_rank"], 3, v["expected_rank"], 3), (r, v)
        assert v["is_default"], (r, v)
        # shm is the auto transport's choice; the survivors are on one host too (or,
        # across hosts, shared memory within one and TCP between).
        assert v["transport"] == harness.transport_expected(transport, survivors), (r, v)
        if transport == "mixed":
            layout = harness.TRANSPORT_ENVS["mixed"][0][1]
            assert harness.emulated_topology(layout, range(world_size))[:2] == (2, 2)  # what the test means
            assert v["parent_algorithm"] == "hier", (r, v)
            hosts, per_host, _ = harness.emulated_topology(layout, survivors)
            assert (hosts, per_host) == (2, 0), (hosts, per_host)  # 2 + 1: unequal hosts
            assert v["topology"] == (hosts, per_host, "ring"), (r, v)
        assert v["all_reduce"] and v["large_all_reduce"] and v["all_gather"], (r, v)
        assert v["took"] < 15.0, (r, v["took"])  # no wait for a timeout
