"""How ringpg counts the CPUs it may use (csrc/common/host.h), which decides whether
waits spin by default (``RINGPG_SPIN_US=auto``; the decision itself is checked per
transport in test_transport.py).

A container's CPU limit is usually a CFS quota rather than a cpuset, so the affinity
mask alone overstates it: cgroup v2 writes the limit as ``cpu.max`` = "QUOTA PERIOD"
(or "max PERIOD" without a limit), and a limit of 1.5 CPUs must count as 2.  A limit
binds every cgroup below it, so the quota is looked up along the process's cgroup path
(from /proc/self/cgroup) up to the hierarchy's root; the lookups here run on real
directory trees laid out as cgroupfs lays them out.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_C = pytest.importorskip("ringpg._C")


@pytest.mark.parametrize(
    "text, cpus",
    [
        ("max 100000\n", None),  # no limit
        ("200000 100000\n", 2),
        ("150000 100000", 2),  # 1.5 CPUs: a rank may still run on 2 at once
        ("50000 100000", 1),  # under one CPU still counts one
        ("400000 50000", 8),
        ("", None),
        ("junk", None),
        ("12x 100000", None),
        ("100000", None),
        ("-1 100000", None),
    ],
)
def test_cpu_max_is_read_as_the_ceiling_of_quota_over_period(text: str, cpus: int | None) -> None:
    assert _C.cpus_from_cpu_max(text) == cpus


def test_usable_cpus_never_exceeds_the_affinity_mask() -> None:
    n = _C.usable_cpus()
    assert 1 <= n <= len(os.sched_getaffinity(0))


PROC_SELF_CGROUP_V1 = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n2:cpuacct:/other\n0::/init.scope\n"


@pytest.mark.parametrize(
    "text, controller, path",
    [
        (PROC_SELF_CGROUP_V1, "cpu", "/docker/abc"),  # co-mounted controllers, comma list
        (PROC_SELF_CGROUP_V1, "cpuacct", "/docker/abc"),  # the first hierarchy that has it
        (PROC_SELF_CGROUP_V1, "", "/init.scope"),  # v2: id 0, no controllers
        (PROC_SELF_CGROUP_V1, "pids", None),
        ("0::/user.slice/a:b.scope\n", "", "/user.slice/a:b.scope"),  # ':' inside the path
        ("2:cpuacct:/x\n", "cpu", None),  # no prefix match
        ("", "", None),
        ("garbage\n", "cpu", None),
    ],
)
def test_cgroup_path_is_parsed_from_proc_self_cgroup(text: str, controller: str, path: str | None) -> None:
    assert _C.cgroup_path(text, controller) == path


def _write(d: Path, files: dict[str, str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)


def test_v2_quota_is_the_tightest_along_the_path(tmp_path: Path) -> None:
    _write(tmp_path / "kubepods" / "pod1" / "ctr", {"cpu.max": "max 100000\n"})
    _write(tmp_path / "kubepods" / "pod1", {"cpu.max": "250000 100000\n"})  # 2.5 CPUs
    _write(tmp_path / "kubepods", {"cpu.max": "800000 100000\n"})
    root = str(tmp_path)
    assert _C.quota_cpus_along(root, "/kubepods/pod1/ctr", True) == 3
    assert _C.quota_cpus_along(root, "/kubepods/pod1/ctr/", True) == 3
    assert _C.quota_cpus_along(root, "/kubepods", True) == 8
    assert _C.quota_cpus_along(root, "/", True) is None  # no cpu.max at the root
    # A path the mount does not show (a container sees only its own subtree): the
    # levels that exist still count.
    assert _C.quota_cpus_along(str(tmp_path / "kubepods"), "/kubepods/pod1/ctr", True) == 8


def test_v1_quota_reads_quota_and_period_and_ignores_minus_one(tmp_path: Path) -> None:
    _write(tmp_path, {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"})
    _write(tmp_path / "docker" / "abc", {"cpu.cfs_quota_us": "150000\n", "cpu.cfs_period_us": "100000\n"})
    _write(tmp_path / "docker", {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"})
    root = str(tmp_path)
    assert _C.quota_cpus_along(root, "/docker/abc", False) == 2
    assert _C.quota_cpus_along(root, "/docker", False) is None
    assert _C.quota_cpus_along(root, "/docker/abc", True) is None  # v2 files absent
