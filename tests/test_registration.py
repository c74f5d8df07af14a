"""Registration of the "ringpg" backend name, the build/torch version check, and what
ringpg says about features the running torch lacks (ringpg.features(), the clear error
for a newer torch's Backend methods), and ``ringpg.use_algorithm``: groups made inside it
run the algorithm it names (on emulated hosts, against gloo), and their split children too.

Mostly in-process (no process group needed).  ``dist.get_backend`` needs a group:
it runs in a spawned world-size-1 job of the backend under test.  The
``torch.backends`` entry point (registration with no ``import ringpg``) is checked
in a fresh interpreter when ringpg is pip-installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Any

import pytest
import ringpg
import torch
import torch.distributed as dist
from harness import (
    TRANSPORT_ENVS,
    Checker,
    CheckReport,
    Groups,
    InitSpec,
    assert_reports_ok,
    backend_under_test,
    entry_point_installed,
    make_data,
    ref_all_reduce,
    run_workers,
)
from ringpg import _features, _loader


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


# Symbols that only libstdc++'s own compiled sources define, never a header's template
# instantiation.  Exported by the extension, they mean it carries a static copy of the C++
# runtime that interposes with the libstdc++.so torch loaded: built by a compiler that
# links libstdc++ statically, ringpg crashed at its first c10::str until setup.py kept
# such copies local (--exclude-libs).
_CXX_RUNTIME_SYMBOLS = (
    "_ZNSt6locale7classicEv",  # std::locale::classic()
    "_ZNSt8ios_base4InitC1Ev",  # std::ios_base::Init::Init()
    "_ZNKSt7codecvtIwc11__mbstate_tE9do_lengthERS0_PKcS4_m",  # codecvt<wchar_t>::do_length
    "__cxa_throw",
)


def test_extension_exports_no_copy_of_the_cxx_runtime() -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils) to list the extension's exported symbols")
    so = _loader.load_extension().__file__
    out = subprocess.run([nm, "-D", "--defined-only", so], capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    assert len(exported) > 0, f"nm listed no exported symbols of {so}"
    assert "PyInit__C" in exported, "the module's init function must be exported"
    leaked = sorted(exported.intersection(_CXX_RUNTIME_SYMBOLS))
    assert not leaked, f"{so} exports C++ runtime symbols {leaked}: a static libstdc++ is not kept local"


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
        assert v["ref"] is None, v  # the gloo reference group
        assert v["cuda"], v


def test_features_follow_the_torch_release() -> None:
    """ringpg.features(), compiled from csrc/common/torch_compat.h, agrees with the
    releases that _features.FEATURES (docs/support.md's feature table) names."""
    running = _features.torch_release()
    assert ringpg.features() == {name: running >= f.since for name, f in _features.FEATURES.items()}


def test_unavailable_feature_message_names_the_release() -> None:
    with pytest.raises(_features.FeatureUnavailable) as e:
        _features.missing_backend_attribute(object(), "shrink")
    assert "from torch 2.10 on" in str(e.value) and torch.__version__ in str(e.value)
    assert isinstance(e.value, AttributeError)  # hasattr() stays False
    with pytest.raises(AttributeError) as e:
        _features.missing_backend_attribute(object(), "no_such_method")
    assert not isinstance(e.value, _features.FeatureUnavailable)


def backend_methods_worker(rank: int, ws: int, groups: Groups, args: Any) -> dict:
    b = ringpg.backend(groups.test)
    out = {}
    for name in list(_features.BACKEND_METHODS) + ["abort", "shutdown", "no_such_method"]:
        try:
            getattr(b, name)
            out[name] = "present"
        except _features.FeatureUnavailable as e:
            out[name] = f"unavailable: {e}"
        except AttributeError as e:
            out[name] = f"bare: {e}"
    return out


def test_backend_methods_of_a_newer_torch_are_present_or_raise_a_clear_error() -> None:
    """Checks _features.BACKEND_METHODS against the running torch's own Backend binding:
    a method is there from the release the table names, and before it the error says so."""
    if backend_under_test() != "ringpg":
        pytest.skip("ringpg.backend() describes ringpg groups only")
    v = run_workers(backend_methods_worker, 1)[0]
    running = _features.torch_release()
    for name, (since, _) in _features.BACKEND_METHODS.items():
        if running >= since:
            assert v[name] == "present", (name, v[name])
        else:
            assert v[name].startswith("unavailable: "), (name, v[name])
            assert f"from torch {since[0]}.{since[1]} on" in v[name], (name, v[name])
    # ringpg binds abort/shutdown itself where torch's Backend lacks them (before 2.7).
    assert v["abort"] == v["shutdown"] == "present", v
    assert v["no_such_method"].startswith("bare: "), v


ALGO_NUMEL = 1 << 20  # 4 MiB of float32: past the one-shot limit, so the algorithm runs


def use_algorithm_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    chk = Checker(rank)
    made = {}
    for algo in ("ring", "hier"):
        with ringpg.use_algorithm(algo):
            made[algo] = dist.new_group(backend="ringpg")
    after = dist.new_group(backend="ringpg")  # RINGPG_ALGO again: auto, hierarchical on 2 hosts x 2
    for algo, g in made.items():
        said = ringpg.backend(g).allreduce_algorithm
        chk.true(f"allreduce_algorithm of a group made in use_algorithm({algo!r})", said == algo, said)
        case = f"all_reduce of a use_algorithm({algo!r}) group ws={ws} numel={ALGO_NUMEL}"
        x = make_data(dist.get_rank(), case, (ALGO_NUMEL,), torch.float32)
        got = x.clone()
        dist.all_reduce(got, group=g)
        chk.equal(case, got, ref_all_reduce(x, "SUM", groups.ref))
    chk.true(
        "allreduce_algorithm after the blocks",
        ringpg.backend(after).allreduce_algorithm == "hier",
        ringpg.backend(after).allreduce_algorithm,
    )
    if _features.torch_release() >= (2, 15):  # split_group without a bound device
        # Split children keep the parent's algorithm, through both of makeChild's paths.
        for transport in ("auto", "gloo"):
            with ringpg.use_transport(transport), ringpg.use_algorithm("ring"):
                parent = dist.new_group(backend="ringpg")
            child = dist.split_group(parent, split_ranks=[list(range(ws))])
            said = ringpg.backend(child).allreduce_algorithm
            chk.true(f"split child of a use_algorithm('ring') {transport} group", said == "ring", said)
    try:
        with ringpg.use_algorithm("tree"):
            pass
        chk.true("unknown algorithm refused", False, "no error")
    except ValueError as e:
        chk.true("unknown algorithm refused", "not one of auto, ring, hier" in str(e), str(e))
    return chk.report()


def test_use_algorithm_picks_the_algorithm_of_groups_made_inside_it() -> None:
    """Groups of one job on different algorithms (the bench's ringpg/ring and ringpg/hier
    columns), on 2 emulated hosts x 2 ranks where RINGPG_ALGO=auto runs the hierarchical
    ones: each says what it runs and its all_reduce matches gloo's; their split children
    keep the algorithm; outside the blocks the process's setting rules again."""
    if backend_under_test() != "ringpg":
        pytest.skip("ringpg's algorithm choice")
    spec = InitSpec(env=TRANSPORT_ENVS["mixed"])
    assert_reports_ok(run_workers(use_algorithm_worker, 4, spec=spec))
