"""Self-tests of the harness: mismatches, child exceptions, crashes and hangs are reported.

These run on gloo only (they test the harness, not the backend), so a broken
backend under test cannot mask a broken harness.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from harness import Checker, Groups, InitSpec, WorkerPool, assert_reports_ok


@pytest.mark.inprocess
def test_checker_reports_exact_mismatch() -> None:
    chk = Checker(rank=2)
    assert chk.equal("same", torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3]))
    assert not chk.equal("values", torch.tensor([1, 2, 3]), torch.tensor([1, 5, 3]))
    assert not chk.equal("dtype", torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64))
    assert not chk.equal("shape", torch.zeros(2, 3), torch.zeros(3, 2))
    assert not chk.within("tol", torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]), torch.tensor([0.1, 0.1]))
    assert chk.within("tol ok", torch.tensor([1.0, 2.0]), torch.tensor([1.05, 2.0]), torch.tensor([0.1, 0.1]))
    rep = chk.report()
    assert rep.n_checks == 6 and len(rep.failures) == 4
    with pytest.raises(AssertionError) as e:
        assert_reports_ok([rep])
    msg = str(e.value)
    assert "rank 2: values: 1/3 elements differ; first at flat index [1]: got [2] expected [5]" in msg
    assert "4 failed checks" in msg
    with pytest.raises(AssertionError, match="only 0 checks ran"):
        assert_reports_ok([Checker(rank=0).report()])


def raise_on_rank0_worker(rank: int, ws: int, groups: Groups, args: Any) -> None:
    if rank == 0:
        raise ValueError("boom from rank 0")
    dist.all_reduce(torch.ones(3), group=groups.ref)  # blocks: rank 0 never joins


def hang_on_rank1_worker(rank: int, ws: int, groups: Groups, args: Any) -> int:
    if rank == 1:
        time.sleep(600)
    return rank


def crash_on_rank0_worker(rank: int, ws: int, groups: Groups, args: Any) -> int:
    if rank == 0:
        os._exit(3)
    time.sleep(600)
    return rank


def echo_worker(rank: int, ws: int, groups: Groups, args: Any) -> tuple[int, int, str]:
    return rank, ws, dist.get_backend(groups.test)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_failures_are_reported_and_pool_recovers() -> None:
    with WorkerPool(2, InitSpec(), backend="gloo", error_grace_s=2.0) as pool:
        with pytest.raises(AssertionError) as e:
            pool.run(raise_on_rank0_worker, timeout=60)
        assert "--- rank 0 raised ---" in str(e.value) and "ValueError: boom from rank 0" in str(e.value)
        assert "ranks [1] were still running" in str(e.value)
        assert not pool.alive

        with pytest.raises(AssertionError, match=r"ranks \[1\] hung: no result within 3 s"):
            pool.run(hang_on_rank1_worker, timeout=3)

        with pytest.raises(AssertionError, match="rank 0 raised ---\nprocess died with exit code 3"):
            pool.run(crash_on_rank0_worker, timeout=30)

        assert pool.run(echo_worker) == [(0, 2, "gloo"), (1, 2, "gloo")]
