"""ringpg benchmark: nccl-tests-style sweep of ringpg against gloo (and nccl on CUDA).

Run from the repository root::

    python -m benchmarks.bench                        # full sweep: 1 KiB..256 MiB, ws 2,3,4,8
    python -m benchmarks.bench --check                # CI: correctness only, small sizes, ws 2,3
    python -m benchmarks.bench --world-sizes 4 --ops all_reduce --max-bytes 64MiB --emulate 1gbit
    python -m benchmarks.bench --backends gloo,gloo   # validate the tool itself (no ringpg needed)
    torchrun --nproc-per-node 4 benchmarks/bench.py   # ranks from torchrun (one world size)

How a number is made (details in ``benchmarks/data.py`` and ``benchmarks/timing.py``):

* The launcher starts ``ws`` ranks (fresh interpreters, or forked from a server that imported torch once: ``--start``; tcp:// rendezvous on
  127.0.0.1 with a free port; under ``--emulate`` one network namespace per rank (per host with ``--hosts``), see
  ``benchmarks/netns.py``).  The default group is gloo; every backend gets its own group
  over the same ranks (``dist.new_group(backend=...)``).
* Per case, backends alternate every iteration on the same buffers; each op follows a
  barrier of its own backend; where the ranks share a clock (one kernel) an op's time
  runs from the last rank's start to the last rank's end, else it is the slowest rank's
  duration; the time is the median over iterations (adaptive count, bounded per case).
  Outputs are verified in untimed rounds, so no check runs between timed ops.
* Inputs are integer-valued and deterministic, so the exact expected output is known on
  every rank: ``#wrong`` counts elements that differ (summed over ranks).
* busbw uses the nccl-tests factors; the ratio column is baseline time / backend time
  (identical to backend busbw / baseline busbw).

Rank 0 (the launcher when it starts the ranks itself) prints the machine facts first,
then the TCP ceiling probe, then one table per world size while it runs, with a
progress line on stderr.  Results go to ``benchmarks/results/`` (CSV, JSON, PNG).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

if __package__ in (None, ""):  # `python benchmarks/bench.py` or torchrun: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from benchmarks import netns  # noqa: E402
from benchmarks.backends import (  # noqa: E402
    FLOOR,
    backend_status,
    ensure_registered,
    expand_specs,
    new_group_of,
    pick_baseline,
    split_spec,
    unique_labels,
)
from benchmarks.cases import (  # noqa: E402
    OPS,
    RINGPG_OP,
    Case,
    canonical_dtype,
    canonical_op,
    check_cases,
    sweep_cases,
)
from benchmarks.data import CaseBuffers  # noqa: E402
from benchmarks.peers import Conductor, default_peers_dir, peer_results, start_peers, summary  # noqa: E402
from benchmarks.table import Progress, TableFormatter, emit  # noqa: E402
from benchmarks.tcp_probe import format_probe, tcp_probe, tcp_ring_probe  # noqa: E402
from benchmarks.timing import IterationPolicy, measure_case, ranks_share_clock  # noqa: E402
from benchmarks.units import format_bytes, parse_bytes, parse_rate  # noqa: E402
from benchmarks.vllm_shm import VLLM, VllmShm, find_library, is_vllm, load  # noqa: E402
from devkit.groups import algorithm_for, algorithm_of, copy_of, transport_of  # noqa: E402
from devkit.launch import (  # noqa: E402
    HUGEPAGES,
    add_start_argument,
    busy_processes,
    die_with_parent,
    free_port,
    hugepages_in_effect,
    rank_context,
    torchrun_env,
    use_hugepages,
)
from devkit.machine import default_threads, format_facts, machine_facts  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = REPO_ROOT / "benchmarks" / "results"

#: Bytes of memory a rank needs per byte of case size (buffers, expected result, backend scratch).
MEMORY_FACTOR = 5


# --------------------------------------------------------------------------------------
# Configuration handed to every rank
# --------------------------------------------------------------------------------------


@dataclass
class WorkerConfig:
    """Everything a rank needs; JSON-serializable (netns ranks read it from a file)."""

    world_size: int
    init_method: str  # tcp://addr:port, or env:// under torchrun
    master_addr: str
    backends: List[str]
    labels: List[str]
    baseline: str
    device: str
    cases: List[Tuple[str, str, int]]  # (op, dtype, numel)
    policy: Dict[str, Any]
    op_timeout_s: float
    probe: bool
    probe_seconds: float
    probe_path: str
    link_GBps: Optional[float]
    result_path: str
    threads: int
    progress: bool
    progress_offset: int = 0
    progress_total: int = 0
    launcher_pid: Optional[int] = None  # ranks die with it (None under torchrun)
    # --pair-dtypes: these dtypes run side by side in each case (cases carry the first).
    pair_dtypes: List[str] = field(default_factory=list)
    extra_env: Dict[str, str] = field(default_factory=dict)
    # --untraced: labels of ringpg groups whose RINGPG_TRACE tracing is switched off.
    untraced: List[str] = field(default_factory=list)
    # --emulate: the TCP ring ceiling (slowest link of the ring probe) an earlier world
    # size measured on the same links; a rank that probes itself uses its own.
    ceiling_GBps: Optional[float] = None
    # --fresh: new input and output tensors for every op (data.CaseBuffers).
    fresh: bool = False
    # --backends ...,vllm: the vLLM library the launcher found and loaded (benchmarks.vllm_shm).
    vllm_lib: Optional[str] = None
    # --vllm-beside: vLLM's column alternates with the others in one pass (else apart).
    vllm_beside: bool = False
    # --pin core: each rank bound to one CPU (rank r to the r-th allowed, round robin).
    pin: bool = False
    # An unreported run-in before each op's first case (timing runs; not --check).
    run_in: bool = True
    # --peers: the MPI peers that run between the cases (their columns, in order), and the
    # directory of FIFOs the ranks wait on before each case (benchmarks.peers.Conductor).
    peers: List[str] = field(default_factory=list)
    gate_dir: Optional[str] = None


def case_algorithm(group: Any, case: Case, device: str) -> Optional[str]:
    """What a ringpg group runs for this case's op and size on ``device`` (``algorithm_for``,
    the op's plan); None for other groups."""
    if group is None:
        return None
    return algorithm_for(group, RINGPG_OP[case.op], case.size_bytes, device)


def measure_passes(col_groups: Mapping[str, Any], vllm_beside: bool) -> List[Dict[str, Any]]:
    """The columns each case is measured in, pass by pass (each pass alternates its columns).

    vLLM's column runs in a pass of its own after the others', as each MPI peer runs in
    processes of its own: alternating with ringpg, its copies and its shared memory evict
    what ringpg's next op finds cached (benchmarks/README.md, Fairness).  ``vllm_beside``
    (``--vllm-beside``), or a run of vLLM columns only: one pass of every column."""
    apart = {} if vllm_beside else {col: g for col, g in col_groups.items() if is_vllm(g)}
    beside = {col: g for col, g in col_groups.items() if col not in apart}
    if not beside:
        return [dict(col_groups)]
    return [beside] + [{col: g} for col, g in apart.items()]


def run_worker(cfg: WorkerConfig, rank: int) -> int:
    """Body of one rank: create the groups, probe, sweep the cases, stream the results.

    Rank 0 prints the table rows as cases finish and appends one JSON line per event to
    ``cfg.result_path`` (probe, case, done), so that a run cut short keeps what it did.
    Returns the process exit status (0, or 1 if any element was wrong or an op failed).
    """
    if cfg.launcher_pid is not None:
        die_with_parent(cfg.launcher_pid)
    for k, v in cfg.extra_env.items():
        os.environ.setdefault(k, v)
    torch.set_num_threads(cfg.threads)
    ws = cfg.world_size
    if cfg.pin:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    # With peers, wait for the launcher's turn before each case (a blocking read: no CPU).
    gate = open(os.path.join(cfg.gate_dir, f"rank{rank}")) if cfg.gate_dir else None
    for name in sorted({split_spec(b)[0] for b in cfg.backends}):
        if name not in ("gloo", "nccl", FLOOR, VLLM):
            ensure_registered(name)
    device = torch.device(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    timeout = datetime.timedelta(seconds=cfg.op_timeout_s)

    dist.init_process_group("gloo", init_method=cfg.init_method, rank=rank, world_size=ws, timeout=timeout)
    ref = dist.group.WORLD
    groups: Dict[str, Any] = {}
    for label, name in zip(cfg.labels, cfg.backends):
        groups[label] = vllm_group(cfg) if name == VLLM else new_group_of(name, timeout)
        if label in cfg.untraced:
            import ringpg  # type: ignore[import-not-found]

            ringpg.backend(groups[label]).tracing = False

    out = open(cfg.result_path, "a") if rank == 0 else None

    def record(obj: Dict[str, Any]) -> None:
        if out is not None:
            out.write(json.dumps(obj) + "\n")
            out.flush()

    # Table columns: a backend each, or with paired dtypes a backend:dtype each.
    pairs = cfg.pair_dtypes
    columns = (
        {f"{lb}:{dt}": (lb, dt) for lb in cfg.labels for dt in pairs}
        if pairs
        else {lb: (lb, None) for lb in cfg.labels}
    )
    baseline = f"{cfg.baseline}:{pairs[0]}" if pairs else cfg.baseline
    col_groups = {col: groups[lb] for col, (lb, _) in columns.items()}
    # torch's floor moves nothing: never verified, and the table sets the others against it.
    floor_labels = {lb for lb, name in zip(cfg.labels, cfg.backends) if split_spec(name)[0] == FLOOR}
    unverified = [col for col, (lb, _) in columns.items() if lb in floor_labels]
    passes = measure_passes(col_groups, cfg.vllm_beside)

    progress = Progress(enabled=rank == 0 and cfg.progress)
    policy = IterationPolicy(**cfg.policy)
    ceiling = cfg.ceiling_GBps
    status = 0
    try:
        if cfg.probe:
            if rank == 0:
                progress.update(f"[probe] raw TCP rank 0 <-> rank 1 ({cfg.probe_path})")
            probe = tcp_probe(rank, cfg.master_addr, ref, cfg.probe_seconds)
            ring = tcp_ring_probe(rank, cfg.master_addr, ref, cfg.probe_seconds)
            if probe is not None and ring is not None:
                probe.update(ring)
            if rank == 0:
                emit(format_probe(probe, cfg.probe_path, cfg.link_GBps), progress)
                record({"kind": "probe", "probe": probe, "path": cfg.probe_path})
            ceiling = ring_ceiling(probe) or ceiling
        table = TableFormatter(
            list(columns),
            baseline,
            cfg.link_GBps,
            ceiling,
            peers=cfg.peers,
            floor=unverified[0] if unverified else None,
        )
        transports = {label: t for label, g in groups.items() if (t := transport_of(g, cfg.device))}
        # What each ringpg group's allreduce, reduce-scatter and all-gather run ("arena", "hier", "ring").
        algorithms = {label: a for label, g in groups.items() if (a := algorithm_of(g, cfg.device))}
        # How each ringpg group moves large same-host messages, as it measured at creation.
        copies = {label: cp for label, g in groups.items() if (cp := copy_of(g, cfg.device))}
        shared_clock = ranks_share_clock(ref)
        timing = "last-start-to-last-end" if shared_clock else "slowest-rank"
        if rank == 0:
            via = "".join(f" {label}:transport={t}" for label, t in transports.items())
            via += "".join(f" {label}:algo={a}" for label, a in algorithms.items())
            via += "".join(f" {label}:copy={cp}" for label, cp in copies.items())
            peers = f" peers={','.join(cfg.peers)}" if cfg.peers else ""
            emit(
                f"#\n# world_size={ws} device={cfg.device} backends={','.join(cfg.labels)}{peers} "
                f"baseline={baseline} threads/rank={cfg.threads} batch={policy.batch} timing={timing}"
                f"{' fresh' if cfg.fresh else ''}{' pinned' if cfg.pin else ''}"
                f" hugepages={hugepages_in_effect()}{via}"
                f"{' vllm=apart' if len(passes) > 1 else ''}",
                progress,
            )
            record(
                {
                    "kind": "transports",
                    "world_size": ws,
                    "transports": transports,
                    "algorithms": algorithms,
                    "copies": copies,
                    "timing": timing,
                }
            )
            emit(table.header(), progress)

        def buffers_for(case: Case) -> Any:
            bufs: Any = CaseBuffers(case, rank, device, fresh=cfg.fresh)
            if pairs:
                # The same bytes in each dtype (counts scale with the element size).
                by_dtype = {case.dtype: bufs}
                for dt in pairs[1:]:
                    numel_dt = case.size_bytes // Case(case.op, dt, 1, ws).itemsize
                    by_dtype[dt] = CaseBuffers(Case(case.op, dt, numel_dt, ws), rank, device, fresh=cfg.fresh)
                bufs = {col: by_dtype[dt] for col, (_, dt) in columns.items()}
            return bufs

        def measure(case: Case) -> Any:
            bufs = buffers_for(case)
            res = [
                measure_case(bufs, cols, ref, policy, sync=sync, shared_clock=shared_clock, unverified=unverified)
                for cols in passes
            ]
            for later in res[1:]:
                res[0].backends.update(later.backends)
            return res[0]

        previous_op = None
        for i, (op, dtype, numel) in enumerate(cfg.cases):
            case = Case(op, dtype, numel, ws)
            first_of_op = op != previous_op
            if rank == 0:
                if previous_op is not None and first_of_op:
                    emit("#", progress)
                progress.update(
                    f"[{cfg.progress_offset + i + 1}/{cfg.progress_total or len(cfg.cases)}] {case.describe()}"
                )
            previous_op = op
            if gate is not None:
                gate.readline()  # "go": the peers of the case before (or of this one) are done
            if first_of_op and cfg.run_in:
                # A run-in, not reported: an op's first case measured slow for every
                # backend, the floor too, though each case has warm-up rounds (16 cores:
                # the floor's and ringpg's 4 KiB all-gather 30-33 us first, 17-18 us at
                # 8 KiB next; benchmarks/RESULTS.md, 2026-11-27 (2)).
                measure(case)
            res = measure(case)
            if any(r.wrong or r.error for r in res.backends.values()):
                status = 1
            if gate is not None and rank == 0:  # the peers' figures of this case, then the row
                record({"kind": "measured", "index": i})
                with open(gate.readline().strip()) as f:
                    res.backends.update(peer_results(case, json.load(f)["peers"], policy.batch))
            if rank == 0:
                emit(table.row(res), progress)
                for line in table.errors(res):
                    emit(line, progress)
                rows = res.to_records(cfg.link_GBps, table.ceiling)
                for row in rows:  # the column's group: its label, without a paired dtype
                    peer = row["backend"] in cfg.peers
                    row["algorithm"] = None
                    if not peer:  # what this case ran, else what the group's allreduce runs
                        label = columns[row["backend"]][0]
                        row["algorithm"] = case_algorithm(groups.get(label), case, cfg.device) or algorithms.get(label)
                    row["peer"] = peer
                    row["fresh"] = cfg.fresh
                record({"kind": "case", "rows": rows})
        record({"kind": "done", "world_size": ws})
    finally:
        progress.clear()
        if out is not None:
            out.close()
        if gate is not None:
            gate.close()
    dist.barrier(group=ref)
    for g in groups.values():
        if not is_vllm(g):  # vLLM's shared memory goes with the process
            dist.destroy_process_group(g)
    dist.destroy_process_group()
    return status


def vllm_group(cfg: WorkerConfig) -> VllmShm:
    """The vLLM column's shared-memory group, named after this run's rendezvous port."""
    why = load(Path(cfg.vllm_lib or ""))
    if why:
        raise RuntimeError(why)
    return VllmShm(f"ringpg-bench-{os.getppid()}-{cfg.init_method.rsplit(':', 1)[-1]}")


def pick_vllm(args: argparse.Namespace, torchrun: bool) -> Optional[str]:
    """``--backends ...,vllm``: the library in ``args.vllm_lib``, or the column dropped and why."""
    args.vllm_lib = None
    if VLLM not in args.backends:
        return None
    if torchrun or args.emulate or args.device != "cpu":
        why = "vLLM's shm collectives run on one host's CPUs: not under torchrun, --emulate or --device cuda"
    else:
        path, why = find_library(Path(args.peers_dir))
        if path is not None:
            why = load(path)
            if not why:
                args.vllm_lib = str(path)
                return None
    args.backends = [b for b in args.backends if b != VLLM]
    return why


def ring_ceiling(probe: Optional[Dict[str, Any]]) -> Optional[float]:
    """The pace a TCP ring can keep on the probed path: its slowest link (GB/s)."""
    return probe.get("ring_slowest_GBps") if probe else None


def _rank_target(cfg: Dict[str, Any], rank: int) -> None:
    """multiprocessing entry point of one rank."""
    try:
        code = run_worker(WorkerConfig(**cfg), rank)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(3)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# --------------------------------------------------------------------------------------
# Launching and supervising ranks
# --------------------------------------------------------------------------------------


class _Rank:
    """A rank process, either a multiprocessing.Process or a subprocess.Popen."""

    def __init__(self, handle: Any) -> None:
        self.h = handle

    def poll(self) -> Optional[int]:
        if isinstance(self.h, mp.process.BaseProcess):
            return self.h.exitcode
        return self.h.poll()

    def terminate(self) -> None:
        try:
            self.h.terminate()
        except (ProcessLookupError, OSError):
            pass

    def kill(self) -> None:
        try:
            self.h.kill()
        except (ProcessLookupError, OSError):
            pass

    def reap(self) -> None:
        try:
            if isinstance(self.h, mp.process.BaseProcess):
                self.h.join(timeout=1)
            else:
                self.h.wait(timeout=1)
        except Exception:  # noqa: BLE001
            pass


def supervise(
    ranks: List[_Rank],
    timeout_s: float,
    stall_s: float,
    events_path: str,
    grace_s: float = 15.0,
    step: Optional[Callable[[], bool]] = None,
) -> Tuple[List[Optional[int]], str]:
    """Wait for all ranks; bounded.  When one fails, the others get ``grace_s`` to finish
    (they would otherwise sit in a collective until the group timeout) and are then
    ended; everyone is ended after ``timeout_s``, or when rank 0 has reported nothing
    new in ``events_path`` for ``stall_s`` (a hung op).  ``step`` (the peers' turns,
    :class:`benchmarks.peers.Conductor`) is called on every look; while it reports work
    done, the ranks are not stalled.  Returns (exit codes, problem or "")."""
    start = time.monotonic()
    deadline = start + timeout_s
    problem = ""
    failed_at: Optional[float] = None
    last_size, last_change = -1, start
    try:
        while True:
            codes = [r.poll() for r in ranks]
            if all(c is not None for c in codes):
                break
            if step is not None and step():
                last_change = time.monotonic()
            now = time.monotonic()
            size = os.path.getsize(events_path) if os.path.exists(events_path) else 0
            if size != last_size:
                last_size, last_change = size, now
            elif now - last_change > stall_s:
                problem = (
                    f"no progress for {stall_s:.0f} s (a collective hangs?); ranks ended "
                    f"(raise --stall-timeout for very slow cases)"
                )
                break
            if failed_at is None and any(c not in (None, 0, 1) for c in codes):
                failed_at = now
                problem = "a rank failed: " + ", ".join(
                    f"rank {i} exit {c}" for i, c in enumerate(codes) if c not in (None, 0, 1)
                )
            if now > deadline or (failed_at is not None and now > failed_at + grace_s):
                if now > deadline:
                    problem = f"timed out after {timeout_s:.0f} s" + (f"; {problem}" if problem else "")
                break
            time.sleep(0.1)
    finally:
        _end_all(ranks)
    return [r.poll() for r in ranks], problem


def _end_all(ranks: List[_Rank]) -> None:
    live = [r for r in ranks if r.poll() is None]
    for r in live:
        r.terminate()
    end = time.monotonic() + 5
    while any(r.poll() is None for r in live) and time.monotonic() < end:
        time.sleep(0.05)
    for r in live:
        if r.poll() is None:
            r.kill()
    for r in ranks:
        r.reap()


def launch_local(
    cfg: WorkerConfig, method: str, timeout_s: float, stall_s: float, step: Optional[Callable[[], bool]] = None
) -> Tuple[List[Optional[int]], str]:
    """Start ``cfg.world_size`` ranks as processes of this launcher (``method``:
    devkit.launch.rank_context) and supervise them."""
    ctx = rank_context(method)
    ranks = []
    try:
        for r in range(cfg.world_size):
            p = ctx.Process(target=_rank_target, args=(asdict(cfg), r), name=f"bench-rank{r}")
            p.start()
            ranks.append(_Rank(p))
    except BaseException:
        _end_all(ranks)
        raise
    return supervise(ranks, timeout_s, stall_s, cfg.result_path, step=step)


def launch_with_peers(
    cfg: WorkerConfig, args: argparse.Namespace, events: List[Dict[str, Any]], notes: set, tmpdir: str
) -> Tuple[List[Optional[int]], str]:
    """Start the MPI peers of ``--peers`` for this world size, then the ranks, taking turns
    with them case by case (:class:`benchmarks.peers.Conductor`); stop the peers after.
    A peer that is missing or does not start is left out with its reason, printed once."""
    jobs, skipped = start_peers(
        args.peers,
        Path(args.peers_dir),
        cfg.world_size,
        cfg.cases,
        cfg.policy,
        args.fresh,
        args.pin == "core",
        Path(tmpdir),
        hugepages=args.hugepages,
    )
    conductor: Optional[Conductor] = None
    try:
        for name, why in skipped.items():
            key = f"{name}: {why}"
            if key not in notes:
                notes.add(key)
                print(f"# peer {name} skipped: {why}", flush=True)
        for job in jobs:
            print(f"# peer {job.peer.name} (ws={cfg.world_size}): {job.describe()}", flush=True)
        events.append({"kind": "peers", "world_size": cfg.world_size, "peers": summary(jobs, skipped)})
        if not jobs:
            return launch_local(cfg, args.start, args.timeout, args.stall_timeout)
        conductor = Conductor(
            jobs,
            cfg.cases,
            Path(tmpdir) / f"gate-ws{cfg.world_size}",
            cfg.world_size,
            cfg.result_path,
            args.peer_timeout,
        )
        cfg.peers = [job.peer.name for job in jobs]
        cfg.gate_dir = str(conductor.gate_dir)
        return launch_local(cfg, args.start, args.timeout, args.stall_timeout, step=conductor.step)
    finally:
        for job in jobs:
            job.stop()
        if conductor is not None:
            conductor.close()


def launch_netns(
    cfg: WorkerConfig, cluster: netns.EmulatedCluster, timeout_s: float, stall_s: float, tmpdir: str
) -> Tuple[List[Optional[int]], str]:
    """Start one rank per namespace with ``ip netns exec NS python -m benchmarks.bench``."""
    import subprocess

    cfg_path = os.path.join(tmpdir, f"worker-ws{cfg.world_size}.json")
    with open(cfg_path, "w") as f:
        json.dump(asdict(cfg), f)
    ranks = []
    try:
        for r in range(cfg.world_size):
            env = dict(os.environ)
            env.update(cluster.env(r))
            env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
            cmd = cluster.exec_prefix(r) + [
                sys.executable,
                "-m",
                "benchmarks.bench",
                "--_worker",
                cfg_path,
                "--_rank",
                str(r),
            ]
            ranks.append(_Rank(subprocess.Popen(cmd, cwd=str(REPO_ROOT), env=env)))
    except BaseException:
        _end_all(ranks)
        raise
    return supervise(ranks, timeout_s, stall_s, cfg.result_path)


# --------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------


def read_events(path: str) -> List[Dict[str, Any]]:
    events = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        events.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass  # a rank killed mid-write
    return events


def write_csv(rows: List[Dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    keys: List[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def is_floor_column(label: str) -> bool:
    """Whether a results column is torch's floor: ``floor``, ``floor#2`` beside another
    floor (:func:`benchmarks.backends.unique_labels`), ``floor:bfloat16`` with paired dtypes."""
    return label.split(":")[0].split("#")[0] == FLOOR


def write_plot(
    rows: List[Dict[str, Any]], path: Path, probe: Optional[Dict[str, float]], link_GBps: Optional[float], title: str
) -> Optional[str]:
    """busbw vs size (log x), one subplot per op (a row per dtype), one line per backend
    and world size; torch's floor is left out (it moves no data: its busbw measures
    nothing, and on the same axis it would flatten every other line).  Returns an
    explanation instead when matplotlib is missing or nothing is left to draw."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install matplotlib, or ringpg[bench])"
    rows = [r for r in rows if not is_floor_column(r["backend"])]
    ops = [op for op in OPS if any(r["op"] == op for r in rows)]
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    sizes_ws = sorted({r["world_size"] for r in rows})
    if not ops:
        return "plot skipped: no results"
    panels = [(dt, op) for dt in dtypes for op in ops]
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes_grid = plt.subplots(nrows, ncols, figsize=(5.0 * ncols, 3.6 * nrows), squeeze=False)
    axes = [ax for row in axes_grid for ax in row]
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D"]
    for k, (dt, op) in enumerate(panels):
        ax = axes[k]
        for wi, ws in enumerate(sizes_ws):
            for bi, be in enumerate(backends):
                pts = sorted(
                    (r["size_bytes"], r["busbw_GBps"])
                    for r in rows
                    if r["op"] == op
                    and r["dtype"] == dt
                    and r["world_size"] == ws
                    and r["backend"] == be
                    and r["busbw_GBps"]
                    and r["size_bytes"] > 0
                )
                if pts:
                    ax.plot(
                        [p[0] for p in pts],
                        [p[1] for p in pts],
                        color=colors[wi % len(colors)],
                        linestyle=styles[bi % len(styles)],
                        marker=markers[bi % len(markers)],
                        markersize=3,
                        label=f"{be} n={ws}",
                    )
        if probe:
            ax.axhline(probe["one_direction_GBps"], color="gray", linestyle=":", linewidth=1, label="TCP one direction")
        if link_GBps:
            ax.axhline(link_GBps, color="red", linestyle=":", linewidth=1, label="link rate")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_bytes(int(x)).replace(" ", "")))
        ax.set_title(f"{op} ({dt})", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_ylabel("busbw (GB/s)", fontsize=8)
        ax.set_xlabel("size (B)", fontsize=8)
        ax.tick_params(labelsize=7)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(8, max(1, len(labels))), fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, (0.05 + 0.02 * (len(labels) // 8)) * 2 / (nrows + 1), 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def finalize(
    args: argparse.Namespace,
    facts: Dict[str, str],
    events: List[Dict[str, Any]],
    link_GBps: Optional[float],
    launch_problems: List[str],
) -> int:
    """Write CSV/JSON/PNG, print the summary; return the exit status (the MPI peers'
    wrong elements and failures are reported, but they are not ringpg's: no failure)."""
    rows = [row for e in events if e.get("kind") == "case" for row in e["rows"]]
    peers = {e["world_size"]: e["peers"] for e in events if e.get("kind") == "peers"}
    probes = [e for e in events if e.get("kind") == "probe"]
    probe = probes[0]["probe"] if probes else None
    done = {e["world_size"] for e in events if e.get("kind") == "done"}
    timing = {e["world_size"]: e.get("timing") for e in events if e.get("kind") == "transports"}
    transports = {e["world_size"]: e.get("transports") for e in events if e.get("kind") == "transports"}
    algorithms = {e["world_size"]: e.get("algorithms") for e in events if e.get("kind") == "transports"}
    copies = {e["world_size"]: e.get("copies") for e in events if e.get("kind") == "transports"}
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    save = not args.no_save and not args.check
    out_dir = Path(args.out_dir)
    paths = {
        "csv": Path(args.csv) if args.csv else (out_dir / f"bench-{stamp}.csv" if save else None),
        "json": Path(args.json) if args.json else (out_dir / f"bench-{stamp}.json" if save else None),
        "plot": Path(args.plot) if args.plot else (out_dir / f"bench-{stamp}.png" if save else None),
    }
    wrong = [r for r in rows if r["wrong"] and not r.get("peer")]
    errors = [r for r in rows if r["error"] and not r.get("peer")]
    peer_wrong = [r for r in rows if r["wrong"] and r.get("peer")]
    peer_errors = [r for r in rows if r["error"] and r.get("peer")]
    print("#")
    if paths["json"]:
        paths["json"].parent.mkdir(parents=True, exist_ok=True)
        with open(paths["json"], "w") as f:
            json.dump(
                {
                    "machine": facts,
                    "argv": sys.argv,
                    "probe": probe,
                    "link_GBps": link_GBps,
                    "world_sizes_completed": sorted(done),
                    "timing": timing,
                    "transports": transports,
                    "algorithms": algorithms,
                    "copies": copies,
                    "fresh": args.fresh,
                    "peers": peers,
                    "problems": launch_problems,
                    "results": rows,
                },
                f,
                indent=1,
            )
        print(f"# json: {paths['json']}")
    if paths["csv"]:
        write_csv(rows, paths["csv"])
        print(f"# csv:  {paths['csv']}")
    if paths["plot"]:
        why = write_plot(
            rows, paths["plot"], probe, link_GBps, f"busbw vs size - {facts.get('cpu', '')}, torch {torch.__version__}"
        )
        print(f"# {why}" if why else f"# plot: {paths['plot']}")
    n_cases = len({(r["world_size"], r["op"], r["dtype"], r["count"]) for r in rows})
    print(
        f"# {n_cases} cases, {len(wrong)} results with wrong elements, {len(errors)} failed ops, "
        f"{len(launch_problems)} launch problems"
    )
    for r in wrong[:20]:
        print(
            f"#   WRONG {r['backend']}: {r['op']} {r['dtype']} count={r['count']} ws={r['world_size']}: "
            f"{r['wrong']} wrong elements"
        )
    for r in errors[:20]:
        print(f"#   ERROR {r['backend']}: {r['op']} {r['dtype']} count={r['count']} ws={r['world_size']}: {r['error']}")
    for p in launch_problems:
        print(f"#   LAUNCH {p}")
    if peers:
        print(
            f"# MPI peers: {len(peer_wrong)} results with wrong elements, {len(peer_errors)} failed ops "
            "(reported, not counted as failures)"
        )
        for r in (peer_wrong + peer_errors)[:20]:
            print(
                f"#   PEER {r['backend']}: {r['op']} {r['dtype']} count={r['count']} ws={r['world_size']}: "
                + (f"{r['wrong']} wrong elements" if r["wrong"] else str(r["error"]))
            )
    ok = not wrong and not errors and not launch_problems
    if args.check:
        print("# check: " + ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def _csv_list(text: str) -> List[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench",
        description=__doc__.split("\n\n")[0],
        epilog="Columns: size(B) count(elements) type op redop, then per backend time(us) algbw(GB/s) "
        "busbw(GB/s) #wrong [%link %probe], then baseline-time/backend-time per non-baseline backend.",
    )
    g = ap.add_argument_group("what to measure")
    g.add_argument(
        "--backends",
        default="ringpg,gloo",
        help="comma list of backends measured side by side (default ringpg,gloo; nccl is added "
        "with --device cuda where there is a GPU per rank). Use gloo,gloo to validate the tool without ringpg; "
        "ringpg[@transport][/algo][%%copy] pins ringpg's transport (ringpg.use_transport), "
        "algorithm (ringpg.use_algorithm) and same-host copy (ringpg.use_copy: auto, cma, slots) per column: "
        "ringpg@gloo, ringpg/ring, ringpg@tcp/hier, ringpg%%cma; "
        "floor: torch's own cost of an op; vllm: vLLM's CPU shm allreduce and all-gather "
        "(scripts/install_peers.sh DIR vllm; a skipped column where missing)",
    )
    g.add_argument(
        "--transports",
        default=None,
        metavar="LIST",
        help="the transport axis: each 'ringpg' of --backends becomes one column per transport "
        "(e.g. --transports tcp,gloo: ringpg@tcp,ringpg@gloo; auto, shm, tcp, gloo)",
    )
    g.add_argument(
        "--algos",
        default=None,
        metavar="LIST",
        help="the algorithm axis: each ringpg column naming no algorithm becomes one column per "
        "algorithm (e.g. --algos hier,ring: ringpg/hier,ringpg/ring; auto, ring, hier, arena)",
    )
    g.add_argument("--baseline", default="gloo", help="label the ratio column divides by (default gloo)")
    g.add_argument("--ops", default=",".join(OPS), help="comma list (aliases ar,rs,ag,bc,a2a)")
    g.add_argument("--dtypes", default="float32,bfloat16")
    g.add_argument(
        "--pair-dtypes",
        action="store_true",
        help="measure the dtypes side by side in each case (alternating, same size in bytes) "
        "instead of one sweep after another; columns become backend:dtype and the ratio is "
        "against the baseline backend's first dtype (e.g. --backends ringpg --dtypes "
        "float32,bfloat16: bf16 busbw / fp32 busbw)",
    )
    g.add_argument("--world-sizes", default=None, help="comma list (default 2,3,4,8; --check: 2,3)")
    g.add_argument("--min-bytes", default="1KiB")
    g.add_argument("--max-bytes", default="256MiB")
    g.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    g.add_argument(
        "--untraced",
        default="",
        help="comma list of ringpg labels whose tracing is switched off, to measure RINGPG_TRACE's cost "
        "in the same processes: RINGPG_TRACE=/tmp/t ... --backends ringpg,ringpg --untraced "
        "'ringpg#2' --baseline 'ringpg#2' (ratio = untraced time / traced time)",
    )
    g.add_argument(
        "--vllm-beside",
        action="store_true",
        help="measure vLLM's column alternating with the others in one pass (by default it runs in a "
        "pass of its own after theirs, as each MPI peer runs alone: its copies evict what the next "
        "backend's op finds cached)",
    )
    g.add_argument(
        "--fresh",
        action="store_true",
        help="new input and output tensors for every op, as user code makes them: the input before "
        "the barrier (untimed), the output (torch.empty; np.empty for MPI peers) inside the timed "
        "region, right before the op",
    )
    g.add_argument(
        "--hugepages",
        choices=list(HUGEPAGES),
        default="on",
        help="the memory every column's buffers live in: on (default): transparent huge pages "
        "for everyone (torch's THP_MEM_ALLOC_ENABLE=1 for the bench's tensors, numpy's own "
        "madvise for the MPI peers' arrays); off: for no one; native: each library's default "
        "(numpy madvises its large arrays, torch does not)",
    )
    g.add_argument(
        "--pin",
        choices=["none", "core"],
        default="none",
        help="none (default): no rank of any backend or peer is bound to a CPU; core: every rank of "
        "the bench and of each MPI peer is bound to one CPU, round robin",
    )
    g.add_argument(
        "--busy",
        type=int,
        default=0,
        help="start this many processes that spin on a CPU each beside the ranks for the whole run "
        "(another job on the host, one CPU short per process; default 0)",
    )
    g.add_argument(
        "--check",
        action="store_true",
        help="correctness only: 1 KiB..64 KiB plus odd counts, few iterations, exit 1 on any "
        "wrong element (what CI runs)",
    )
    g = ap.add_argument_group("iterations")
    g.add_argument("--warmup", type=int, default=None, help="warm-up rounds per case (default 2; --check 1)")
    g.add_argument("--iters-min", type=int, default=None, help="default 3 (--check: 2)")
    g.add_argument("--iters-max", type=int, default=None, help="default 100 (--check: 2)")
    g.add_argument("--case-time", type=float, default=0.75, help="target seconds of timed rounds per case")
    g.add_argument(
        "--batch",
        type=int,
        default=1,
        help="ops per timed iteration (default 1: each op after a barrier of its backend; N > 1: "
        "N ops back to back, time = total / N, the nccl-tests loop); outputs are checked in "
        "untimed rounds either way",
    )
    g = ap.add_argument_group("MPI peers")
    g.add_argument(
        "--peers",
        default="",
        help="comma list of MPI peers (venvs DIR/NAME made by "
        "scripts/install_peers.sh: mpich, ompi, impi) measured between the cases; a missing one is "
        "skipped with its reason; adds their columns and each backend's ratio to the best peer",
    )
    g.add_argument(
        "--peers-dir",
        default=None,
        help="where the peers' venvs are (default $RINGPG_PEERS_DIR, else ~/.cache/ringpg-peers)",
    )
    g.add_argument(
        "--peer-timeout",
        type=float,
        default=300.0,
        help="seconds a peer may take for one case before it is ended and dropped (default 300)",
    )
    g = ap.add_argument_group("ceiling and network")
    g.add_argument(
        "--probe",
        dest="probe",
        action="store_true",
        default=None,
        help="raw TCP throughput probe between rank 0 and 1 (default: on, off with --check)",
    )
    g.add_argument("--no-probe", dest="probe", action="store_false")
    g.add_argument("--probe-seconds", type=float, default=1.0)
    g.add_argument(
        "--emulate",
        metavar="RATE",
        default=None,
        help="emulated cluster: each rank in its own network namespace, links shaped to RATE "
        "(tc notation: 1gbit, 100mbit, 10gbit). Needs root and iproute2; skipped otherwise",
    )
    g.add_argument(
        "--hosts",
        type=int,
        default=None,
        metavar="H",
        help="with --emulate: H emulated hosts (network namespaces), rank r on host r %% H, the "
        "ranks of a host sharing its link and its memory (default: one host per rank)",
    )
    g.add_argument(
        "--mtu",
        type=int,
        default=1500,
        help="MTU of the emulated links (default 1500: TCP goodput <= 95.6%% of the rate; "
        "9000, jumbo frames: <= 99.3%%)",
    )
    g = ap.add_argument_group("output")
    g.add_argument("--csv", default=None, help="CSV path (default benchmarks/results/bench-<time>.csv)")
    g.add_argument("--json", default=None, help="JSON path (default benchmarks/results/bench-<time>.json)")
    g.add_argument("--plot", default=None, help="PNG path (default benchmarks/results/bench-<time>.png)")
    g.add_argument("--out-dir", default=str(DEFAULT_OUT_DIR))
    g.add_argument("--no-save", action="store_true", help="write no files unless a path is given")
    g.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    g = ap.add_argument_group("limits")
    add_start_argument(g)
    g.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per world size before all ranks are ended (default 3 h; --check 300)",
    )
    g.add_argument(
        "--stall-timeout",
        type=float,
        default=None,
        help="end the ranks when no case finished for this many seconds (default 900; --check 120)",
    )
    g.add_argument(
        "--op-timeout", type=float, default=None, help="process-group timeout in seconds (default 300; --check 60)"
    )
    g.add_argument("--threads", type=int, default=None, help="torch intra-op threads per rank (default cores/ws)")
    ap.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_rank", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        args.ops = [canonical_op(o) for o in _csv_list(args.ops)]
        args.dtypes = [canonical_dtype(d) for d in _csv_list(args.dtypes)]
        args.min_bytes = parse_bytes(args.min_bytes)
        args.max_bytes = parse_bytes(args.max_bytes)
        args.world_sizes = [int(w) for w in _csv_list(args.world_sizes or ("2,3" if args.check else "2,3,4,8"))]
        args.rate_bps = parse_rate(args.emulate) if args.emulate else None
    except ValueError as e:
        ap.error(str(e))
    if any(w < 2 for w in args.world_sizes):
        ap.error("world sizes must be >= 2")
    if args.min_bytes > args.max_bytes:
        ap.error("--min-bytes is larger than --max-bytes")
    if args.hosts is not None and (not args.emulate or args.hosts < 1 or args.hosts > min(args.world_sizes)):
        ap.error("--hosts H needs --emulate and 1 <= H <= every world size")
    if args.pair_dtypes and (args.check or len(args.dtypes) < 2):
        ap.error("--pair-dtypes needs two or more --dtypes, and no --check")
    if args.batch < 1 or (args.check and args.batch != 1):
        ap.error("--batch must be >= 1, and 1 with --check (every op is verified)")
    args.backends = expand_specs(
        _csv_list(args.backends), _csv_list(args.transports or ""), _csv_list(args.algos or "")
    )
    if args.device == "cuda":
        if not torch.cuda.is_available():
            ap.error("--device cuda but torch.cuda.is_available() is False")
        # NCCL takes one GPU per rank ("Duplicate GPU detected" where ranks share one):
        # added only where every world size has a GPU per rank and torch has NCCL.
        gpus = torch.cuda.device_count()
        if "nccl" not in args.backends and dist.is_nccl_available() and gpus >= max(args.world_sizes):
            args.backends.append("nccl")
    if not args.backends:
        ap.error("no backends")
    args.untraced = _csv_list(args.untraced)
    labels = unique_labels(args.backends)
    args.peers = list(dict.fromkeys(_csv_list(args.peers)))
    args.peers_dir = args.peers_dir or str(default_peers_dir())
    if args.peers:
        if args.emulate or args.device != "cpu" or args.pair_dtypes:
            ap.error("--peers runs MPI peers on this host's CPUs: not with --emulate, --device cuda or --pair-dtypes")
        clash = [p for p in args.peers if p in labels or not p.replace("-", "").replace("_", "").isalnum()]
        if clash:
            ap.error(
                f"--peers: {', '.join(clash)}: a peer's name must be a plain name unlike any backend label "
                f"({','.join(labels)})"
            )
    for lb in args.untraced:
        if lb not in labels or not lb.startswith("ringpg"):
            ap.error(f"--untraced {lb!r} is not a ringpg label of --backends (labels: {','.join(labels)})")
    if args.untraced and not os.environ.get("RINGPG_TRACE"):
        ap.error("--untraced switches tracing off for some groups: set RINGPG_TRACE=DIR for the others")
    if args.probe is None:
        args.probe = not args.check
    args.warmup = args.warmup if args.warmup is not None else (1 if args.check else 2)
    args.iters_min = args.iters_min if args.iters_min is not None else (2 if args.check else 3)
    args.iters_max = args.iters_max if args.iters_max is not None else (2 if args.check else 100)
    args.iters_max = max(args.iters_max, args.iters_min)
    args.timeout = args.timeout or (300.0 if args.check else 3 * 3600.0)
    args.op_timeout = args.op_timeout or (60.0 if args.check else 300.0)
    args.stall_timeout = args.stall_timeout or (120.0 if args.check else 900.0)
    return args


def build_cases(args: argparse.Namespace, ws: int) -> Tuple[List[Case], Optional[str]]:
    """The case list of one world size, minus sizes that would not fit in memory."""
    if args.check:
        cases = check_cases(args.ops, args.dtypes, ws)
    else:
        # Paired dtypes share a case: it names the first, the worker derives the others.
        dtypes = args.dtypes[:1] if args.pair_dtypes else args.dtypes
        cases = sweep_cases(args.ops, dtypes, ws, args.min_bytes, args.max_bytes)
    avail = _mem_available()
    if avail and args.device == "cpu":
        limit = int(avail * 0.75) // (MEMORY_FACTOR * ws)
        kept = [c for c in cases if c.size_bytes <= limit]
        if len(kept) < len(cases):
            return kept, (
                f"ws={ws}: skipped sizes above {format_bytes(limit)} "
                f"(~{MEMORY_FACTOR}x size per rank would exceed 75% of available memory)"
            )
    return cases, None


def _mem_available() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _config(
    args: argparse.Namespace,
    ws: int,
    cases: List[Case],
    init_method: str,
    master_addr: str,
    result_path: str,
    probe: bool,
    probe_path: str,
    link_GBps: Optional[float],
    offset: int,
    total: int,
    extra_env: Dict[str, str],
) -> WorkerConfig:
    labels = unique_labels(args.backends)
    return WorkerConfig(
        world_size=ws,
        init_method=init_method,
        master_addr=master_addr,
        backends=list(args.backends),
        labels=labels,
        baseline=pick_baseline(labels, args.baseline),
        device=args.device,
        cases=[(c.op, c.dtype, c.numel) for c in cases],
        policy=asdict(
            IterationPolicy(
                args.warmup, args.iters_min, args.iters_max, args.case_time, args.batch, verify_timed=args.check
            )
        ),
        op_timeout_s=args.op_timeout,
        probe=probe,
        probe_seconds=args.probe_seconds,
        probe_path=probe_path,
        link_GBps=link_GBps,
        result_path=result_path,
        threads=args.threads or default_threads(ws),
        progress=not args.quiet,
        progress_offset=offset,
        progress_total=total,
        extra_env=extra_env,
        launcher_pid=None if torchrun_env() else os.getpid(),
        pair_dtypes=list(args.dtypes) if args.pair_dtypes else [],
        untraced=list(args.untraced),
        fresh=args.fresh,
        vllm_lib=args.vllm_lib,
        vllm_beside=args.vllm_beside,
        run_in=not args.check,
        pin=args.pin == "core",
    )


def check_backends(args: argparse.Namespace) -> Tuple[Dict[str, str], Optional[str]]:
    """Availability of every requested backend; the second item explains a missing one."""
    info: Dict[str, str] = {}
    for name in dict.fromkeys(args.backends):
        if name == VLLM:
            info[name] = f"vLLM's CPU shm collectives ({args.vllm_lib})"
            continue
        ok, desc = backend_status(name, args.device)
        info[name] = desc if ok else f"UNAVAILABLE ({desc})"
        if not ok:
            hint = (
                (
                    " -- build it with `pip install --no-build-isolation -e .`, or validate the tool "
                    "with --backends gloo,gloo"
                )
                if split_spec(name)[0] == "ringpg"
                else ""
            )
            return info, f"backend {name!r} is not usable: {desc}{hint}"
    return info, None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args._worker is not None:  # a rank started by launch_netns
        with open(args._worker) as f:
            cfg = WorkerConfig(**json.load(f))
        try:
            return run_worker(cfg, args._rank)
        except BaseException:  # exit 3 = failed rank (1 means "wrong elements")
            traceback.print_exc()
            return 3
    tr = torchrun_env()
    if tr is not None:
        return main_torchrun(args, *tr)

    use_hugepages(args.hugepages)
    vllm_skipped = pick_vllm(args, torchrun=False)
    if not args.backends:
        print(f"# ERROR: no backends left: vllm skipped: {vllm_skipped}", flush=True)
        return 2
    info, problem = check_backends(args)
    extra = {}
    cluster: Optional[netns.EmulatedCluster] = None
    if args.emulate:
        reason = netns.unavailable_reason()
        if reason:
            print(f"# --emulate {args.emulate}: network emulation skipped: {reason}")
            return 0
        per = f"{args.hosts} hosts (netns), rank r on host r % {args.hosts}" if args.hosts else "one netns per rank"
        extra["network"] = f"emulated, {args.emulate} per link (tc tbf), {per}"
    else:
        extra["network"] = "loopback 127.0.0.1 (GLOO_SOCKET_IFNAME/RINGPG_SOCKET_IFNAME=lo unless set)"
    if args.busy:
        extra["busy"] = f"{args.busy} spinning process(es) beside the ranks (--busy)"
    facts = machine_facts(info, args.device, extra)
    print("# ringpg benchmark (launcher; ranks are started below)")
    print(format_facts(facts), flush=True)
    if vllm_skipped:
        print(f"# backend vllm skipped: {vllm_skipped}", flush=True)
    if problem:
        print(f"# ERROR: {problem}", flush=True)
        return 2

    plans = [(ws,) + build_cases(args, ws) for ws in args.world_sizes]
    for _, _, note in plans:
        if note:
            print(f"# note: {note}")
    total = sum(len(cases) for _, cases, _ in plans)
    launch_problems: List[str] = []
    events: List[Dict[str, Any]] = []
    link_GBps = args.rate_bps / 8 / 1e9 if args.rate_bps else None
    t_start = time.monotonic()
    tmpdir = tempfile.mkdtemp(prefix="ringpg-bench-")
    interrupted = False
    running: Optional[str] = None  # events file of the world size being run
    peer_notes: set = set()  # why a peer is skipped, printed once
    beside = contextlib.ExitStack()  # the --busy processes, for the whole run
    try:
        _interrupt_on_signals()
        beside.enter_context(busy_processes(args.busy))
        if args.emulate:
            cluster = netns.EmulatedCluster(max(args.world_sizes), args.rate_bps, mtu=args.mtu, hosts=args.hosts)
            cluster.up()
            _interrupt_on_signals()  # ours, not netns's: finish below with partial results
            print(f"# emulated cluster: {cluster.describe()}", flush=True)
        else:
            for k in ("GLOO_SOCKET_IFNAME", "RINGPG_SOCKET_IFNAME"):
                os.environ.setdefault(k, "lo")
        offset = 0
        probe_pending = args.probe
        ceiling: Optional[float] = None
        for idx, (ws, cases, _) in enumerate(plans):
            result_path = running = os.path.join(tmpdir, f"events-ws{ws}.jsonl")
            if cluster is not None:
                addr, port = cluster.master_addr, 29500 + idx
                path = f"emulated {args.emulate} links through a bridge"
            else:
                addr, port = "127.0.0.1", free_port()
                path = "loopback"
            cfg = _config(
                args,
                ws,
                cases,
                f"tcp://{addr}:{port}",
                addr,
                result_path,
                probe_pending,
                path,
                link_GBps,
                offset,
                total,
                {},
            )
            cfg.ceiling_GBps = ceiling
            if cluster is not None:
                codes, problem = launch_netns(cfg, cluster, args.timeout, args.stall_timeout, tmpdir)
            elif args.peers:
                codes, problem = launch_with_peers(cfg, args, events, peer_notes, tmpdir)
            else:
                codes, problem = launch_local(cfg, args.start, args.timeout, args.stall_timeout)
            got = read_events(result_path)
            running = None
            events.extend(got)
            for e in got:
                if e.get("kind") == "probe":
                    probe_pending = False
                    ceiling = ring_ceiling(e.get("probe")) or ceiling
            finished = any(e.get("kind") == "done" for e in got)
            if not finished and not problem:
                problem = f"ranks exited with {codes} before finishing"
            elif finished and problem:
                problem = f"all cases measured, but then: {problem} (hang in destroy_process_group?)"
            if problem:
                launch_problems.append(f"ws={ws}: {problem}")
                print(f"# ws={ws}: {problem}", flush=True)
            offset += len(cases)
    except KeyboardInterrupt as e:
        interrupted = True
        launch_problems.append(f"interrupted ({e or 'SIGINT'})")
        print(f"\n# interrupted ({e or 'SIGINT'}); ranks ended, writing what was measured", flush=True)
        if running is not None:
            events.extend(read_events(running))
    finally:
        beside.close()
        if cluster is not None:
            cluster.down()
        shutil.rmtree(tmpdir, ignore_errors=True)
    status = finalize(args, facts, events, link_GBps, launch_problems)
    print(f"# elapsed {time.monotonic() - t_start:.1f} s")
    return 130 if interrupted else status


def _interrupt_on_signals() -> None:
    """SIGTERM/SIGHUP behave like Ctrl-C in the launcher: ranks are ended, the emulated
    network is torn down, and the results measured so far are still written."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def main_torchrun(args: argparse.Namespace, rank: int, ws: int) -> int:
    """Ranks provided by torchrun: one world size; rank 0 prints and writes the outputs."""
    facts: Dict[str, str] = {}
    if rank == 0 and args.peers:
        print("# --peers: skipped under torchrun (the bench's own launcher starts the peers)", flush=True)
    if args.busy and rank == 0:
        print("# --busy: ignored under torchrun (the bench's own launcher starts them)", flush=True)
    args.peers = []
    vllm_skipped = pick_vllm(args, torchrun=True)
    if rank == 0 and vllm_skipped:
        print(f"# backend vllm skipped: {vllm_skipped}", flush=True)
    if not args.backends:
        return 2
    if rank == 0:
        info, problem = check_backends(args)
        facts = machine_facts(
            info, args.device, {"network": f"torchrun env:// (MASTER_ADDR={os.environ.get('MASTER_ADDR', '?')})"}
        )
        print(format_facts(facts), flush=True)
        if problem:
            print(f"# ERROR: {problem}", flush=True)
    cases, note = build_cases(args, ws)
    if rank == 0 and note:
        print(f"# note: {note}")
    fd, result_path = tempfile.mkstemp(prefix="ringpg-bench-", suffix=".jsonl")
    os.close(fd)
    cfg = _config(
        args,
        ws,
        cases,
        "env://",
        os.environ.get("MASTER_ADDR", "127.0.0.1"),
        result_path,
        args.probe,
        "torchrun rendezvous address",
        None,
        0,
        len(cases),
        {},
    )
    try:
        status = run_worker(cfg, rank)
        if rank != 0:
            return status
        return max(status, finalize(args, facts, read_events(result_path), None, []))
    finally:
        os.unlink(result_path)


if __name__ == "__main__":
    sys.exit(main())
