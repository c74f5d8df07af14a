"""The all_reduce docs/ring_walkthrough.md traces: run it under torchrun with RINGPG_TRACE set.

    RINGPG_TRACE=/tmp/ring RINGPG_ONESHOT_BYTES=0 torchrun --nproc-per-node 3 docs/ring_demo.py --numel 9
    python -m ringpg.trace /tmp/ring --walkthrough

Rank r contributes 100 * (r + 1) + i at element i, so the sums are easy to check by hand.
"""

import argparse

import ringpg  # noqa: F401  (registers the backend)
import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--numel", type=int, default=9)
ap.add_argument("--iters", type=int, default=1)
args = ap.parse_args()

dist.init_process_group("ringpg")
rank = dist.get_rank()
for _ in range(args.iters):
    x = torch.arange(args.numel, dtype=torch.float32) + 100.0 * (rank + 1)
    dist.barrier()  # ranks start each all_reduce together, so its timeline shows the ring, not the skew
    dist.all_reduce(x)
if rank == 0:
    print("result:", x[:12].tolist(), "..." if args.numel > 12 else "")
dist.destroy_process_group()
