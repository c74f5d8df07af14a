"""Command lines of the repository run as a user runs them, without one ``import torch`` each.

:func:`run_module` runs ``python -m MODULE ARGS`` and returns a
:class:`subprocess.CompletedProcess` (text output), raising
:class:`subprocess.TimeoutExpired` past its timeout, as ``subprocess.run`` would.  The
command runs in a child forked from one server (``tests/scripts/command_server.py``,
started on first use, ended at exit) that imported torch once: a command line's own
import costs seconds on 2 cores, and the suite runs some twenty of them.  The server's
``sys.path`` holds the repository root and the ringpg these tests import, whether or not
ringpg is installed; a request's ``env`` is the child's whole environment (default: this
process's), which the ranks and servers the command starts inherit.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "tests" / "scripts" / "command_server.py"

_server: Optional[subprocess.Popen] = None


def _start() -> subprocess.Popen:
    spec = importlib.util.find_spec("ringpg")
    assert spec is not None and spec.origin is not None
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), str(Path(spec.origin).parent.parent), env.get("PYTHONPATH")])
    )
    p = subprocess.Popen(
        [sys.executable, str(SERVER)], cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    ready = p.stdout.readline()
    if not ready.startswith('{"ready"'):
        p.kill()
        raise RuntimeError(f"command server did not start: {ready!r}")
    return p


def _stop() -> None:
    global _server
    if _server is not None:
        _server.terminate()  # it ends a command still running, then itself
        try:
            _server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _server.kill()
            _server.wait()
        _server = None


atexit.register(_stop)


def run_module(
    module: str, *args: str, cwd: Path = REPO, env: Optional[Mapping[str, str]] = None, timeout: float = 240
) -> subprocess.CompletedProcess:
    """``python -m module *args`` in ``cwd`` with ``env``, its output captured as text."""
    global _server
    if _server is None or _server.poll() is not None:
        _server = _start()
    argv = [module, *args]
    req = {"argv": argv, "cwd": str(cwd), "env": dict(os.environ if env is None else env), "timeout": timeout}
    assert _server.stdin is not None and _server.stdout is not None
    try:
        _server.stdin.write(json.dumps(req) + "\n")
        _server.stdin.flush()
        line = _server.stdout.readline()
        reply = json.loads(line)
    except BaseException:
        _stop()  # a request interrupted (the test's own timeout) leaves the server out of step
        raise
    if reply["timed_out"]:
        raise subprocess.TimeoutExpired(["-m", *argv], timeout, reply["stdout"], reply["stderr"])
    return subprocess.CompletedProcess(["-m", *argv], reply["rc"], reply["stdout"], reply["stderr"])
