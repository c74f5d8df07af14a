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
* Tiers (markers, registered in pyproject.toml): every test is ``inprocess`` (the pytest
  process and its threads alone) or ``multiprocess`` (it starts other processes: ranks,
  torchrun, a tool's command line), never both and never neither: collection fails
  otherwise.  Each test file says which, module-wide (``pytestmark``) or, where a file
  mixes the two, on each test.  ``slow`` marks what takes more than about 5 s on 2 cores
  (where the test or parameter is defined, or in :data:`SLOW` for one case of a product
  of parametrizations), ``cuda`` what needs a GPU, and ``quick`` the subset :data:`QUICK`
  lists (here, and only here), which ``scripts/test_torch.sh --quick`` runs on the oldest
  torch.  A :data:`NODE_MARKS` entry that names no test fails collection.  So
  ``pytest -m "not slow and not multiprocess"`` is the in-process tier (seconds) and
  ``pytest -m quick`` the quick subset.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile
from typing import Iterator, Sequence

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


TIERS = ("inprocess", "multiprocess")

# The quick subset (pytest -m quick; scripts/test_torch.sh --quick on the oldest torch): the
# ring collectives against gloo (3 ranks: an odd ring), PREMUL_SUM (a renamed c10d type),
# point-to-point, async work, a killed rank, abort and shutdown (c10d virtuals since 2.7),
# and registration with the import-time version check (not the rest of its file:
# rendezvous, shared settings, torchrun).  Node ids as pytest prints them: with a
# parametrization, that one alone; without, every parametrization of the test.
QUICK = frozenset(
    [
        "tests/test_collectives.py::test_matches_gloo[flat-all_reduce-ws3]",
        "tests/test_collectives.py::test_matches_gloo[flat-reduce_scatter_tensor-ws3]",
        "tests/test_collectives.py::test_matches_gloo[flat-all_gather_into_tensor-ws3]",
        "tests/test_reduce_ops_and_dtypes.py::test_premul_sum[ws2]",
        "tests/test_collectives.py::test_p2p_tags_out_of_order[ws2]",
        "tests/test_collectives.py::test_batch_isend_irecv_ring[ws2]",
        "tests/test_collectives.py::test_futures_then_and_wait_all[n262144-ws3]",
        "tests/test_faults.py::test_killed_rank_every_survivor_raises_fast[2-sigkill-shm]",
        "tests/test_faults.py::test_abort_fails_the_peers_pending_op_at_once",
        "tests/test_faults.py::test_shutdown_is_orderly_and_later_ops_are_refused",
        # A build under another torch names the command that installs the right one.
        "tests/test_wheels.py::test_a_wheel_for_another_torch_names_both_and_the_wheelhouse_command",
    ]
    + [
        "tests/test_rendezvous_and_registration.py::" + name
        for name in (
            "test_version_mismatch_raises_with_rebuild_command",
            "test_matching_versions_pass",
            "test_extension_exports_no_copy_of_the_cxx_runtime",
            "test_backend_name_registered",
            "test_register_twice_is_harmless",
            "test_entry_point_registers_cleanly",
            "test_get_backend_of_group",
            "test_backend_returns_the_groups_ringbackend_and_none_for_others",
            "test_features_follow_the_torch_release",
            "test_unavailable_feature_message_names_the_release",
            "test_backend_methods_of_a_newer_torch_are_present_or_raise_a_clear_error",
            "test_use_algorithm_picks_the_algorithm_of_groups_made_inside_it",
        )
    ]
)

# Cases marked slow (more than about 5 s on 2 cores) that no pytest.param can mark alone:
# one combination of several parametrize decorators.  Whole tests and single parameters
# are marked where they are defined.
SLOW = frozenset(
    [
        "tests/test_collectives.py::test_matches_gloo[flat-reduce_scatter_list-ws4]",
        "tests/test_collectives.py::test_matches_gloo[flat-reduce_scatter_list-ws5]",
        "tests/test_collectives.py::test_matches_gloo[flat-reduce_scatter_tensor-ws5]",
    ]
)
NODE_MARKS = {"quick": QUICK, "slow": SLOW}


def _node_id(item: pytest.Item) -> str:
    """The item's node id from the repository root (as NODE_MARKS spell it), wherever pytest runs."""
    return os.path.relpath(str(item.path), ROOT).replace(os.sep, "/") + "::" + item.nodeid.split("::", 1)[1]


def _whole_file_collected(config: pytest.Config, path: str) -> bool:
    """Whether this run collects all of `path`: a NODE_MARKS entry absent from its tests is then
    stale (a test renamed or a parametrization changed), not just left out of the run."""
    args = config.args or [config.rootpath]
    for arg in args:
        arg = os.path.abspath(os.path.join(config.invocation_params.dir, str(arg)))
        if path == arg or path.startswith(arg.rstrip(os.sep) + os.sep):
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before -m and -k deselect: the checks see every collected test
def pytest_collection_modifyitems(config: pytest.Config, items: Sequence[pytest.Item]) -> None:
    untiered, both, matched, files = [], [], set(), set()
    for item in items:
        files.add(str(item.path))
        tiers = [t for t in TIERS if item.get_closest_marker(t) is not None]
        if not tiers:
            untiered.append(item.nodeid)
        elif len(tiers) > 1:
            both.append(item.nodeid)
        node = _node_id(item)
        for mark, entries in NODE_MARKS.items():
            for entry in (node, node.split("[", 1)[0]):
                if entry in entries:
                    item.add_marker(mark)
                    matched.add(entry)
    problems = []
    if untiered:
        problems.append("tests marked neither inprocess nor multiprocess:\n  " + "\n  ".join(untiered))
    if both:
        problems.append("tests marked both inprocess and multiprocess:\n  " + "\n  ".join(both))
    stale = []
    for entry in sorted(QUICK.union(SLOW) - matched):
        path = os.path.join(ROOT, entry.split("::", 1)[0])
        if path in files and _whole_file_collected(config, path):
            stale.append(entry)
    if stale:
        problems.append("tests/conftest.py NODE_MARKS names tests that do not exist:\n  " + "\n  ".join(stale))
    if problems:
        raise pytest.UsageError("\n".join(problems) + "\n(tiers: tests/conftest.py, pyproject.toml's markers)")


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
