"""A small collective's time per op, the two ways issue 30 looks at it.

* **Back to back** (default): every rank calls the op in a loop, each call timed on its
  own rank; the figure is the slowest rank's median, best of ``--rounds``.  The steady
  state of a loop of small ops, where torch's path and the backend's stay hot.
* **After a barrier** (``--after-barrier``): each op follows its own group's barrier and
  is timed from the last rank's start to the last rank's end (one host, one clock), as
  ``benchmarks.bench`` times it; the median over the iterations.  The path runs cold.

Backends are ``--backends`` entries as the bench reads them (``floor``: torch's fake
group with the flight recorder hook, benchmarks/backends.py), measured in the same
processes, taking turns round by round.  Prints one line per op, size and backend::

    python -m benchmarks.backtoback --ops ar --bytes 4KiB --backends ringpg,floor
    python -m benchmarks.backtoback --ops ar,rs,ag --bytes 4KiB,64KiB --after-barrier

Set ``TORCH_FR_BUFFER_SIZE=0`` to leave torch's flight recorder out of every column.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from benchmarks.backends import new_group_of
from benchmarks.cases import canonical_op
from benchmarks.launch import HUGEPAGES, add_start_argument, run_ranks, use_hugepages
from benchmarks.units import parse_bytes

Key = Tuple[str, int, str]  # op, bytes per rank, backend


def _call(op: str, group: Any, x: torch.Tensor, big: torch.Tensor) -> None:
    if op == "all_reduce":
        dist.all_reduce(x, group=group)
    elif op == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(x, big, group=group)
    elif op == "all_gather_into_tensor":
        dist.all_gather_into_tensor(big, x, group=group)
    else:
        raise ValueError(f"backtoback: {op} is not one of all_reduce, reduce_scatter_tensor, all_gather_into_tensor")


def _rank(rank: int, ws: int, port: int, args: argparse.Namespace, q: Any) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws)
    import ringpg  # noqa: F401 - registers the backend in a spawned rank

    groups = {b: new_group_of(b, timedelta(seconds=60)) for b in args.backends}
    pc = time.perf_counter_ns
    out: Dict[Key, float] = {}
    spans: Dict[Key, List[Tuple[int, int]]] = {}
    for op in args.ops:
        for nbytes in args.bytes:
            x = torch.ones(max(1, nbytes // 4))
            big = torch.ones(x.numel() * ws)
            for rnd in range(args.rounds):
                order = args.backends if rnd % 2 == 0 else args.backends[::-1]
                for b in order:
                    g, key = groups[b], (op, nbytes, b)
                    for _ in range(max(1, args.iters // 5)):  # warm-up
                        _call(op, g, x, big)
                    dist.barrier(group=g)
                    if args.after_barrier:
                        for _ in range(args.iters):
                            dist.barrier(group=g)
                            t0 = pc()
                            _call(op, g, x, big)
                            spans.setdefault(key, []).append((t0, pc()))
                        continue
                    times = [0] * args.iters
                    for i in range(args.iters):
                        t0 = pc()
                        _call(op, g, x, big)
                        times[i] = pc() - t0
                    out[key] = min(out.get(key, float("inf")), statistics.median(times) / 1000)
    keys = sorted(spans) if args.after_barrier else sorted(out)
    if args.after_barrier:
        # Every rank's (start, end) of each op; an op's time runs from the last start to the last end.
        local = torch.tensor([spans[k] for k in keys], dtype=torch.int64)
        every = [torch.empty_like(local) for _ in range(ws)]
        dist.all_gather(every, local)
        last = torch.stack(every).amax(dim=0)
        figures = [
            statistics.median(((last[i, :, 1] - last[i, :, 0]).double() / 1000).tolist()) for i in range(len(keys))
        ]
    else:
        mine = torch.tensor([out[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank's median
        figures = mine.tolist()
    dist.destroy_process_group()
    q.put((rank, list(zip(keys, figures))))


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="ar", help="comma list: ar, rs, ag (or the full names)")
    ap.add_argument("--bytes", default="4KiB", help="comma list of sizes per rank (4KiB, 64KiB, ...)")
    ap.add_argument("--backends", default="ringpg,floor", help="comma list, as the bench's --backends")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5000, help="timed ops per round and backend")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--after-barrier", action="store_true", help="each op after its group's barrier, as the bench")
    ap.add_argument("--hugepages", choices=list(HUGEPAGES), default="native", help="as the bench's --hugepages")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    add_start_argument(ap)
    args = ap.parse_args(argv)
    args.ops = [canonical_op(o) for o in args.ops.split(",")]
    args.bytes = [parse_bytes(b) for b in args.bytes.split(",")]
    args.backends = args.backends.split(",")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    use_hugepages(args.hugepages)
    results = dict(run_ranks(_rank, args.world_size, (args,), args.timeout, args.start))
    how = "after a barrier: last start to last end, median" if args.after_barrier else "back to back: median"
    print(
        f"# world_size={args.world_size} {how}; us per op (TORCH_FR_BUFFER_SIZE={os.environ.get('TORCH_FR_BUFFER_SIZE', 'unset')})"
    )
    for (op, nbytes, backend), us in results[0]:
        print(f"{op:24s} {nbytes:>10d} {backend:10s} {us:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
