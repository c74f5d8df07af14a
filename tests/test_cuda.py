"""CUDA tensors: ringpg against gloo's CUDA path, several ranks sharing one GPU.

Skipped where torch sees no GPU (CI, and machines without one).  Covers the serial
staging path (small tensors, every collective), the pipelined staging of large
allreduces, reduce-scatters and all-gathers (algorithms/staged_ring.h: on the ring at two
ranks, over the host arena at three), point-to-point through host copies, and the stream
contract: an op is ordered after the work queued on the caller's current stream
(side streams included, the FSDP2 pattern), and Work.wait() orders the current
stream after the op.
"""

from __future__ import annotations

from typing import Any

import harness
import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

WORLD_SIZES = [2, 3]


def _cuda_cases(rank: int, ws: int, groups: harness.Groups, args: Any) -> harness.CheckReport:
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
    reports = harness.run_workers(_cuda_cases, world_size, timeout=600)
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


@pytest.mark.parametrize("world_size", [2, 3])  # 2: the staged ring; 3: the arena staged in pieces
def test_ops_are_ordered_after_the_callers_stream(world_size: int) -> None:
    reports = harness.run_workers(_stream_contract, world_size, timeout=600)
    harness.assert_reports_ok(reports)
