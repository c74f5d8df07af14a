"""Leaving is not failing (issue 60 item 5): a rank whose connections close at a frame
boundary, with nothing of it still expected, has *left* the group; it has not failed it.

A script that ends without ``destroy_process_group`` (or exits with ``os._exit``) closes
its sockets the moment its last op returns on that rank, while its peers may still be
finishing the same op: the frames they still need from it are already on their way, or
no longer come from it at all (a ring's rank never receives from its right neighbour).
What must hold, on every transport:

* the rank that leaves right after an allreduce does not fail that allreduce anywhere:
  every other rank completes it with the right sum, although one of them is still
  inside it when the leaver's connections close (the race is real: its last segment
  is relayed by a third rank, the leaver's end of stream reaches it directly);
* the next op that needs the departed rank fails within seconds, long before its
  timeout, on every survivor, with a typed error that names the departed rank in
  gloo's words ("Connection closed by peer"), and later ops fail at once with it;
* a rank killed in the middle of an op still fails every rank fast
  (test_faults.py's dead-peer tests, unchanged).

``RINGPG_TEST_LEAVE_REPEAT`` runs the race that many times (default 1) per transport.
Ringpg's own failure handling: skipped for other backends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import harness
import pytest
import torch
import torch.distributed as dist
from harness import (
    SHM_RING,
    TRANSPORT_NAMES,
    expect_error,
    run_scenario,
    transport_env,
    transport_expected,
    transport_of,
)
from harness.scenarios import KILL_DETECT_S, TYPED_ERRORS, init_ringpg

pytestmark = [pytest.mark.multiprocess, harness.ringpg_only("ringpg's own handling of a departed rank")]

WS = 3
LEAVER = WS - 1
# The slow rank: the leaver's right neighbour on the ring (ranks in ring order on one
# host; under "mixed" the ring is 0, 2, 1 and it is the leaver's left one).  Its last
# steps still read what the leaver sent last and relay what the leaver's other
# neighbour waits for last, so that rank is still inside the allreduce, waiting on the
# slow rank, when the leaver's connections close.
SLOW = 0
# 16 MiB a rank: the leaver's last segments are still in its socket buffers (or the
# slots) when its allreduce returns.
NUMEL = 1 << 22
# The slow rank runs on a CPU of its own beside HOGS busy processes, at nice SLOW_NICE
# for the length of the allreduce: the op takes it a few tenths of a second, and the
# leaver's end of stream reaches the others while it is still inside (each survivor
# reports how long after the leaver's departure its op ended).  Measured on the base
# commit, whose engine took that end of stream for a failure: the allreduce failed on a
# survivor in most runs over TCP.  Nice 10, not 19: at 19 the scheduler ran the rank so
# rarely that its op took 1.4-9.5 s in isolation and outlasted the 30-s timeout in the
# full suite (2026-12-06, the 2-vCPU Xeon guest, kernel 6.18); at 10 it took 0.26-0.47 s
# and ended 7-189 ms after the leaver had left, on every transport, two runs.
HOGS = 2
SLOW_NICE = 10
TIMEOUT_S = 30.0
REPEAT = int(os.environ.get("RINGPG_TEST_LEAVE_REPEAT", "1"))


def _pin(rank: int) -> None:
    """Before the group (whose threads inherit it): the slow rank on the last CPU, the
    others on the rest."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[-1]} if rank == SLOW else set(cpus[:-1]))


def _niceness(value: int) -> None:
    """Every thread of this process (the group's engine and worker among them) at `value`."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), value)
        except (ProcessLookupError, PermissionError):
            pass


def _starve(rank: int) -> list[subprocess.Popen]:
    """On the slow rank: HOGS busy processes on its CPU, and its own threads at nice SLOW_NICE."""
    if rank != SLOW:
        return []
    cpu = max(os.sched_getaffinity(0))
    spin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(HOGS)]
    _niceness(SLOW_NICE)
    return hogs


def _unstarve(hogs: list[subprocess.Popen]) -> None:
    for h in hogs:
        h.kill()
        h.wait()
    if hogs:
        _niceness(0)


def _leave_after_last_op(rank: int, ws: int, port: int, args: Any) -> dict:
    """The leaver exits (``os._exit(0)``, no destroy) the moment its allreduce returns;
    the survivors check that allreduce's sum, meet on a gloo group of their own (so that
    none of them is still inside the allreduce), then run one that needs the leaver."""
    _pin(rank)
    init_ringpg(rank, ws, port, timeout_s=TIMEOUT_S)
    survivors = [r for r in range(ws) if r != LEAVER]
    side = dist.new_group(ranks=survivors, backend="gloo", timeout=timedelta(seconds=60))
    dist.all_reduce(torch.ones(8))  # the connections are up: what follows tests the departure
    import ringpg

    algo = ringpg.backend().algorithm_for("allreduce", NUMEL * 4)
    x = torch.full((NUMEL,), float(rank + 1))
    hogs = _starve(rank)
    first = ""
    began = time.monotonic()
    try:
        dist.all_reduce(x)
    except Exception as e:  # noqa: BLE001 - what the engine did before issue 60 item 5: reported
        first = f"{type(e).__name__}: {e}"
    finally:
        ended = time.monotonic()  # before the hogs are reaped
        _unstarve(hogs)
    first_s = ended - began
    store = dist.distributed_c10d._get_default_store()
    if rank == LEAVER:
        store.set("left_at", repr(ended))
        os._exit(0)
    want = float(sum(range(1, ws + 1)))
    wrong = int((x != want).sum().item())
    dist.barrier(group=side)
    left_at = float(store.get("left_at"))
    kind, msg, took = expect_error(lambda: dist.all_reduce(torch.ones(1 << 10)))
    again_kind, again, _ = expect_error(lambda: dist.all_reduce(torch.ones(8)))
    return {
        "first": first,
        "first_s": round(first_s, 2),
        "after_leaver_s": round(ended - left_at, 3),
        "transport": transport_of(dist.group.WORLD),
        "algo": algo,
        "wrong": wrong,
        "type": kind,
        "msg": msg,
        "took": took,
        "again_type": again_kind,
        "again": again,
    }


@pytest.mark.parametrize("repeat", range(REPEAT), ids=lambda i: f"run{i}")
@pytest.mark.parametrize("transport", [*TRANSPORT_NAMES, SHM_RING])
def test_a_rank_that_leaves_after_its_last_op_fails_no_one(transport: str, repeat: int) -> None:
    res = run_scenario(
        _leave_after_last_op,
        WS,
        expect={r for r in range(WS) if r != LEAVER},
        timeout=90,
        env=dict(transport_env(transport)),
    )
    for r, v in res.items():
        assert v.get("transport", transport_expected(transport, WS)) == transport_expected(transport, WS), (r, v)
        # The allreduce the leaver left right after: complete and right everywhere.
        assert v["first"] == "", (r, v["first"])
        assert v["wrong"] == 0, (r, v)
        # The next one needs the departed rank: typed, naming it, within seconds.
        assert v["type"] in TYPED_ERRORS, (r, v)
        assert "ringpg::all_reduce" in v["msg"], (r, v["msg"])
        assert f"rank {LEAVER}" in v["msg"] and "Connection closed by peer" in v["msg"], (r, v["msg"])
        assert v["took"] < KILL_DETECT_S, (r, v["took"], v["msg"])
        assert v["again_type"] in TYPED_ERRORS and "failed earlier" in v["again"], (r, v)
