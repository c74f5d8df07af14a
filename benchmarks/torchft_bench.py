"""allreduce under torchft: ringpg's ProcessGroupRingpg against torchft's ProcessGroupGloo.

    python -m benchmarks.torchft_bench [--world-sizes 2,3] [--min-bytes 1MiB] [--max-bytes 64MiB]

Each of N processes (one per rank, one machine) configures both torchft process
groups, ``ringpg.torchft.ProcessGroupRingpg`` and ``torchft.process_group.ProcessGroupGloo``,
on one TCPStore, as torchft's Manager does at a quorum, and times
``pg.allreduce([t], SUM).wait()`` through the torchft wrapper (what ``Manager.allreduce``
calls) on float32 tensors of each size.  The two backends alternate per iteration in the
same processes on the same buffers (the order flips every round); each timed op follows
a barrier of its own group.  An iteration's time is the slowest rank's; the figure is the
median over iterations.  busbw = size / time x 2(N-1)/N (nccl-tests).  The data is
integer-valued, and the result of each backend is checked exactly once per size.
Speed is reported, never asserted.  Needs the torchft extra (``pip install 'ringpg[torchft]'``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

from benchmarks.cases import bus_factor
from benchmarks.units import format_bytes, parse_bytes


def _sizes(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 4
    return out


def _rank(rank: int, ws: int, port: int, sizes: list[int], budget_s: float, out: Any) -> None:
    import torch
    import torch.distributed as dist
    from ringpg.torchft import ProcessGroupRingpg
    from torch.distributed.distributed_c10d import AllreduceOptions, BarrierOptions, ReduceOp
    from torchft.process_group import ProcessGroupGloo

    torch.set_num_threads(1)
    addr = f"localhost:{port}"
    groups = {
        "ringpg": ProcessGroupRingpg(timeout=timedelta(seconds=120)),
        "gloo": ProcessGroupGloo(timeout=timedelta(seconds=120)),
    }
    for name, pg in groups.items():
        pg.configure(f"{addr}/{name}", "0", rank, ws)
    store = dist.TCPStore("localhost", port, is_master=False, wait_for_workers=False)
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.SUM
    results = []
    for size in sizes:
        numel = size // 4
        src = (torch.arange(numel, dtype=torch.float32) % 61 - 30) * (rank + 1)
        expect = (torch.arange(numel, dtype=torch.float32) % 61 - 30) * sum(range(1, ws + 1))
        t = src.clone()
        wrong = {}
        for name, pg in groups.items():  # warm-up and check
            t.copy_(src)
            pg.allreduce([t], opts).wait()
            wrong[name] = int((t != expect).sum())
        t0 = time.perf_counter()
        for pg in groups.values():
            pg.allreduce([t], opts).wait()
        # Iterations: about budget_s per size, agreed on by all ranks (rank 0's count).
        if rank == 0:
            store.set(f"iters/{size}", str(max(3, min(30, int(budget_s / max(time.perf_counter() - t0, 1e-6))))))
        iters = int(store.get(f"iters/{size}"))
        times: dict[str, list[float]] = {n: [] for n in groups}
        for i in range(iters):
            order = list(groups) if i % 2 == 0 else list(groups)[::-1]
            for name in order:
                pg = groups[name]
                t.copy_(src)
                pg.barrier(BarrierOptions()).wait()
                s = time.perf_counter()
                pg.allreduce([t], opts).wait()
                times[name].append(time.perf_counter() - s)
        results.append({"size": size, "times": times, "wrong": wrong})
    for pg in groups.values():
        pg.shutdown()
    out.put((rank, results))


def run(ws: int, sizes: list[int], budget_s: float) -> list[dict[str, Any]]:
    import torch.distributed as dist

    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, ws, store.port, sizes, budget_s, q)) for r in range(ws)]
    for p in procs:
        p.start()
    per_rank = dict(q.get(timeout=900) for _ in range(ws))
    for p in procs:
        p.join(timeout=60)
    rows = []
    for k, size in enumerate(sizes):
        row: dict[str, Any] = {"ws": ws, "size": size}
        for name in ("ringpg", "gloo"):
            per_iter = zip(*(per_rank[r][k]["times"][name] for r in range(ws)))
            sec = statistics.median(max(x) for x in per_iter)
            row[name] = (
                sec,
                size / sec * bus_factor("all_reduce", ws) / 1e9,
                sum(per_rank[r][k]["wrong"][name] for r in range(ws)),
            )
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-sizes", default="2,3")
    ap.add_argument("--min-bytes", default="1MiB")
    ap.add_argument("--max-bytes", default="64MiB")
    ap.add_argument("--budget", type=float, default=1.5, help="seconds of timed iterations per size and backend")
    args = ap.parse_args()
    sizes = _sizes(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes))
    import torch
    import torchft  # noqa: F401 - fail here, not in the ranks, without the extra

    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.node()} {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"{'N':>2} {'size':>7} {'ringpg ms':>10} {'gloo ms':>9} {'ringpg busbw':>13} {'gloo busbw':>11} "
        f"{'ratio':>6}  wrong(r/g)"
    )
    ok = True
    for ws in [int(x) for x in args.world_sizes.split(",")]:
        for row in run(ws, sizes, args.budget):
            (rt, rb, rw), (gt, gb, gw) = row["ringpg"], row["gloo"]
            ok &= rw == 0 and gw == 0
            print(
                f"{ws:>2} {format_bytes(row['size']):>7} {rt * 1e3:>10.2f} {gt * 1e3:>9.2f} "
                f"{rb:>9.2f} GB/s {gb:>6.2f} GB/s {rb / gb:>5.2f}x  {rw}/{gw}",
                flush=True,
            )
    print(f"# load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
