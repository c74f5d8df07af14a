"""Where a small collective's time goes: each rank's CPU time per op, itemised (issue 56 item 4).

Each rank runs one op back to back (``benchmarks.backtoback``'s loop: the steady state of
a loop of small ops) for ``--seconds`` while ``perf record`` samples the rank's threads on
the CPU clock; every sample is charged to the function it landed in (self time: no call
graphs, which the libraries here cannot unwind cheaply), and each function to one item by
its library and name (:data:`ITEMS`).  An item's time per op is its samples times the
sampling period over the ops run; the wall time per op beside them says how much of it
the rank spent off the CPU (asleep on a futex).  One table per op and backend::

    python -m benchmarks.op_profile --ops ar,rs,ag --bytes 4KiB
    python -m benchmarks.op_profile --ops ar --backends ringpg,floor --top 15

``floor`` (torch's call path through a backend that touches no data) beside ringpg
shows what torch's own path costs, so that ``ringpg - floor`` is ringpg's part.  Needs
``perf`` (Debian's linux-perf) and ``kernel.perf_event_paranoid`` ≤ 2 for a process's
own threads; the CPU clock is a software event, so it works where the VM has no
hardware counters.  Self time charges ``memcpy`` to the library that runs it, not to
its caller: at a few KiB nearly all of it is the op's data.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence, Tuple

# (item, library pattern, function pattern): the first that matches a sample's library
# and function names it.  Patterns are regular expressions searched case-sensitively.
ITEMS: Tuple[Tuple[str, str, str], ...] = (
    ("flight recorder", r"", r"FlightRecorder|FlightRecord|flight_record|Ticket"),
    ("kernel: futex, scheduler", r"kernel", r"futex|schedule|switch_to|finish_task|pick_next|dequeue|enqueue_task"),
    ("clock reads (vdso: mostly the waits' deadline checks)", r"vdso", r""),
    ("kernel: other", r"kernel", r""),
    ("ringpg: validation", r"_C\.", r"check[A-Z]|toReduction|validat|OpSignature|signatureOf"),
    (
        "ringpg: waits (flags, spins)",
        r"_C\.",
        r"[Ww]ait|await|allArrived|spin|Spin|poll|drive|publishCpu|ringBell|arenaStep",
    ),
    (
        "ringpg: data (copy, reduce)",
        r"_C\.",
        r"reduce|Reduce|[Cc]opy|kernel|Kernel|sum|Sum|gather|Gather|scatter|Scatter",
    ),
    ("ringpg: work, future, completion", r"_C\.", r"RingWork|[Ff]uture|finishWork|complete|Complete"),
    ("ringpg: op set-up (enqueue, plan, sequence)", r"_C\.", r""),
    ("data: memcpy/memset (libc)", r"libc", r"mem(cpy|move|set)"),
    ("allocation (malloc, free)", r"libc|libstdc|jemalloc|tcmalloc", r"malloc|free|new|delete|_int_|cfree|tcache"),
    ("locks and threads (libc)", r"libc|libpthread", r"pthread|mutex|lll_|cond_|sem_|futex"),
    ("libc: other", r"libc|libstdc|libm|libgcc", r""),
    ("torch: c10d (ProcessGroup, Work)", r"libtorch", r"c10d"),
    ("torch: tensors, dispatch", r"libtorch|libc10", r""),
    ("Python interpreter", r"python|libpython", r""),
)
OTHER = "other"


def item_of(dso: str, sym: str) -> str:
    """The item (:data:`ITEMS`) charged for a sample in function ``sym`` of library ``dso``."""
    for name, dso_re, sym_re in ITEMS:
        if (not dso_re or re.search(dso_re, dso)) and (not sym_re or re.search(sym_re, sym)):
            return name
    return OTHER


def parse_report(text: str) -> List[Tuple[int, str, str]]:
    """``perf report --stdio -F sample,dso,sym`` lines as (samples, library, function)."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"\s*(\d+)\s+(\S+)\s+\[[.kgu]\]\s+(.*\S)", line)
        if m:
            rows.append((int(m.group(1)), m.group(2), m.group(3)))
    return rows


def perf_rows(data: str) -> List[Tuple[int, str, str]]:
    """Samples per (library, function) of one ``perf record`` file."""
    out = subprocess.run(
        ["perf", "report", "-i", data, "--stdio", "--no-children", "-F", "sample,dso,sym", "--sort", "dso,sym"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse_report(out)


def _rank(rank: int, ws: int, port: int, args: argparse.Namespace, q: Any) -> None:
    import torch
    import torch.distributed as dist

    from benchmarks.backends import new_group_of
    from benchmarks.cases import sweep_cases
    from benchmarks.data import CaseBuffers

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws)
    import ringpg  # noqa: F401 - registers the backend in a spawned rank

    groups = {b: new_group_of(b, timedelta(seconds=60)) for b in args.backends}
    results = []
    for case in sweep_cases(args.ops, [args.dtype], ws, args.bytes, args.bytes):
        bufs = CaseBuffers(case, rank, torch.device("cpu"))
        for b in args.backends:
            g = groups[b]
            for _ in range(200):  # warm-up
                bufs.run(g)
            data = os.path.join(args.out, f"{case.op}.{b}.rank{rank}.data")
            dist.barrier(group=g)
            perf = subprocess.Popen(
                ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(args.freq), "-p", str(os.getpid()), "-o", data],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)  # perf attaches to every thread
            t0 = time.perf_counter()
            n = 0
            while True:  # until rank 0 says stop: every rank runs the same ops
                for _ in range(100):
                    bufs.run(g)
                n += 100
                if n >= args.min_ops:
                    flag = torch.tensor([1 if time.perf_counter() - t0 >= args.seconds else 0])
                    dist.broadcast(flag, 0)  # on the world group (gloo): not profiled as the op
                    if flag.item():
                        break
            wall = time.perf_counter() - t0
            perf.send_signal(signal.SIGINT)
            perf.wait(timeout=60)
            results.append((case.op, case.size_bytes, b, n, wall, data))
            dist.barrier()
    dist.destroy_process_group()
    q.put((rank, results))


def table(rows: List[Tuple[int, str, str]], ops: int, wall: float, freq: int, top: int) -> List[str]:
    """One rank's itemised CPU time per op, and its ``top`` hottest functions."""
    period_us = 1e6 / freq
    items: Dict[str, int] = defaultdict(int)
    for n, dso, sym in rows:
        items[item_of(dso, sym)] += n
    total = sum(items.values())
    lines = [f"  {'item':54s} {'us/op':>8s} {'share':>6s}"]
    for name, n in sorted(items.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {name:54s} {n * period_us / ops:8.2f} {100 * n / max(total, 1):5.1f}%")
    lines.append(f"  {'on the CPU':54s} {total * period_us / ops:8.2f}")
    lines.append(f"  {'wall':54s} {wall * 1e6 / ops:8.2f}")
    if top:
        lines.append("  hottest functions (us/op, library, function):")
        for n, dso, sym in sorted(rows, reverse=True)[:top]:
            lines.append(f"    {n * period_us / ops:7.2f}  {dso[:28]:28s} {sym[:90]}")
    return lines


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    from benchmarks.cases import canonical_op
    from benchmarks.units import parse_bytes

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="ar,rs,ag", help="comma list, as the bench's --ops")
    ap.add_argument("--bytes", default="4KiB", help="the op's size, as the bench counts it (the full buffer)")
    ap.add_argument("--backends", default="ringpg,floor", help="comma list, as the bench's --backends")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0, help="profiled time per op and backend")
    ap.add_argument("--min-ops", type=int, default=2000)
    ap.add_argument("--freq", type=int, default=20000, help="samples per second of CPU time")
    ap.add_argument("--top", type=int, default=12, help="hottest functions listed per table (0: none)")
    ap.add_argument("--ranks", default="0", help="comma list of ranks whose tables print, or 'all'")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    args = ap.parse_args(argv)
    args.ops = [canonical_op(o) for o in args.ops.split(",")]
    args.bytes = parse_bytes(args.bytes)
    args.backends = args.backends.split(",")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if shutil.which("perf") is None:
        print("op_profile: no `perf` on PATH (Debian: apt-get install linux-perf)", file=sys.stderr)
        return 2
    from devkit.launch import run_ranks

    with tempfile.TemporaryDirectory(prefix="ringpg-op-profile-") as out:
        args.out = out
        results = dict(run_ranks(_rank, args.world_size, (args,), args.timeout, "spawn"))
        show = sorted(results) if args.ranks == "all" else [int(r) for r in args.ranks.split(",")]
        print(
            f"# world_size={args.world_size} dtype={args.dtype} back to back, perf cpu-clock at {args.freq} Hz "
            f"(TORCH_FR_BUFFER_SIZE={os.environ.get('TORCH_FR_BUFFER_SIZE', 'unset')}); us per op, self time"
        )
        for rank in show:
            for op, nbytes, backend, ops, wall, data in results[rank]:
                print(f"\n{op} {nbytes} B {backend} rank {rank}: {ops} ops in {wall:.2f} s")
                print("\n".join(table(perf_rows(data), ops, wall, args.freq, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
