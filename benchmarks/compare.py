"""ringpg against gloo on the same data: the project's main job.

    torchrun --nproc-per-node 4 benchmarks/compare.py
    torchrun --nproc-per-node 2 benchmarks/compare.py --size 64MiB --iters 10

Every rank initializes the *default* group with backend "ringpg" -- without ``import
ringpg``: the package's ``torch.backends`` entry point registers the name when torch is
imported (the script imports ringpg only if that did not happen, and says so) -- and a
gloo group over the same ranks.  On the same integer-valued data it runs all_reduce,
reduce_scatter_tensor and all_gather_into_tensor with both backends, alternating
iterations, each op bracketed by a gloo barrier, time = median over iterations of the
max over ranks (the conventions of ``benchmarks/bench.py``, shared through the
package's modules: ``cases``, ``data``, ``timing``).

Rank 0 prints one line per op: whether ringpg's result equals gloo's bit for bit, wrong
elements against the exact expected result, both times and the speedup (gloo time /
ringpg time).  Every rank exits 1 if any result disagrees or any op fails, so torchrun
fails too.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence

if __package__ in (None, ""):  # torchrun runs this file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402  (runs the torch.backends entry points, ringpg's included)
import torch.distributed as dist  # noqa: E402

from benchmarks.backends import ensure_registered  # noqa: E402
from benchmarks.cases import CHUNKED_OPS, DTYPES, Case, canonical_dtype, canonical_op  # noqa: E402
from benchmarks.data import CaseBuffers  # noqa: E402
from benchmarks.timing import (  # noqa: E402
    BackendResult,
    CaseResult,
    IterationPolicy,
    measure_case,
    ranks_share_clock,
)
from benchmarks.units import format_bytes, parse_bytes  # noqa: E402
from devkit.groups import transport_of  # noqa: E402
from devkit.launch import torchrun_env  # noqa: E402
from devkit.machine import default_threads, machine_facts  # noqa: E402

DEFAULT_OPS = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node N benchmarks/compare.py", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--size", default="16MiB", help="full buffer size per op (nccl-tests convention)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--ops", default=",".join(DEFAULT_OPS), help="comma list (aliases ar,rs,ag,bc,a2a)")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per backend")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="process-group timeout, seconds")
    ap.add_argument(
        "--backend",
        default="ringpg",
        help="backend under test for the default group (default ringpg; gloo validates the script)",
    )
    args = ap.parse_args(argv)
    try:
        args.ops = [canonical_op(o) for o in args.ops.split(",") if o.strip()]
        args.dtype = canonical_dtype(args.dtype)
        args.size = parse_bytes(args.size)
    except ValueError as e:
        ap.error(str(e))
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    env = torchrun_env()
    if env is None:
        print(
            "compare.py needs ranks from torchrun: torchrun --nproc-per-node 4 benchmarks/compare.py", file=sys.stderr
        )
        return 2
    rank, ws = env
    torch.set_num_threads(default_threads(int(os.environ.get("LOCAL_WORLD_SIZE", ws))))

    how = "built in"
    if args.backend not in ("gloo", "nccl"):
        try:
            explicit = ensure_registered(args.backend)
        except (ImportError, RuntimeError) as e:
            if rank == 0:
                print(
                    f"compare.py: backend {args.backend!r} is not available ({e}); build and install it "
                    "with `pip install --no-build-isolation -e .` from the repository root",
                    file=sys.stderr,
                )
            return 2
        how = (
            "imported explicitly: the entry point did not register it"
            if explicit
            else "registered by its torch.backends entry point, no import"
        )
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group(backend=args.backend, timeout=timeout)
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    under_test = args.backend if args.backend != "gloo" else "gloo(default)"
    groups = {under_test: dist.group.WORLD, "gloo": gloo}
    transport = transport_of(dist.group.WORLD, "cpu")
    policy = IterationPolicy(warmup=args.warmup, iters_min=args.iters, iters_max=args.iters, case_time_s=0.0)
    shared_clock = ranks_share_clock(gloo)

    results: List[CaseResult] = []
    for op in args.ops:
        itemsize = torch.empty((), dtype=DTYPES[args.dtype]).element_size()
        numel = max(1, args.size // itemsize)
        if op in CHUNKED_OPS:
            numel = max(ws, numel // ws * ws)
        case = Case(op, args.dtype, numel, ws)
        bufs = CaseBuffers(case, rank, torch.device("cpu"))
        results.append(
            measure_case(bufs, groups, gloo, policy, cross_check=True, baseline="gloo", shared_clock=shared_clock)
        )
        del bufs

    failed = False
    lines = [
        f"# compare: {under_test} [{how}{', transport ' + transport if transport else ''}] vs gloo, "
        f"world_size={ws}, {args.dtype}, "
        f"size {format_bytes(results[0].case.size_bytes) if results else '-'}, "
        f"median of {args.iters} iterations (max over ranks), torch {torch.__version__}, "
        f"{machine_facts({}, 'cpu')['cpu']} x{os.cpu_count()}",
        f"{'op':<24} {'equal':>6} {'#wrong':>8} {under_test + ' us':>13} {'gloo us':>11} {'speedup':>8} "
        f"{'busbw ' + under_test:>13} {'busbw gloo':>11}",
    ]
    for res in results:
        t, g = res.backends[under_test], res.backends["gloo"]
        equal = t.error is None and g.error is None and t.differs_from_baseline == 0
        failed |= not equal or bool(t.wrong) or bool(g.wrong)

        def us(r: BackendResult) -> str:
            return f"{r.time_us:.0f}" if r.time_us is not None else "ERR"

        def bw(r: BackendResult) -> str:
            return f"{r.busbw_GBps:.3f}" if r.busbw_GBps is not None else "-"

        speed = f"{g.time_us / t.time_us:.2f}x" if t.time_us and g.time_us else "-"
        lines.append(
            f"{res.case.op:<24} {'yes' if equal else 'NO':>6} {f'{t.wrong}/{g.wrong}':>8} "
            f"{us(t):>13} {us(g):>11} {speed:>8} {bw(t):>13} {bw(g):>11}"
        )
        for r in (t, g):
            if r.error:
                lines.append(f"#   ! {r.label}: {r.error}")
            elif r.differs_from_baseline and r.label == under_test:
                lines.append(f"#   ! {r.label}: {r.differs_from_baseline} elements differ from gloo's result")
    lines.append(
        "# equal: bit-identical to gloo's result on the same integer-valued inputs; #wrong: "
        f"elements differing from the exact expected result ({under_test}/gloo); "
        "speedup = gloo time / " + under_test + " time"
    )
    lines.append("# RESULT: " + ("FAILED - results disagree" if failed else "OK - results agree"))
    if rank == 0:
        print("\n".join(lines), flush=True)
    dist.barrier(group=gloo)
    dist.destroy_process_group(gloo)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
