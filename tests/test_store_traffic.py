"""What a group's creation asks of the Store (issue 58; csrc/transport/store_exchange.h).

A rank other than 0 writes and reads the same from the Store whatever the group's size:
its own values, rank 0's decisions (the settings' agreement, the hosts in their compact
form, the shared-memory verdicts) and the addresses of the few peers it dials.  Only rank
0 reads every rank's values, once.  So the Store's host serves O(N) bytes to a group of
N, not the O(N^2) of every rank reading every rank's address.

Ranks as threads of this process, each creating its own group (``RingBackend`` over the
tcp transport, real loopback sockets) on one ``HashStore``, at 4 and at 32 ranks; then an
allreduce on each, whose partners past 8 ranks (recursive doubling) are dialled on first
use, their addresses read then.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, Callable, List

import pytest
import torch
import torch.distributed as dist

_C = pytest.importorskip("ringpg._C")

pytestmark = pytest.mark.inprocess


def _on_threads(ws: int, fn: Callable[[int], Any]) -> List[Any]:
    """fn(rank) on one thread per rank, all at once; the results in rank order."""
    out: List[Any] = [None] * ws
    errors: List[BaseException] = []

    def run(r: int) -> None:
        try:
            out[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(ws)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a rank's thread did not finish in 120 s"
    if errors:
        raise errors[0]
    return out


def _groups(ws: int, per_host: int = 0) -> List[Any]:
    """ws ranks' groups; with `per_host`, rank r's group claims emulated host r // per_host."""
    store = dist.HashStore()

    def make(r: int) -> Any:
        host = f"emulated-{r // per_host}" if per_host else ""
        return _C.RingBackend(store, r, ws, timedelta(seconds=60), f"traffic{ws}", "tcp", host_id=host)

    return _on_threads(ws, make)


def _allreduce(groups: List[Any], numel: int = 8) -> None:
    ws = len(groups)

    def one(r: int) -> None:
        t = torch.full((numel,), float(r + 1))
        groups[r].allreduce([t]).wait()
        assert torch.equal(t, torch.full((numel,), float(ws * (ws + 1) // 2))), (r, t)

    _on_threads(ws, one)


def test_a_rank_other_than_0_reads_as_much_from_the_store_at_4_ranks_as_at_32() -> None:
    small, large = _groups(4), _groups(32)
    s = [g.store_traffic for g in small]
    big = [g.store_traffic for g in large]
    # Ranks 1.. make the same calls at both sizes ...
    assert {t["requests"] for t in s[1:]} | {t["requests"] for t in big[1:]} == {s[1]["requests"]}, (s, big)
    # ... and read as many bytes, to the digits of a port and a nonce (random, so of any
    # length up to 20) in each of the two neighbours' addresses.  Every rank reading every
    # address would read about 40 bytes more per rank of the group.
    most_small = max(t["bytes_read"] for t in s[1:])
    most_large = max(t["bytes_read"] for t in big[1:])
    assert most_large <= most_small + 2 * 25, (most_small, most_large)
    # Rank 0 reads every rank's values, once: O(N).
    assert big[0]["bytes_read"] > s[0]["bytes_read"] + 28 * 30, (s[0], big[0])
    # The groups work: past 8 ranks the allreduce doubles recursively, dialling partners
    # whose addresses are read now, one Store read each at most.
    _allreduce(small)
    _allreduce(large)
    after = [g.store_traffic for g in large]
    for r in range(1, 32):
        extra = after[r]["requests"] - big[r]["requests"]
        assert 0 < extra <= 5, (r, big[r], after[r])  # log2(32) partners, less the neighbours known


def test_ranks_as_threads_given_host_ids_run_as_those_hosts() -> None:
    """RingBackend's host_id (RINGPG_HOSTID for one group) emulates hosts among ranks that
    share a process: rank 0 decides the hosts from them, the hierarchical algorithms run
    (host rings, then rings across hosts) and give the right sum; hosts of two ranks in
    blocks travel in the compact form, so a rank other than 0 still reads as much at 16
    ranks as at 4."""
    plain = _groups(4)
    assert plain[1].hosts == 1 and plain[1].algorithm_for("allreduce", 1 << 20) == "ring"
    small, large = _groups(4, per_host=2), _groups(16, per_host=2)
    for groups in (small, large):
        ws = len(groups)
        assert [g.hosts for g in groups] == [ws // 2] * ws
        assert [g.host_of for g in groups] == [[r // 2 for r in range(ws)]] * ws
        assert {g.algorithm_for("allreduce", 1 << 20) for g in groups} == {"hier"}
    most_small = max(g.store_traffic["bytes_read"] for g in small[1:])
    most_large = max(g.store_traffic["bytes_read"] for g in large[1:])
    assert most_large <= most_small + 2 * 25, (most_small, most_large)
    _allreduce(large, numel=1 << 16)  # 256 KiB: the hierarchical allreduce, not recursive doubling


def test_groups_of_one_process_with_the_same_hosts_share_one_topology() -> None:
    """A topology is tens of bytes a rank of the group (each rank's host, the ring order);
    ranks as threads of one process (torchft's tests, benchmarks/scale_threads.py at
    10,000 ranks) hold one copy of it between them, not one a rank."""
    ws = 16
    groups = _groups(ws, per_host=2)
    # Each group holds the arrays at least once (its topology), and every group's copy
    # is the same one: no fewer holders than groups.
    assert min(g.topology_holders for g in groups) >= ws, [g.topology_holders for g in groups]
    assert [g.host_of for g in groups] == [[r // 2 for r in range(ws)]] * ws
    _allreduce(groups, numel=1 << 16)
    held = [g.topology_holders for g in groups]
    # Another layout is another topology (16 ranks on one host), shared by its groups
    # and not by the first layout's.
    others = _groups(ws)
    assert others[0].hosts == 1 and min(g.topology_holders for g in others) >= ws
    assert [g.topology_holders for g in groups] == held
