"""Registration of the "ringpg" backend name and the build/torch version check.

Mostly in-process (no process group needed).  ``dist.get_backend`` needs a group:
it runs in a spawned world-size-1 job of the backend under test.  The
``torch.backends`` entry point (registration with no ``import ringpg``) is checked
in a fresh interpreter when ringpg is pip-installed.
"""
from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch
import torch.distributed as dist

import ringpg
from ringpg import _loader
from harness import Groups, backend_under_test, entry_point_installed, run_workers


def test_version_mismatch_raises_with_rebuild_command() -> None:
    with pytest.raises(_loader.RingpgBuildMismatch) as e:
        _loader.check_torch_version("2.14.0", "2.15.0+cu132")
    msg = str(e.value)
    assert "pip install --no-build-isolation" in msg
    assert "2.14.0" in msg and "2.15.0+cu132" in msg


@pytest.mark.parametrize(
    "built_for, running",
    [("2.15.0", "2.15.0+cu132"), ("2.15.0+cpu", "2.15.0+cu132"), (torch.__version__, torch.__version__)],
)
def test_matching_versions_pass(built_for: str, running: str) -> None:
    _loader.check_torch_version(built_for, running)


def test_backend_name_registered() -> None:
    assert dist.Backend.RINGPG == "ringpg"
    assert dist.Backend("ringpg") == "ringpg"
    assert list(dist.Backend.backend_capability["ringpg"]) == ["cpu", "cuda"]


def test_register_twice_is_harmless() -> None:
    ringpg.register()
    ringpg.register()
    from ringpg import _autoload

    _autoload.register()
    assert dist.Backend.backend_list.count("ringpg") == 1
    assert dist.Backend.RINGPG == "ringpg"


@pytest.mark.skipif(not entry_point_installed(), reason="ringpg is not pip-installed: no torch.backends entry point")
@pytest.mark.parametrize(
    "code",
    [
        # The entry point alone registers the name; _C is loaded only when a group is created.
        "import sys, torch.distributed as dist; print(dist.Backend.RINGPG, 'ringpg._C' in sys.modules)",
        # `import ringpg` before torch: the entry point then runs while ringpg is half-imported.
        "import ringpg, sys, torch.distributed as dist; print(dist.Backend.RINGPG, 'ringpg._C' in sys.modules)",
    ],
    ids=["import-torch-only", "import-ringpg-first"],
)
def test_entry_point_registers_cleanly(code: str) -> None:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ringpg", "False"], out.stdout + out.stderr
    assert "ringpg" not in out.stderr, f"unexpected ringpg warning/error:\n{out.stderr}"


def get_backend_worker(rank: int, ws: int, groups: Groups, args: Any) -> tuple[str, str]:
    return str(dist.get_backend()), str(dist.get_backend(groups.test))


def test_get_backend_of_group() -> None:
    assert run_workers(get_backend_worker, 1) == [(backend_under_test(), backend_under_test())]


def backend_object_worker(rank: int, ws: int, groups: Groups, args: Any) -> dict:
    b = ringpg.backend(groups.test)
    return {
        "test": None if b is None else (type(b).__name__, b.transport, b.wait_spin_us, b.size(), b.rank()),
        "ref": ringpg.backend(groups.ref),
        "cuda": ringpg.backend(groups.test, "cuda") is b,  # one RingBackend serves both devices
    }


def test_backend_returns_the_groups_ringbackend_and_none_for_others() -> None:
    if backend_under_test() != "ringpg":
        pytest.skip("ringpg.backend() describes ringpg groups only")
    for rank, v in enumerate(run_workers(backend_object_worker, 2)):
        name, transport, spin, size, grank = v["test"]
        assert (name, size, grank) == ("RingBackend", 2, rank), v
        assert transport in ("shm", "tcp") and spin >= 0, v
        assert v["ref"] is None, v   # the gloo reference group
        assert v["cuda"], v
