"""CUDA tensors: ringpg against gloo on the same values, several ranks sharing one GPU.

Skipped where torch sees no GPU (CI, and machines without one).  Covers the serial
staging path (small tensors), the pipelined staging of large allreduces,
reduce-scatters and all-gathers (algorithms/staged_ring.h: straight into and out of the
host arena, through pinned copies where its segment is not registered with the device,
and on the ring without an arena); every other collective and point-to-point op on device
tensors (reduce and every ReduceOp, the list forms, gather, scatter, all-to-all with
uneven splits, the coalesced forms, send/recv, barrier) against gloo on host copies;
DDP with ``device_ids`` against the same on gloo's CUDA path and FSDP2 on a CUDA mesh against a plain
model (harness.models' tolerances); and the stream contract: an op is ordered after
the work queued on the caller's current stream (side streams included, the FSDP2
pattern), and Work.wait() orders the current stream after the op.
"""

from __future__ import annotations

from typing import Any

import harness
import pytest
import torch
import torch.distributed as dist
from harness.models import (
    DDP_CONFIGS,
    FSDP_ATOL,
    FSDP_RTOL,
    build_ddp,
    close_bound,
    sharded_mlp,
    train_ddp,
    train_fsdp_and_reference,
)

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]

WORLD_SIZES = [2, 3]


def _cuda_cases(rank: int, ws: int, groups: harness.Groups, args: Any) -> harness.CheckReport:
    if args == "refuse registration":
        from ringpg import _C

        _C.refuse_device_registration(True)  # before the group's first device op asks
    chk = harness.Checker(rank)
    dev = torch.device("cuda", 0)
    for numel in [0, 1, ws + 1, 1000, 2**22 + 3]:  # 2**22+3 floats: the pipelined path
        for dtype in [torch.float32, torch.bfloat16, torch.int64]:
            case = f"n{numel}-{dtype}"
            x = harness.make_data(rank, case, [numel], dtype).to(dev)
            a, b = x.clone(), x.clone()
            dist.all_reduce(a, group=groups.test)
            dist.all_reduce(b, group=groups.ref)
            chk.equal(f"all_reduce {case}", a.cpu(), b.cpu())
            avg = x.clone()
            if dtype != torch.int64:
                dist.all_reduce(avg, op=dist.ReduceOp.AVG, group=groups.test)
                chk.equal(f"all_reduce AVG {case}", avg.cpu(), harness.divide_by_world(b.cpu(), ws))
            out_t = torch.empty(numel * ws, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out_t, x, group=groups.test)
            chk.equal(f"all_gather {case}", out_t.cpu(), harness.ref_all_gather(x.cpu(), groups.ref))
            # In place, as FSDP calls it: the input is this rank's chunk of the output.
            inplace = torch.zeros(numel * ws, dtype=dtype, device=dev)
            inplace.narrow(0, rank * numel, numel).copy_(x)
            dist.all_gather_into_tensor(inplace, inplace.narrow(0, rank * numel, numel), group=groups.test)
            chk.equal(f"all_gather in place {case}", inplace.cpu(), harness.ref_all_gather(x.cpu(), groups.ref))
            full = harness.make_data(rank, "rs" + case, [numel * ws], dtype).to(dev)
            rs = torch.empty(numel, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(rs, full, group=groups.test)
            chk.equal(f"reduce_scatter {case}", rs.cpu(), harness.ref_reduce_scatter(full.cpu(), "SUM", groups.ref))
            bc = x.clone()
            dist.broadcast(bc, src=ws - 1, group=groups.test)
            chk.equal(f"broadcast {case}", bc.cpu(), harness.ref_broadcast(x.cpu(), ws - 1, groups.ref))
    # Point-to-point around the ring, through host copies.
    send = torch.full((4096,), float(rank), device=dev)
    recv = torch.empty(4096, device=dev)
    ops = [
        dist.P2POp(dist.isend, send, (rank + 1) % ws, group=groups.test),
        dist.P2POp(dist.irecv, recv, (rank - 1) % ws, group=groups.test),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    chk.equal("p2p ring", recv.cpu(), torch.full((4096,), float((rank - 1) % ws)))
    return chk.report()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_cuda_collectives_match_gloo(world_size: int) -> None:
    # Large device tensors go straight into and out of the host arena (its segment
    # registered with the device) at both world sizes.
    reports = harness.run_workers(_cuda_cases, world_size, timeout=600)
    harness.assert_reports_ok(reports)


def test_cuda_collectives_on_the_staged_ring_match_gloo() -> None:
    # Links alone (RINGPG_ALGO=ring, no arena): the staged ring.
    reports = harness.run_workers(_cuda_cases, 2, spec=harness.InitSpec(env=(("RINGPG_ALGO", "ring"),)), timeout=600)
    harness.assert_reports_ok(reports)


def test_cuda_collectives_staged_through_pinned_copies_match_gloo() -> None:
    # Where the arena's segment cannot be registered with the device: pinned copies in
    # pieces, into and out of the arena by the CPU (three ranks: the arena's choice).
    reports = harness.run_workers(_cuda_cases, 3, args="refuse registration", timeout=600)
    harness.assert_reports_ok(reports)


def _cuda_surface(rank: int, ws: int, groups: harness.Groups, args: Any) -> harness.CheckReport:
    """Every other collective and point-to-point op on device tensors, against gloo on host copies."""
    chk = harness.Checker(rank)
    dev = torch.device("cuda", 0)
    test, ref = groups.test, groups.ref
    for numel in [0, 3, 2**20 + 5]:  # 2**20+5 floats: several pieces of every staged path
        for dtype in [torch.float32, torch.int64]:
            case = f"n{numel}-{dtype}"
            x = harness.make_data(rank, case, [numel], dtype)
            for op in ["SUM", "AVG", "MAX", "MIN", "PRODUCT"]:
                if op == "AVG" and dtype == torch.int64:
                    continue
                data = harness.make_data(
                    rank, case + op, [numel], dtype, kind="product" if op == "PRODUCT" else "small"
                )
                want = harness.ref_all_reduce(data, op, ref)  # every rank joins the reference
                a = data.to(dev, copy=True)
                dist.all_reduce(a, op=harness.reduce_op(op), group=test)
                chk.equal(f"all_reduce {op} {case}", a.cpu(), want)
                r = data.to(dev, copy=True)
                dist.reduce(r, dst=ws - 1, op=harness.reduce_op(op), group=test)
                if rank == ws - 1:
                    chk.equal(f"reduce {op} {case}", r.cpu(), want)
            # The list forms.
            outs = [torch.full((numel,), -1, dtype=dtype, device=dev) for _ in range(ws)]
            dist.all_gather(outs, x.to(dev), group=test)
            chk.equal(f"all_gather list {case}", torch.cat([o.cpu() for o in outs]), harness.ref_all_gather(x, ref))
            full = harness.make_data(rank, "rs" + case, [numel * ws], dtype)
            rs = torch.empty(numel, dtype=dtype, device=dev)
            dist.reduce_scatter(rs, [full.narrow(0, q * numel, numel).to(dev) for q in range(ws)], group=test)
            chk.equal(f"reduce_scatter list {case}", rs.cpu(), harness.ref_reduce_scatter(full, "SUM", ref))
            # Gather and scatter, rooted at the last rank.
            root = ws - 1
            gl = [torch.empty(numel, dtype=dtype, device=dev) for _ in range(ws)] if rank == root else None
            dist.gather(x.to(dev), gather_list=gl, dst=root, group=test)
            if gl is not None:
                chk.equal(f"gather {case}", torch.cat([g.cpu() for g in gl]), harness.ref_all_gather(x, ref))
            else:
                harness.ref_all_gather(x, ref)  # every rank joins the reference
            parts = [harness.make_data(root, f"scatter {case} {q}", [numel], dtype) for q in range(ws)]
            sc = torch.empty(numel, dtype=dtype, device=dev)
            dist.scatter(sc, [p.to(dev) for p in parts] if rank == root else None, src=root, group=test)
            chk.equal(f"scatter {case}", sc.cpu(), parts[rank])
            # All-to-all, even and uneven: rank r sends (r + q) % 3 + numel % 5 elements to rank q.
            even = harness.make_data(rank, "a2a" + case, [numel * ws], dtype)
            a2a = torch.empty_like(even, device=dev)
            dist.all_to_all_single(a2a, even.to(dev), group=test)
            want = torch.empty_like(even)
            dist.all_to_all_single(want, even, group=ref)
            chk.equal(f"all_to_all_single {case}", a2a.cpu(), want)
            send_splits = [(rank + q) % 3 + numel % 5 for q in range(ws)]
            recv_splits = [(q + rank) % 3 + numel % 5 for q in range(ws)]
            src = harness.make_data(rank, "a2av" + case, [sum(send_splits)], dtype)
            got = torch.empty(sum(recv_splits), dtype=dtype, device=dev)
            dist.all_to_all_single(got, src.to(dev), recv_splits, send_splits, group=test)
            want = torch.empty(sum(recv_splits), dtype=dtype)
            dist.all_to_all_single(want, src, recv_splits, send_splits, group=ref)
            chk.equal(f"all_to_all_single uneven {case}", got.cpu(), want)
            ins = list(src.split(send_splits))
            outl = [torch.empty(n, dtype=dtype, device=dev) for n in recv_splits]
            dist.all_to_all(outl, [t.to(dev) for t in ins], group=test)
            chk.equal(f"all_to_all list {case}", torch.cat([o.cpu() for o in outl]), want)
    # The coalesced forms, as FSDP and DDP's buckets call them.
    xs = [harness.make_data(rank, f"coalesced {i}", [n], torch.float32) for i, n in enumerate([5, 2**19 + 1, 0, 77])]
    ys = [t.to(dev, copy=True) for t in xs]
    with dist._coalescing_manager(group=test):
        for y in ys:
            dist.all_reduce(y, group=test)
    for i, (x, y) in enumerate(zip(xs, ys)):
        chk.equal(f"coalesced all_reduce {i}", y.cpu(), harness.ref_all_reduce(x, "SUM", ref))
    gathered = [torch.empty(x.numel() * ws, device=dev) for x in xs]
    with dist._coalescing_manager(group=test):
        for out, x in zip(gathered, xs):
            dist.all_gather_into_tensor(out, x.to(dev), group=test)
    for i, (x, out) in enumerate(zip(xs, gathered)):
        chk.equal(f"coalesced all_gather_into_tensor {i}", out.cpu(), harness.ref_all_gather(x, ref))
    fulls = [harness.make_data(rank, f"coalesced rs {i}", [x.numel() * ws], torch.float32) for i, x in enumerate(xs)]
    scattered = [torch.empty(x.numel(), device=dev) for x in xs]
    with dist._coalescing_manager(group=test):
        for out, f in zip(scattered, fulls):
            dist.reduce_scatter_tensor(out, f.to(dev), group=test)
    for i, (f, out) in enumerate(zip(fulls, scattered)):
        chk.equal(f"coalesced reduce_scatter_tensor {i}", out.cpu(), harness.ref_reduce_scatter(f, "SUM", ref))
    # Blocking send/recv around the ring (even ranks send first), then a barrier.
    msg = torch.arange(1000, device=dev, dtype=torch.float32) + rank
    got = torch.empty(1000, device=dev)
    right, left = (rank + 1) % ws, (rank - 1) % ws
    if rank % 2 == 0:
        dist.send(msg, right, group=test)
        dist.recv(got, left, group=test)
    else:
        dist.recv(got, left, group=test)
        dist.send(msg, right, group=test)
    chk.equal("send/recv", got.cpu(), torch.arange(1000, dtype=torch.float32) + left)
    dist.barrier(group=test)
    return chk.report()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_op_on_cuda_tensors_matches_gloo(world_size: int) -> None:
    reports = harness.run_workers(_cuda_surface, world_size, timeout=600)
    harness.assert_reports_ok(reports)


def _cuda_training(rank: int, ws: int, groups: harness.Groups, args: Any) -> harness.CheckReport:
    """DDP with device_ids against the same on gloo's CUDA path, and FSDP2 on a CUDA mesh against a plain model."""
    from torch.distributed.device_mesh import init_device_mesh

    chk = harness.Checker(rank)
    dev = torch.device("cuda", 0)
    for cfg in DDP_CONFIGS:
        # Both models on the GPU (gloo's own CUDA path for the reference): the same
        # kernels, so only the communication differs, within harness.models' bounds.
        tag = f"DDP on CUDA {cfg.name} ws={ws}"
        test_ddp, ref_ddp = build_ddp(cfg, rank, groups.test, dev), build_ddp(cfg, rank, groups.ref, dev)
        train_ddp(cfg, test_ddp, rank, dev)
        train_ddp(cfg, ref_ddp, rank, dev)
        test_state = test_ddp.module.state_dict()
        for name, want in ref_ddp.module.state_dict().items():
            got, want = test_state[name].cpu(), want.cpu()
            if want.dtype.is_floating_point:
                chk.within(
                    f"{tag}: {name} (atol={cfg.atol}, rtol={cfg.rtol})",
                    got,
                    want,
                    close_bound(want, cfg.atol, cfg.rtol),
                )
            else:
                chk.equal(f"{tag}: {name}", got, want)
    mesh = init_device_mesh("cuda", (ws,))
    chk.true(
        "the CUDA mesh's group is the backend under test",
        dist.get_backend(mesh.get_group()) == groups.backend,
        str(dist.get_backend(mesh.get_group())),
    )
    trained, plain = train_fsdp_and_reference(sharded_mlp(0, mesh, dev), rank, ws, dev)
    for name, p in plain.named_parameters():
        chk.within(
            f"FSDP2 on CUDA ws={ws}: {name} vs a plain model (rtol={FSDP_RTOL}, atol={FSDP_ATOL})",
            trained[name].cpu(),
            p.detach().cpu(),
            close_bound(p.cpu(), FSDP_ATOL, FSDP_RTOL),
        )
    return chk.report()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ddp_and_fsdp2_on_cuda(world_size: int) -> None:
    reports = harness.run_workers(_cuda_training, world_size, timeout=600)
    harness.assert_reports_ok(reports)


def _stream_contract(rank: int, ws: int, groups: harness.Groups, args: Any) -> harness.CheckReport:
    chk = harness.Checker(rank)
    dev = torch.device("cuda", 0)
    n = 2**22
    side = torch.cuda.Stream()
    expected = sum(range(1, ws + 1)) * 2.0
    for trial in range(3):
        x = torch.zeros(n, device=dev)
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # a long kernel ahead of the fill on the same stream
            x.fill_(rank + 1)
            work = dist.all_reduce(x, group=groups.test, async_op=True)
            work.wait()  # orders `side` after the op; the CPU need not block
            y = x * 2
        side.synchronize()
        chk.equal(f"side-stream async all_reduce, trial {trial}", y.cpu(), torch.full((n,), expected))
        # Reduce-scatter and all-gather of large tensors: the staged ring too, at two ranks.
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)
            full = torch.full((n * ws,), float(rank + 1), device=dev)
            out = torch.empty(n, device=dev)
            dist.reduce_scatter_tensor(out, full, group=groups.test, async_op=True).wait()
            rs2 = out * 2
            gathered = torch.empty(n * ws, device=dev)
            dist.all_gather_into_tensor(gathered, rs2, group=groups.test, async_op=True).wait()
            ag = gathered + 0
        side.synchronize()
        chk.equal(f"side-stream reduce_scatter, trial {trial}", rs2.cpu(), torch.full((n,), expected))
        chk.equal(f"side-stream all_gather, trial {trial}", ag.cpu(), torch.full((n * ws,), expected))
        fut = dist.all_reduce(torch.ones(8, device=dev), group=groups.test, async_op=True).get_future()
        chk.equal("future value", fut.wait()[0].cpu(), torch.full((8,), float(ws)))
    return chk.report()


@pytest.mark.parametrize("algo", ["auto", "ring"])  # the arena staged directly; the staged ring
@pytest.mark.parametrize("world_size", [2, 3])
def test_ops_are_ordered_after_the_callers_stream(world_size: int, algo: str) -> None:
    spec = harness.InitSpec(env=(("RINGPG_ALGO", algo),))
    reports = harness.run_workers(_stream_contract, world_size, spec=spec, timeout=600)
    harness.assert_reports_ok(reports)
