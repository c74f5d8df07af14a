"""Launched by tests/test_rendezvous_and_registration.py under ``python -m torch.distributed.run``.

It never imports ringpg: ``init_process_group(backend="ringpg")`` must work through
the ``torch.backends`` entry point that ``import torch`` runs.  It checks a few
collectives against a gloo group of the same ranks and prints ``OK rank=<r>``.
The backend comes from ``$RINGPG_TEST_BACKEND`` (default ``ringpg``), so the
launcher test can itself be validated against gloo.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch.distributed as dist

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [TESTS, os.path.dirname(TESTS)]  # tests/ for harness, the repository root for benchmarks

from harness import PG_TIMEOUT_S, REFERENCE_BACKEND, Checker, backend_under_test, smoke_checks  # noqa: E402


def main() -> int:
    backend = backend_under_test()
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=PG_TIMEOUT_S))  # env:// from torchrun
    ref = dist.new_group(backend=REFERENCE_BACKEND)
    rank = dist.get_rank()
    chk = Checker(rank)
    chk.true("backend name", str(dist.get_backend()) == backend, str(dist.get_backend()))
    smoke_checks(chk, "torchrun", dist.group.WORLD, ref)
    dist.destroy_process_group()
    if chk.failures or chk.n_checks == 0:
        print("\n".join(chk.failures) or "no checks ran", file=sys.stderr, flush=True)
        return 1
    print(f"OK rank={rank} backend={backend} checks={chk.n_checks}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
