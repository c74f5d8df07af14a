"""One-shot scenarios: ranks that start their own torch.distributed job and may die on purpose.

A killed, frozen or aborting rank does not fit a :class:`harness.WorkerPool` (it
would take the pool down with it), so such a test runs a module-level function
``fn(rank, ws, port, args) -> dict`` on ``ws`` fresh processes
(:func:`run_scenario`); each puts its result dict on a queue, and the parent
collects the survivors' with a deadline (:func:`harness.collect_results`), killing
whatever is left.  :func:`expect_error` times a call that should raise.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from typing import Any, Callable, Optional

from benchmarks.launch import free_port

from .backend import apply_env
from .processes import collect_results

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


def run_scenario(fn: ScenarioFn, ws: int, args: Any = None, expect: Optional[set[int]] = None,
                 timeout: float = 90.0, env: Optional[dict[str, str]] = None) -> dict[int, dict]:
    """Runs fn(rank, ws, port, args) on ws ranks (with `env` set in each); returns results of the ranks in `expect`."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_scenario_child, args=(fn, r, ws, port, args, out, env or {}), daemon=True)
             for r in range(ws)]
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
