"""Worker processes: a real torch.distributed job per pool, serving tasks, never hanging.

A :class:`WorkerPool` starts ``world_size`` processes (:func:`worker_context`).  Each initialises torch.distributed once, builds a :class:`Groups` pair
(the backend under test and a gloo reference group over the same ranks), and then
serves tasks: a task is a module-level function ``fn(rank, ws, groups, args)``
referenced by name (so it pickles), run on every rank; its picklable return values
come back to the parent through a queue.  Many cases run inside one task so that
process start-up is paid once per pool, not once per case.

Nothing may hang: every wait has a deadline; on expiry all children are killed and
the parent fails naming the ranks that did not finish.  A child exception comes
back as a formatted traceback and the parent raises ``AssertionError`` with all of
them (after a short grace period the still-running ranks, typically blocked in a
collective their failed peer never joined, are killed).
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from devkit.launch import free_port, rank_context
from devkit.settings import merged_env

from .backend import REFERENCE_BACKEND, apply_env, backend_under_test

DEFAULT_RUN_TIMEOUT_S = 120.0
PG_TIMEOUT_S = 60.0
ERROR_GRACE_S = 10.0  # after one rank fails, how long the others get to report
SHUTDOWN_TIMEOUT_S = 30.0

TaskFn = Callable[[int, int, "Groups", Any], Any]


@dataclass(frozen=True)
class InitSpec:
    """How the workers initialise torch.distributed.

    method: ``"tcp"`` (init_method=tcp://), ``"env"`` (env:// with MASTER_ADDR/PORT,
    RANK, WORLD_SIZE set in the child), ``"file"`` (file://) or ``"store"``
    (explicit ``store=`` TCPStore).
    default_backend: backend of the default group; ``None`` means the backend under
    test.  The other backend of the (test, gloo) pair is created with ``new_group``.
    """

    method: str = "tcp"
    default_backend: Optional[str] = None
    # Extra environment for the workers, set before torch.distributed starts (for
    # example {"RINGPG_TRANSPORT": "tcp"}); ringpg reads its RINGPG_* knobs once.
    env: tuple[tuple[str, str], ...] = ()
    # Extra environment for rank 0 only (ranks that disagree, e.g. on the transport).
    rank0_env: tuple[tuple[str, str], ...] = ()
    # Called in rank 0's process before torch.distributed starts (a module-level
    # function, so it pickles): gives that rank a different machine view.
    rank0_setup: Optional[Callable[[], None]] = None


@dataclass
class Groups:
    """The groups a task runs on (built in the child; never pickled)."""

    test: Any  # process group of the backend under test, all ranks
    ref: Any  # gloo process group, same ranks
    backend: str  # name of the backend under test


@dataclass(frozen=True)
class _Rendezvous:
    spec: InitSpec
    backend: str
    port: int
    file_path: str


def _init_child(rank: int, ws: int, rdv: _Rendezvous) -> Groups:
    torch.set_num_threads(1)
    apply_env(merged_env({}, rdv.spec.env), rank)
    if rank == 0:
        os.environ.update(merged_env(os.environ, rdv.spec.rank0_env))
        if rdv.spec.rank0_setup is not None:
            rdv.spec.rank0_setup()
    if rdv.backend == "ringpg" or (rdv.spec.default_backend == "ringpg"):
        import ringpg  # noqa: F401  (registers the backend; harmless if the entry point did)
    default_backend = rdv.spec.default_backend or rdv.backend
    timeout = timedelta(seconds=PG_TIMEOUT_S)
    method = rdv.spec.method
    if method == "tcp":
        dist.init_process_group(
            default_backend, init_method=f"tcp://127.0.0.1:{rdv.port}", rank=rank, world_size=ws, timeout=timeout
        )
    elif method == "env":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(rdv.port), RANK=str(rank), WORLD_SIZE=str(ws))
        dist.init_process_group(default_backend, init_method="env://", timeout=timeout)
    elif method == "file":
        dist.init_process_group(
            default_backend, init_method=f"file://{rdv.file_path}", rank=rank, world_size=ws, timeout=timeout
        )
    elif method == "store":
        store = dist.TCPStore("127.0.0.1", rdv.port, ws, is_master=(rank == 0), timeout=timeout)
        dist.init_process_group(default_backend, store=store, rank=rank, world_size=ws, timeout=timeout)
    else:
        raise ValueError(f"unknown init method {method!r}")
    if default_backend == rdv.backend:
        test = dist.group.WORLD
        # Always a distinct group, even when the backend under test is gloo itself.
        ref = dist.new_group(backend=REFERENCE_BACKEND)
    else:
        test = dist.new_group(backend=rdv.backend)
        ref = dist.group.WORLD if default_backend == REFERENCE_BACKEND else dist.new_group(backend=REFERENCE_BACKEND)
    return Groups(test=test, ref=ref, backend=rdv.backend)


# How workers start (RINGPG_TEST_START): "forkserver" (the default) forks each from a
# server process that imported torch once, so a worker starts in milliseconds instead of
# the 1-2 s of CPU an interpreter and `import torch` cost (most of a small test's time on
# 2 cores); "spawn" starts a fresh interpreter for each.  Either way a worker's own
# settings (InitSpec.env, a scenario's env) are applied in the worker before
# torch.distributed starts, and torch and ringpg read them at group creation, not at
# import.  The server inherits this process's environment when it first starts.
START_METHOD = os.environ.get("RINGPG_TEST_START", "forkserver")


def worker_context() -> Any:
    """The multiprocessing context every harness worker is started with (START_METHOD)."""
    return rank_context(START_METHOD)


def _child_main(rank: int, ws: int, rdv: _Rendezvous, tasks: Any, results: Any) -> None:
    """Child process: initialise, then run tasks until the ``None`` sentinel."""
    try:
        groups = _init_child(rank, ws, rdv)
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, -1, "error", f"initialisation failed:\n{traceback.format_exc()}"))
        return
    results.put((rank, -1, "ok", None))
    while True:
        task = tasks.get()
        if task is None:
            break
        task_id, fn, args = task
        try:
            out = fn(rank, ws, groups, args)
            results.put((rank, task_id, "ok", out))
        except BaseException:  # noqa: BLE001 - reported to the parent
            results.put((rank, task_id, "error", traceback.format_exc()))
    try:
        dist.destroy_process_group()
        results.put((rank, -2, "ok", None))
    except BaseException:  # noqa: BLE001
        results.put((rank, -2, "error", f"destroy_process_group failed:\n{traceback.format_exc()}"))


class WorkerPool:
    """``world_size`` long-lived worker processes sharing one torch.distributed job."""

    def __init__(
        self,
        world_size: int,
        spec: InitSpec = InitSpec(),  # noqa: B008 - frozen: one shared default is safe
        backend: Optional[str] = None,
        error_grace_s: float = ERROR_GRACE_S,
    ) -> None:
        self.world_size = world_size
        self.error_grace_s = error_grace_s
        self.spec = spec
        self.backend = backend or backend_under_test()
        self._ctx = worker_context()
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._results: Any = None
        self._tmpdir: Optional[str] = None
        self._next_id = 0
        self._init_failure: Optional[str] = None  # initialisation is deterministic: fail fast after one failure

    @property
    def alive(self) -> bool:
        return bool(self._procs)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._kill()

    def start(self, timeout: float = DEFAULT_RUN_TIMEOUT_S) -> None:
        """Spawn the workers and wait until every rank has initialised."""
        if self.alive:
            return
        if self._init_failure is not None:
            raise AssertionError(f"(not retried) {self._init_failure}")
        self._tmpdir = tempfile.mkdtemp(prefix="ringpg-test-")
        rdv = _Rendezvous(self.spec, self.backend, free_port(), os.path.join(self._tmpdir, "rendezvous"))
        self._results = self._ctx.Queue()
        self._tasks = [self._ctx.Queue() for _ in range(self.world_size)]
        self._procs = [
            self._ctx.Process(
                target=_child_main,
                args=(r, self.world_size, rdv, self._tasks[r], self._results),
                daemon=True,
                name=f"ringpg-test-rank{r}",
            )
            for r in range(self.world_size)
        ]
        for p in self._procs:
            p.start()
        try:
            self._collect(
                -1,
                f"initialisation ({self.spec.method}://, default backend {self.spec.default_backend or self.backend})",
                timeout,
            )
        except AssertionError as e:
            self._init_failure = str(e)
            raise

    def run(self, fn: TaskFn, args: Any = None, timeout: float = DEFAULT_RUN_TIMEOUT_S) -> list[Any]:
        """Run ``fn(rank, ws, groups, args)`` on every rank; return the results by rank.

        Starts (or restarts, after a failure) the workers if needed.  Raises
        AssertionError naming the ranks that failed, crashed or hung.
        """
        self.start()
        self._next_id += 1
        task_id = self._next_id
        for q in self._tasks:
            q.put((task_id, fn, args))
        got = self._collect(task_id, f"task {fn.__module__}.{fn.__qualname__}", timeout)
        return [got[r] for r in range(self.world_size)]

    def close(self) -> None:
        """Stop the workers (each destroys its process groups); fail if one does not stop cleanly."""
        if not self.alive:
            return
        for q in self._tasks:
            q.put(None)
        try:
            self._collect(-2, "shutdown (destroy_process_group)", SHUTDOWN_TIMEOUT_S)
        finally:
            self._kill()

    def _collect(self, task_id: int, what: str, timeout: float) -> dict[int, Any]:
        ws = self.world_size
        deadline = time.monotonic() + timeout
        done: dict[int, Any] = {}
        errors: dict[int, str] = {}
        first_error: Optional[float] = None
        while len(done) + len(errors) < ws:
            limit = deadline if first_error is None else min(deadline, first_error + self.error_grace_s)
            now = time.monotonic()
            if now >= limit:
                break
            try:
                rank, tid, status, payload = self._results.get(timeout=min(0.25, limit - now))
            except queue.Empty:
                for r, p in enumerate(self._procs):
                    if r not in done and r not in errors and not p.is_alive():
                        errors[r] = f"process died with exit code {p.exitcode} without reporting (crash?)"
                        first_error = first_error or time.monotonic()
                continue
            if tid != task_id:
                continue  # stale message from an earlier task
            if status == "ok":
                done[rank] = payload
            else:
                errors[rank] = payload
                first_error = first_error or time.monotonic()
        if not errors and len(done) == ws:
            return done
        missing = [r for r in range(ws) if r not in done and r not in errors]
        self._kill()
        parts = [f"{what} failed with backend {self.backend!r}, world size {ws}:"]
        for r in sorted(errors):
            parts.append(f"--- rank {r} raised ---\n{errors[r]}")
        if missing:
            if errors:
                parts.append(
                    f"ranks {missing} were still running {self.error_grace_s:.0f} s after a peer failed (killed)"
                )
            else:
                parts.append(f"ranks {missing} hung: no result within {timeout:.0f} s (all workers killed)")
        raise AssertionError("\n".join(parts))

    def _kill(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(timeout=10)
        for q in [*self._tasks, self._results]:
            if q is not None:
                q.cancel_join_thread()
                q.close()
        self._procs, self._tasks, self._results = [], [], None
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None


def run_workers(
    fn: TaskFn,
    world_size: int,
    args: Any = None,
    spec: InitSpec = InitSpec(),  # noqa: B008 - frozen: one shared default is safe
    backend: Optional[str] = None,
    timeout: float = DEFAULT_RUN_TIMEOUT_S,
) -> list[Any]:
    """One-shot: start a pool, run ``fn`` on every rank, shut the pool down, return the results."""
    with WorkerPool(world_size, spec, backend) as pool:
        return pool.run(fn, args, timeout)


def collect_results(procs: list[Any], out: Any, expect: set[int], timeout: float) -> dict[int, dict]:
    """For one-shot scenarios that start their own processes (a rank that dies, freezes
    or aborts on purpose): waits up to ``timeout`` s for a ``(rank, result dict)`` from
    each rank in ``expect`` on queue ``out``, then kills every process still alive.
    Raises ``AssertionError`` naming the ranks that hung, or the results that report a
    ``"crash"``; returns every result that came."""
    results: dict[int, dict] = {}
    deadline = time.monotonic() + timeout
    try:
        while not expect <= results.keys():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"ranks {sorted(expect - results.keys())} hung (no result in {timeout}s)")
            try:
                rank, res = out.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            results[rank] = res
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
    crashes = {r: v["crash"] for r, v in results.items() if "crash" in v}
    assert not crashes, crashes
    return results
