"""Every command line of the repository answers ``--help``: exit 0, a usage text on stdout.

The command lines are found, not listed: every ``benchmarks/*.py`` and
``python/ringpg/*.py`` that builds an ``argparse.ArgumentParser`` and runs as
``__main__``, each run as ``python -m MODULE --help`` from the repository root.  So a
new one is checked without touching this file; :data:`EXPECTED` names some that must
be found, so that the discovery cannot come back empty and the test pass on nothing.
A ``%`` left single in a help string (argparse formats help with ``%``), or an optional
dependency imported before the arguments are parsed (``mpi_peer``'s mpi4py), fails here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

REPO = Path(__file__).resolve().parent.parent

# (folder, module prefix): where command lines live, and the package their modules are in.
CLI_FOLDERS = ((REPO / "benchmarks", "benchmarks."), (REPO / "python" / "ringpg", "ringpg."))

# A few that discovery must find (not all: new ones join without an edit here).
EXPECTED = {"benchmarks.bench", "benchmarks.backtoback", "benchmarks.mpi_peer", "ringpg.trace"}


def cli_modules() -> List[str]:
    """The modules of :data:`CLI_FOLDERS` with an argparse command line, sorted."""
    found = []
    for folder, prefix in CLI_FOLDERS:
        for path in sorted(folder.glob("*.py")):
            text = path.read_text()
            if "ArgumentParser(" in text and "__main__" in text:
                found.append(prefix + path.stem)
    return sorted(found)


CLI_MODULES = cli_modules()


@pytest.mark.inprocess
def test_the_command_lines_are_found() -> None:
    assert EXPECTED <= set(CLI_MODULES), f"missing {sorted(EXPECTED - set(CLI_MODULES))} in {CLI_MODULES}"


@pytest.fixture(scope="module")
def help_runs() -> Dict[str, Dict[str, Any]]:
    """Every :data:`CLI_MODULES`' ``--help``, run by ``tests/scripts/run_help.py`` in one process
    that imports torch once and forks a child per module."""
    # The ringpg these tests import (tests/conftest.py falls back on the source tree), for
    # ``-m ringpg.*`` whether or not ringpg is installed.
    spec = importlib.util.find_spec("ringpg")
    assert spec is not None and spec.origin is not None
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), str(Path(spec.origin).parent.parent), env.get("PYTHONPATH")])
    )
    p = subprocess.run(
        [sys.executable, str(REPO / "tests" / "scripts" / "run_help.py"), *CLI_MODULES],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert p.returncode == 0, f"run_help.py: rc {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.multiprocess
@pytest.mark.parametrize("module", CLI_MODULES)
def test_help_exits_zero_with_usage(module: str, help_runs: Dict[str, Dict[str, Any]]) -> None:
    run = help_runs[module]
    assert run["rc"] == 0, f"{module} --help: rc {run['rc']}\n{run['stdout']}\n{run['stderr']}"
    assert "usage" in run["stdout"], f"{module} --help printed no usage:\n{run['stdout']}\n{run['stderr']}"
