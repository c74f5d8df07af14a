"""Rendezvous, coexistence with gloo, and subgroups of the backend under test.

* init via env://, file://, explicit ``store=`` (TCPStore) and tcp:// (tcp:// is
  also what every other test uses; here with gloo as the default group and the
  backend under test as a ``new_group``);
* two full-world groups of the backend under test used interleaved (one op of
  each in flight), next to gloo;
* subgroups via ``dist.new_group(ranks=..., backend=...)`` at world size 4 with
  non-member ranks: two disjoint pairs working concurrently, a 3-rank group and a
  non-contiguous pair, each compared with the gloo subgroup of the same ranks;
* ranks that disagree on the transport (one sets RINGPG_TRANSPORT=tcp): the group
  agrees through the Store and uses TCP on every rank;
* ``ringpg.use_transport("gloo")``: a group made inside it runs on Gloo's pairs, one
  made after it on the process's setting, and an unknown name is refused;
* a rank whose /dev/shm is a tiny one of its own (a container's): no region fits and
  its neighbours' are invisible, so the group falls back to TCP without a crash and
  leaves no names behind;
* a RINGPG_TCP_CONGESTION the host cannot give fails the group's creation, saying why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Optional

import pytest
import torch
import torch.distributed as dist
from harness import (
    Checker,
    CheckReport,
    Groups,
    InitSpec,
    WorkerPool,
    assert_reports_ok,
    backend_under_test,
    can_make_mount_namespaces,
    make_data,
    ref_all_reduce,
    run_workers,
    smoke_checks,
    tiny_private_dev_shm,
    transport_of,
)


def smoke_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    chk = Checker(rank)
    smoke_checks(chk, "default groups", groups.test, groups.ref)
    return chk.report()


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


@pytest.mark.parametrize("world_size", [4], ids=lambda ws: f"ws{ws}", scope="module")
def test_two_groups_of_backend_coexist(pool: WorkerPool) -> None:
    assert_reports_ok(pool.run(two_groups_worker))


@pytest.mark.parametrize("world_size", [4], ids=lambda ws: f"ws{ws}", scope="module")
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


@pytest.mark.parametrize("world_size", [4], ids=lambda ws: f"ws{ws}", scope="module")
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


@pytest.mark.skipif(backend_under_test() != "ringpg", reason="ringpg's transport choice")
@pytest.mark.skipif(not can_make_mount_namespaces(), reason="needs root and mount namespaces")
def test_a_rank_with_a_tiny_private_dev_shm_keeps_the_group_on_tcp() -> None:
    spec = InitSpec(rank0_setup=tiny_private_dev_shm)
    assert_reports_ok(run_workers(small_shm_worker, 3, spec=spec))


def test_a_congestion_control_the_host_cannot_give_fails_group_creation(tmp_path: Any) -> None:
    """RINGPG_TCP_CONGESTION names an algorithm this host lacks: creating the group fails
    with the setting and what the host offers, instead of running on something else."""
    if backend_under_test() != "ringpg":
        pytest.skip("a ringpg setting")
    script = (
        "import torch.distributed as dist\n"
        f"dist.init_process_group('ringpg', init_method='file://{tmp_path}/store', rank=0, world_size=1)\n"
    )
    env = dict(os.environ, RINGPG_TCP_CONGESTION="no_such_cc")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "RINGPG_TCP_CONGESTION=no_such_cc cannot be set on this host" in out.stderr, out.stderr
    assert "available: " in out.stderr and "reno" in out.stderr, out.stderr


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


@pytest.mark.skipif(backend_under_test() != "ringpg", reason="ringpg's group creation")
def test_group_creation_takes_the_same_store_round_trips_per_rank_at_any_size() -> None:
    """Every set-up step that hears from every rank (addresses, settings, host
    identities, shared-memory regions and verdicts) reads one Store value holding all
    ranks' values: a rank's Store calls at creation do not grow with the group (the
    rank that gathers each step reads each key once more).  Before, every rank read
    every rank's key in each step: 4 x N gets."""
    from harness import run_ranks

    per_size = {}
    for ws in (2, 8):
        got = dict(run_ranks(store_calls_rank, ws, (), 120, "forkserver"))
        assert all(c.pop("ok") for c in got.values()), got
        per_size[ws] = got
    gets = {ws: sorted(c.get("get", 0) for c in got.values()) for ws, got in per_size.items()}
    # Which rank gathers a step is whichever arrives last, but at 8 ranks some rank
    # gathered none of the 5 steps: it reads no more than the least-reading rank at 2.
    assert gets[8][0] <= gets[2][0], gets
    # In all, the Store serves O(N) reads per step, not O(N^2).
    assert sum(gets[8]) <= 4 * sum(gets[2]) + 8 * 8, gets
