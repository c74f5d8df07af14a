"""pytest configuration for ringpg's tests.

* The backend under test is ``$RINGPG_TEST_BACKEND`` (default ``"ringpg"``); set
  it to ``gloo`` to validate the tests themselves against gloo.
* ``tests/`` (for ``harness``) and the repository root (for the ``benchmarks``
  helpers the harness shares) are put on ``sys.path``; if ringpg is not installed,
  its source tree (``python/``) too, so the pure-Python tests can still run.
  Spawned workers inherit ``sys.path``.
* ``pool``: a module-scoped :class:`harness.WorkerPool` for the module's
  ``world_size`` parameter.  Declare the parameter with
  ``pytest.mark.parametrize("world_size", [...], scope="module")`` so pytest groups
  a module's tests by world size and each pool is started once.
* torch >= 2.15 dumps its flight recorder's trace when a ringpg group fails (ringpg
  runs torch's abort hooks, and the failed op's error waits for them), and the fault
  tests fail groups on purpose: unless ``TORCH_FR_DUMP_TEMP_FILE`` is set, the dumps go
  to a temporary directory of this session (the ranks inherit it; removed at exit), not
  to torch's default place in /tmp; and unless ``TORCH_INCLUDE_STACK_TRACE`` is set, they carry no
  stack traces, whose symbolization takes torch 2 s or more on a 2-core machine and
  would blur how fast the fault tests' failures surface.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile
from typing import Iterator

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (ROOT, HERE):  # the repository root for benchmarks, then tests/ (first) for harness
    if path not in sys.path:
        sys.path.insert(0, path)
if importlib.util.find_spec("ringpg") is None:
    sys.path.insert(0, os.path.join(ROOT, "python"))

import harness  # noqa: E402

if "TORCH_FR_DUMP_TEMP_FILE" not in os.environ:
    _fr_dump_dir = tempfile.mkdtemp(prefix="ringpg-tests-fr-")
    atexit.register(shutil.rmtree, _fr_dump_dir, ignore_errors=True)
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(_fr_dump_dir, "rank_")
os.environ.setdefault("TORCH_INCLUDE_STACK_TRACE", "0")


def pytest_report_header(config: pytest.Config) -> str:
    return f"ringpg tests: backend under test = {harness.backend_under_test()!r} (set {harness.BACKEND_ENV} to change)"


@pytest.fixture(scope="module")
def pool(world_size: int) -> Iterator[harness.WorkerPool]:
    """Workers for ``world_size`` ranks, default group = backend under test, plus a gloo group."""
    p = harness.WorkerPool(world_size)
    yield p
    p.close()  # fails the last test of the group if a rank does not shut down cleanly
