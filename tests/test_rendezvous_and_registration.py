"""How a group of the backend under test comes to be: rendezvous, registration, the
settings its ranks must share, and torchrun.

* rendezvous via env://, file://, explicit ``store=`` (TCPStore) and tcp:// (tcp:// is
  also what every other test uses; here with gloo as the default group and the backend
  under test as a ``new_group``); two full-world groups of the backend under test used
  interleaved (one op of each in flight), next to gloo; subgroups via
  ``dist.new_group(ranks=..., backend=...)`` at world size 4 with non-member ranks:
  two disjoint pairs working concurrently, a 3-rank group and a non-contiguous pair,
  each compared with the gloo subgroup of the same ranks; ringpg's threads are named;
  16 ranks leaving a group together fail no one; a rank's Store calls at a group's
  creation do not grow with the group;
* the link a group gets: ranks that disagree on the transport (one sets
  RINGPG_TRANSPORT=tcp) agree through the Store and use TCP on every rank;
  ``ringpg.use_transport("gloo")``: a group made inside it runs on Gloo's pairs, one
  made after it on the process's setting, and an unknown name is refused; a rank whose
  /dev/shm is a tiny one of its own (a container's): no region fits and its
  neighbours' are invisible, so the group falls back to TCP without a crash and leaves
  no names behind; a ``tcp_congestion`` the host cannot give fails the group's
  creation, saying why, and so do a malformed ``RINGPG_TUNING`` and a variable it
  replaced (``RINGPG_SEGMENT_BYTES``, ...), naming what to set instead;
* registration of the "ringpg" backend name, the build/torch version check, the
  extension's exported symbols, ``dist.get_backend`` and ``ringpg.backend()`` of a
  group, and what ringpg says about features the running torch lacks
  (``ringpg.features()``, the clear error for a newer torch's Backend methods); the
  ``torch.backends`` entry point (registration with no ``import ringpg``) is checked
  in a fresh interpreter when ringpg is pip-installed;
* ``ringpg.use_algorithm``: groups made inside it run the algorithm it names (on
  emulated hosts, against gloo), and their split children too;
* settings the ranks of a group must share are agreed on when the group is created:
  the algorithm (``RINGPG_ALGO`` / ``ringpg.use_algorithm``), the segment, one-shot
  and hierarchical piece sizes and the all-to-all algorithm (``RINGPG_TUNING`` keys)
  decide which frames each rank sends and expects, and tracing runs a clock sync at
  creation: ranks that differ in any of them get one ``ValueError`` on every rank,
  within seconds, naming each setting and every rank's value (the transport is agreed
  on likewise: test_bad_input.py).  Settings that stay local are shown to be local: ranks
  whose receive windows differ run the ring on shared memory, ringpg's TCP and Gloo's
  pairs with exact results;
* end to end under torchrun, with no ``import ringpg`` anywhere in the script:
  ``tests/scripts/torchrun_script.py`` calls ``init_process_group(backend="ringpg")``
  relying on the ``torch.backends`` entry point, so this needs ringpg pip-installed
  (an editable install counts); it is skipped otherwise.

Registration is checked mostly in-process (no process group needed); what needs a
group runs in a job of its own (``dist.get_backend`` in a world-size-1 job of the
backend under test) or on a pool of workers, each group compared with gloo.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from datetime import timedelta
from typing import Any, Optional

import harness
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
    WorkerPool,
    assert_reports_ok,
    backend_under_test,
    can_make_mount_namespaces,
    entry_point_installed,
    free_port,
    make_data,
    ref_all_reduce,
    run_workers,
    smoke_checks,
    tiny_private_dev_shm,
    transport_of,
)
from ringpg import _features, _loader
from ringpg._registration import served_devices

from devkit.settings import TUNING, merged_env, tuning_value

ON_WS_4 = pytest.mark.parametrize("world_size", [4], ids=lambda ws: f"ws{ws}", scope="module")


# ============================================= rendezvous, groups and their links


def smoke_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    chk = Checker(rank)
    smoke_checks(chk, "default groups", groups.test, groups.ref)
    return chk.report()


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "method, default_backend",
    [("env", None), ("file", None), ("store", None), ("tcp", "gloo")],
    ids=["env", "file", "store", "tcp-gloo-default-group"],
)
def test_init_methods(method: str, default_backend: Optional[str]) -> None:
    assert_reports_ok(run_workers(smoke_worker, 2, spec=InitSpec(method, default_backend)))


def two_groups_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """A second full-world group of the backend under test, interleaved with the first."""
    chk = Checker(rank)
    other = dist.new_group(backend=groups.backend)
    for i in range(3):
        a = make_data(rank, f"two groups a{i}", (4099,), torch.float32)
        b = make_data(rank, f"two groups b{i}", (513,), torch.int32)
        ya, yb = a.clone(), b.clone()
        wa = dist.all_reduce(ya, group=groups.test, async_op=True)
        wb = dist.all_reduce(yb, op=dist.ReduceOp.MAX, group=other, async_op=True)
        wb.wait()
        wa.wait()
        chk.equal(
            f"round {i}: all_reduce SUM on the default group while the second group runs",
            ya,
            ref_all_reduce(a, "SUM", groups.ref),
        )
        chk.equal(
            f"round {i}: all_reduce MAX on the second group while the default group runs",
            yb,
            ref_all_reduce(b, "MAX", groups.ref),
        )
    smoke_checks(chk, "second full-world group", other, groups.ref)
    dist.destroy_process_group(other)
    smoke_checks(chk, "default group after destroying the second", groups.test, groups.ref)
    return chk.report()


# Every rank creates every group, in the same order (new_group's requirement).
SUBGROUPS = ([0, 1], [2, 3], [1, 2, 3], [1, 3])


def subgroups_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    chk = Checker(rank)
    pairs = [
        (ranks, dist.new_group(ranks=ranks, backend=groups.backend), dist.new_group(ranks=ranks, backend="gloo"))
        for ranks in SUBGROUPS
    ]
    for ranks, test_g, ref_g in pairs:
        tag = f"subgroup {ranks}"
        if rank in ranks:
            chk.true(f"{tag}: group rank", dist.get_rank(test_g) == ranks.index(rank), f"{dist.get_rank(test_g)}")
            chk.true(
                f"{tag}: backend name", str(dist.get_backend(test_g)) == groups.backend, str(dist.get_backend(test_g))
            )
            smoke_checks(chk, tag, test_g, ref_g, numel=1001)
        else:
            chk.true(
                f"{tag}: non-member gets NON_GROUP_MEMBER", test_g == dist.GroupMember.NON_GROUP_MEMBER, repr(test_g)
            )
    smoke_checks(chk, "world after subgroups", groups.test, groups.ref)
    return chk.report()


@pytest.mark.multiprocess
@ON_WS_4
def test_two_groups_of_backend_coexist(pool: WorkerPool) -> None:
    assert_reports_ok(pool.run(two_groups_worker))


@pytest.mark.multiprocess
@ON_WS_4
def test_subgroups_with_non_members(pool: WorkerPool) -> None:
    assert_reports_ok(pool.run(subgroups_worker))


def thread_names_worker(rank: int, ws: int, groups: Groups, args: Any) -> list[str]:
    dist.all_reduce(torch.ones(8), group=groups.test)
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # a thread that ended meanwhile
            pass
    return sorted(names)


@pytest.mark.multiprocess
@ON_WS_4
def test_ringpg_threads_are_named(pool: WorkerPool) -> None:
    """top -H, perf and /proc tell ringpg's threads from the caller's: each group's engine
    and worker, named."""
    if backend_under_test() != "ringpg":
        pytest.skip("ringpg's threads")
    for rank, names in enumerate(pool.run(thread_names_worker)):
        assert "ringpg-engine" in names and "ringpg-worker" in names, (rank, names)


def disagreeing_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    chk = Checker(rank)
    transport = transport_of(groups.test)
    chk.true("transport", transport == "tcp", f"rank {rank} uses {transport!r}; one rank opted out of shm")
    smoke_checks(chk, "one rank opted out of shm", groups.test, groups.ref, numel=100_003)
    return chk.report()


@pytest.mark.multiprocess
@pytest.mark.skipif(backend_under_test() != "ringpg", reason="ringpg's transport choice")
def test_one_rank_opting_out_of_shm_keeps_the_whole_group_on_tcp() -> None:
    """Both ends of every link must use the same transport, whatever each rank was told."""
    spec = InitSpec(rank0_env=(("RINGPG_TRANSPORT", "tcp"),))
    assert_reports_ok(run_workers(disagreeing_worker, 3, spec=spec))


def use_transport_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    import ringpg

    chk = Checker(rank)
    with ringpg.use_transport("gloo"):
        gloo_pairs = dist.new_group(backend="ringpg")
    tcp = dist.new_group(backend="ringpg")  # outside the block: RINGPG_TRANSPORT again (here auto)
    chk.true("transport inside use_transport", transport_of(gloo_pairs) == "gloo", transport_of(gloo_pairs))
    chk.true("transport after it", transport_of(tcp) == transport_of(groups.test), transport_of(tcp))
    smoke_checks(chk, "a group made in use_transport('gloo')", gloo_pairs, groups.ref, numel=100_003)
    try:
        with ringpg.use_transport("udp"):
            pass
        chk.true("unknown transport refused", False, "no error")
    except ValueError as e:
        chk.true("unknown transport refused", "not one of auto, shm, tcp, gloo" in str(e), str(e))
    return chk.report()


@pytest.mark.multiprocess
@pytest.mark.skipif(backend_under_test() != "ringpg", reason="ringpg's transport choice")
def test_use_transport_picks_the_link_of_groups_made_inside_it() -> None:
    """Groups of one job on different links (the bench's ringpg@gloo column), each
    checked against gloo; the process's RINGPG_TRANSPORT still rules outside the block."""
    assert_reports_ok(run_workers(use_transport_worker, 3))


def small_shm_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    chk = Checker(rank)
    transport = transport_of(groups.test)
    chk.true("transport", transport == "tcp", f"rank {rank} uses {transport!r}; rank 0's /dev/shm is tiny")
    smoke_checks(chk, "rank 0 with a tiny /dev/shm", groups.test, groups.ref, numel=100_003)
    mine = [n for n in os.listdir("/dev/shm") if n.startswith(f"ringpg-{os.getpid()}-")]
    chk.true("no names left in /dev/shm", not mine, repr(mine))
    return chk.report()


@pytest.mark.multiprocess
@pytest.mark.skipif(backend_under_test() != "ringpg", reason="ringpg's transport choice")
@pytest.mark.skipif(not can_make_mount_namespaces(), reason="needs root and mount namespaces")
def test_a_rank_with_a_tiny_private_dev_shm_keeps_the_group_on_tcp() -> None:
    spec = InitSpec(rank0_setup=tiny_private_dev_shm)
    assert_reports_ok(run_workers(small_shm_worker, 3, spec=spec))


@pytest.mark.multiprocess
def test_a_congestion_control_the_host_cannot_give_fails_group_creation(tmp_path: Any) -> None:
    """RINGPG_TUNING's tcp_congestion names an algorithm this host lacks: creating the group fails
    with the setting and what the host offers, instead of running on something else."""
    if backend_under_test() != "ringpg":
        pytest.skip("a ringpg setting")
    script = (
        "import torch.distributed as dist\n"
        f"dist.init_process_group('ringpg', init_method='file://{tmp_path}/store', rank=0, world_size=1)\n"
    )
    env = dict(os.environ, RINGPG_TUNING="tcp_congestion=no_such_cc")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "RINGPG_TUNING tcp_congestion=no_such_cc cannot be set on this host" in out.stderr, out.stderr
    assert "available: " in out.stderr and "reno" in out.stderr, out.stderr


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "env, says",
    [
        (
            {"RINGPG_SEGMENT_BYTES": "65536"},
            "RINGPG_SEGMENT_BYTES is no longer read; set RINGPG_TUNING=segment_bytes=65536",
        ),
        ({TUNING: "spin_us=5,segment_byte=1"}, "RINGPG_TUNING has no key 'segment_byte' (its keys: segment_bytes,"),
    ],
    ids=["replaced-variable", "unknown-key"],
)
def test_a_replaced_or_misspelt_setting_fails_group_creation_naming_the_fix(
    env: dict, says: str, tmp_path: Any
) -> None:
    """A variable RINGPG_TUNING replaced, or a key it lacks, fails the group's creation
    saying what to set, instead of running with a value the job did not ask for."""
    if backend_under_test() != "ringpg":
        pytest.skip("a ringpg setting")
    script = (
        "import torch.distributed as dist\n"
        f"dist.init_process_group('ringpg', init_method='file://{tmp_path}/store', rank=0, world_size=1)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )
    assert out.returncode != 0
    assert says in out.stderr, out.stderr


@pytest.mark.inprocess
@pytest.mark.parametrize(
    "text, says",
    [
        ("segment_bytes=12", "RINGPG_TUNING segment_bytes=12 is outside [4096,"),
        ("segment_bytes=64k", "RINGPG_TUNING segment_bytes=64k is not an integer"),
        ("alltoall=ring", "RINGPG_TUNING alltoall=ring is not one of auto, direct, bruck"),
        ("spin_us", "RINGPG_TUNING item 'spin_us' is not key=value"),
        ("tcp_congestion=cu bic", "RINGPG_TUNING tcp_congestion=cu bic is not an algorithm name"),
        ("cma_op_bytes=-1", "RINGPG_TUNING cma_op_bytes=-1 is outside [0,"),
    ],
)
def test_a_malformed_tuning_value_is_refused_naming_the_key(text: str, says: str) -> None:
    """ringpg's parser of RINGPG_TUNING (the one group creation runs) refuses what it
    cannot read, naming the key and the value."""
    from ringpg import _C

    with pytest.raises(RuntimeError, match=re.escape(says)):
        _C.tuning(text)


@pytest.mark.inprocess
def test_tuning_keys_read_back_as_set_the_last_one_winning() -> None:
    """Each key set reads back as set, a repeated key's last value wins (so settings
    can be appended), spaces around items are ignored, and unset keys keep defaults."""
    from ringpg import _C

    defaults = _C.tuning("")
    got = _C.tuning(" segment_bytes=65536 , spin_us=7,alltoall=bruck,segment_bytes=131072,connect=all,cma_op_bytes=0")
    assert got["segment_bytes"] == "131072" and got["spin_us"] == "7", got
    assert got["alltoall"] == "bruck" and got["connect"] == "all" and got["cma_op_bytes"] == "0", got
    changed = {"segment_bytes", "spin_us", "alltoall", "connect", "cma_op_bytes"}
    assert {k: v for k, v in got.items() if k not in changed} == {k: v for k, v in defaults.items() if k not in changed}
    assert defaults["segment_bytes"] == "524288" and defaults["spin_us"] == "auto", defaults
    assert defaults["cma_op_bytes"] == "auto", defaults


def leave_together_worker(rank: int, ws: int, groups: Groups, rounds: int) -> list[str]:
    """Round after round: a fresh group of every rank, a barrier, then every rank destroys
    it at once (as a job's ranks do at its end).  Returns what went wrong."""
    errors = []
    for i in range(rounds):
        g = dist.new_group(backend=groups.backend)
        try:
            dist.barrier(group=g)
        except Exception as e:  # noqa: BLE001 - reported, and the next round goes on
            errors.append(f"round {i}: {type(e).__name__}: {e}"[:400])
        dist.destroy_process_group(g)
    return errors


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [16], ids=lambda ws: f"ws{ws}", scope="module")
def test_ranks_that_leave_together_fail_no_one(pool: WorkerPool) -> None:
    """Ranks that finish a barrier early shut their group down while others are still in
    it.  Two ranks leaving together each read the other's goodbye first and send none
    back; the one still saying its own goodbyes then reads the other's close.  That close
    is no failure: it must not abort the group under the ranks still in the barrier (at
    32 ranks it did, in about half of the runs)."""
    bad = [f"rank {r}: {e}" for r, errs in enumerate(pool.run(leave_together_worker, 12)) for e in errs]
    assert not bad, "\n".join(bad)


class CountingStore(dist.Store):
    """A Store that counts the calls this rank makes through it (ringpg's and torch's)."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def set(self, key: str, value: Any) -> None:
        self._count("set")
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        self._count("get")
        return self.inner.get(key)

    def add(self, key: str, amount: int) -> int:
        self._count("add")
        return self.inner.add(key, amount)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        self._count("compare_set")
        return self.inner.compare_set(key, expected, desired)

    def check(self, keys: list[str]) -> bool:
        self._count("check")
        return self.inner.check(keys)

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        self._count("wait")
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        self._count("delete_key")
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()


def store_calls_rank(rank: int, ws: int, port: int, q: Any) -> None:
    """One rank: a ringpg group (no gloo beside it) created on a counting Store."""
    import datetime

    inner = dist.TCPStore("127.0.0.1", port, ws, rank == 0, timeout=datetime.timedelta(seconds=60))
    store = CountingStore(inner)
    dist.init_process_group("ringpg", store=store, rank=rank, world_size=ws)
    dist.barrier()
    calls = dict(store.calls)
    x = torch.ones(8)
    dist.all_reduce(x)
    calls["ok"] = bool((x == ws).all())
    dist.destroy_process_group()
    q.put((rank, calls))


@pytest.mark.multiprocess
@pytest.mark.skipif(backend_under_test() != "ringpg", reason="ringpg's group creation")
def test_group_creation_takes_the_same_store_round_trips_per_rank_at_any_size() -> None:
    """A rank other than 0 makes the same Store calls, each of the same few keys, at 3
    ranks as at 8 (csrc/transport/store_exchange.h): it publishes its own values, reads
    rank 0's decisions and the values of the few ranks it works with (its neighbours'
    addresses and regions, its host arena's name).  Rank 0 alone reads every rank's
    values, once a step (this Python Store has no multiGet: a get each).  Before, every
    rank read every rank's key in each step: 4 x N gets; then one value holding them
    all, O(N) bytes for every rank."""
    from harness import run_ranks

    per_size = {}
    for ws in (3, 8):
        got = dict(run_ranks(store_calls_rank, ws, (), 120, "forkserver"))
        assert all(c.pop("ok") for c in got.values()), got
        per_size[ws] = got
    others = {ws: {tuple(sorted(c.items())) for r, c in got.items() if r != 0} for ws, got in per_size.items()}
    assert len(others[3]) == 1 and others[8] == others[3], others
    # Rank 0's reads grow with the group: every rank's value in each decided step.
    gets0 = {ws: got[0].get("get", 0) for ws, got in per_size.items()}
    assert gets0[8] >= gets0[3] + 3 * (8 - 3), gets0


# ============================================= registration, versions and features


@pytest.mark.inprocess
def test_version_mismatch_raises_with_rebuild_command() -> None:
    with pytest.raises(_loader.RingpgBuildMismatch) as e:
        _loader.check_torch_version("2.14.0", "2.15.0+cu132")
    msg = str(e.value)
    assert "pip install --no-build-isolation" in msg
    assert "2.14.0" in msg and "2.15.0+cu132" in msg


@pytest.mark.inprocess
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


@pytest.mark.multiprocess
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


@pytest.mark.inprocess
def test_backend_name_registered() -> None:
    assert dist.Backend.RINGPG == "ringpg"
    assert dist.Backend("ringpg") == "ringpg"
    # cuda only where this process sees a GPU (ringpg._registration.served_devices): torch's
    # flight recorder asks every served device's stream on a barrier, which throws on a
    # host without one.
    want = ["cpu", "cuda"] if torch.cuda.device_count() > 0 else ["cpu"]
    assert list(dist.Backend.backend_capability["ringpg"]) == want


@pytest.mark.inprocess
def test_register_twice_is_harmless() -> None:
    ringpg.register()
    ringpg.register()
    from ringpg import _autoload

    _autoload.register()
    assert dist.Backend.backend_list.count("ringpg") == 1
    assert dist.Backend.RINGPG == "ringpg"


@pytest.mark.multiprocess
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


@pytest.mark.multiprocess
def test_get_backend_of_group() -> None:
    assert run_workers(get_backend_worker, 1) == [(backend_under_test(), backend_under_test())]


def backend_object_worker(rank: int, ws: int, groups: Groups, args: Any) -> dict:
    b = ringpg.backend(groups.test)
    return {
        "test": None if b is None else (type(b).__name__, b.transport, b.wait_spin_us, b.size(), b.rank()),
        "ref": ringpg.backend(groups.ref),
        # One RingBackend serves both devices, where the group serves cuda at all.
        "cuda": ringpg.backend(groups.test, "cuda") is (b if "cuda" in served_devices() else None),
    }


@pytest.mark.multiprocess
def test_backend_returns_the_groups_ringbackend_and_none_for_others() -> None:
    if backend_under_test() != "ringpg":
        pytest.skip("ringpg.backend() describes ringpg groups only")
    for rank, v in enumerate(run_workers(backend_object_worker, 2)):
        name, transport, spin, size, grank = v["test"]
        assert (name, size, grank) == ("RingBackend", 2, rank), v
        assert transport in ("shm", "tcp") and spin >= 0, v
        assert v["ref"] is None, v  # the gloo reference group
        assert v["cuda"], v


@pytest.mark.inprocess
def test_features_follow_the_torch_release() -> None:
    """ringpg.features(), compiled from csrc/common/torch_compat.h, agrees with the
    releases that _features.FEATURES (docs/support.md's feature table) names."""
    running = _features.torch_release()
    assert ringpg.features() == {name: running >= f.since for name, f in _features.FEATURES.items()}


@pytest.mark.inprocess
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


@pytest.mark.multiprocess
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


@pytest.mark.multiprocess
def test_use_algorithm_picks_the_algorithm_of_groups_made_inside_it() -> None:
    """Groups of one job on different algorithms (the bench's ringpg/ring and ringpg/hier
    columns), on 2 emulated hosts x 2 ranks where RINGPG_ALGO=auto runs the hierarchical
    ones: each says what it runs and its all_reduce matches gloo's; their split children
    keep the algorithm; outside the blocks the process's setting rules again."""
    if backend_under_test() != "ringpg":
        pytest.skip("ringpg's algorithm choice")
    spec = InitSpec(env=TRANSPORT_ENVS["mixed"])
    assert_reports_ok(run_workers(use_algorithm_worker, 4, spec=spec))


# ============================================= settings the ranks must share

ringpg_settings = pytest.mark.skipif(harness.backend_under_test() != "ringpg", reason="ringpg's group settings")

# Rank 1's values of every shared setting, where ranks 0 and 2 keep the defaults.
# Each setting as the error names it: a variable, or a key of RINGPG_TUNING.
RANK1_TUNING = {"segment_bytes": "65536", "oneshot_bytes": "0", "hier_piece_bytes": "65536", "alltoall": "bruck"}
RANK1_ENV = {"RINGPG_ALGO": "ring", TUNING: ",".join(f"{k}={v}" for k, v in RANK1_TUNING.items())}
RANK1_VALUES = {"RINGPG_ALGO / ringpg.use_algorithm": "ring", **{f"{TUNING} {k}": v for k, v in RANK1_TUNING.items()}}


def _defaults() -> dict[str, str]:
    """What ranks 0 and 2 run each setting with (ringpg's parser, read when a test needs it)."""
    return {
        "RINGPG_ALGO / ringpg.use_algorithm": "auto",
        **{f"{TUNING} {k}": tuning_value(k, {}) for k in RANK1_TUNING},
    }


def _rank1_differs(rank: int, ws: int, port: int, args: Any) -> dict:
    (trace_dir,) = args
    if rank == 1:
        os.environ.update(RANK1_ENV)
        os.environ["RINGPG_TRACE"] = trace_dir
    kind, msg, took = harness.expect_error(lambda: harness.init_ringpg(rank, ws, port, timeout_s=30.0))
    return {"type": kind, "msg": msg, "took": took}


@pytest.mark.multiprocess
@ringpg_settings
def test_a_rank_that_differs_fails_every_rank_naming_each_setting(tmp_path: Any) -> None:
    res = harness.run_scenario(_rank1_differs, 3, (str(tmp_path),))
    for r, v in res.items():
        assert v["type"] == "ValueError", (r, v)
        assert v["msg"].count("ringpg: the ranks of a group disagree on") == 1, v["msg"]
        for name, value in RANK1_VALUES.items():
            dflt = _defaults()[name]
            assert f"{name} (rank 0: {dflt}, rank 1: {value}, rank 2: {dflt})" in v["msg"], (name, v["msg"])
        assert "RINGPG_TRACE (rank 0: off, rank 1: on, rank 2: off)" in v["msg"], v["msg"]
        assert "RINGPG_TRANSPORT" not in v["msg"], v["msg"]  # equal: not named
        assert v["took"] < harness.KILL_DETECT_S, v


def _local_settings_differ_then_algorithms(rank: int, ws: int, port: int, args: Any) -> dict:
    """Equal non-default shared settings and receive windows and RINGPG_CMA_BYTES that differ
    (local): the ring runs on each transport; then one rank picks another algorithm with
    use_algorithm."""
    import ringpg

    # segment_bytes equal on every rank, not the default; recv_window 16, 1 and (rank 2) the default
    mine = "segment_bytes=65536" + {0: ",recv_window=16", 1: ",recv_window=1"}.get(rank, "")
    os.environ.update(merged_env(os.environ, {TUNING: mine}))
    # Set on rank 1 alone, to its default: the group takes single copy as asked rather
    # than measuring it (a measurement needs every rank).
    os.environ["RINGPG_CMA_BYTES"] = "65536" if rank == 1 else ""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws, timeout=timedelta(seconds=30)
    )
    out: dict[str, Any] = {}
    n = 1 << 18  # 1 MiB of float32: past the one-shot limit, several segments per chunk
    x = torch.arange(n, dtype=torch.float32) % 1000 + rank
    want_sum = (torch.arange(n, dtype=torch.float32) % 1000) * ws + sum(range(ws))
    for transport in ("auto", "tcp", "gloo"):
        # The links' algorithms: a one-host group of three under auto would run every
        # collective in its arena and map no same-host links, whose copy this checks.
        with ringpg.use_transport(transport), ringpg.use_algorithm("ring"):
            g = dist.new_group(backend="ringpg")
        y = x.clone()
        dist.all_reduce(y, group=g)
        rs = torch.empty(n // ws)
        dist.reduce_scatter_tensor(rs, x[: n // ws * ws].clone(), group=g)
        ag = torch.empty(n * ws)
        dist.all_gather_into_tensor(ag, x, group=g)
        want_ag = torch.cat([torch.arange(n, dtype=torch.float32) % 1000 + q for q in range(ws)])
        b = ringpg.backend(g)
        out[transport] = {
            "transport": transport_of(g),
            "copy": (b.same_host_copy, b.same_host_copy_probe) if b is not None else None,
            "all_reduce": bool(torch.equal(y, want_sum)),
            "reduce_scatter": bool(torch.equal(rs, want_sum[rank * (n // ws) : (rank + 1) * (n // ws)])),
            "all_gather": bool(torch.equal(ag, want_ag)),
        }
    with ringpg.use_algorithm("ring" if rank == 1 else "auto"):
        out["algo_type"], out["algo_msg"], out["algo_took"] = harness.expect_error(
            lambda: dist.new_group(backend="ringpg")
        )
    return out


@pytest.mark.multiprocess
@ringpg_settings
def test_local_settings_may_differ_and_use_algorithm_is_agreed() -> None:
    res = harness.run_scenario(_local_settings_differ_then_algorithms, 3)
    for r, v in res.items():
        assert "crash" not in v, v
        for transport, want, copy in (("auto", "shm", "cma"), ("tcp", "tcp", ""), ("gloo", "gloo", "")):
            assert v[transport] == {
                "transport": want,
                "copy": (copy, None),
                "all_reduce": True,
                "reduce_scatter": True,
                "all_gather": True,
            }, (r, transport, v[transport])
        assert v["algo_type"] == "ValueError", v
        assert (
            "disagree on RINGPG_ALGO / ringpg.use_algorithm (rank 0: auto, rank 1: ring, rank 2: auto); "
            "it must be the same on every rank"
        ) in v["algo_msg"], v["algo_msg"]
        assert v["algo_took"] < harness.KILL_DETECT_S, v


# ============================================= end to end under torchrun

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "torchrun_script.py")
NPROC = 2
LAUNCH_TIMEOUT_S = 180


@pytest.mark.inprocess
def test_script_never_imports_ringpg() -> None:
    with open(SCRIPT) as f:
        code = f.read()
    assert "import ringpg" not in code and "from ringpg" not in code


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.skipif(
    backend_under_test() == "ringpg" and not entry_point_installed(),
    reason="ringpg is not pip-installed: no torch.backends entry point",
)
@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
def test_torchrun_without_import() -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(NPROC),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        SCRIPT,
    ]
    # Own session, so a hang kills torchrun *and* its workers.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish within {LAUNCH_TIMEOUT_S} s:\n{out}")
    assert proc.returncode == 0, f"torchrun exited with {proc.returncode}:\n{out}"
    for r in range(NPROC):
        assert f"OK rank={r} backend={backend_under_test()}" in out, out
