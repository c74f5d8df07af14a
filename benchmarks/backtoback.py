"""A small collective's time per op, the two ways issue 30 looks at it.

* **Back to back** (default): every rank calls the op in a loop, each call timed on its
  own rank; the figure is the slowest rank's median, best of ``--rounds``.  The steady
  state of a loop of small ops, where torch's path and the backend's stay hot.
* **After a barrier** (``--after-barrier``): each op follows its own group's barrier and
  is timed from the last rank's start to the last rank's end (one host, one clock), as
  ``benchmarks.bench`` times it; the median over the iterations.  The path runs cold.

Cases, buffers and backends are the bench's (``sweep_cases``, ``CaseBuffers``, ``--dtype``;
``--backends`` entries, ``floor`` being torch's call path alone),
measured in the same processes, taking turns round by round; outputs are not checked
(``bench --check`` does that).  Prints one line per op, size and backend::

    python -m benchmarks.backtoback --ops ar --max-bytes 4KiB --backends ringpg,floor
    python -m benchmarks.backtoback --ops ar,rs,ag --max-bytes 64KiB --after-barrier

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
from benchmarks.cases import canonical_op, sweep_cases
from benchmarks.data import CaseBuffers
from benchmarks.timing import op_times_ns, ranks_share_clock
from benchmarks.units import parse_bytes
from devkit.launch import HUGEPAGES, add_start_argument, run_ranks, use_hugepages

Key = Tuple[str, int, str]  # op, size in bytes (the bench's: the full buffer), backend


def _rank(rank: int, ws: int, port: int, args: argparse.Namespace, q: Any) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws)
    import ringpg  # noqa: F401 - registers the backend in a spawned rank

    groups = {b: new_group_of(b, timedelta(seconds=60)) for b in args.backends}
    shared_clock = ranks_share_clock(dist.group.WORLD)
    pc = time.perf_counter_ns
    medians: Dict[Key, float] = {}
    spans: Dict[Key, List[Tuple[int, int, int]]] = {}
    for case in sweep_cases(args.ops, [args.dtype], ws, args.min_bytes, args.max_bytes):
        bufs = CaseBuffers(case, rank, torch.device("cpu"))
        for rnd in range(args.rounds):
            for b in args.backends if rnd % 2 == 0 else args.backends[::-1]:
                g, key = groups[b], (case.op, case.size_bytes, b)
                for _ in range(max(1, args.iters // 5)):  # warm-up
                    bufs.run(g)
                dist.barrier(group=g)
                if args.after_barrier:
                    for _ in range(args.iters):
                        dist.barrier(group=g)
                        t0 = pc()
                        bufs.run(g)
                        t1 = pc()
                        spans.setdefault(key, []).append((t0, t1, t1 - t0))
                    continue
                times = [0] * args.iters
                for i in range(args.iters):
                    t0 = pc()
                    bufs.run(g)
                    times[i] = pc() - t0
                medians[key] = min(medians.get(key, float("inf")), statistics.median(times) / 1000)
    keys = sorted(spans if args.after_barrier else medians)
    if args.after_barrier:
        # The bench's rule (timing.op_times_ns): the spans' MAX over ranks, then per op
        # the last start to the last end (the slowest rank's own time without one clock).
        every = torch.tensor([spans[k] for k in keys], dtype=torch.int64)
        dist.all_reduce(every, op=dist.ReduceOp.MAX)
        figures = [
            statistics.median((op_times_ns(every[i], 1, shared_clock) / 1000).tolist()) for i in range(len(keys))
        ]
    else:
        mine = torch.tensor([medians[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank's median
        figures = mine.tolist()
    dist.destroy_process_group()
    q.put((rank, list(zip(keys, figures))))


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="ar", help="comma list, as the bench's --ops (ar, rs, ag, bc, a2a)")
    ap.add_argument("--min-bytes", default="4KiB", help="as the bench's: the full buffer, powers of two")
    ap.add_argument("--max-bytes", default="4KiB")
    ap.add_argument("--backends", default="ringpg,floor", help="comma list, as the bench's --backends")
    ap.add_argument("--dtype", default="float32", help="one of the bench's --dtypes (float32, bfloat16, ...)")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5000, help="timed ops per round and backend")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--after-barrier", action="store_true", help="each op after its group's barrier, as the bench")
    ap.add_argument("--hugepages", choices=list(HUGEPAGES), default="native", help="as the bench's --hugepages")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    add_start_argument(ap)
    args = ap.parse_args(argv)
    args.ops = [canonical_op(o) for o in args.ops.split(",")]
    args.min_bytes, args.max_bytes = parse_bytes(args.min_bytes), parse_bytes(args.max_bytes)
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
