"""Group creation at many ranks on one machine: time, sockets, threads and memory per rank.

    python -m benchmarks.scale                          # 8, 16 and 32 ranks
    python -m benchmarks.scale --world-sizes 32,64 --backends ringpg,ringpg-all,gloo,gloo-lazy

For each world size and backend, that many processes (forked from a server that imported
torch once, so the start-up measured is the group's, not the interpreter's) each time
``init_process_group`` (TCP rendezvous on loopback) plus a barrier, count their open
sockets, threads and RSS, run a 1 MiB allreduce (checked), and count the sockets again.
``gloo-lazy`` is gloo with ``TORCH_GLOO_LAZY_INIT=1`` (connections on first use), where the
torch has it; ``ringpg-all`` is ringpg with ``RINGPG_TUNING=connect=all`` (the full mesh at creation;
plain ``ringpg`` connects its ring's neighbours, the rest on first use). The TCPStore's server runs in the launcher, so no rank counts its
connections, and the clock starts once every rank has reached it. Each case runs
``--repeat`` times, the backends interleaved; printed: a run's creation time (its
slowest rank's), best and median over the runs, and the per-rank maxima over all runs.
Issue 33 asks for these figures; they go to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from typing import Any, Dict, List

import torch
import torch.distributed as dist

from devkit.launch import add_start_argument, quick_reverse_lookups, run_ranks, store_barrier
from devkit.machine import open_sockets, rss_mb, threads

BACKENDS = {
    "ringpg": ("ringpg", {}),
    "ringpg-all": ("ringpg", {"RINGPG_TUNING": "connect=all"}),
    "gloo": ("gloo", {}),
    "gloo-lazy": ("gloo", {"TORCH_GLOO_LAZY_INIT": "1"}),
}


def _rank(rank: int, ws: int, _port: int, backend: str, env: Dict[str, str], store_port: int, q: Any) -> None:
    os.environ.update(env)
    torch.set_num_threads(1)
    if backend == "ringpg":
        import ringpg  # noqa: F401
    before = open_sockets()
    store = dist.TCPStore("127.0.0.1", store_port, ws, False, timeout=datetime.timedelta(seconds=120))
    # Every rank has reached the Store before the clock starts: what is timed is the
    # group's creation, not the ranks' start nor a connect to the Store's server that the
    # kernel dropped and TCP retried seconds later (32 ranks connecting at once now and
    # then meet that, whatever the backend).
    store_barrier(store, "scale/ready", ws)
    t0 = time.monotonic()
    dist.init_process_group(backend, store=store, rank=rank, world_size=ws)
    dist.barrier()
    created = time.monotonic() - t0
    res = {
        "rank": rank,
        "create_s": created,
        "sockets_created": open_sockets() - before,
        "threads": threads(),
        "rss_mb": rss_mb(),
    }
    x = torch.full((1 << 18,), float(rank))
    dist.all_reduce(x)
    res["ok"] = bool((x == ws * (ws - 1) / 2).all())
    res["sockets_after_allreduce"] = open_sockets() - before
    dist.barrier()
    dist.destroy_process_group()
    q.put(res)


def run(ws: int, name: str, timeout: float, method: str) -> List[Dict[str, Any]]:
    backend, env = BACKENDS[name]
    # The Store's server lives here, up before any rank: a rank that hosted it would
    # count its connections (one per rank) as its own sockets, and ranks that came up
    # before it would wait out TCPStore's connect back-off (seconds) in their creation time.
    server = dist.TCPStore("127.0.0.1", 0, ws + 1, True, wait_for_workers=False)
    return run_ranks(_rank, ws, (backend, env, server.port), timeout, method)


def main() -> int:
    quick_reverse_lookups()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-sizes", default="8,16,32")
    ap.add_argument("--backends", default="ringpg,gloo,gloo-lazy")
    ap.add_argument("--repeat", type=int, default=3, help="runs per world size and backend, interleaved (default 3)")
    ap.add_argument("--timeout", type=float, default=300.0, help="per run, seconds")
    add_start_argument(ap, default="forkserver")  # creation at many ranks: no interpreter starts
    args = ap.parse_args()
    print(
        f"# group creation on loopback: torch {torch.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'ranks':>5} {'backend':<10} {'create s best/median':>21} {'sockets':>8} {'after AR':>9} "
        f"{'threads':>8} {'RSS MB':>7}  ok"
    )
    bad = 0
    for ws in (int(w) for w in args.world_sizes.split(",")):
        names = args.backends.split(",")
        runs: Dict[str, List[List[Dict[str, Any]]]] = {n: [] for n in names}
        for _ in range(args.repeat):
            for name in names:  # interleaved: a slow spell of the machine hits every backend
                try:
                    rs = run(ws, name, args.timeout, args.start)
                except Exception as e:  # noqa: BLE001 - one failed run is a line, not the end
                    print(f"{ws:>5} {name:<10} failed: {type(e).__name__}: {e}")
                    bad += 1
                    continue
                runs[name].append(rs)
        for name, done in runs.items():
            if not done:
                continue
            slowest = sorted(max(r["create_s"] for r in rs) for rs in done)  # a run's creation: its slowest rank
            every = [r for rs in done for r in rs]
            ok = all(len(rs) == ws and all(r["ok"] for r in rs) for rs in done)
            bad += not ok
            print(
                f"{ws:>5} {name:<10} {slowest[0]:10.2f}/{slowest[len(slowest) // 2]:<10.2f} "
                f"{max(r['sockets_created'] for r in every):8d} {max(r['sockets_after_allreduce'] for r in every):9d} "
                f"{max(r['threads'] for r in every):8d} {max(r['rss_mb'] for r in every):7.0f}  {'yes' if ok else 'NO'}"
            )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
