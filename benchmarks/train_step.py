"""A training step's time with DDP and FSDP2 on ringpg and on gloo, side by side.

    python -m benchmarks.train_step                        # 2 ranks, CUDA if present
    python -m benchmarks.train_step --world-sizes 2,4 --device cuda --steps 8

Every rank builds the same MLP (``--layers`` square Linear layers of ``--width``, float32:
8 x 2048 is 33.6M parameters, 134 MB of gradients a step) and trains it with SGD on its
own random batch, once wrapped in DDP (``device_ids`` on CUDA, 25 MB buckets) and once in
FSDP2 (``fully_shard`` per layer and on the root, on a mesh made from the group), each on
a ringpg group and on a gloo group of the same ranks. Steps alternate between the two
backends (one ringpg step, one gloo step, ...) after ``--warmup`` steps each, so that
the machine's drift falls on both; each step ends with the device synchronised and a
barrier on a third (gloo) group, and its time is the slowest rank's. Printed: the median
step in ms per (world size, wrapper, backend) and gloo's time / ringpg's (> 1: ringpg
faster). Ranks share the machine's one GPU where there is one: a training job
with a GPU per rank moves the same bytes. Where the figures go: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Dict, List

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from devkit.launch import add_start_argument, run_ranks

BACKENDS = ("ringpg", "gloo")
WRAPPERS = ("ddp", "fsdp2")


def _model(width: int, layers: int, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    mods: List[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods).to(device)


def _wrap(kind: str, group: Any, device: torch.device, args: Any) -> nn.Module:
    model = _model(args.width, args.layers, device)
    if kind == "ddp":
        ids = [device.index or 0] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids, process_group=group)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, device.type)
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _worker(rank: int, ws: int, port: int, args: Any, q: Any) -> None:
    import ringpg  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws)
    fence = dist.new_group(backend="gloo")  # the step's end, on neither backend measured
    groups = {b: dist.new_group(backend=b) for b in BACKENDS}
    res: Dict[str, Any] = {"rank": rank, "times": {}, "errors": {}}
    gen = torch.Generator(device="cpu").manual_seed(rank)
    for kind in WRAPPERS:
        models, opts = {}, {}
        for b in BACKENDS:
            try:
                models[b] = _wrap(kind, groups[b], device, args)
                opts[b] = torch.optim.SGD(models[b].parameters(), lr=1e-3)
            except Exception as e:  # noqa: BLE001 - reported per backend, the rest goes on
                res["errors"][f"{kind}/{b}"] = f"{type(e).__name__}: {e}"
        x = torch.randn(args.batch, args.width, generator=gen).to(device)
        y = torch.randn(args.batch, args.width, generator=gen).to(device)
        for b in models:
            res["times"][f"{kind}/{b}"] = []
        for i in range(args.warmup + args.steps):
            for b in list(models):
                try:
                    dist.barrier(group=fence)
                    t0 = time.perf_counter()
                    F.mse_loss(models[b](x), y).backward()
                    opts[b].step()
                    opts[b].zero_grad(set_to_none=True)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    took = time.perf_counter() - t0
                except Exception as e:  # noqa: BLE001
                    res["errors"][f"{kind}/{b}"] = f"{type(e).__name__}: {e}"
                    del models[b]
                    continue
                if i >= args.warmup:
                    res["times"][f"{kind}/{b}"].append(took)
        del models, opts
    dist.barrier(group=fence)
    dist.destroy_process_group()
    q.put(res)


def run(ws: int, args: Any) -> Dict[str, Any]:
    """Median step time (the slowest rank's each step) per wrapper/backend, in ms."""
    out = run_ranks(_worker, ws, (args,), args.timeout, args.start)
    errors = {k: v for r in out for k, v in r["errors"].items()}
    med: Dict[str, float] = {}
    for key in out[0]["times"]:
        steps = zip(*(r["times"].get(key, []) for r in out))
        slowest = [max(s) for s in steps]
        if slowest and key not in errors:
            med[key] = 1000 * statistics.median(slowest)
    return {"world_size": ws, "median_ms": med, "errors": errors}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-sizes", default="2")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per world size")
    ap.add_argument("--json", default=None, help="write the results here")
    add_start_argument(ap)
    args = ap.parse_args()
    params = args.layers * (args.width * args.width + args.width)
    print(
        f"# {args.device}, MLP {args.layers} x {args.width} ({params / 1e6:.1f}M parameters, "
        f"{4 * params / 1e6:.0f} MB of gradients), batch {args.batch}, {args.steps} timed steps"
    )
    print(f"{'ws':>3} {'wrapper':<6} {'ringpg ms':>10} {'gloo ms':>10} {'gloo/ringpg':>12}")
    results = []
    for ws in (int(w) for w in args.world_sizes.split(",")):
        r = run(ws, args)
        results.append(r)
        for kind in WRAPPERS:
            rg, gl = r["median_ms"].get(f"{kind}/ringpg"), r["median_ms"].get(f"{kind}/gloo")
            ratio = f"{gl / rg:.2f}x" if rg and gl else "-"
            fmt = lambda v: f"{v:10.1f}" if v else f"{'error':>10}"  # noqa: E731
            print(f"{ws:>3} {kind:<6} {fmt(rg)} {fmt(gl)} {ratio:>12}")
        for key, err in r["errors"].items():
            print(f"    {key}: {err[:200]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv, "results": results}, f, indent=1)
    return 1 if any(f"{k}/ringpg" in r["errors"] for r in results for k in WRAPPERS) else 0


if __name__ == "__main__":
    sys.exit(main())
