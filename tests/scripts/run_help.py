"""Runs ``python -m MODULE --help`` for every MODULE named on the command line, torch imported once.

Each module runs as ``__main__`` (``runpy``, as ``-m`` runs it) in a child forked from
this process after ``import torch``, its stdout and stderr in files of their own and its
exit status its own, so a command line is checked as a user runs it, without paying
torch's import (seconds on 2 cores) once per module.  Prints one JSON object:
``{module: {"rc": int, "stdout": str, "stderr": str}}``.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import tempfile
from typing import Dict

import torch  # noqa: F401 - every command line imports it; here once, before the forks


def run_one(module: str, out_path: str, err_path: str) -> int:
    """Forks a child that runs ``module --help``; its exit status (a signal: 128 + it)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            signal.alarm(120)  # a command line that hangs is killed, and fails
            with open(out_path, "w") as out, open(err_path, "w") as err:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.argv = [module, "--help"]
                try:
                    runpy.run_module(module, run_name="__main__", alter_sys=True)
                    code = 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                except BaseException:
                    import traceback

                    traceback.print_exc()
                sys.stdout.flush()
                sys.stderr.flush()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.waitstatus_to_exitcode(status) >= 0 else 128 - status


def main() -> int:
    results: Dict[str, Dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, module in enumerate(sys.argv[1:]):
            out, err = os.path.join(tmp, f"{i}.out"), os.path.join(tmp, f"{i}.err")
            rc = run_one(module, out, err)
            with open(out) as fo, open(err) as fe:
                results[module] = {"rc": rc, "stdout": fo.read(), "stderr": fe.read()}
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
