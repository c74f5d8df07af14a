"""Runs command lines (``python -m MODULE ARGS``) in children forked from one process that imported torch.

The client is :mod:`harness.commands`.  This process imports torch once, then reads one
JSON request a line on stdin, ``{"argv": [MODULE, ARG, ...], "cwd": str, "env": {...},
"timeout": float}``, and for each forks a child that takes the request's working
directory and environment, puts its stdout and stderr in files of their own, and runs
MODULE as ``__main__`` (``runpy``, as ``-m`` runs it).  It answers one JSON line,
``{"rc": int, "stdout": str, "stderr": str, "timed_out": bool}``: the child's exit status
(a signal: minus it, as ``subprocess`` reports one).  So a command line runs as a user
runs it, its ranks and servers started by it as the user's would be (a
multiprocessing forkserver is a fresh interpreter with the request's environment),
without paying torch's import (seconds on 2 cores) once per command.  What this process
read before the fork stays as it was: ``sys.path`` (from the server's own
``PYTHONPATH``) and what torch read of the environment at its import.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import tempfile
import time
from typing import Any, Dict

import torch  # noqa: F401 - every command line imports it; here once, before the forks


def _child(req: Dict[str, Any], out_path: str, err_path: str) -> None:
    """The forked child: runs the request's module and exits with its status; never returns."""
    code = 1
    try:
        os.setpgrp()  # its own group: a timeout ends it with whatever it started
        with open(os.devnull) as null, open(out_path, "w") as out, open(err_path, "w") as err:
            os.dup2(null.fileno(), 0)
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.path[0] = req["cwd"]  # as ``python -m`` puts the working directory first
        sys.argv = list(req["argv"])
        try:
            runpy.run_module(req["argv"][0], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:
            import traceback

            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


_running = 0  # the child now running (its process group), or 0


def _end(signum: int, frame: Any) -> None:
    """SIGTERM (the client gave up on a request): the running command goes with the server."""
    if _running:
        try:
            os.killpg(_running, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(1)


def run(req: Dict[str, Any]) -> Dict[str, Any]:
    """Forks a child for one request and waits for it, at most ``req["timeout"]`` seconds
    (then its process group is killed)."""
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        global _running
        pid = os.fork()
        if pid == 0:
            _child(req, out, err)
        _running = pid
        deadline = time.monotonic() + float(req["timeout"])
        timed_out = False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                timed_out = True
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.02)
        _running = 0
        with open(out) as fo, open(err) as fe:
            return {
                "rc": os.waitstatus_to_exitcode(status),
                "stdout": fo.read(),
                "stderr": fe.read(),
                "timed_out": timed_out,
            }


def main() -> int:
    signal.signal(signal.SIGTERM, _end)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        print(json.dumps(run(json.loads(line))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
