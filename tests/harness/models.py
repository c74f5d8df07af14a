"""The small models the torch-stack tests train (DDP, FSDP2), on the CPU or a CUDA device.

``tests/test_torch_features.py`` trains them on CPU tensors, ``tests/test_cuda.py`` on
a GPU (DDP with ``device_ids``, FSDP2 on a CUDA mesh); both compare against gloo or a
single-process reference with the tolerances below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .data import make_random_float

TRAIN_STEPS = 3
LR = 0.05
BATCH = 8
IN_DIM, HIDDEN, OUT_DIM = 12, 35, 5  # 35 rows shard unevenly over 2 and 3 ranks
FSDP_ATOL, FSDP_RTOL = 1e-6, 1e-5


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


def build_ddp(
    cfg: DDPConfig, rank: int, group: Any, device: Optional[torch.device] = None
) -> nn.parallel.DistributedDataParallel:
    """The model for ``cfg`` on ``group``; rank-specific initial parameters and buffers.
    On a CUDA ``device`` the model lives there and DDP gets ``device_ids``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.manual_seed(1000 + rank)
    model = TinyNet(batch_norm=cfg.batch_norm, extra_branch=cfg.find_unused)
    if model.bn is not None:
        with torch.no_grad():
            model.bn.running_mean.fill_(float(rank + 1))
            model.bn.running_var.fill_(float(rank + 2))
            model.bn.num_batches_tracked.fill_(10 * rank)
    on_cuda = device is not None and device.type == "cuda"
    if device is not None:
        model = model.to(device)
    ddp = nn.parallel.DistributedDataParallel(
        model,
        device_ids=[device.index or 0] if on_cuda else None,
        process_group=group,
        find_unused_parameters=cfg.find_unused,
        broadcast_buffers=True,
        bucket_cap_mb=0.001,  # several buckets even for this tiny model
    )
    if cfg.hook is not None:
        ddp.register_comm_hook(group, getattr(default_hooks, f"{cfg.hook}_compress_hook"))
    return ddp


def train_ddp(
    cfg: DDPConfig, ddp: nn.parallel.DistributedDataParallel, rank: int, device: Optional[torch.device] = None
) -> None:
    """TRAIN_STEPS of SGD on deterministic per-rank data (identical for both backends)."""
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step in range(TRAIN_STEPS):
        opt.zero_grad(set_to_none=True)
        for micro in range(cfg.micro_batches):
            case = f"ddp {cfg.name} step {step} micro {micro}"
            x = make_random_float(rank, case + " x", (BATCH, IN_DIM), torch.float32).to(device)
            y = make_random_float(rank, case + " y", (BATCH, OUT_DIM), torch.float32).to(device)

            def fwd_bwd() -> None:
                F.mse_loss(ddp(x, use_extra=step % 2 == 1), y).backward()

            if micro < cfg.micro_batches - 1:
                with ddp.no_sync():
                    fwd_bwd()
            else:
                fwd_bwd()
        opt.step()


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


def sharded_mlp(seed: int, mesh: Any, device: Optional[torch.device] = None) -> nn.Module:
    """An MLP from ``seed`` (on ``device``), each layer and the root wrapped with
    fully_shard on ``mesh``."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = MLP().to(device)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded copies of every parameter (DTensor.full_tensor gathers over the mesh)."""
    return {
        n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for n, p in model.named_parameters()
    }


def train_fsdp_and_reference(
    model: nn.Module, rank: int, ws: int, device: Optional[torch.device] = None
) -> tuple[dict[str, torch.Tensor], nn.Module]:
    """TRAIN_STEPS of SGD on the sharded ``model`` (each rank its slice of one global
    batch) and on a plain MLP of the same seed (0) on the whole batch; returns the
    sharded model's full parameters and the reference."""
    torch.manual_seed(0)
    ref = MLP().to(device)  # same seed: same initial parameters as the unsharded model
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for step in range(TRAIN_STEPS):
        # The global batch is the same on every rank; each rank trains on its slice.
        x = make_random_float(0, f"fsdp x {step}", (BATCH * ws, IN_DIM), torch.float32).to(device)
        y = make_random_float(0, f"fsdp y {step}", (BATCH * ws, OUT_DIM), torch.float32).to(device)
        mine = slice(rank * BATCH, (rank + 1) * BATCH)
        F.mse_loss(model(x[mine]), y[mine]).backward()
        opt.step()
        opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    return full_state(model), ref
