"""Subgroups of the backend under test at world size 4, against gloo subgroups of the same ranks.

* ``dist.new_group(ranks=..., backend=<backend>)`` for a non-contiguous pair
  ([1, 3]) and a prefix ([0, 1, 2]); non-members get NON_GROUP_MEMBER;
* ``dist.new_subgroups(group_size=2, backend=<backend>)``: both subgroups run
  their collectives at the same time;
* on each group: harness.smoke_checks (all_reduce, reduce_scatter_tensor,
  all_gather_into_tensor, broadcast), plus reduce to a global destination,
  scatter, object collectives and a point-to-point ring addressed by group rank;
* the subgroups are destroyed at the end and the world group still works.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from harness import (
    Checker,
    CheckReport,
    Groups,
    WorkerPool,
    assert_reports_ok,
    make_data,
    ref_all_reduce,
    sentinel_like,
    smoke_checks,
)
from harness.surface import finish

pytestmark = pytest.mark.parametrize("world_size", [4], ids=lambda ws: f"ws{ws}", scope="module")


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


def test_subgroups(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(subgroups_worker))
