"""How fast a CUDA tensor's bytes reach host memory and come back: the ceiling of
ringpg's staging path for CUDA tensors (csrc/algorithms/staged_ring.h, host_buffer.h).

    python -m benchmarks.pinned_copy [--sizes 4MiB,64MiB,256MiB] [--json FILE]

Times, per size, device-to-host and host-to-device copies into pinned memory (torch's
caching host allocator, as ringpg stages) and into pageable memory, on the current
stream and with both directions at once on two streams, in GB/s (median of a few
copies after a warm-up, timed with CUDA events).  Skips, saying so, without a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import torch

from benchmarks.units import parse_bytes


def _timed(fn: Any, reps: int) -> float:
    """Median seconds of ``fn()`` over ``reps`` runs, CUDA events around each."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def measure(nbytes: int, reps: int = 5) -> dict[str, float]:
    """GB/s of each copy of ``nbytes``."""
    n = nbytes // 4
    dev = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    dev2 = torch.empty_like(dev)
    pinned = torch.empty(n, dtype=torch.float32, pin_memory=True)
    pinned2 = torch.empty(n, dtype=torch.float32, pin_memory=True)
    pageable = torch.empty(n, dtype=torch.float32)
    pageable.fill_(1.0)  # faulted in: the copy, not the first touch, is timed
    side = torch.cuda.Stream()

    def both() -> None:
        pinned.copy_(dev, non_blocking=True)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dev2.copy_(pinned2, non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)

    cases = {
        "d2h_pinned": lambda: pinned.copy_(dev, non_blocking=True),
        "h2d_pinned": lambda: dev2.copy_(pinned, non_blocking=True),
        "d2h_pageable": lambda: pageable.copy_(dev),
        "h2d_pageable": lambda: dev2.copy_(pageable),
        "both_pinned": both,
    }
    out = {}
    for name, fn in cases.items():
        fn()  # warm-up
        torch.cuda.synchronize()
        moved = nbytes * (2 if name == "both_pinned" else 1)
        out[name] = moved / _timed(fn, reps) / 1e9
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1MiB,4MiB,16MiB,64MiB,256MiB")
    ap.add_argument("--json", default=None, help="write the figures here too")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("pinned_copy: no GPU (torch.cuda.is_available() is False); nothing measured")
        return 0
    sizes = [parse_bytes(s) for s in args.sizes.split(",")]
    rows = {}
    print(f"# {torch.cuda.get_device_name(0)}, GB/s (median of 5 CUDA-event-timed copies)")
    names = ("d2h_pinned", "h2d_pinned", "both_pinned", "d2h_pageable", "h2d_pageable")
    print(f"{'size':>10} " + " ".join(f"{n:>13}" for n in names))
    for size in sizes:
        r = measure(size)
        rows[size] = r
        print(f"{size:>10} " + " ".join(f"{r[n]:13.1f}" for n in names))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "GBps": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
