"""End to end under torchrun, with no ``import ringpg`` anywhere in the script.

``tests/scripts/torchrun_script.py`` calls ``init_process_group(backend="ringpg")``
relying on the ``torch.backends`` entry point, so this needs ringpg pip-installed
(an editable install counts); it is skipped otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from harness import backend_under_test, entry_point_installed, free_port

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "torchrun_script.py")
NPROC = 2
LAUNCH_TIMEOUT_S = 180


def test_script_never_imports_ringpg() -> None:
    with open(SCRIPT) as f:
        code = f.read()
    assert "import ringpg" not in code and "from ringpg" not in code


@pytest.mark.skipif(
    backend_under_test() == "ringpg" and not entry_point_installed(),
    reason="ringpg is not pip-installed: no torch.backends entry point",
)
@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
def test_torchrun_without_import() -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(NPROC),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        SCRIPT,
    ]
    # Own session, so a hang kills torchrun *and* its workers.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish within {LAUNCH_TIMEOUT_S} s:\n{out}")
    assert proc.returncode == 0, f"torchrun exited with {proc.returncode}:\n{out}"
    for r in range(NPROC):
        assert f"OK rank={r} backend={backend_under_test()}" in out, out
