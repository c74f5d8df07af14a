"""What a failed group says (ringpg's own: skipped for other backends).

``Backend.get_error()`` (torch >= 2.7): SUCCESS while healthy, TIMEOUT on the rank whose
op passed its deadline, REMOTE_ERROR on a rank that learnt of another's failure (its
Abort frame), COMM_ERROR for a lost peer or ``abort()``.  Abort hooks (torch >= 2.14,
``ProcessGroup.register_abort_hook``): run when the group fails, before the failed op's
error reaches its caller.  torch's flight recorder (torch >= 2.15): ringpg writes its
ops into it itself, as gloo does, so ``distributed_c10d`` attaches no per-op hook to its
groups; finished ops read "completed" with a duration, ringpg dumps the trace
(``TORCH_FR_DUMP_TEMP_FILE<rank>``) when the group fails, before the error reaches the
caller, and torch's analyzer (``python -m
torch.distributed.flight_recorder.fr_trace``) reads the dumps of a job where one rank
skipped an all_reduce and names that rank; its loader reads every rank's dump of
reduce-scatter, all-gather, coalesced and hierarchical ops: names, sequence ids, states
and sizes.
"""

from __future__ import annotations

import os
import pickle
import time
from datetime import timedelta
from typing import Any

import harness
import pytest
import torch
import torch.distributed as dist
from harness import TRANSPORT_ENV_DICTS as TRANSPORTS
from harness import init_ringpg as _init
from harness.commands import run_module

from devkit.settings import TUNING

pytestmark = [pytest.mark.multiprocess, harness.ringpg_only("ringpg's own failure reporting")]


# ============================== what a failed group says: get_error, abort hooks, flight recorder

GROUP_TIMEOUT_S = 3.0
DUMP_PREFIX = "fr_trace_rank_"  # TORCH_FR_DUMP_TEMP_FILE's file part; the analyzer's --prefix


def _features() -> dict[str, bool]:
    import ringpg

    return ringpg.features()


def _recorder_env(dump_dir: str) -> dict[str, str]:
    """Where the ranks' flight recorders dump (no stack traces: quick, and not what is tested)."""
    return {
        "TORCH_FR_BUFFER_SIZE": "200",
        "TORCH_FR_DUMP_TEMP_FILE": os.path.join(dump_dir, DUMP_PREFIX),
        "TORCH_INCLUDE_STACK_TRACE": "0",
    }


def _init_short(rank: int, ws: int, port: int) -> None:
    """A scenario rank's ringpg world group, timing out after GROUP_TIMEOUT_S."""
    _init(rank, ws, port, timeout_s=GROUP_TIMEOUT_S)


def _error_name(backend: Any) -> str:
    """backend.get_error() as 'SUCCESS', 'TIMEOUT', ... ('' on a torch without it)."""
    return backend.get_error().name if _features()["get_error"] else ""


def _wait_until(cond: Any, limit_s: float = 30.0) -> bool:
    t_end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > t_end:
            return False
        time.sleep(0.05)
    return True


# ------------------------------------------------- one rank skips an all_reduce


def _skip_an_all_reduce(rank: int, ws: int, port: int, args: Any) -> dict:
    """Every rank but the last calls a third all_reduce, which the last never calls."""
    (dump_prefix,) = args
    dump_file = f"{dump_prefix}{rank}"
    _init_short(rank, ws, port)
    group = dist.group.WORLD
    backend = harness.cpu_backend(group)
    feats = _features()
    hook_calls: list[float] = []
    if feats["abort_hooks"]:
        group.register_abort_hook(101, lambda: hook_calls.append(time.monotonic()))
        group.register_abort_hook(102, lambda: 1 / 0)  # a hook that raises is logged and harms nothing
    x = torch.ones(1 << 16)
    dist.all_reduce(x)  # synchronous: run in this thread while the group is idle
    dist.all_reduce(x, async_op=True).wait()  # on the worker
    out: dict[str, Any] = {"before": _error_name(backend), "sum": float(x[0])}
    if rank < ws - 1:
        kind, msg, took = harness.expect_error(lambda: dist.all_reduce(x))
        # What is true the moment the error reaches the caller.
        out.update(
            type=kind, msg=msg, took=took, hooks_at_error=len(hook_calls), dumped_at_error=os.path.exists(dump_file)
        )
    elif feats["get_error"]:
        # Stay in the group until the others' failure reaches this rank (their Abort frame).
        out["heard"] = _wait_until(lambda: _error_name(backend) != "SUCCESS")
    else:
        time.sleep(2 * GROUP_TIMEOUT_S)
    if feats["abort_hooks"]:
        _wait_until(lambda: bool(hook_calls), 10.0)  # the last rank runs them on the engine's thread
    if feats["flight_recorder"]:
        _wait_until(lambda: os.path.exists(dump_file), 20.0)
    out.update(after=_error_name(backend), hooks=len(hook_calls), dumped=os.path.exists(dump_file))
    return out


@pytest.fixture(scope="module", params=sorted(TRANSPORTS))
def skipped_all_reduce(request: Any, tmp_path_factory: Any) -> tuple[str, str, dict[int, dict]]:
    """(transport, dump directory, each rank's result) of the skip scenario on 3 ranks, run
    once per transport for the tests below."""
    transport = request.param
    dump_dir = str(tmp_path_factory.mktemp(f"fr-{transport}"))
    env = {**TRANSPORTS[transport], **_recorder_env(dump_dir)}
    res = harness.run_scenario(_skip_an_all_reduce, 3, (os.path.join(dump_dir, DUMP_PREFIX),), env=env)
    return transport, dump_dir, res


def test_get_error_says_who_timed_out_and_who_heard_of_it(skipped_all_reduce: tuple[str, str, dict]) -> None:
    if not _features()["get_error"]:
        pytest.skip(f"torch {torch.__version__} has no Backend.get_error (torch >= 2.7)")
    _, _, res = skipped_all_reduce
    for r, v in res.items():
        assert "crash" not in v, (r, v)
        assert v["sum"] == 9.0 and v["before"] == "SUCCESS", (r, v)
    waiting = [res[0], res[1]]
    for v in waiting:
        assert v["type"] in ("DistBackendError", "DistNetworkError") and "ringpg::all_reduce" in v["msg"], v
        assert GROUP_TIMEOUT_S - 1.0 < v["took"] < GROUP_TIMEOUT_S + 10.0, v
    # A rank that waited on the missing one times out; the other may time out too, or
    # hear of the first one's timeout before its own deadline.
    assert {v["after"] for v in waiting} <= {"TIMEOUT", "REMOTE_ERROR"}, waiting
    assert "TIMEOUT" in {v["after"] for v in waiting}, waiting
    # The rank that skipped the op learns of the failure from the others.
    assert res[2]["heard"] and res[2]["after"] == "REMOTE_ERROR", res[2]


def test_abort_hooks_run_before_the_error_reaches_the_caller(skipped_all_reduce: tuple[str, str, dict]) -> None:
    if not _features()["abort_hooks"]:
        pytest.skip(f"torch {torch.__version__} has no abort hooks (torch >= 2.14)")
    _, _, res = skipped_all_reduce
    for r, v in res.items():
        assert "crash" not in v, (r, v)
        assert v["hooks"] >= 1, (r, v)  # on every rank, the throwing hook beside it notwithstanding
    for r in (0, 1):
        assert res[r]["hooks_at_error"] >= 1, res[r]


def test_flight_recorder_names_the_rank_that_skipped_the_op(skipped_all_reduce: tuple[str, str, dict]) -> None:
    if not _features()["flight_recorder"]:
        pytest.skip(
            f"torch {torch.__version__} has no completion hooks or backend-agnostic flight recorder (torch >= 2.15)"
        )
    transport, dump_dir, res = skipped_all_reduce
    for r, v in res.items():
        assert "crash" not in v, (r, v)
        assert v["dumped"], (r, v)  # each rank's abort hook made torch dump its trace
    for r in (0, 1):
        assert res[r]["dumped_at_error"], res[r]  # before the error reached the caller
    # torch's own analyzer over the three dumps.
    proc = run_module("torch.distributed.flight_recorder.fr_trace", dump_dir, "--prefix", DUMP_PREFIX, timeout=120)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    # "Not all ranks joining collective, sequence number: 3 ... collective: ringpg:all_reduce
    # ... missing ranks: {2} ... collective state: scheduled" (it also warns that it does
    # not know the comm library "ringpg", which it says is not fatal).
    assert "Not all ranks joining collective, sequence number: 3" in report, report
    assert "collective: ringpg:all_reduce" in report, report
    assert "missing ranks: {2}" in report, report


# ------------------------------------------------- abort() and shutdown()


def _abort_or_shutdown(rank: int, ws: int, port: int, args: Any) -> dict:
    """Rank 0 aborts (or shuts down) the group while rank 1 waits in an op it never joins."""
    (how,) = args
    _init_short(rank, ws, port)
    group = dist.group.WORLD
    backend = harness.cpu_backend(group)
    side = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))
    feats = _features()
    calls: list[int] = []
    out: dict[str, Any] = {}
    if feats["abort_hooks"]:
        group.register_abort_hook(1, lambda: calls.append(1))
        group.register_abort_hook(2, lambda: calls.append(2))
        group.unregister_abort_hook(2)
        group.unregister_abort_hook(99)  # unknown: nothing to do
        out["again"], out["again_msg"], _ = harness.expect_error(lambda: group.register_abort_hook(1, lambda: None))
    x = torch.ones(1 << 10)
    dist.all_reduce(x)
    if how == "shutdown":
        dist.barrier(group=side)
        backend.shutdown()
    elif rank == 0:
        dist.barrier(group=side)
        time.sleep(0.5)  # rank 1 waits in its all_reduce by now
        backend.abort()
        out["hooks_at_return"] = list(calls)  # abort() ran them before it returned
    else:
        work = dist.all_reduce(x, async_op=True)  # rank 0 never joins it
        dist.barrier(group=side)
        out["type"], out["msg"], out["took"] = harness.expect_error(work.wait)
    out.update(error=_error_name(backend), hooks=list(calls))
    return out


def test_abort_runs_the_hooks_and_get_error_reports_it() -> None:
    if not _features()["get_error"]:
        pytest.skip(f"torch {torch.__version__} has no Backend.get_error (torch >= 2.7)")
    res = harness.run_scenario(_abort_or_shutdown, 2, ("abort",))
    for r, v in res.items():
        assert "crash" not in v, (r, v)
    # abort() on a healthy group: its connections are gone, a communication error here ...
    assert res[0]["error"] == "COMM_ERROR", res[0]
    # ... and on the peer whose op it failed: the aborting rank's reason, or its closed socket.
    assert res[1]["type"] in ("DistBackendError", "DistNetworkError") and res[1]["took"] < 10.0, res[1]
    assert res[1]["error"] in ("REMOTE_ERROR", "COMM_ERROR"), res[1]
    if _features()["abort_hooks"]:
        for v in res.values():
            assert v["again"] and "already registered" in v["again_msg"], v  # an id registers once
        # Not the hook unregistered.  Rank 0's ran once, in abort(); rank 1's may run twice
        # (the engine's thread and the worker race to it; Hooks.hpp allows it).
        assert res[0]["hooks_at_return"] == res[0]["hooks"] == [1], res[0]
        assert res[1]["hooks"] and set(res[1]["hooks"]) == {1}, res[1]


def test_shutdown_is_no_failure() -> None:
    if not _features()["get_error"]:
        pytest.skip(f"torch {torch.__version__} has no Backend.get_error (torch >= 2.7)")
    res = harness.run_scenario(_abort_or_shutdown, 2, ("shutdown",))
    for r, v in res.items():
        assert "crash" not in v, (r, v)
        assert v["error"] == "SUCCESS" and v["hooks"] == [], v


# ------------------------------------------------- completed vs scheduled


def _finished_and_hung(rank: int, ws: int, port: int, args: Any) -> dict:
    """Finished ops, then one that rank 1 never joins; rank 0 reads its recorder."""
    _init_short(rank, ws, port)
    backend = harness.cpu_backend(dist.group.WORLD)
    side = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))
    x = torch.ones(1 << 10)
    dist.all_reduce(x)
    dist.all_reduce(x, async_op=True).wait()
    if rank == 0:
        dist.send(x, dst=1)
    else:
        dist.recv(x, src=0)

    def entries() -> list[dict]:
        dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(True, False, False, backend="ringpg"))
        return [
            {k: e.get(k) for k in ("profiling_name", "state", "duration_ms", "collective_seq_id")}
            for e in dump.get("entries", [])
        ]

    out: dict[str, Any] = {"hooked": dist.group.WORLD in dist.distributed_c10d._world.pg_flight_recorder_hooks}
    if rank == 0:
        work = dist.all_reduce(x, async_op=True)  # rank 1 never calls it
        time.sleep(0.5)
        out["hung"] = entries()
        dist.barrier(group=side)
        out["type"], out["msg"], _ = harness.expect_error(work.wait)
        out["failed"] = entries()
    else:
        dist.barrier(group=side)
        _wait_until(lambda: _error_name(backend) != "SUCCESS")  # stay until rank 0's op fails
        out["finished"] = entries()
    out["error"] = _error_name(backend)
    return out


def test_finished_ops_read_completed_with_a_duration_and_a_hung_one_scheduled(tmp_path: Any) -> None:
    if not _features()["flight_recorder"]:
        pytest.skip(
            f"torch {torch.__version__} has no completion hooks or backend-agnostic flight recorder (torch >= 2.15)"
        )
    res = harness.run_scenario(_finished_and_hung, 2, env=_recorder_env(str(tmp_path)))
    for r, v in res.items():
        assert "crash" not in v, (r, v)
        assert not v["hooked"], (r, v)  # ringpg records itself: torch attached no per-op hook
    # Rank 1: the two all_reduces (one run inline, one on the worker) and the receive
    # (completed on the engine's thread) all finished.
    done = res[1]["finished"]
    assert [e["profiling_name"] for e in done] == ["ringpg:all_reduce", "ringpg:all_reduce", "ringpg:recv 1<-0"], done
    for e in done:
        assert e["state"] == "completed", done
        assert e["duration_ms"] is not None and e["duration_ms"] >= 0.0, done
    # Rank 0: the same three, then the all_reduce rank 1 never joined: issued, never finished.
    hung = res[0]["hung"]
    assert [e["profiling_name"] for e in hung] == [
        "ringpg:all_reduce",
        "ringpg:all_reduce",
        "ringpg:send 0->1",
        "ringpg:all_reduce",
    ], hung
    assert [e["state"] for e in hung] == ["completed"] * 3 + ["scheduled"], hung
    assert hung[-1]["duration_ms"] is None, hung
    # Its timeout fires nothing: a failed op stays "scheduled" (Hooks.hpp), the group says why.
    assert res[0]["type"] == "DistBackendError" and "Timed out" in res[0]["msg"], res[0]
    assert res[0]["failed"][-1]["state"] == "scheduled", res[0]["failed"]
    assert res[0]["error"] == "TIMEOUT" and res[1]["error"] == "REMOTE_ERROR", res


# ------------------------------------------------------------------ dumps read with torch's own loader


def _record_collectives(rank: int, ws: int, port: int, args: Any) -> dict:
    """Reduce-scatter, all-gather, coalesced and hierarchical ops (2 hosts x 2 ranks, the
    4 MiB allreduce in pieces), then each rank writes its recorder's dump where torch's
    analyzer looks for it (TORCH_FR_DUMP_TEMP_FILE<rank>)."""
    (dump_prefix,) = args
    _init_short(rank, ws, port)
    import ringpg

    x = torch.ones(1 << 20)
    dist.all_reduce(x)  # hierarchical, in pieces
    dist.reduce_scatter_tensor(torch.empty(1 << 14), torch.ones(ws << 14))
    dist.all_gather_into_tensor(torch.empty(ws << 14), torch.ones(1 << 14))
    with dist._coalescing_manager():
        dist.all_reduce(torch.ones(5))
        dist.all_reduce(torch.ones(7))
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * ws))
        dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * ws))
    dist.barrier()
    with open(f"{dump_prefix}{rank}", "wb") as f:
        f.write(torch._C._distributed_c10d._dump_fr_trace(True, False, False, backend="ringpg"))
    return {"algorithm": ringpg.backend().allreduce_algorithm}


def test_dumps_read_with_torchs_loader(tmp_path: Any) -> None:
    """torch's own loader (flight_recorder.components.loader.read_dir, what fr_trace runs)
    reads every rank's dump: the reduce-scatter, all-gather, coalesced and hierarchical
    ops in order, completed, with the same sequence ids on every rank and their sizes
    (issue 31 item 7)."""
    if not _features()["flight_recorder"]:
        pytest.skip(f"torch {torch.__version__} has no backend-agnostic flight recorder (torch >= 2.15)")
    import argparse

    from torch.distributed.flight_recorder.components.loader import read_dir

    ws = 4
    env = {**_recorder_env(str(tmp_path)), harness.EMULATED_HOSTS_ENV: "2", TUNING: "hier_piece_bytes=65536"}
    res = harness.run_scenario(_record_collectives, ws, (os.path.join(str(tmp_path), DUMP_PREFIX),), env=env)
    assert all(v.get("algorithm") == "hier" for v in res.values()), res
    details, version = read_dir(argparse.Namespace(trace_dir=str(tmp_path), prefix=DUMP_PREFIX))
    assert version and sorted(details) == [f"{DUMP_PREFIX}{r}" for r in range(ws)], sorted(details)
    seen = {}
    for name, dump in details.items():
        entries = dump["entries"]
        seen[name] = [
            (e["profiling_name"], e["collective_seq_id"], e["state"], e["input_sizes"], e["output_sizes"])
            for e in entries
        ]
        assert all(e["state"] == "completed" and e["duration_ms"] is not None for e in entries), entries
    first = seen[f"{DUMP_PREFIX}0"]
    assert all(v == first for v in seen.values()), seen  # the same ops, ids and sizes on every rank
    assert first == [
        ("ringpg:all_reduce", 1, "completed", [[1 << 20]], [[1 << 20]]),
        ("ringpg:_reduce_scatter_base", 2, "completed", [[ws << 14]], [[1 << 14]]),
        ("ringpg:_all_gather_base", 3, "completed", [[1 << 14]], [[ws << 14]]),
        ("ringpg:allreduce_coalesced", 4, "completed", [[5], [7]], [[5], [7]]),
        ("ringpg:reduce_scatter_tensor_coalesced", 5, "completed", [[3 * ws], [2 * ws]], [[3], [2]]),
        ("ringpg:barrier", 6, "completed", [], []),
    ], first
