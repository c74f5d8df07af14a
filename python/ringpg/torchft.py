"""torchft integration: :class:`ProcessGroupRingpg`, a reconfigurable ringpg group.

torchft (fault-tolerant training: replica groups come and go, and the process group
that joins them is rebuilt in place each time the quorum changes) drives its process
group through ``configure(store_addr, replica_id, rank, world_size, ...)``: every
quorum hands a fresh ``host:port/prefix`` store address, and the wrapper aborts the
old group and builds a new one on that store.  This module gives torchft a ringpg
group for that role, in the place of its ``ProcessGroupGloo``::

    from ringpg.torchft import ProcessGroupRingpg
    manager = torchft.Manager(pg=ProcessGroupRingpg(timeout=timedelta(seconds=10)), ...)

Every collective torchft's process groups expose works, including the two that
torchft's gloo group refuses (``reduce_scatter``, ``reduce_scatter_tensor_coalesced``),
and ``alltoall_base`` with uneven splits.

torchft is an optional extra (``pip install 'ringpg[torchft]'``): ``import ringpg``
never imports this module, and importing it without torchft raises an ImportError
that says what to install.

Errors: an op that fails (a peer died, shut down or aborted, the group's timeout
passed) raises from ``wait()`` as usual; then, as torchft's own NCCL and XCCL groups do
when an op fails, the wrapper aborts the group and :meth:`ProcessGroupRingpg.errored`
returns ``RuntimeError("aborted: <the op's error>")`` (the op's error as its
``__cause__``) until the next ``configure()``; torchft's Manager reads ``errored()`` in
``should_commit`` and skips the step, and tools that match "aborted" see it.  Later
ops fail at once ("process group not initialized", torchft's words) until then.

Timeouts: the ``timeout`` given to the constructor is the group's op timeout and the
store's timeout; :meth:`set_timeout` changes it for the live group's later ops at once
(torch >= 2.9) and for the groups of later ``configure()`` calls; per-op timeouts
(``opts.timeout``) apply as in ringpg.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Generator, List, Optional, Tuple

import torch
import torch.distributed as dist

try:
    from torchft.process_group import ProcessGroupWrapper
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "ringpg.torchft needs torchft, an optional extra: pip install 'ringpg[torchft]' "
        f"(or pip install torchft==0.2.0); importing it failed with: {e}"
    ) from e

from ._registration import new_ring_backend, served_devices

__all__ = ["ProcessGroupRingpg"]

_CUSTOM = dist.ProcessGroup.BackendType.CUSTOM


class ProcessGroupRingpg(ProcessGroupWrapper):
    """A torchft ``ProcessGroupWrapper`` whose ``configure()`` builds a ringpg group.

    Args:
        timeout: the group's op timeout and the store client's timeout (torchft's
            meaning of the wrapper's timeout); it also bounds group creation.
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        self._errored: Optional[Exception] = None
        # ops of the current group not yet seen finished, with their deadlines
        self._works: List[Tuple[Any, float]] = []
        # ops may be issued from autograd's thread (DDP comm hooks) while another
        # thread reads errored()
        self._works_lock = threading.Lock()

    def getBackendName(self) -> str:
        return "torchft-ringpg"

    def _create_pg(self, store: dist.Store, rank: int, world_size: int) -> dist.ProcessGroup:
        """Build a ringpg group on the store torchft hands ``configure()``.

        The same steps torch's ``init_process_group`` takes for a registered backend:
        a ``ProcessGroup`` over the store, with one ``RingBackend`` serving every device
        it runs on (ringpg stages accelerator tensors through host memory).
        """
        self._errored = None
        with self._works_lock:
            self._works = []
        backend = new_ring_backend(store, rank, world_size, self._timeout, self._backend_group_name())
        pg = dist.ProcessGroup(store, rank, world_size)
        pg._set_default_backend(_CUSTOM)
        for device in served_devices():
            pg._register_backend(torch.device(device), _CUSTOM, backend)
        return pg

    def _backend_group_name(self) -> str:
        # ringpg uses the name in its logs only; the same words torchft gives its groups.
        if self._group_rank is not None and self._group_world_size:
            return f"torchft_quorum_{self._quorum_id}_rank_{self._group_rank % self._group_world_size}"
        return f"torchft_quorum_{self._quorum_id}"

    # ---- errors -------------------------------------------------------------------

    def _record(self, e: Optional[BaseException]) -> None:
        """The first failed op of the current group: aborts the group, as torchft's own
        groups do, and keeps "aborted: <why>" for :meth:`errored`."""
        if e is None or self._errored is not None or not isinstance(e, Exception):
            return
        err = RuntimeError(f"aborted: {e}")
        err.__cause__ = e
        self._errored = err
        super().abort(errored=True)  # torchft's error log, the group's abort, then no group

    def _collect(self) -> None:
        """Record the error of every finished tracked op, forget finished ops.

        Errors are read from the Works here, when asked, rather than recorded by a
        Future callback: callbacks run on ringpg's thread after the Work has finished,
        so one could record an error only after ``errored()`` was read.  An op still
        pending past its timeout counts as failed too: ``wait()`` has already raised
        "timed out after" for it, and ringpg fails it at that deadline.
        """
        now = time.monotonic()
        pending = []
        with self._works_lock:
            works, self._works = self._works, []
        for work, deadline in works:
            if work.is_completed():
                try:
                    work.get_future().wait()
                except Exception as e:  # noqa: BLE001 - the op's error
                    self._record(e)
            else:
                if now >= deadline:
                    ms = int(work.timeout.total_seconds() * 1000)
                    self._record(
                        TimeoutError(
                            f"ringpg: op seq {work._get_sequence_number()} timed out after {ms} ms "
                            "(still pending past its timeout)"
                        )
                    )
                pending.append((work, deadline))
        with self._works_lock:
            self._works = pending + self._works

    @contextmanager
    def _run_context(self) -> Generator[None, None, None]:
        # A call that fails at once with a distributed error (its group already failed,
        # or an op that ran in the caller's thread failed) marks the group as errored
        # too; a call refused for its arguments (ValueError, RuntimeError from ringpg's
        # validation, before any rank moved) leaves the group usable.
        try:
            yield
        except dist.DistError as e:
            self._record(e)
            raise

    def _wrap_work(self, work: Any, opts: object) -> Any:
        # Tracked until it finishes; a finished op costs nothing more than a check.
        self._collect()
        with self._works_lock:
            self._works.append((work, time.monotonic() + work.timeout.total_seconds()))
        return work

    def errored(self) -> Optional[Exception]:
        """``RuntimeError("aborted: ...")`` once an op of the current group has failed
        (the op's error chained as its ``__cause__``) or the group was aborted, else None.

        Reset by ``configure()``; torchft's Manager reads it before committing a step.
        """
        self._collect()
        return self._errored

    def abort(self, errored: bool = True) -> None:
        if errored and self._errored is None and self._pg is not None:
            self._errored = RuntimeError("aborted: abort() was called on this process group")
        super().abort(errored=errored)

    def set_timeout(self, timeout: timedelta) -> None:
        """The op timeout of the live group's later ops, at once (torch >= 2.9: ringpg's
        ``set_timeout``; older torch keeps it for the next group), and of the groups
        later ``configure()`` calls build, with the store's timeout."""
        super().set_timeout(timeout)
        pg = self._pg
        if pg is not None:
            backend = pg._get_backend(torch.device("cpu"))
            if hasattr(backend, "set_timeout"):
                backend.set_timeout(timeout)

    def shutdown(self) -> None:
        """Shut the group down gracefully (ringpg finishes queued ops, says goodbye to
        its peers and closes its connections), then forget it."""
        pg = self._pg
        self._pg = None
        if pg is not None:
            pg.shutdown()

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(pg={self._pg}, timeout={self._timeout})"
