"""Every command line of the repository answers ``--help``: exit 0, a usage text on stdout.

The command lines are found, not listed: every ``benchmarks/*.py`` and
``python/ringpg/*.py`` that builds an ``argparse.ArgumentParser`` and runs as
``__main__``, each run as ``python -m MODULE --help`` from the repository root (forked
from one process that imported torch: :mod:`harness.commands`).  So a
new one is checked without touching this file; :data:`EXPECTED` names some that must
be found, so that the discovery cannot come back empty and the test pass on nothing.
A ``%`` left single in a help string (argparse formats help with ``%``), or an optional
dependency imported before the arguments are parsed (``mpi_peer``'s mpi4py), fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest
from harness.commands import run_module

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


@pytest.mark.multiprocess
@pytest.mark.parametrize("module", CLI_MODULES)
def test_help_exits_zero_with_usage(module: str) -> None:
    run = run_module(module, "--help", timeout=120)
    assert run.returncode == 0, f"{module} --help: rc {run.returncode}\n{run.stdout}\n{run.stderr}"
    assert "usage" in run.stdout, f"{module} --help printed no usage:\n{run.stdout}\n{run.stderr}"


@pytest.mark.inprocess
def test_device_check_help_is_its_whole_header_and_a_wrong_option_is_refused() -> None:
    """scripts/device_check.sh parses (bash -n); --help prints every line of its header
    comment, up to the code, and an option it does not know exits 2."""
    import subprocess

    script = REPO / "scripts" / "device_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0
    header = []
    for line in script.read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        header.append(line)
    run = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0 and run.stdout.splitlines() == header, run.stdout
    assert "DEVICE_CHECK_PEER_RUNS" in run.stdout and "DEVICE_CHECK_SKIP" in run.stdout
    wrong = subprocess.run(["bash", str(script), "--no-such"], capture_output=True, text=True, timeout=30)
    assert wrong.returncode == 2 and "unknown option" in wrong.stderr
