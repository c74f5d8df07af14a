"""pytest configuration for ringpg's tests.

* The backend under test is ``$RINGPG_TEST_BACKEND`` (default ``"ringpg"``); set
  it to ``gloo`` to validate the tests themselves against gloo.
* ``tests/`` (for ``harness``) and the repository root (for the ``benchmarks``
  helpers the harness shares) are put on ``sys.path``; if ringpg is not installed,
  its source tree (``python/``) too, so the pure-Python tests can still run.
  Spawned workers inherit ``sys.path``.
* ``pool``: a module-scoped :class:`harness.WorkerPool` for the module's
  ``world_size`` parameter; ``shared_pool``: the same, but one per world size for the
  whole session, shared by every module that asks for it; ``bpool``: a module-scoped
  pool whose group runs on the ``transport`` parameter.  Declare the parameter with
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


# One pool per world size for the whole session (shared_pool).
_SHARED_POOLS: dict[int, harness.WorkerPool] = {}


def _close_shared_pool(world_size: int) -> None:
    p = _SHARED_POOLS.pop(world_size, None)
    if p is not None:
        p.close()


@pytest.fixture(scope="module")
def shared_pool(world_size: int, request: pytest.FixtureRequest) -> Iterator[harness.WorkerPool]:
    """A :class:`harness.WorkerPool` for ``world_size`` ranks, reused across modules.

    Unlike ``pool``, the workers live until the end of the session (a finalizer on the
    session closes them), so every module that asks for this fixture shares them and
    the process start-up is paid once per world size.  A failed task restarts the
    workers (harness), so one broken case cannot poison later ones.
    """
    p = _SHARED_POOLS.get(world_size)
    if p is None:
        p = harness.WorkerPool(world_size)
        _SHARED_POOLS[world_size] = p
        request.session.addfinalizer(lambda: _close_shared_pool(world_size))
    yield p


@pytest.fixture(scope="module")
def bpool(world_size: int, transport: str) -> Iterator[harness.WorkerPool]:
    """Workers for ``world_size`` ranks whose ringpg group runs on ``transport`` (a name of
    harness.TRANSPORT_ENVS; parametrize with harness.transports.on_transports)."""
    p = harness.WorkerPool(world_size, harness.InitSpec(env=harness.TRANSPORT_ENVS[transport]))
    yield p
    p.close()
