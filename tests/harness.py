"""Multi-process test harness for ringpg: real processes, real sockets, gloo as the reference.

A :class:`WorkerPool` spawns ``world_size`` processes (``multiprocessing`` "spawn"
context).  Each initialises torch.distributed once, builds a :class:`Groups` pair
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

Value mismatches are *not* exceptions in the workers: they are recorded in a
:class:`Checker` so every rank finishes every case (no rank blocks waiting for a
peer that stopped), and the parent reports all of them with
:func:`assert_reports_ok`.

The backend under test is ``"ringpg"`` unless the environment variable
``RINGPG_TEST_BACKEND`` names another (``RINGPG_TEST_BACKEND=gloo`` validates the
harness and the tests themselves against gloo).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import re
import shutil
import socket
import tempfile
import time
import traceback
import zlib
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

BACKEND_ENV = "RINGPG_TEST_BACKEND"
REFERENCE_BACKEND = "gloo"

DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
)
OPS: tuple[str, ...] = ("SUM", "AVG", "MIN", "MAX", "PRODUCT")
# The 2**20+3 case runs only for these dtypes to keep the suite's runtime reasonable.
BIG_NUMEL = 2**20 + 3
BIG_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.int32)

DEFAULT_RUN_TIMEOUT_S = 120.0
PG_TIMEOUT_S = 60.0
ERROR_GRACE_S = 10.0  # after one rank fails, how long the others get to report
SHUTDOWN_TIMEOUT_S = 30.0

TaskFn = Callable[[int, int, "Groups", Any], Any]


def backend_under_test() -> str:
    """The backend the tests exercise: ``$RINGPG_TEST_BACKEND`` or ``"ringpg"``."""
    return os.environ.get(BACKEND_ENV, "ringpg")


def cpu_backend(group: Any) -> Any:
    """The c10d Backend object serving ``group``'s CPU tensors (ringpg's RingBackend, say)."""
    return group._get_backend(torch.device("cpu"))


def transport_of(group: Any) -> Optional[str]:
    """How ``group``'s ring moves its bytes: ringpg says "shm" or "tcp"; None for other backends."""
    import ringpg

    b = ringpg.backend(group)
    return b.transport if b is not None else None


def wait_spin_of(group: Any) -> Optional[int]:
    """Microseconds ringpg's waits poll before sleeping (RINGPG_SPIN_US or auto's choice); None for others."""
    import ringpg

    b = ringpg.backend(group)
    return b.wait_spin_us if b is not None else None


def entry_point_installed(name: str = "ringpg") -> bool:
    """Whether a ``torch.backends`` entry point named ``name`` is installed (pip install)."""
    from importlib.metadata import entry_points

    return any(ep.name == name for ep in entry_points(group="torch.backends"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- data


def case_seed(rank: int, case: str) -> int:
    """Deterministic seed from (rank, case); independent of PYTHONHASHSEED."""
    return zlib.crc32(case.encode()) * 1024 + rank


def make_data(rank: int, case: str, shape: Sequence[int], dtype: torch.dtype, kind: str = "small") -> torch.Tensor:
    """Deterministic integer-valued data so every reduction is exact in every dtype.

    kind ``"small"``: values in [-4, 4] (signed) or [0, 4] (unsigned);
    kind ``"product"``: values in {-1, 1, 2} (signed) or {1, 2} (unsigned), so
    |product| <= 2**5 at world size 5.
    """
    g = torch.Generator().manual_seed(case_seed(rank, case))
    signed = dtype != torch.uint8
    if kind == "small":
        lo = -4 if signed else 0
        vals = torch.randint(lo, 5, tuple(shape), generator=g, dtype=torch.int64)
    elif kind == "product":
        choices = torch.tensor([-1, 1, 2] if signed else [1, 2], dtype=torch.int64)
        vals = choices[torch.randint(0, len(choices), tuple(shape), generator=g)]
    else:
        raise ValueError(f"unknown data kind {kind!r}")
    return vals.to(dtype)


def make_random_float(rank: int, case: str, shape: Sequence[int], dtype: torch.dtype, kind: str = "normal") -> torch.Tensor:
    """Deterministic random floats, exactly representable in ``dtype``.

    kind ``"normal"``: standard normal; kind ``"product"``: random sign times a
    magnitude uniform in [0.5, 2) (no underflow in a product of 5 factors).
    """
    g = torch.Generator().manual_seed(case_seed(rank, case))
    if kind == "normal":
        x = torch.randn(tuple(shape), generator=g, dtype=torch.float64)
    elif kind == "product":
        mag = 0.5 + 1.5 * torch.rand(tuple(shape), generator=g, dtype=torch.float64)
        sign = torch.randint(0, 2, tuple(shape), generator=g).to(torch.float64) * 2 - 1
        x = sign * mag
    else:
        raise ValueError(f"unknown data kind {kind!r}")
    return x.to(dtype)


def data_kind(op: str) -> str:
    return "product" if op == "PRODUCT" else "small"


def numels_for(ws: int, dtype: torch.dtype) -> list[int]:
    """{0, 1, ws-1, ws, 1000} plus 2**20+3 for BIG_DTYPES only (runtime)."""
    ns = sorted({0, 1, ws - 1, ws, 1000})
    if dtype in BIG_DTYPES:
        ns.append(BIG_NUMEL)
    return ns


# Features gloo lacks (checked in torch 2.15).  Only relevant when
# RINGPG_TEST_BACKEND=gloo substitutes gloo for the backend under test: those checks
# are then skipped; they always run against ringpg.
GLOO_GAPS = frozenset(
    {
        "AVG on integer dtypes",  # raises "result type Float can't be cast"
        "future of reduce_scatter_tensor",  # Work::getFuture not implemented; is_completed() stays False
        "future of reduce_scatter",  # same
        "future of all_gather_into_tensor",  # value is the list of per-rank views, not [output]
    }
)


def known_gap(backend: str, feature: str) -> bool:
    """True if ``feature`` is a known gap of the substituted backend (gloo only)."""
    return backend == REFERENCE_BACKEND and feature in GLOO_GAPS


def skip_case(backend: str, op: str, dtype: torch.dtype) -> bool:
    """Reduction cases the backend under test cannot run (gloo's integer AVG only)."""
    return op == "AVG" and not dtype.is_floating_point and known_gap(backend, "AVG on integer dtypes")


def reduce_op(name: str) -> Any:
    return getattr(dist.ReduceOp, name)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ------------------------------------------------------------------- references


def divide_by_world(x: torch.Tensor, n: int) -> torch.Tensor:
    """AVG from SUM in the same dtype (truncating division for integer dtypes)."""
    if x.dtype.is_floating_point:
        return torch.div(x, n)
    return torch.div(x, n, rounding_mode="trunc")


def ref_all_reduce(x: torch.Tensor, op: str, group: Any) -> torch.Tensor:
    """all_reduce of a copy of ``x`` on the gloo ``group``; AVG as SUM / group size."""
    out = x.clone()
    dist.all_reduce(out, op=reduce_op("SUM" if op == "AVG" else op), group=group)
    if op == "AVG":
        out = divide_by_world(out, dist.get_world_size(group))
    return out


def ref_reduce_scatter(full_input: torch.Tensor, op: str, group: Any) -> torch.Tensor:
    """This rank's block of the reduction of ``full_input`` (dim 0 split in group-size blocks).

    Computed from a gloo all_reduce, so it does not depend on gloo's reduce_scatter.
    """
    red = ref_all_reduce(full_input, op, group)
    block = red.shape[0] // dist.get_world_size(group)
    return red.narrow(0, dist.get_rank(group) * block, block).clone()


def ref_all_gather(x: torch.Tensor, group: Any) -> torch.Tensor:
    """gloo all_gather_into_tensor of ``x``, concatenated along dim 0."""
    ws = dist.get_world_size(group)
    out = torch.empty((x.shape[0] * ws, *x.shape[1:]), dtype=x.dtype)
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def ref_broadcast(x: torch.Tensor, src: int, group: Any) -> torch.Tensor:
    """gloo broadcast of a copy of ``x`` from global rank ``src``."""
    out = x.clone()
    dist.broadcast(out, src=src, group=group)
    return out


def sentinel_like(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Output buffer pre-filled with a value the data never contains (77)."""
    return torch.full(tuple(shape), 77, dtype=dtype)


# --------------------------------------------------------------------- checking


def describe_mismatch(got: torch.Tensor, expected: torch.Tensor, max_items: int = 4) -> Optional[str]:
    """None if ``got`` equals ``expected`` exactly (dtype, shape, values); else a description."""
    if not isinstance(got, torch.Tensor):
        return f"got a {type(got).__name__}, expected a tensor"
    if got.dtype != expected.dtype or tuple(got.shape) != tuple(expected.shape):
        return f"got dtype={got.dtype} shape={tuple(got.shape)}, expected dtype={expected.dtype} shape={tuple(expected.shape)}"
    if torch.equal(got, expected):
        return None
    bad = (got != expected).flatten()
    return _format_bad(got, expected, bad, max_items)


def _format_bad(got: torch.Tensor, expected: torch.Tensor, bad: torch.Tensor, max_items: int) -> str:
    idx = bad.nonzero().flatten()
    first = idx[:max_items]
    g = got.flatten()[first].tolist()
    e = expected.flatten()[first].tolist()
    return (
        f"{idx.numel()}/{got.numel()} elements differ; first at flat index {first.tolist()}: "
        f"got {g} expected {e}"
    )


@dataclass
class CheckReport:
    """What one rank checked in one task (picklable)."""

    rank: int
    n_checks: int
    failures: list[str]
    extra: Any = None


@dataclass
class Checker:
    """Records comparisons in a worker; never raises, so every rank runs every case."""

    rank: int
    n_checks: int = 0
    failures: list[str] = field(default_factory=list)

    def equal(self, what: str, got: torch.Tensor, expected: torch.Tensor) -> bool:
        """Exact comparison (dtype, shape and every value)."""
        self.n_checks += 1
        msg = describe_mismatch(got, expected)
        if msg is not None:
            self.failures.append(f"rank {self.rank}: {what}: {msg}")
        return msg is None

    def within(self, what: str, got: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> bool:
        """Elementwise ``|got - expected| <= bound`` (evaluated in float64); dtype and shape must match."""
        self.n_checks += 1
        if not isinstance(got, torch.Tensor) or got.dtype != expected.dtype or got.shape != expected.shape:
            msg = describe_mismatch(got, expected)
            self.failures.append(f"rank {self.rank}: {what}: {msg}")
            return False
        err = (got.double() - expected.double()).abs()
        bad = (~(err <= bound)).flatten()
        if bool(bad.any()):
            worst = int(torch.argmax(torch.where(bound > 0, err / bound, err).flatten()))
            self.failures.append(
                f"rank {self.rank}: {what}: {_format_bad(got, expected, bad, 4)}; "
                f"worst at {worst}: |err|={err.flatten()[worst].item():.3g} bound={bound.flatten()[worst].item():.3g}"
            )
            return False
        return True

    def true(self, what: str, cond: bool, detail: str = "") -> bool:
        """Record a boolean property."""
        self.n_checks += 1
        if not cond:
            self.failures.append(f"rank {self.rank}: {what}" + (f": {detail}" if detail else ""))
        return bool(cond)

    def report(self, extra: Any = None) -> CheckReport:
        return CheckReport(self.rank, self.n_checks, list(self.failures), extra)


_SIZE_FIELDS = re.compile(r" (shape=\([^)]*\)|numel=\d+|n=\d+)")


def _summary(failures: Sequence[str]) -> str:
    """Failures grouped by case with sizes and ranks stripped: which op/dtype/ws combos fail."""
    kinds: dict[str, int] = {}
    for line in failures:
        parts = line.split(": ", 2)  # "rank r", what, detail
        key = _SIZE_FIELDS.sub("", parts[1]) if len(parts) == 3 else line
        kinds[key] = kinds.get(key, 0) + 1
    return "\n".join(f"  {n:4d} x {k}" for k, n in kinds.items())


def assert_reports_ok(reports: Sequence[CheckReport], min_checks_per_rank: int = 1, max_lines: int = 60) -> None:
    """Fail with every recorded mismatch; also fail if a rank checked (almost) nothing."""
    lines: list[str] = []
    for rep in reports:
        if rep.n_checks < min_checks_per_rank:
            lines.append(f"rank {rep.rank}: only {rep.n_checks} checks ran (expected >= {min_checks_per_rank})")
        lines.extend(rep.failures)
    if lines:
        shown = lines[:max_lines]
        more = f"\n... and {len(lines) - max_lines} more" if len(lines) > max_lines else ""
        raise AssertionError(
            f"{len(lines)} failed checks; by case (all ranks and sizes):\n{_summary(lines)}\ndetails:\n"
            + "\n".join(shown)
            + more
        )


def smoke_checks(chk: Checker, tag: str, test_group: Any, ref_group: Any, numel: int = 1000) -> None:
    """A few of each collective on ``test_group`` vs the gloo ``ref_group`` (same ranks).

    For rendezvous, subgroup and launcher tests, where *that* the group works
    matters more than the full dtype/op battery of test_collectives.py.
    """
    rank, ws = dist.get_rank(test_group), dist.get_world_size(test_group)
    chk.true(f"{tag}: rank/size match the gloo group", (rank, ws) == (dist.get_rank(ref_group), dist.get_world_size(ref_group)),
             f"({rank}, {ws}) vs ({dist.get_rank(ref_group)}, {dist.get_world_size(ref_group)})")
    grank = dist.get_rank()
    for dtype, op in ((torch.float32, "SUM"), (torch.int64, "MAX"), (torch.float32, "AVG"), (torch.int32, "PRODUCT")):
        case = f"{tag}: all_reduce op={op} dtype={dtype_name(dtype)} ws={ws} numel={numel}"
        x = make_data(grank, case, (numel,), dtype, data_kind(op))
        got = x.clone()
        dist.all_reduce(got, op=reduce_op(op), group=test_group)
        chk.equal(case, got, ref_all_reduce(x, op, ref_group))
    case = f"{tag}: reduce_scatter_tensor op=SUM dtype=float32 ws={ws} numel={numel}"
    x = make_data(grank, case, (numel * ws,), torch.float32)
    out = sentinel_like((numel,), torch.float32)
    dist.reduce_scatter_tensor(out, x, group=test_group)
    chk.equal(case, out, ref_reduce_scatter(x, "SUM", ref_group))
    case = f"{tag}: all_gather_into_tensor dtype=int64 ws={ws} numel={numel}"
    x = make_data(grank, case, (numel,), torch.int64)
    out = sentinel_like((numel * ws,), torch.int64)
    dist.all_gather_into_tensor(out, x, group=test_group)
    chk.equal(case, out, ref_all_gather(x, ref_group))
    src = dist.get_global_rank(test_group, ws - 1) if test_group is not dist.group.WORLD else ws - 1
    case = f"{tag}: broadcast src={src} (global) dtype=float64 ws={ws} numel={numel}"
    x = make_data(grank, case, (numel,), torch.float64)
    got = x.clone()
    dist.broadcast(got, src=src, group=test_group)
    chk.equal(case, got, ref_broadcast(x, src, ref_group))
    dist.barrier(group=test_group)


# -------------------------------------------------------------------- processes


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
    os.environ.update(dict(rdv.spec.env))
    if rank == 0:
        os.environ.update(dict(rdv.spec.rank0_env))
        if rdv.spec.rank0_setup is not None:
            rdv.spec.rank0_setup()
    if rdv.backend == "ringpg" or (rdv.spec.default_backend == "ringpg"):
        import ringpg  # noqa: F401  (registers the backend; harmless if the entry point did)
    default_backend = rdv.spec.default_backend or rdv.backend
    timeout = timedelta(seconds=PG_TIMEOUT_S)
    method = rdv.spec.method
    if method == "tcp":
        dist.init_process_group(default_backend, init_method=f"tcp://127.0.0.1:{rdv.port}", rank=rank, world_size=ws, timeout=timeout)
    elif method == "env":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(rdv.port), RANK=str(rank), WORLD_SIZE=str(ws))
        dist.init_process_group(default_backend, init_method="env://", timeout=timeout)
    elif method == "file":
        dist.init_process_group(default_backend, init_method=f"file://{rdv.file_path}", rank=rank, world_size=ws, timeout=timeout)
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
        spec: InitSpec = InitSpec(),
        backend: Optional[str] = None,
        error_grace_s: float = ERROR_GRACE_S,
    ) -> None:
        self.world_size = world_size
        self.error_grace_s = error_grace_s
        self.spec = spec
        self.backend = backend or backend_under_test()
        self._ctx = mp.get_context("spawn")
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
            self._ctx.Process(target=_child_main, args=(r, self.world_size, rdv, self._tasks[r], self._results), daemon=True, name=f"ringpg-test-rank{r}")
            for r in range(self.world_size)
        ]
        for p in self._procs:
            p.start()
        try:
            self._collect(-1, f"initialisation ({self.spec.method}://, default backend {self.spec.default_backend or self.backend})", timeout)
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
                parts.append(f"ranks {missing} were still running {self.error_grace_s:.0f} s after a peer failed (killed)")
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
    spec: InitSpec = InitSpec(),
    backend: Optional[str] = None,
    timeout: float = DEFAULT_RUN_TIMEOUT_S,
) -> list[Any]:
    """One-shot: start a pool, run ``fn`` on every rank, shut the pool down, return the results."""
    with WorkerPool(world_size, spec, backend) as pool:
        return pool.run(fn, args, timeout)
