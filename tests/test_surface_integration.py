"""Integration with torch's distributed stack on CPU: DDP, FSDP2, functional collectives,
DeviceMesh / DTensor and torch.distributed.checkpoint, at world sizes 2 and 3.

DDP: two models per configuration in the same processes, one on the group under
test and one on the gloo group, built from the same seed (a different seed per
rank, so DDP's initial broadcast matters) and trained on the same per-rank data;
their parameters (and buffers) must agree after a few SGD steps.  Tolerances:

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
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch.nn.functional as F
from harness import (
    Checker,
    CheckReport,
    Groups,
    WorkerPool,
    assert_reports_ok,
    dtype_name,
    make_data,
    make_random_float,
    ref_all_gather,
    ref_all_reduce,
    ref_reduce_scatter,
)
from harness.surface import finish

pytestmark = pytest.mark.parametrize("world_size", [2, 3], ids=lambda ws: f"ws{ws}", scope="module")

TRAIN_STEPS = 3
LR = 0.05
BATCH = 8
IN_DIM, HIDDEN, OUT_DIM = 12, 35, 5  # 35 rows shard unevenly over 2 and 3 ranks


def close_bound(ref: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """Elementwise bound atol + rtol * |ref| (float64), for Checker.within."""
    return atol + rtol * ref.detach().double().abs()


# -------------------------------------------------------------------------- DDP


class TinyNet(nn.Module):
    """Linear -> (BatchNorm) -> ReLU -> Linear, with an optional branch used on odd steps only."""

    def __init__(self, batch_norm: bool = False, extra_branch: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(IN_DIM, HIDDEN)
        self.bn = nn.BatchNorm1d(HIDDEN) if batch_norm else None
        self.fc2 = nn.Linear(HIDDEN, OUT_DIM)
        self.extra = nn.Linear(HIDDEN, OUT_DIM) if extra_branch else None

    def forward(self, x: torch.Tensor, use_extra: bool = False) -> torch.Tensor:
        h = self.fc1(x)
        if self.bn is not None:
            h = self.bn(h)
        h = F.relu(h)
        out = self.fc2(h)
        if self.extra is not None and use_extra:
            out = out + self.extra(h)
        return out


@dataclass(frozen=True)
class DDPConfig:
    """One DDP scenario; ``atol``/``rtol`` bound |test - gloo| on every parameter and buffer."""

    name: str
    hook: Optional[str] = None  # "fp16" or "bf16": default_hooks.<hook>_compress_hook
    find_unused: bool = False  # model has a branch used on odd steps only
    micro_batches: int = 1  # > 1: accumulate under no_sync(), sync on the last
    batch_norm: bool = False  # BatchNorm with rank-specific initial buffers, broadcast_buffers=True
    atol: float = 1e-6
    rtol: float = 1e-5


DDP_CONFIGS = (
    DDPConfig("default"),
    DDPConfig("fp16_compress_hook", hook="fp16", atol=5e-4, rtol=0.0),
    DDPConfig("bf16_compress_hook", hook="bf16", atol=4e-3, rtol=0.0),
    DDPConfig("find_unused_parameters", find_unused=True),
    DDPConfig("no_sync accumulation", micro_batches=3),
    DDPConfig("broadcast_buffers with BatchNorm", batch_norm=True),
)


def build_ddp(cfg: DDPConfig, rank: int, group: Any) -> nn.parallel.DistributedDataParallel:
    """The model for ``cfg`` on ``group``; rank-specific initial parameters and buffers."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.manual_seed(1000 + rank)
    model = TinyNet(batch_norm=cfg.batch_norm, extra_branch=cfg.find_unused)
    if model.bn is not None:
        with torch.no_grad():
            model.bn.running_mean.fill_(float(rank + 1))
            model.bn.running_var.fill_(float(rank + 2))
            model.bn.num_batches_tracked.fill_(10 * rank)
    ddp = nn.parallel.DistributedDataParallel(
        model,
        process_group=group,
        find_unused_parameters=cfg.find_unused,
        broadcast_buffers=True,
        bucket_cap_mb=0.001,  # several buckets even for this tiny model
    )
    if cfg.hook is not None:
        ddp.register_comm_hook(group, getattr(default_hooks, f"{cfg.hook}_compress_hook"))
    return ddp


def train_ddp(cfg: DDPConfig, ddp: nn.parallel.DistributedDataParallel, rank: int) -> None:
    """TRAIN_STEPS of SGD on deterministic per-rank data (identical for both backends)."""
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step in range(TRAIN_STEPS):
        opt.zero_grad(set_to_none=True)
        for micro in range(cfg.micro_batches):
            case = f"ddp {cfg.name} step {step} micro {micro}"
            x = make_random_float(rank, case + " x", (BATCH, IN_DIM), torch.float32)
            y = make_random_float(rank, case + " y", (BATCH, OUT_DIM), torch.float32)

            def fwd_bwd() -> None:
                F.mse_loss(ddp(x, use_extra=step % 2 == 1), y).backward()

            if micro < cfg.micro_batches - 1:
                with ddp.no_sync():
                    fwd_bwd()
            else:
                fwd_bwd()
        opt.step()


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


# ------------------------------------------------------------------------ FSDP2


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(IN_DIM, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, OUT_DIM)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.tanh(x)
        return x


FSDP_ATOL, FSDP_RTOL = 1e-6, 1e-5


def sharded_mlp(seed: int, mesh: Any) -> nn.Module:
    """An MLP from ``seed``, each layer and the root wrapped with fully_shard on ``mesh``."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = MLP()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded copies of every parameter (DTensor.full_tensor gathers over the mesh)."""
    return {
        n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for n, p in model.named_parameters()
    }


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
    torch.manual_seed(0)
    ref = MLP()  # same seed: same initial parameters as the unsharded model
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for step in range(TRAIN_STEPS):
        # The global batch is the same on every rank; each rank trains on its slice.
        x = make_random_float(0, f"fsdp x {step}", (BATCH * ws, IN_DIM), torch.float32)
        y = make_random_float(0, f"fsdp y {step}", (BATCH * ws, OUT_DIM), torch.float32)
        mine = slice(rank * BATCH, (rank + 1) * BATCH)
        F.mse_loss(model(x[mine]), y[mine]).backward()
        opt.step()
        opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    trained = full_state(model)
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


def test_ddp_matches_gloo(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(ddp_worker, timeout=240))


def test_fsdp2_and_checkpoint(shared_pool: WorkerPool, tmp_path: Any) -> None:
    if not hasattr(torch.cpu.Stream, "record_event"):
        # torch 2.6's FSDP2 records events on its CPU streams, which cannot (any backend).
        pytest.skip(f"torch {torch.__version__}: FSDP2 cannot run on CPU (torch.cpu.Stream has no record_event)")
    ckpt = os.path.join(str(tmp_path), "ckpt")
    assert_reports_ok(shared_pool.run(fsdp2_dcp_worker, ckpt, timeout=240))


def test_functional_collectives_on_mesh(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(funcol_mesh_worker))
