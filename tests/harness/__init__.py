"""Multi-process test harness for ringpg: real processes, real sockets, gloo as the reference.

One module a room; every test imports what it needs from ``harness`` itself:

* :mod:`harness.backend`: which backend is under test (``$RINGPG_TEST_BACKEND``,
  default ``ringpg``), what a live group of it says, the worker environments of
  ringpg's two transports (:data:`TRANSPORT_ENVS`), its one-shot allreduce limit and
  the algorithms its traces show (:func:`traced_algorithms`, :func:`traced_ops`);
* :mod:`harness.gloo_gaps`: the one registry of features gloo lacks, for runs that
  substitute gloo for ringpg (:func:`known_gap`, :func:`skip_case`);
* :mod:`harness.data`: deterministic integer data, dtypes, ops and sizes swept;
* :mod:`harness.references`: gloo's results on the same ranks (:func:`ref_all_reduce`, ...);
* :mod:`harness.checking`: :class:`Checker`, :func:`assert_reports_ok`, :func:`smoke_checks`;
* :mod:`harness.processes`: :class:`WorkerPool` and :func:`run_workers`, which spawn the
  ranks, run tasks on them and never hang;
* :mod:`harness.scenarios`: :func:`run_scenario`, one-shot ranks that may die on
  purpose, and :func:`expect_error`, which times a call that should raise; the shared
  dead-peer scenario (:func:`die_mid_collective`, :func:`assert_survivors_raised_fast`).

* :mod:`harness.batteries`: worker batteries more than one test file runs (the
  collectives' exact checks, the coalesced APIs, the ReduceOps);
* :mod:`harness.transports`: a battery on each transport (``on_transports`` for
  conftest's ``bpool``, ``check_transport``);
* :mod:`harness.commands`: :func:`run_module`, a command line (``python -m ...``) run
  in a child forked from one process that imported torch;
* :mod:`harness.surface`: raw-byte data, a reduction reference for every (dtype,
  ReduceOp) pair, and :func:`harness.surface.guarded` for the API-surface batteries.

Helpers the tests share with the benchmarks (``free_port``, ``run_ranks``,
``transport_of``, ``global_rank``, ``rss_mb``, ``default_tcp_congestion``) live in the
neutral ``devkit`` package, which both import, and are re-exported here, so that tests
import from ``harness`` alone (``tests/test_bench_tool.py`` aside, which tests the benchmarks);
``tests/conftest.py`` puts the repository root on ``sys.path`` so that tests and workers
can import it.
"""

from __future__ import annotations

# The helpers shared with the benchmarks (devkit), not copied.
from devkit.groups import global_rank, transport_of
from devkit.launch import free_port, run_ranks
from devkit.machine import default_tcp_congestion, rss_mb

# Re-exported, so that a test writes ``from harness import Checker, make_data, WorkerPool``.
from .backend import (
    BACKEND_ENV,
    EMULATED_HOSTS_ENV,
    EMULATED_LAYOUTS,
    REFERENCE_BACKEND,
    REFUSE_CMA_ENV,
    SHM_RING,
    TRANSPORT_ENV_DICTS,
    TRANSPORT_ENVS,
    TRANSPORT_NAMES,
    apply_env,
    backend_under_test,
    can_make_mount_namespaces,
    cpu_backend,
    emulated_host,
    emulated_topology,
    entry_point_installed,
    hier_pieces,
    hierarchical_expected,
    oneshot_limit_bytes,
    private_dev_shm,
    ringpg_only,
    spin_yields_of,
    tiny_private_dev_shm,
    traced_algorithms,
    traced_ops,
    traced_pieces,
    transport_env,
    transport_expected,
    wait_spin_of,
)
from .checking import Checker, CheckReport, assert_reports_ok, describe_mismatch, smoke_checks
from .data import (
    BIG_DTYPES,
    BIG_NUMEL,
    DTYPES,
    OPS,
    case_seed,
    data_kind,
    dtype_name,
    make_data,
    make_random_float,
    numels_for,
    reduce_op,
)
from .gloo_gaps import GLOO_GAPS, known_gap, skip_case
from .processes import (
    DEFAULT_RUN_TIMEOUT_S,
    ERROR_GRACE_S,
    PG_TIMEOUT_S,
    SHUTDOWN_TIMEOUT_S,
    Groups,
    InitSpec,
    TaskFn,
    WorkerPool,
    collect_results,
    run_workers,
)
from .references import (
    divide_by_world,
    rank_block,
    ref_all_gather,
    ref_all_reduce,
    ref_all_reduce_many,
    ref_broadcast,
    ref_reduce_scatter,
    ref_reduce_scatter_many,
    sentinel_like,
)
from .scenarios import (
    KILL_DETECT_S,
    TYPED_ERRORS,
    ScenarioFn,
    assert_survivors_raised_fast,
    die_mid_collective,
    expect_error,
    init_ringpg,
    run_scenario,
)
