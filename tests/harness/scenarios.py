"""One-shot scenarios: ranks that start their own torch.distributed job and may die on purpose.

A killed, frozen or aborting rank does not fit a :class:`harness.WorkerPool` (it
would take the pool down with it), so such a test runs a module-level function
``fn(rank, ws, port, args) -> dict`` on ``ws`` fresh processes
(:func:`run_scenario`); each puts its result dict on a queue, and the parent
collects the survivors' with a deadline (:func:`harness.collect_results`), killing
whatever is left.  :func:`expect_error` times a call that should raise.

The dead-peer scenario that several fault batteries share lives here too:
:func:`init_ringpg` (a scenario rank's ringpg world group), :func:`die_mid_collective`
(one rank dies while the others loop over a collective) and
:func:`assert_survivors_raised_fast` (what every survivor must have seen).
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from devkit.groups import transport_of
from devkit.launch import free_port

from .backend import apply_env
from .processes import collect_results, worker_context

ScenarioFn = Callable[[int, int, int, Any], dict]


def _scenario_child(fn: ScenarioFn, rank: int, ws: int, port: int, args: Any, out: Any, env: dict[str, str]) -> None:
    apply_env(env, rank)
    try:
        res = fn(rank, ws, port, args)
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        res = {"crash": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
    out.put((rank, res))
    out.close()
    out.join_thread()
    os._exit(0)  # skip destructors of a deliberately broken group


def run_scenario(
    fn: ScenarioFn,
    ws: int,
    args: Any = None,
    expect: Optional[set[int]] = None,
    timeout: float = 90.0,
    env: Optional[dict[str, str]] = None,
) -> dict[int, dict]:
    """Runs fn(rank, ws, port, args) on ws ranks (with `env` set in each); returns results of the ranks in `expect`."""
    ctx = worker_context()
    out = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_scenario_child, args=(fn, r, ws, port, args, out, env or {}), daemon=True)
        for r in range(ws)
    ]
    for p in procs:
        p.start()
    return collect_results(procs, out, set(range(ws)) if expect is None else expect, timeout)


def expect_error(fn: Callable[[], Any]) -> tuple[str, str, float]:
    """Calls ``fn``: (exception type name, message, seconds taken); ``("", "", took)`` if it did not raise."""
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e), time.monotonic() - t0
    return "", "", time.monotonic() - t0


# ------------------------------------------------------------------ a dead peer

KILL_DETECT_S = 10.0  # "within a few seconds" of a peer's death
# The typed torch.distributed errors a failed op raises (naming op, rank and cause).
TYPED_ERRORS = ("DistBackendError", "DistNetworkError")


def init_ringpg(rank: int, ws: int, port: int, timeout_s: float = 60.0) -> None:
    """A scenario rank's world group: ringpg, tcp:// rendezvous on ``port``."""
    import ringpg  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group(
        "ringpg", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws, timeout=timedelta(seconds=timeout_s)
    )


# Collectives die_mid_collective loops over: 4 MiB per rank (float32), past the one-shot
# allreduce's default limit at every world size up to 16.
DEATH_NUMEL = 1 << 20


def _looped_call(op: str, ws: int, numel: int = DEATH_NUMEL) -> Callable[[], None]:
    if op == "all_reduce":
        x = torch.ones(DEATH_NUMEL)
        return lambda: dist.all_reduce(x)
    if op == "reduce_scatter_tensor":
        inp, out = torch.ones(numel * ws), torch.empty(numel)
        return lambda: dist.reduce_scatter_tensor(out, inp)
    if op == "all_gather_into_tensor":
        inp, out = torch.ones(DEATH_NUMEL), torch.empty(DEATH_NUMEL * ws)
        return lambda: dist.all_gather_into_tensor(out, inp)
    if op == "broadcast":
        x = torch.ones(DEATH_NUMEL)
        return lambda: dist.broadcast(x, src=0)
    if op == "reduce":
        x = torch.ones(DEATH_NUMEL)
        return lambda: dist.reduce(x, dst=0)
    if op == "barrier":
        return lambda: dist.barrier()
    raise ValueError(f"no looped collective {op!r}")


# What ringpg's choice calls the looped tensor collectives, and the bytes it counts for
# each (an allreduce its buffer; a reduce-scatter its input; an all-gather its output).
_CHOICE_NAMES = {
    "all_reduce": "allreduce",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_gather_into_tensor": "all_gather",
}


def die_mid_collective(rank: int, ws: int, port: int, args: Any) -> dict:
    """args = (victim, how, stamp_file, op[, numel]): every rank loops over ``op`` (a
    reduce-scatter of ``numel`` float32 a rank, DEATH_NUMEL unless given); at the fourth
    call the victim writes the time to ``stamp_file`` and dies (``how``: ``"sigkill"``,
    else ``os._exit(1)``).  A survivor returns its first error (type, message, time), the
    error of one more op after it, its group's transport, allreduce algorithm and
    same-host copy, and what ``op`` runs (tensor collectives; None for the others)."""
    victim, how, stamp_file, op = args[:4]
    numel = args[4] if len(args) > 4 else DEATH_NUMEL
    init_ringpg(rank, ws, port)
    call = _looped_call(op, ws, numel)
    import ringpg

    b = ringpg.backend()
    algorithm = b.allreduce_algorithm if b is not None else None
    op_algorithm, copy = None, b.same_host_copy if b is not None else None
    if b is not None and op in _CHOICE_NAMES:
        op_algorithm = b.algorithm_for(_CHOICE_NAMES[op], numel * 4 * (1 if op == "all_reduce" else ws))
    for i in range(1000):
        if rank == victim and i == 3:
            with open(stamp_file, "w") as f:
                f.write(repr(time.time()))
            if how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(1)
        try:
            call()
        except Exception as e:  # noqa: BLE001
            t_err = time.time()
            kind, again, _ = expect_error(lambda: dist.all_reduce(torch.ones(8)))
            return {
                "type": type(e).__name__,
                "msg": str(e),
                "t": t_err,
                "again_type": kind,
                "again": again,
                "transport": transport_of(dist.group.WORLD),
                "algorithm": algorithm,
                "op_algorithm": op_algorithm,
                "copy": copy,
            }
    return {"type": "", "msg": f"no error after 1000 {op} calls"}


def assert_survivors_raised_fast(results: dict[int, dict], stamp_file: str, op: str, transport: str) -> None:
    """Every survivor of :func:`die_mid_collective` raised a typed error naming ``op``, its
    rank and the lost connection (gloo's words, which torchft and scripts match on) within
    KILL_DETECT_S of the death, its group on ``transport``, and a later op failed at once,
    naming the earlier failure."""
    with open(stamp_file) as f:
        died = float(f.read())
    for r, v in results.items():
        assert v.get("transport") == transport, (r, v)
        assert v["type"] in ("DistNetworkError", "DistBackendError"), (r, v)
        assert f"ringpg::{op}" in v["msg"] and f"rank {r}" in v["msg"], v["msg"]
        assert "Connection closed by peer" in v["msg"], v["msg"]
        assert v["t"] - died < KILL_DETECT_S, (r, v["t"] - died, v["msg"])
        assert v["again_type"] in ("DistNetworkError", "DistBackendError"), v
        assert "failed earlier" in v["again"], v["again"]
