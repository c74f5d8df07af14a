"""How often a rank sleeps per small allreduce: context switches per op per rank.

Each rank runs ``--iters`` allreduces of ``--bytes`` (float32, in place, checked
against the exact sum on every op) on a ringpg group made under ``RINGPG_TUNING``
(``--tunings``: one launch per world size and tuning), after ``--warmup`` untimed
ones, and counts the context switches the loop cost (``getrusage``):

* ``vol/op``, ``invol/op``: voluntary (a sleep: a futex wait, a blocking read) and
  involuntary (preempted) switches of the thread that calls the op, the mean over the
  ranks, and ``max vol/op`` the most any rank had;
* ``proc vol/op``: voluntary switches of every thread of the rank (its group's
  progress thread too), the mean over the ranks;
* ``sleeps/op``, ``wakes/op``: the arena's own counts (``arena_wait_counts`` of the
  rank's backend, where the build has it; ``-`` where not): futex waits of a rank, the
  mean over the ranks, and futex wake calls of all the ranks together;
* ``migr/op``, ``queued us/op``: the op thread's moves between CPUs and its time
  runnable but waiting for a CPU (the kernel's ``/proc/thread-self/sched`` and
  ``schedstat``; ``-`` where the kernel has neither), the mean over the ranks;
* ``us/op``: the slowest rank's mean time per op of the loop;
* ``algo``: what the op ran (``algorithm_for``), ``arena_oneshot`` at 4 KiB.

``--algos`` picks ringpg's algorithm per launch (``ringpg.use_algorithm``: ``auto``,
or ``ring`` for the links alone), and ``--busy`` starts that many busy processes (one
spinning loop each) beside the ranks for the launch: the host one CPU short, where 16
ranks on 16 vCPUs once ran 10-60 times slower (issue 59 item 2).

A wait that sleeps costs one voluntary switch, so with ``spin_us=0`` (every wait
sleeps at once) the least is about (N-1)/N per op: every member but the last to arrive
sleeps once.  Prints one line per world size and tuning::

    python -m benchmarks.wakeups                              # N=4,6,8; spin_us=0 and the default
    python -m benchmarks.wakeups --world-sizes 4 --iters 2000 --tunings spin_us=0
    python -m benchmarks.wakeups --world-sizes 16 --busy 0,1 --algos auto,ring --tunings default
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from benchmarks.units import parse_bytes
from devkit.launch import add_start_argument, busy_processes, run_ranks

DEFAULT = "default"  # a --tunings item: RINGPG_TUNING unset


def _switches(who: int) -> tuple:
    u = resource.getrusage(who)
    return u.ru_nvcsw, u.ru_nivcsw


def _sched() -> Optional[Tuple[int, int]]:
    """The calling thread's moves between CPUs and its nanoseconds queued (runnable, not
    running) so far, as the kernel counts them; None where it does not say."""
    try:
        with open("/proc/thread-self/sched") as f:
            migrations = next(int(line.split(":")[1]) for line in f if line.startswith("se.nr_migrations"))
        with open("/proc/thread-self/schedstat") as f:
            queued = int(f.read().split()[1])
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return migrations, queued


def _arena_counts(group: Any) -> Optional[Dict[str, int]]:
    import ringpg

    b = ringpg.backend(group)
    return getattr(b, "arena_wait_counts", None) if b is not None else None


def measure(group: Any, rank: int, ws: int, nbytes: int, iters: int, warmup: int) -> Dict[str, float]:
    """Runs ``warmup`` + ``iters`` allreduces on ``group``; this rank's counts per op
    (``sleeps``, ``wakes``: -1 where the build does not count them).  Raises
    AssertionError on a wrong sum."""
    t = torch.empty(max(1, nbytes // 4), dtype=torch.float32)
    want = float(ws * (ws + 1) // 2)  # ranks contribute rank + 1: exact in float32
    for _ in range(warmup):
        t.fill_(rank + 1)
        dist.all_reduce(t, group=group)
    bad = 0
    a0 = _arena_counts(group)
    th0, pr0 = _switches(resource.RUSAGE_THREAD), _switches(resource.RUSAGE_SELF)
    s0 = _sched()
    t0 = time.perf_counter()
    for _ in range(iters):
        t.fill_(rank + 1)
        dist.all_reduce(t, group=group)
        if t[0].item() != want or not bool(t.eq(want).all()):
            bad += 1
    t1 = time.perf_counter()
    th1, pr1 = _switches(resource.RUSAGE_THREAD), _switches(resource.RUSAGE_SELF)
    s1 = _sched()
    a1 = _arena_counts(group)
    assert bad == 0, f"rank {rank}: {bad} of {iters} allreduces gave a wrong sum"
    return {
        "vol": (th1[0] - th0[0]) / iters,
        "invol": (th1[1] - th0[1]) / iters,
        "proc_vol": (pr1[0] - pr0[0]) / iters,
        "us": (t1 - t0) / iters * 1e6,
        "sleeps": (a1["sleeps"] - a0["sleeps"]) / iters if a0 is not None and a1 is not None else -1.0,
        "wakes": (a1["wakes"] - a0["wakes"]) / iters if a0 is not None and a1 is not None else -1.0,
        "migr": (s1[0] - s0[0]) / iters if s0 is not None and s1 is not None else -1.0,
        "queued_us": (s1[1] - s0[1]) / iters / 1e3 if s0 is not None and s1 is not None else -1.0,
    }


def _rank(rank: int, ws: int, port: int, args: argparse.Namespace, tuning: str, algo: str, q: Any) -> None:
    if tuning == DEFAULT:
        os.environ.pop("RINGPG_TUNING", None)
    else:
        os.environ["RINGPG_TUNING"] = tuning  # read when the group is made
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws)
    import ringpg  # noqa: F401 - registers the backend in a started rank

    torch.set_num_threads(1)
    with ringpg.use_algorithm(algo):
        g = dist.new_group(backend="ringpg", timeout=timedelta(seconds=120))
    dist.barrier(group=g)
    figures: Dict[str, Any] = dict(measure(g, rank, ws, args.bytes, args.iters, args.warmup))
    figures["algo"] = ringpg.backend(g).algorithm_for("allreduce", args.bytes)
    dist.destroy_process_group()
    q.put((rank, figures))


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-sizes", default="4,6,8", help="comma list")
    ap.add_argument(
        "--tunings",
        default=f"spin_us=0;{DEFAULT}",
        help=f"';'-separated RINGPG_TUNING values, one launch each ('{DEFAULT}': unset)",
    )
    ap.add_argument("--algos", default="auto", help="comma list of ringpg.use_algorithm names, one launch each")
    ap.add_argument("--busy", default="0", help="comma list: busy processes beside the ranks, one launch each")
    ap.add_argument("--bytes", default="4KiB", help="the allreduce's buffer")
    ap.add_argument("--iters", type=int, default=2000, help="counted ops per launch")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per launch")
    add_start_argument(ap)
    args = ap.parse_args(argv)
    args.world_sizes = [int(w) for w in args.world_sizes.split(",")]
    args.tunings = [t.strip() for t in args.tunings.split(";") if t.strip()]
    args.algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    args.busy = [int(b) for b in args.busy.split(",")]
    args.bytes = parse_bytes(args.bytes)
    return args


def _fmt(value: float, width: int, spec: str = ".3f") -> str:
    """``value`` in ``width`` columns, or ``-`` where it was not counted (negative)."""
    return f"{value:{width}{spec}}" if value >= 0 else f"{'-':>{width}s}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    print(f"# allreduce {args.bytes} B float32, {args.iters} ops; per op per rank; load {os.getloadavg()[0]:.2f}")
    print(
        f"{'N':>3s} {'busy':>4s} {'tuning':14s} {'vol/op':>8s} {'max vol/op':>10s} {'invol/op':>9s} "
        f"{'proc vol/op':>11s} {'sleeps/op':>9s} {'wakes/op':>8s} {'migr/op':>8s} {'queued us/op':>12s} "
        f"{'us/op':>9s}  algo"
    )
    for ws in args.world_sizes:
        for busy in args.busy:
            for algo in args.algos:
                for tuning in args.tunings:
                    with busy_processes(busy):
                        launch = run_ranks(_rank, ws, (args, tuning, algo), args.timeout, args.start)
                    rows: List[Dict[str, Any]] = [f for _, f in launch]
                    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0] if k != "algo"}
                    wakes = mean["wakes"] * len(rows) if mean["wakes"] >= 0 else -1.0
                    print(
                        f"{ws:3d} {busy:4d} {tuning:14s} {mean['vol']:8.3f} {max(r['vol'] for r in rows):10.3f} "
                        f"{mean['invol']:9.3f} {mean['proc_vol']:11.3f} {_fmt(mean['sleeps'], 9)} "
                        f"{_fmt(wakes, 8)} {_fmt(mean['migr'], 8)} {_fmt(mean['queued_us'], 12, '.2f')} "
                        f"{max(r['us'] for r in rows):9.1f}  {algo}: {rows[0]['algo']}",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
