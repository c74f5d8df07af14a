"""An MPI peer of the bench: the same cases, data, checks and timing rule, through mpi4py.

Run by ``benchmarks.peers`` under each MPI's own launcher, from that MPI's virtual
environment (numpy and mpi4py, no torch)::

    mpiexec -n N python -m benchmarks.mpi_peer CONFIG.json

``CONFIG.json`` holds the case list (``[op, dtype, numel]``), the iteration policy,
``fresh``, ``hugepages`` (the bench's ``--hugepages``: numpy's madvise) and the control
directory.  Every rank waits for its next command in a blocking read of its own FIFO
(``DIR/rank<r>``: ``run <index>`` or ``quit``), so an idle peer takes no CPU from the
bench's ranks, even on an MPI whose blocking calls spin.
Rank 0 writes one JSON line per event to the FIFO ``DIR/results``: ``ready`` (the MPI
library, whether the ranks share a clock), then per case its timed spans (start, end,
end - start in ns, MAX over ranks, per timed iteration) and the wrong elements (each
rank's worst checked round, summed over ranks); the bench turns them into its figures.

The ops and their MPI calls: all_reduce -> ``MPI_Allreduce(MPI_IN_PLACE)`` (in place,
as the bench's all_reduce), reduce_scatter_tensor -> ``MPI_Reduce_scatter_block``,
all_gather_into_tensor -> ``MPI_Allgather``, all_to_all_single -> ``MPI_Alltoall``
(out of place, as torch's), broadcast -> ``MPI_Bcast`` from rank 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, TextIO, Tuple

if __package__ in (None, ""):  # `python benchmarks/mpi_peer.py`: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from benchmarks.protocol import BROADCAST_ROOT, IterationPolicy, assemble, clock_identity, layout  # noqa: E402

# mpi4py's MPI module, imported by main() once the command line is parsed: ``--help``
# answers without mpi4py (importing MPI initializes MPI, outside mpiexec too).
MPI: Any = None


class PeerBuffers:
    """One rank's buffers of a case, as numpy arrays: the bench's ``CaseBuffers`` for MPI
    (same layout, sentinels, fresh-tensor rule and wrong-element count)."""

    def __init__(self, op: str, dtype: str, numel: int, rank: int, world_size: int, fresh: bool) -> None:
        self.op = op
        self.dtype = np.dtype(dtype)
        self.fresh = fresh
        lay = layout(op, rank, world_size, numel)
        self.inplace = lay.inplace
        self.output_numel = lay.output_numel
        self.expected = assemble(lay.expected, world_size, self.dtype)
        self.pristine = assemble(lay.input, world_size, self.dtype) if lay.input is not None else None
        self.input: np.ndarray = np.empty_like(self.expected) if self.inplace else self.pristine.copy()  # type: ignore[union-attr]
        self.output: Optional[np.ndarray] = None if self.inplace else self._new_output(sentinel=True)
        self._sentinel_output = True
        self.reset()

    def _new_output(self, sentinel: bool) -> np.ndarray:
        if sentinel:
            return np.full(self.output_numel, np.nan, dtype=self.dtype)
        return np.empty(self.output_numel, dtype=self.dtype)

    def reset(self, verify: bool = True) -> None:
        """As ``CaseBuffers.reset``: restore the in-place buffer, sentinel outputs; fresh: new arrays."""
        if self.fresh:
            if self.pristine is not None:
                self.input = self.pristine.copy()
            elif verify:
                self.input = np.full_like(self.expected, np.nan)
            else:
                self.input = np.empty_like(self.expected)
            self._sentinel_output = verify
        elif self.inplace:
            if self.pristine is not None:
                np.copyto(self.input, self.pristine)
            else:  # broadcast receiver
                self.input.fill(np.nan)
        else:
            assert self.output is not None
            self.output.fill(np.nan)

    def run(self, comm: Any) -> None:
        """The collective, synchronously (fresh: the output allocated first, inside the timed region)."""
        op = self.op
        if self.fresh and not self.inplace:
            self.output = self._new_output(self._sentinel_output)
        if op == "all_reduce":
            comm.Allreduce(MPI.IN_PLACE, self.input, op=MPI.SUM)
        elif op == "broadcast":
            comm.Bcast(self.input, root=BROADCAST_ROOT)
        elif op == "reduce_scatter_tensor":
            comm.Reduce_scatter_block(self.input, self.output, op=MPI.SUM)
        elif op == "all_gather_into_tensor":
            comm.Allgather(self.input, self.output)
        elif op == "all_to_all_single":
            comm.Alltoall(self.input, self.output)
        else:
            raise ValueError(op)

    def count_wrong(self) -> int:
        """Wrong output elements, plus input elements an out-of-place op modified (restored)."""
        result = self.input if self.inplace else self.output
        wrong = int(np.count_nonzero(result != self.expected))
        if not self.inplace and self.pristine is not None:
            clobbered = int(np.count_nonzero(self.input != self.pristine))
            if clobbered:
                np.copyto(self.input, self.pristine)
            wrong += clobbered
        return wrong


def measure(comm: Any, bufs: PeerBuffers, policy: IterationPolicy) -> Dict[str, Any]:
    """One case, by the bench's rule (``timing.measure_case`` for one backend): warm-up rounds
    that verify, adaptive timed rounds (each after a barrier; ``batch`` ops back to back),
    one verifying round after them; spans reduced with MAX and wrong counts with SUM over ranks."""
    spans: List[Tuple[int, int, int]] = []
    wrong = 0

    def one_round(timed: bool, verify: bool) -> None:
        nonlocal wrong
        if verify or bufs.inplace or bufs.fresh:
            bufs.reset(verify)
        comm.Barrier()
        n_ops = policy.batch if timed else 1
        t0 = time.perf_counter_ns()
        for _ in range(n_ops):
            bufs.run(comm)
        t1 = time.perf_counter_ns()
        if timed:
            spans.append((t0, t1, t1 - t0))
        if verify:
            wrong = max(wrong, bufs.count_wrong())

    rounds, last_round_s = 0, 0.0
    for _ in range(policy.warmup):
        t = time.perf_counter()
        one_round(timed=False, verify=True)
        rounds += 1
        last_round_s = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
        if policy.warmup_done(last_round_s):
            break
    for _ in range(policy.timed_iterations(rounds, last_round_s)):
        one_round(timed=True, verify=policy.verify_timed)
    if not policy.verify_timed:
        one_round(timed=False, verify=True)
    smat = np.array(spans, dtype=np.int64).reshape(-1, 3)
    comm.Allreduce(MPI.IN_PLACE, smat, op=MPI.MAX)
    return {"spans": smat.tolist(), "wrong": comm.allreduce(wrong, op=MPI.SUM)}


def _send(out: Optional[TextIO], obj: Dict[str, Any]) -> None:
    if out is not None:
        out.write(json.dumps(obj) + "\n")
        out.flush()


def use_hugepages(choice: str) -> None:
    """numpy's huge-page madvise for its large arrays as the bench's --hugepages asks
    (``native``: numpy's default, which is on where the kernel has transparent huge pages)."""
    if choice == "native":
        return
    try:
        from numpy._core import multiarray  # numpy 2
    except ImportError:
        from numpy.core import multiarray  # type: ignore[no-redef]  # numpy 1
    multiarray._set_madvise_hugepage(choice == "on")


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.mpi_peer",
        description="An MPI peer of benchmarks.bench, run by benchmarks.peers under an MPI's "
        "own launcher: mpiexec -n N python -m benchmarks.mpi_peer CONFIG.json (needs numpy and mpi4py).",
    )
    ap.add_argument("config", help="the JSON file benchmarks.peers writes: cases, iteration policy, control directory")
    args = ap.parse_args(argv)
    global MPI
    from mpi4py import MPI

    with open(args.config) as f:
        cfg = json.load(f)
    use_hugepages(cfg.get("hugepages", "native"))
    comm = MPI.COMM_WORLD
    rank, ws = comm.Get_rank(), comm.Get_size()
    control = Path(cfg["control_dir"])
    ids = comm.allgather(clock_identity())
    commands = open(control / f"rank{rank}")  # the launcher holds the other end: no wait here
    out = open(control / "results", "w") if rank == 0 else None
    import mpi4py

    _send(
        out,
        {
            "kind": "ready",
            "world_size": ws,
            "shared_clock": bool(ids[0]) and len(set(ids)) == 1,
            "library": " ".join(MPI.Get_library_version().strip().splitlines()[0].split(",")[0].split()),
            "mpi4py": mpi4py.__version__,
            "numpy": np.__version__,
        },
    )
    policy = IterationPolicy(**cfg["policy"])
    while True:
        words = commands.readline().split()  # blocks without spinning until the launcher writes
        if not words or words[0] == "quit":
            break
        index = int(words[1])
        op, dtype, numel = cfg["cases"][index]
        try:
            bufs = PeerBuffers(op, dtype, numel, rank, ws, bool(cfg.get("fresh")))
            result = measure(comm, bufs, policy)
            del bufs
        except Exception:  # noqa: BLE001 - the others would wait in a collective forever
            traceback.print_exc()
            sys.stderr.flush()
            comm.Abort(3)
        _send(out, {"kind": "case", "index": index, **result})
    commands.close()
    if out is not None:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
