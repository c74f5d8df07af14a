"""Fresh tensors every op, as real code allocates them: ops completed and resident memory.

    python -m benchmarks.workload                       # 2 ranks, ringpg then gloo, 15 s per op
    python -m benchmarks.workload --world-size 4 --seconds 5 --rss-ops 4000

Each op (all_reduce, reduce_scatter_tensor, all_gather_into_tensor, broadcast) runs for
``--seconds`` on tensors made for that op alone (``torch.full`` input, ``torch.empty``
output) of a random size from 1,000 to 786,432 float32 elements, the same sequence on
every rank; every result is checked exactly. Ranks stop together: every 50 ops they agree
(a one-element MAX all_reduce, counted as an op) whether rank 0's time is up.

Then the resident-memory phase: ``--rss-ops`` synchronous ops cycling through the four,
each on fresh tensors of 4 KiB to 3 MiB, with rank 1's RSS every 500 ops. Each phase also
reports which of the process's threads took the minor page faults (ringpg's are named
``ringpg-*``; the rest are the caller's and torch's).

A backend runs in processes of its own (RSS is per process), ringpg first, then gloo, with
the same seeds. Where the figures go: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from typing import Any, Dict, List

import torch
import torch.distributed as dist

from devkit.launch import add_start_argument, run_ranks
from devkit.machine import rss_mb

OPS = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast")
MIN_NUMEL, MAX_NUMEL = 1000, 786432
RSS_MIN_BYTES, RSS_MAX_BYTES = 4096, 3 << 20
ROUND = 50  # ops between the ranks' agreement on stopping


def _faults_by_thread() -> Dict[str, int]:
    """Minor page faults so far of each of this process's threads, summed by name."""
    out: Dict[str, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        key = "main" if tid == str(os.getpid()) else name
        out[key] = out.get(key, 0) + int(fields[7])  # field 10 of stat: minflt
    return out


def _delta(after: Dict[str, int], before: Dict[str, int]) -> Dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}


def _one_op(op: str, n: int, rank: int, ws: int) -> bool:
    """One op on fresh tensors of ``n`` elements per rank; True if the result is exact."""
    total = ws * (ws + 1) // 2  # sum of (r + 1): exact in float32
    if op == "all_reduce":
        x = torch.full((n,), float(rank + 1))
        dist.all_reduce(x)
        return bool((x == total).all())
    if op == "reduce_scatter_tensor":
        x = torch.full((n * ws,), float(rank + 1))
        out = torch.empty(n)
        dist.reduce_scatter_tensor(out, x)
        return bool((out == total).all())
    if op == "all_gather_into_tensor":
        x = torch.full((n,), float(rank + 1))
        out = torch.empty(n * ws)
        dist.all_gather_into_tensor(out, x)
        return all(bool((out[r * n : (r + 1) * n] == r + 1).all()) for r in range(ws))
    x = torch.full((n,), float(rank + 1)) if rank == 0 else torch.empty(n)
    dist.broadcast(x, src=0)
    return bool((x == 1).all())


def _worker(rank: int, ws: int, port: int, backend: str, args: Any, q: Any) -> None:
    torch.set_num_threads(1)
    if backend == "ringpg":
        import ringpg  # noqa: F401
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws)
    res: Dict[str, Any] = {"rank": rank, "ops": {}, "wrong": 0}
    for op in args.ops:
        rng = random.Random(args.seed)
        dist.barrier()
        f0, t0 = _faults_by_thread(), time.monotonic()
        done, stop = 0, torch.zeros(1)
        while True:
            for _ in range(ROUND):
                res["wrong"] += not _one_op(op, rng.randint(MIN_NUMEL, MAX_NUMEL), rank, ws)
            done += ROUND
            stop.fill_(float(time.monotonic() - t0 >= args.seconds))
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            done += 1
            if stop.item():
                break
        res["ops"][op] = {"ops": done, "seconds": time.monotonic() - t0, "faults": _delta(_faults_by_thread(), f0)}
    if args.rss_ops:
        rng = random.Random(args.seed + 1)
        dist.barrier()
        res["rss"] = [(0, rss_mb())]
        f0 = _faults_by_thread()
        for i in range(1, args.rss_ops + 1):
            n = rng.randint(RSS_MIN_BYTES, RSS_MAX_BYTES) // 4
            res["wrong"] += not _one_op(OPS[i % len(OPS)], n // ws if i % len(OPS) == 1 else n, rank, ws)
            if i % 500 == 0:
                res["rss"].append((i, rss_mb()))
        res["rss_faults"] = _delta(_faults_by_thread(), f0)
    dist.destroy_process_group()
    q.put(res)


def run(backend: str, args: Any) -> List[Dict[str, Any]]:
    timeout = args.seconds * len(args.ops) * 4 + args.rss_ops * 0.2 + 120
    out = run_ranks(_worker, args.world_size, (backend, args), timeout, args.start)
    return sorted(out, key=lambda r: r["rank"])


def _top(faults: Dict[str, int], k: int = 3) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(faults.items(), key=lambda kv: -kv[1])[:k])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=15.0, help="per op (default 15)")
    ap.add_argument("--ops", default=",".join(OPS), help="comma list of " + ", ".join(OPS))
    ap.add_argument("--rss-ops", type=int, default=4000, help="ops of the memory phase (0: none)")
    ap.add_argument("--backends", default="ringpg,gloo")
    ap.add_argument("--seed", type=int, default=0)
    add_start_argument(ap)
    args = ap.parse_args()
    args.ops = [o for o in args.ops.split(",") if o]
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
    print(
        f"# fresh tensors every op: world size {args.world_size}, {args.seconds:g} s per op, "
        f"{MIN_NUMEL}-{MAX_NUMEL} float32 elements; load {os.getloadavg()[0]:.2f}; torch {torch.__version__}"
    )
    results = {b: run(b, args) for b in args.backends.split(",")}
    wrong = sum(r["wrong"] for rs in results.values() for r in rs)
    print(
        f"\n{'op':<24}" + "".join(f"{b + ' ops':>14}" for b in results) + "   ratio   page faults of rank 1 by thread"
    )
    for op in args.ops:
        counts = [rs[0]["ops"][op]["ops"] for rs in results.values()]
        ratio = counts[0] / counts[1] if len(counts) > 1 and counts[1] else float("nan")
        faults = " | ".join(f"{b}: {_top(rs[1 % len(rs)]['ops'][op]['faults'])}" for b, rs in results.items())
        print(f"{op:<24}" + "".join(f"{c:>14}" for c in counts) + f"   {ratio:5.2f}x  {faults}")
    if args.rss_ops:
        print(
            f"\nRSS of rank {1 % args.world_size} (MB) over {args.rss_ops} synchronous ops on fresh 4 KiB-3 MiB tensors:"
        )
        for b, rs in results.items():
            r1 = rs[1 % len(rs)]
            print(f"  {b:<8}" + " ".join(f"{mb:7.0f}" for _, mb in r1["rss"]) + f"   faults: {_top(r1['rss_faults'])}")
    print(f"\n{wrong} wrong results")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
