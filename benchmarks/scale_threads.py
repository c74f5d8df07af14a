"""Ranks as threads: ringpg's own costs at 64 to 1,024 ranks on one machine.

    python -m benchmarks.scale_threads                      # 64, 256 and 1024 ranks
    python -m benchmarks.scale_threads --world-sizes 64 --ops allreduce,alltoall
    python -m benchmarks.scale_threads --world-sizes 10000 --ranks-per-host 8 \
        --ops barrier,allreduce_1m --timeout 1200               # issue 58's run

With ``--ranks-per-host K`` each rank's group gets the host identity of emulated host
r // K (RingBackend's ``host_id``, RINGPG_HOSTID for one group), so the hierarchical
algorithms run: rings inside each host, then K rings across the hosts.

Each rank is a thread that creates its own ringpg group (``RingBackend``, over real
loopback sockets, ``RINGPG_TRANSPORT=tcp``), as torchft's tests run ranks as threads; the
threads live in a few processes (``--processes``, default one per 256 ranks: each
process's descriptor limit, raised to its hard limit, must hold its ranks' sockets,
about six per rank after creation, 2(N-1) after a direct all-to-all, O(log N) after
Bruck's, which tuning key alltoall=auto runs from 512 ranks), forked from a server
that imported torch, so torch's import is paid once. The Store's server runs in the
launcher, and each rank has a client of its own (not counted). Printed per world size: the creation time (from the moment every process and
Store client is up to the last group's return), and per rank: sockets, threads and resident
memory that creation added; then each op (checked on every rank), timed from the first
process's start to the last one's end, and the sockets per rank after it; and what
creation asked of the Store: requests per rank, the bytes a rank other than 0 read
(constant in the size: issue 58) and the bytes rank 0 read (every rank's values).
Issues 33 and 58; figures go to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import threading
import time
from datetime import timedelta
from typing import Any, Callable, List

import torch
import torch.distributed as dist

from devkit.launch import quick_reverse_lookups, run_ranks, store_barrier
from devkit.machine import open_sockets, rss_mb, threads

# One ring allreduce's elements per rank: 256 KiB, past the small allreduce's limit.
RING_NUMEL = 1 << 16
MIB_NUMEL = 1 << 18  # allreduce_1m: 1 MiB of float32 a rank
SMALL_NUMEL = 8  # recursive doubling past 8 ranks


def _on_ranks(ranks: range, fn: Callable[[int], Any]) -> List[Any]:
    """fn(rank) on one thread per rank, all at once; the results in rank order; the first
    error re-raised."""
    out: List[Any] = [None] * len(ranks)
    errors: List[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = fn(ranks[i])
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(ranks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        # A rank that failed first names its own cause; the others name the rank that
        # aborted the group: raise a first failure where one is here.
        raise next((e for e in errors if "aborted the group" not in str(e)), errors[0])
    return out


def _process(
    index: int,
    procs: int,
    _port: int,
    ws: int,
    ops: List[str],
    timeout_s: float,
    store_port: int,
    backend: str,
    per_host: int,
    q: Any,
) -> None:
    """Process `index` of `procs`: holds ranks index*ws/procs ... as threads."""
    from ringpg._loader import load_extension

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    torch.set_num_threads(1)
    os.environ.setdefault("RINGPG_TRANSPORT", "tcp")
    # gloo-lazy: ProcessGroupGloo connecting each pair on first use (torch's
    # TORCH_GLOO_LAZY_INIT), as ringpg does; plain gloo connects every pair at creation.
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1" if backend == "gloo-lazy" else "0"
    C = load_extension()
    per = ws // procs
    mine = range(index * per, (index + 1) * per)

    # A Store client per rank: one client's socket carries one request at a time, and
    # group creation blocks in get() on several threads at once.  Opened before the
    # counts start, so they count the groups' sockets only.
    def client() -> Any:
        return dist.TCPStore("127.0.0.1", store_port, procs + 1, False, timeout=timedelta(seconds=timeout_s))

    store = client()
    stores = {r: client() for r in mine}
    sockets0, threads0, rss0 = open_sockets(), threads(), rss_mb()
    store_barrier(store, "go", procs)
    go = time.time()

    def make(r: int) -> Any:
        if backend == "ringpg":
            host = f"emulated-{r // per_host}" if per_host else ""
            return C.RingBackend(stores[r], r, ws, timedelta(seconds=timeout_s), f"t{ws}", "tcp", host_id=host)
        return dist.ProcessGroupGloo(stores[r], r, ws, timedelta(seconds=timeout_s))

    groups = dict(zip(mine, _on_ranks(mine, make)))
    res: dict = {
        "go": go,
        "created": time.time(),
        "sockets": open_sockets() - sockets0,
        "threads": threads() - threads0,
        "rss_mb": rss_mb() - rss0,
        # What each group's creation asked of the Store (RingBackend.store_traffic; gloo
        # does not count its own).
        "store": {r: g.store_traffic for r, g in groups.items()} if backend == "ringpg" else {},
    }
    for op in ops:
        store_barrier(store, f"start {op}", procs)
        t0 = time.time()
        try:
            ok = all(_on_ranks(mine, lambda r, run=_OPS[op]: run(groups[r], r, ws)))
        except Exception as e:  # noqa: BLE001 - reported in the table's row
            ok = False
            res.setdefault("errors", []).append(f"{op}: {e}")
        res[op] = (t0, time.time(), ok, open_sockets() - sockets0)
    store_barrier(store, "done", procs)
    if backend == "ringpg":
        _on_ranks(mine, lambda r: groups[r].shutdown())
    q.put(res)


def measure(ws: int, procs: int, ops: List[str], timeout_s: float, backend: str, per_host: int = 0) -> dict:
    """ws ranks as threads of `procs` processes (forked from a server that imported
    torch), over a TCPStore served here; `per_host` ranks an emulated host (0: one host)."""
    server = dist.TCPStore("127.0.0.1", 0, procs + 1, True, wait_for_workers=False)
    limit = timeout_s * (len(ops) + 1) + 60  # creation and each op may take a group's timeout
    parts = run_ranks(_process, procs, (ws, ops, timeout_s, server.port, backend, per_host), limit, "forkserver")
    res: dict = {
        "ranks": ws,
        # From the first process's start (every process and Store client up) to the last group.
        "create_s": max(p["created"] for p in parts) - min(p["go"] for p in parts),
        "sockets": sum(p["sockets"] for p in parts) / ws,
        "threads": sum(p["threads"] for p in parts) / ws,
        "rss_mb": sum(p["rss_mb"] for p in parts) / ws,
    }
    store = {r: t for p in parts for r, t in p["store"].items()}
    if store:
        others = [store[r]["bytes_read"] for r in range(1, ws)] or [0]
        res["store_read_B"] = sum(others) / len(others)  # a rank other than 0: constant in ws
        res["store_read_max_B"] = max(others)
        res["store_read0_B"] = store[0]["bytes_read"]  # rank 0 reads every rank's values
        res["store_requests"] = sum(t["requests"] for t in store.values()) / ws
    res["errors"] = [e for p in parts for e in p.get("errors", [])]
    for op in ops:
        start = min(p[op][0] for p in parts)
        res[op] = (
            max(p[op][1] for p in parts) - start,
            all(p[op][2] for p in parts),
            sum(p[op][3] for p in parts) / ws,
        )
    return res


_expected: dict = {}
_expected_lock = threading.Lock()


def _allreduce_of(numel: int, b: Any, r: int, ws: int) -> bool:
    """An allreduce of numel float32 (rank r holds r % 7) on every rank, compared with one
    expected tensor a process (a comparison's own tensor a rank would add a quarter of
    the buffer to every rank's memory: at 10,000 ranks on one machine that counts)."""
    x = torch.full((numel,), float(r % 7))
    b.allreduce([x]).wait()
    with _expected_lock:
        want = _expected.get((numel, ws))
        if want is None:
            want = _expected[(numel, ws)] = torch.full((numel,), float(sum(q % 7 for q in range(ws))))
    return torch.equal(x, want)


def _ring_allreduce(b: Any, r: int, ws: int) -> bool:
    return _allreduce_of(RING_NUMEL, b, r, ws)


def _mib_allreduce(b: Any, r: int, ws: int) -> bool:
    return _allreduce_of(MIB_NUMEL, b, r, ws)


def _all_gather_object(b: Any, r: int, ws: int) -> bool:
    """torch's all_gather_object as it runs on a group (distributed_c10d.py): each rank's
    pickle's size all-gathered, then every pickle padded to the largest and all-gathered;
    checked on the gathered bytes (each rank's object is {"rank": r, "host": ...})."""

    def obj(q: int) -> dict:
        return {"rank": q, "host": f"h{q // 8}"}

    def pickled(q: int) -> torch.Tensor:
        return torch.frombuffer(bytearray(pickle.dumps(obj(q))), dtype=torch.uint8)

    mine = pickled(r)
    sizes = torch.empty(ws, dtype=torch.int64)
    b._allgather_base(sizes, torch.tensor([mine.numel()], dtype=torch.int64)).wait()
    most = int(sizes.max())
    out = torch.empty(ws * most, dtype=torch.uint8)
    padded = torch.zeros(most, dtype=torch.uint8)
    padded[: mine.numel()] = mine
    b._allgather_base(out, padded).wait()
    rows = out.view(ws, most)
    # Spot-checked at a few ranks (every rank's unpickling of every object would be the
    # harness's own N^2 Python work): the sizes, then those ranks' objects.
    return all(
        int(sizes[q]) == pickled(q).numel() and pickle.loads(rows[q, : int(sizes[q])].numpy().tobytes()) == obj(q)
        for q in {0, ws // 2, ws - 1, (r + 1) % ws}
    )


def _small_allreduce(b: Any, r: int, ws: int) -> bool:
    x = torch.full((SMALL_NUMEL,), r, dtype=torch.int64)
    b.allreduce([x]).wait()
    return bool((x == ws * (ws - 1) // 2).all())


def _barrier(b: Any, r: int, ws: int) -> bool:
    b.barrier(dist.BarrierOptions()).wait()
    return True


def _alltoall(b: Any, r: int, ws: int) -> bool:
    inp = torch.arange(ws, dtype=torch.int32) + r * ws  # block q goes to rank q
    out = torch.empty(ws, dtype=torch.int32)
    b.alltoall_base(out, inp, [], [], dist.AllToAllOptions()).wait()
    return bool(torch.equal(out, torch.arange(ws, dtype=torch.int32) * ws + r))


_OPS = {
    "allreduce": _ring_allreduce,
    "small_allreduce": _small_allreduce,
    "alltoall": _alltoall,
    "barrier": _barrier,
    "allreduce_1m": _mib_allreduce,
    "all_gather_object": _all_gather_object,
}


def _processes(ws: int, fd_limit: int) -> int:
    """The fewest processes, at least one per 256 ranks, that split ws evenly and hold
    their ranks' sockets after recursive doubling (its ceil(log2 ws) partners both ways,
    the rings' six neighbours, the listener and two Store connections; a process holds
    both ends of its own ranks' pairs) within the descriptor limit."""
    per_rank = 2 * ((ws - 1).bit_length() + 6) + 4
    least = max(-(-ws // 256), -(-ws * per_rank // fd_limit))
    return next(p for p in range(least, ws + 1) if ws % p == 0)


def _sysctl(name: str) -> str:
    """A kernel setting's value as /proc/sys shows it ("?" where it cannot be read)."""
    try:
        with open(f"/proc/sys/{name}") as f:
            return " ".join(f.read().split())
    except OSError:
        return "?"


def main() -> int:
    quick_reverse_lookups()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-sizes", default="64,256,1024")
    ap.add_argument("--ops", default="allreduce,small_allreduce,alltoall,barrier", help=f"of {','.join(_OPS)}")
    ap.add_argument("--timeout", type=float, default=300.0, help="each group's timeout, seconds")
    ap.add_argument(
        "--backend",
        choices=("ringpg", "gloo-lazy", "gloo"),
        default="ringpg",
        help="whose groups: ringpg's, or ProcessGroupGloo's connecting on first use (gloo-lazy) or every "
        "pair at creation (gloo: 2(N-1) sockets a rank, so a few hundred ranks a process at most)",
    )
    ap.add_argument(
        "--processes",
        type=int,
        default=0,
        help="processes the ranks are spread over (default: the fewest, at least one per 256 ranks, that split "
        "them evenly and hold their sockets within the descriptor limit)",
    )
    ap.add_argument(
        "--ranks-per-host",
        type=int,
        default=0,
        help="emulated hosts of K ranks each (each group's host_id; default: every rank on this one host)",
    )
    args = ap.parse_args()
    ops = [o for o in args.ops.split(",") if o]
    for o in ops:
        if o not in _OPS:
            ap.error(f"unknown op {o!r}")
    from ringpg._loader import load_extension

    C = load_extension()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the Store's server: a socket per rank
    print(
        f"# {args.backend} ranks as threads; fd limit per process {soft} -> {hard}; {os.cpu_count()} CPUs; "
        f"torch {torch.__version__}; {args.ranks_per_host or 'all'} ranks a host"
    )
    # On loopback every rank's listener and Store connections take a port of the
    # ephemeral range, and every rank's threads a pid: the machine's limits on the size.
    ports, pid_max = _sysctl("net/ipv4/ip_local_port_range"), _sysctl("kernel/pid_max")
    print(f"# ephemeral ports {ports}; pid_max {pid_max}")
    # Store: requests a rank made at creation (mean), bytes a rank other than 0 read (mean
    # and most), and bytes rank 0 read.
    head = f"{'ranks':>5} {'procs':>5} {'create s':>9} {'sockets':>8} {'threads':>8} {'RSS MB':>7}"
    head += f" {'st req':>6} {'st B':>6} {'st max':>6} {'st B r0':>8}"
    print(head + "".join(f" {o + ' s':>18} {'ok':>3} {'sockets':>8}" for o in ops))
    for ws in (int(w) for w in args.world_sizes.split(",")):
        procs = args.processes or _processes(ws, hard)
        if ws % procs:
            ap.error(f"{ws} ranks do not split evenly over {procs} processes")
        # The direct all-to-all connects every pair: 2(ws - 1) sockets per rank, and a
        # process holds both ends of its ranks' pairs with each other.  Bruck's connects
        # a peer each way per round, and the ring's two neighbours.
        algo = C.alltoall_algorithm(ws)  # the ranks inherit this process's environment
        peers = ws - 1 if algo == "direct" else min(ws - 1, 2 * (ws - 1).bit_length() + 2)
        need = (ws // procs) * 2 * peers + 64
        run_ops = [o for o in ops if o != "alltoall" or need <= hard]
        if "alltoall" in ops:
            verdict = "run" if "alltoall" in run_ops else f"skipped: over the limit {hard}"
            print(
                f"# {ws} ranks: alltoall {algo} (RINGPG_TUNING alltoall): about {need} descriptors per process, {verdict}"
            )
        if args.ranks_per_host and ws % args.ranks_per_host:
            ap.error(f"{ws} ranks do not split evenly into hosts of {args.ranks_per_host}")
        r = measure(ws, procs, run_ops, args.timeout, args.backend, args.ranks_per_host)
        line = f"{ws:5d} {procs:5d} {r['create_s']:9.2f} {r['sockets']:8.2f} {r['threads']:8.2f} {r['rss_mb']:7.2f}"
        if "store_requests" in r:
            line += f" {r['store_requests']:6.1f} {r['store_read_B']:6.0f} {r['store_read_max_B']:6d}"
            line += f" {r['store_read0_B']:8d}"
        else:
            line += f" {'-':>6} {'-':>6} {'-':>6} {'-':>8}"
        for o in ops:
            took, ok, socks = r.get(o, (float("nan"), None, float("nan")))
            line += f" {took:18.2f} {'-' if ok is None else 'yes' if ok else 'NO':>3} {socks:8.2f}"
        print(line, flush=True)
        # First failures (their own cause) before the ranks that heard of one.
        for e in sorted(r["errors"], key=lambda e: "aborted the group" in e)[:3]:
            # A chain of "rank A aborted the group: ..." ends in the first failure's cause.
            print(f"#   {e if len(e) <= 400 else e[:120] + ' ... ' + e[-280:]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
