"""How ringpg counts the CPUs it may use (csrc/common/host.h), which decides whether
waits spin by default (``RINGPG_SPIN_US=auto``; the decision itself is checked per
transport in test_transport.py).

A container's CPU limit is usually a CFS quota rather than a cpuset, so the affinity
mask alone overstates it: cgroup v2 writes the limit as ``cpu.max`` = "QUOTA PERIOD"
(or "max PERIOD" without a limit), and a limit of 1.5 CPUs must count as 2.
"""
from __future__ import annotations

import os

import pytest

_C = pytest.importorskip("ringpg._C")


@pytest.mark.parametrize("text, cpus", [
    ("max 100000\n", None),           # no limit
    ("200000 100000\n", 2),
    ("150000 100000", 2),             # 1.5 CPUs: a rank may still run on 2 at once
    ("50000 100000", 1),              # under one CPU still counts one
    ("400000 50000", 8),
    ("", None), ("junk", None), ("12x 100000", None), ("100000", None), ("-1 100000", None),
])
def test_cpu_max_is_read_as_the_ceiling_of_quota_over_period(text: str, cpus: int | None) -> None:
    assert _C.cpus_from_cpu_max(text) == cpus


def test_usable_cpus_never_exceeds_the_affinity_mask() -> None:
    n = _C.usable_cpus()
    assert 1 <= n <= len(os.sched_getaffinity(0))
