"""torch's distributed stack on groups of the backend under test: DDP, FSDP2, functional
collectives, DeviceMesh / DTensor and torch.distributed.checkpoint at world sizes 2 and
3; splitting and shrinking ringpg groups at world size 4.

DDP: two models per configuration in the same processes, one on the group under test
and one on the gloo group, built from the same seed (a different seed per rank, so
DDP's initial broadcast matters) and trained on the same per-rank data; their
parameters (and buffers) must agree after a few SGD steps.  Tolerances:

* fp32 gradients: |test - gloo| <= 1e-6 + 1e-5 |gloo|.  At world size 2 the sums
  are exact (a + b == b + a); at 3 the summation order may differ in the last
  bit, which a few SGD steps amplify only marginally;
* fp16 / bf16 compress hooks: both backends reduce the same compressed values;
  order-dependent rounding of the half-precision sum (2**-11 resp. 2**-8 relative)
  times lr (0.05) over 3 steps stays below 5e-4 (fp16) resp. 4e-3 (bf16) absolute.

FSDP2 (``fully_shard`` on a DeviceMesh over the default group, i.e. the backend
under test) must match a plain model trained on the concatenated global batch:
rtol 1e-5, atol 1e-6 (float32; only the summation order differs).

Functional collectives and DTensor redistribution on a mesh of the backend under
test must equal the same calls on a gloo mesh (exact, integer-valued data).

torch.distributed.checkpoint: the FSDP2 model's sharded state dict plus a plain
tensor dict are saved to a directory shared by the ranks and loaded into a
differently initialised model; the values must round-trip exactly.

Split and shrink (ringpg only; torch >= 2.9 / >= 2.10, skipped where the running torch
lacks the API, ``ringpg.features()``):

* ``dist.split_group`` (torch >= 2.15 here: 2.9 to 2.14 split only when the default
  group is bound to an accelerator) of a 4-rank ringpg group into two halves, and into
  one pair with two ranks in no part, on each transport (the parent's transport is
  made with ``ringpg.use_transport``): the children are ringpg groups of the parent's
  transport, rank = position in the part; their collectives match gloo groups of the
  same ranks (harness.smoke_checks); non-members get no group; the parent still works
  after.  Across 3 emulated hosts x 2 ranks, the children recompute their topology and
  algorithm from their own members;
* ``dist.distributed_c10d.shrink_group`` after a rank is killed: the three survivors
  build the shrunk group (on every transport, after their group failed, and with
  SHRINK_ABORT before they noticed the death) and its all_reduce / all_gather give
  exact results;
* ``RingBackend.shrink`` refuses bad arguments (no rendezvous started).
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
import torch.distributed._functional_collectives as funcol
from harness import (
    Checker,
    CheckReport,
    Groups,
    WorkerPool,
    assert_reports_ok,
    dtype_name,
    make_data,
    ref_all_gather,
    ref_all_reduce,
    ref_reduce_scatter,
    smoke_checks,
)
from harness.models import (
    DDP_CONFIGS,
    FSDP_ATOL,
    FSDP_RTOL,
    build_ddp,
    close_bound,
    full_state,
    sharded_mlp,
    train_ddp,
    train_fsdp_and_reference,
)
from harness.surface import finish

from devkit.settings import tuning

pytestmark = pytest.mark.multiprocess

ON_WS_2_3 = pytest.mark.parametrize("world_size", [2, 3], ids=lambda ws: f"ws{ws}", scope="module")
ON_WS_4 = pytest.mark.parametrize("world_size", [4], ids=lambda ws: f"ws{ws}", scope="module")
ringpg_split_shrink = pytest.mark.skipif(
    harness.backend_under_test() != "ringpg", reason="ringpg's own split and shrink"
)


# ============================================= DDP, FSDP2, funcol, DTensor, DCP: world sizes 2, 3


def ddp_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """Every DDPConfig: the model on the group under test vs the same model on gloo."""
    chk = Checker(rank)
    for cfg in DDP_CONFIGS:
        tag = f"DDP {cfg.name} ws={ws}"
        test_ddp, ref_ddp = build_ddp(cfg, rank, groups.test), build_ddp(cfg, rank, groups.ref)
        if cfg.batch_norm:  # DDP's constructor broadcast rank 0's buffers
            for (name, b), (_, rb) in zip(test_ddp.module.named_buffers(), ref_ddp.module.named_buffers()):
                chk.equal(f"{tag}: buffer {name} after construction", b, rb)
        extra_before = test_ddp.module.extra.weight.detach().clone() if cfg.find_unused else None
        train_ddp(cfg, test_ddp, rank)
        train_ddp(cfg, ref_ddp, rank)
        test_state, ref_state = test_ddp.module.state_dict(), ref_ddp.module.state_dict()
        for name, ref in ref_state.items():
            got = test_state[name]
            if ref.dtype.is_floating_point:
                chk.within(
                    f"{tag}: {name} (atol={cfg.atol}, rtol={cfg.rtol})", got, ref, close_bound(ref, cfg.atol, cfg.rtol)
                )
            else:
                chk.equal(f"{tag}: {name}", got, ref)
        if extra_before is not None:  # used on odd steps only: it must have been trained
            chk.true(
                f"{tag}: the sometimes-unused branch was trained",
                not torch.equal(test_ddp.module.extra.weight, extra_before),
            )
    return finish(chk, groups.test)


def fsdp2_dcp_worker(rank: int, ws: int, groups: Groups, ckpt_dir: str) -> CheckReport:
    """FSDP2 training vs a single-process reference, then a DCP save/load round trip."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    chk = Checker(rank)
    mesh = init_device_mesh("cpu", (ws,))
    chk.true(
        "mesh group is the backend under test",
        dist.get_backend(mesh.get_group()) == groups.backend,
        str(dist.get_backend(mesh.get_group())),
    )
    model = sharded_mlp(0, mesh)
    trained, ref = train_fsdp_and_reference(model, rank, ws)
    for name, p in ref.named_parameters():
        chk.within(
            f"FSDP2 ws={ws}: {name} vs single-process reference (rtol={FSDP_RTOL}, atol={FSDP_ATOL})",
            trained[name],
            p.detach(),
            close_bound(p, FSDP_ATOL, FSDP_RTOL),
        )

    # torch.distributed.checkpoint: sharded model state + a plain tensor dict.
    plain = {"table": torch.arange(24, dtype=torch.int64).reshape(4, 6), "scale": torch.tensor([0.25])}
    dcp.save({"model": model.state_dict(), "plain": plain}, checkpoint_id=ckpt_dir)
    fresh = sharded_mlp(123, mesh)
    chk.true(
        "DCP: the fresh model starts different",
        any(not torch.equal(v, trained[k]) for k, v in full_state(fresh).items()),
    )
    target = {"model": fresh.state_dict(), "plain": {k: torch.zeros_like(v) for k, v in plain.items()}}
    dcp.load(target, checkpoint_id=ckpt_dir)
    fresh.load_state_dict(target["model"])
    for name, value in full_state(fresh).items():
        chk.equal(f"DCP ws={ws}: {name} round trip", value, trained[name])
    for name, value in plain.items():
        chk.equal(f"DCP ws={ws}: plain {name} round trip", target["plain"][name], value)
    return finish(chk, groups.test)


# ------------------------------------------ functional collectives and DeviceMesh


def funcol_mesh_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """funcol on a mesh of the backend under test vs the same calls on a gloo mesh; DTensor redistribution."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    chk = Checker(rank)
    mesh = init_device_mesh("cpu", (ws,))
    gloo_mesh = DeviceMesh.from_group(groups.ref, "cpu")
    for dtype in (torch.float32, torch.int64):
        for dim in (0, 1):
            tag = f"dtype={dtype_name(dtype)} ws={ws} dim={dim}"
            case = f"funcol.all_gather_tensor gather_dim={dim} {tag}"
            x = make_data(rank, case, (3, 4), dtype)
            got = funcol.wait_tensor(funcol.all_gather_tensor(x, dim, mesh))
            chk.equal(case, got, funcol.wait_tensor(funcol.all_gather_tensor(x, dim, gloo_mesh)))
            if dim == 0:
                chk.equal(case + " [vs eager gloo]", got, ref_all_gather(x, groups.ref))

            for op in ("sum", "max"):
                case = f"funcol.reduce_scatter_tensor op={op} scatter_dim={dim} {tag}"
                shape = (ws * 3, 4) if dim == 0 else (3, ws * 4)
                x = make_data(rank, case, shape, dtype)
                got = funcol.wait_tensor(funcol.reduce_scatter_tensor(x, op, dim, mesh))
                want = ref_reduce_scatter(x.movedim(dim, 0).contiguous(), op.upper(), groups.ref).movedim(0, dim)
                chk.equal(case + " [vs eager gloo]", got, want)
                gloo_funcol = funcol.wait_tensor(funcol.reduce_scatter_tensor(x, op, dim, gloo_mesh))
                # gloo's own functional reduce_scatter_tensor with op max returns wrong values
                # on some torch releases (2.6, 2.8); compare with it only where it is right.
                if op == "sum" or torch.equal(gloo_funcol, want):
                    chk.equal(case, got, gloo_funcol)

        for op in ("sum", "max", "min", "avg"):
            if op == "avg" and not dtype.is_floating_point:
                continue
            case = f"funcol.all_reduce op={op} dtype={dtype_name(dtype)} ws={ws}"
            x = make_data(rank, case, (5, 3), dtype)
            got = funcol.wait_tensor(funcol.all_reduce(x, op, mesh))
            chk.equal(case, got, ref_all_reduce(x, op.upper(), groups.ref))

    case = f"DTensor redistribute ws={ws}"
    full = make_data(0, case, (ws * 2 + 1, 6), torch.float32)  # same on every rank; uneven Shard(0)
    dt = distribute_tensor(full, mesh, [Shard(0)])
    chk.equal(f"{case}: Shard(0) -> full_tensor", dt.full_tensor(), full)
    chk.equal(f"{case}: Shard(0) -> Shard(1) -> full_tensor", dt.redistribute(mesh, [Shard(1)]).full_tensor(), full)
    chk.equal(f"{case}: Shard(0) -> Replicate", dt.redistribute(mesh, [Replicate()]).to_local(), full)
    mine = make_data(rank, case + " partial", (4, 3), torch.float32)
    from torch.distributed.tensor import DTensor

    partial = DTensor.from_local(mine, mesh, [Partial()])
    chk.equal(
        f"{case}: Partial -> Replicate",
        partial.redistribute(mesh, [Replicate()]).to_local(),
        ref_all_reduce(mine, "SUM", groups.ref),
    )
    return finish(chk, groups.test)


# ------------------------------------------------------------------------ tests


@ON_WS_2_3
def test_ddp_matches_gloo(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(ddp_worker, timeout=240))


@ON_WS_2_3
def test_fsdp2_and_checkpoint(shared_pool: WorkerPool, tmp_path: Any) -> None:
    if not hasattr(torch.cpu.Stream, "record_event"):
        # torch 2.6's FSDP2 records events on its CPU streams, which cannot (any backend).
        pytest.skip(f"torch {torch.__version__}: FSDP2 cannot run on CPU (torch.cpu.Stream has no record_event)")
    ckpt = os.path.join(str(tmp_path), "ckpt")
    assert_reports_ok(shared_pool.run(fsdp2_dcp_worker, ckpt, timeout=240))


@ON_WS_2_3
def test_functional_collectives_on_mesh(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(funcol_mesh_worker))


# ============================================= split and shrink (ringpg), world size 4

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
    from ringpg._registration import served_devices

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
            cuda = ringpg.backend(child, "cuda")
            if "cuda" in served_devices():
                chk.true(f"{tag}: one backend for cpu and cuda", cuda is b, "two")
            else:
                chk.true(f"{tag}: no cuda backend without a GPU", cuda is None, repr(cuda))
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


@ON_WS_4
@ringpg_split_shrink
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
    tuning(oneshot_bytes=0, segment_bytes=65536, hier_piece_bytes=65536),
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


@ON_WS_4
@ringpg_split_shrink
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


@ON_WS_4
@ringpg_split_shrink
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
    case = "large all_reduce after shrink"  # many segments (segment_bytes in the across-hosts case)
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
ACROSS_HOSTS_ENV = dict((tuning(oneshot_bytes=0, segment_bytes=65536, hier_piece_bytes=65536),))


@ON_WS_4
@ringpg_split_shrink
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
