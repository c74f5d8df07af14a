"""Faults: dead, frozen and hostile peers, bad input, mismatched ranks, load.

Each scenario spawns its own ranks (some of them die on purpose, so the shared
WorkerPool does not fit): every rank runs a module-level scenario function and puts
a result dict on a queue; the parent collects the survivors' results with a
deadline and kills whatever is left.  Assertions are on what users see: a typed
torch.distributed error, naming op, rank and cause, raised within a bound time.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from datetime import timedelta
from typing import Any, Callable

import harness
import pytest
import torch
import torch.distributed as dist
from harness import free_port, transport_of

pytestmark = pytest.mark.skipif(harness.backend_under_test() != "ringpg", reason="ringpg-specific fault handling")

KILL_DETECT_S = harness.KILL_DETECT_S  # "within a few seconds" of a peer's death

# A scenario rank's ringpg world group (the harness's, shared with test_hierarchical.py).
_init = harness.init_ringpg


# The ring's transports, as environments: shared memory (the default here), ringpg's
# own TCP and Gloo's pairs.
TRANSPORTS = {name: dict(env) for name, env in harness.TRANSPORT_ENVS.items()}


# The scenario runner and error timer are the harness's (shared with test_blind_spots_2.py).
run_scenario = harness.run_scenario
_expect_error = harness.expect_error


# ------------------------------------------------------------------ dead peers


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
@pytest.mark.parametrize("victim,how", [(1, "exit"), (2, "sigkill")])
def test_killed_rank_every_survivor_raises_fast(tmp_path: Any, victim: int, how: str, transport: str) -> None:
    ws = 4  # with victim 2, rank 0 is not a ring neighbour of the dead rank
    stamp = str(tmp_path / "died")
    res = run_scenario(
        harness.die_mid_collective,
        ws,
        (victim, how, stamp, "all_reduce"),
        expect={r for r in range(ws) if r != victim},
        env=TRANSPORTS[transport],
    )
    # Typed, naming op and rank, in gloo's words (issue 19 item 5), within seconds; later
    # ops fail at once, with the original cause.
    harness.assert_survivors_raised_fast(res, stamp, "all_reduce", harness.transport_expected(transport, ws))


def _freeze_mid_collective(rank: int, ws: int, port: int, args: Any) -> dict:
    (victim,) = args
    _init(rank, ws, port, timeout_s=3.0)
    x = torch.ones(1 << 16)
    dist.all_reduce(x)
    if rank == victim:
        os.kill(os.getpid(), signal.SIGSTOP)
    kind, msg, took = _expect_error(lambda: dist.all_reduce(x))
    return {"type": kind, "msg": msg, "took": took, "transport": transport_of(dist.group.WORLD)}


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_frozen_rank_gives_timeout_at_the_deadline(transport: str) -> None:
    ws = 3
    res = run_scenario(_freeze_mid_collective, ws, (2,), expect={0, 1}, env=TRANSPORTS[transport])
    for v in res.values():
        assert v["transport"] == harness.transport_expected(transport, ws), v
        assert v["type"] in ("DistBackendError", "DistNetworkError"), v
        assert "ringpg::all_reduce" in v["msg"], v["msg"]
        # The rank waiting on the frozen one times out; the other may learn it from its abort.
        # gloo's phrase with the timeout in ms, which torch's own tests match as
        # " (Timed out|closed|timeout) " and torchft as "Timed out waiting".
        assert re.search(r"Timed out waiting for rank \d+ after 3000 ms ", v["msg"]) or "aborted" in v["msg"], v["msg"]
        assert 2.0 < v["took"] < 3.0 + KILL_DETECT_S, v


def _set_timeout_then_freeze(rank: int, ws: int, port: int, args: Any) -> dict:
    _init(rank, ws, port, timeout_s=60.0)
    x = torch.ones(1 << 16)
    dist.all_reduce(x)
    if hasattr(dist, "set_timeout"):  # the public API (torch 2.15 has it; 2.12 not)
        dist.set_timeout(timedelta(seconds=1))
    else:  # the Backend binding's set_timeout (torch >= 2.9) is the way there
        import ringpg

        ringpg.backend().set_timeout(timedelta(seconds=1))
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    kind, msg, took = _expect_error(lambda: dist.all_reduce(x))
    return {"type": kind, "msg": msg, "took": took, "transport": transport_of(dist.group.WORLD)}


def _has_set_timeout() -> bool:
    import ringpg

    return ringpg.features().get("set_timeout", False)


@pytest.mark.skipif(not _has_set_timeout(), reason="Backend.set_timeout is in torch from 2.9 on")
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_set_timeout_applies_to_later_ops(transport: str) -> None:
    """A group created with 60 s, then set_timeout(1 s): the next op against a frozen
    peer fails after 1 s, in gloo's words, not after 60 s (issue 19 item 1)."""
    res = run_scenario(_set_timeout_then_freeze, 2, expect={0}, env=TRANSPORTS[transport])
    v = res[0]
    assert v["transport"] == harness.transport_expected(transport, 2), v
    assert v["type"] == "DistBackendError", v
    assert "Timed out waiting for rank 1 after 1000 ms" in v["msg"], v["msg"]
    assert 0.9 < v["took"] < 1.0 + KILL_DETECT_S, v


# ------------------------------------------------------------------ bad input


def _bad_inputs(rank: int, ws: int, port: int, args: Any) -> dict:
    _init(rank, ws, port)
    gloo = dist.new_group(backend="gloo")
    backend = harness.cpu_backend(dist.group.WORLD)
    t = torch.arange(6, dtype=torch.float32) + rank
    errors: dict[str, str] = {}

    def attempt(name: str, fn: Callable[[], Any]) -> None:
        kind, msg, _ = _expect_error(fn)
        errors[name] = f"{kind}: {msg}"
        # The refused call took no sequence number: a real collective still agrees with gloo.
        a, b = t.clone(), t.clone()
        dist.all_reduce(a)
        dist.all_reduce(b, group=gloo)
        assert torch.equal(a, b), (name, a, b)

    opts = dist.BroadcastOptions()
    opts.rootRank = 7
    attempt("invalid root", lambda: backend.broadcast([t], opts).wait())
    attempt("output list length", lambda: dist.all_gather([torch.empty(6) for _ in range(ws + 1)], t))
    attempt("mismatched sizes", lambda: dist.all_gather_into_tensor(torch.empty(5), t))
    attempt("sparse", lambda: dist.all_reduce(t.to_sparse()))
    # torch answers meta tensors itself, so this one goes to the backend directly.
    attempt("meta device", lambda: backend.allreduce([torch.empty(6, device="meta")], dist.AllreduceOptions()))
    attempt("negative tag", lambda: dist.send(t, (rank + 1) % ws, tag=-1))
    attempt("unsupported op/dtype", lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND))
    return {"errors": errors, "seq": backend._get_sequence_number_for_group()}


def test_bad_input_is_refused_before_taking_a_sequence_number() -> None:
    res = run_scenario(_bad_inputs, 2)
    for v in res.values():
        for name, err in v["errors"].items():
            assert err and not err.startswith(": "), (name, "no error raised")
            if name not in ("sparse", "output list length"):  # torch's own layer may answer first
                assert "ringpg::" in err, (name, err)
    assert res[0]["seq"] == res[1]["seq"]


def _mismatch(rank: int, ws: int, port: int, args: Any) -> dict:
    (what,) = args
    _init(rank, ws, port, timeout_s=20.0)
    if what == "numel":  # small: the one-shot exchange
        x = torch.ones(1000 if rank == 0 else 3000)
    elif what == "numel-ring":  # large: the pipelined ring
        x = torch.ones((1 << 20) if rank == 0 else (3 << 20))
    else:
        x = torch.ones(1000, dtype=torch.float32 if rank == 0 else torch.float64)
    kind, msg, took = _expect_error(lambda: dist.all_reduce(x))
    return {"type": kind, "msg": msg, "took": took, "transport": transport_of(dist.group.WORLD)}


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
@pytest.mark.parametrize("what", ["numel", "numel-ring", "dtype"])
def test_ranks_calling_different_sizes_raise_instead_of_overrunning(what: str, transport: str) -> None:
    res = run_scenario(_mismatch, 2, (what,), env=TRANSPORTS[transport])
    for v in res.values():
        assert v["transport"] == harness.transport_expected(transport, 2), v
        assert v["type"] in ("DistBackendError", "DistNetworkError"), v
        assert "mismatch" in v["msg"] or "aborted" in v["msg"], v["msg"]
        assert v["took"] < KILL_DETECT_S, v


def _one_rank_on(rank: int, ws: int, port: int, args: Any) -> dict:
    (transport,) = args
    if rank == 0:
        os.environ["RINGPG_TRANSPORT"] = transport  # read when the first group is made
    kind, msg, took = _expect_error(lambda: _init(rank, ws, port, timeout_s=20.0))
    return {"type": kind, "msg": msg, "took": took}


@pytest.mark.parametrize("transport", ["gloo", "shm"])
def test_a_rank_alone_on_its_transport_fails_every_rank_clearly(transport: str) -> None:
    """Gloo's pairs need a Gloo group on every rank: one rank alone would wait for the
    others until the timeout; shm refuses a group without shared memory, which must
    reach every rank alike.  The ranks compare choices through the store first."""
    res = run_scenario(_one_rank_on, 3, (transport,))
    for v in res.values():
        assert v["type"] == "ValueError", v
        assert f"disagree on RINGPG_TRANSPORT (rank 0: {transport}, rank 1: auto, rank 2: auto)" in v["msg"], v
        assert v["took"] < KILL_DETECT_S, v


def _shm_on_separate_hosts(rank: int, ws: int, port: int, args: Any) -> dict:
    """RINGPG_TRANSPORT=shm on emulated hosts: ranks 0 and 2 share one, rank 1 is alone
    on the other (no same-host neighbour: nothing to set up, TCP both ways)."""
    os.environ["RINGPG_TRANSPORT"] = "shm"
    os.environ["RINGPG_HOSTID"] = f"host-{rank % 2}"
    _init(rank, ws, port, timeout_s=20.0)
    out = {"transport": transport_of(dist.group.WORLD)}
    x = torch.arange(10.0) + rank
    dist.all_reduce(x)
    out["sum_ok"] = bool(torch.equal(x, torch.arange(10.0) * ws + sum(range(ws))))
    return out


def test_shm_transport_runs_shared_memory_where_ranks_share_a_host() -> None:
    """RINGPG_TRANSPORT=shm on three ranks of two emulated hosts: shared memory within the
    host of ranks 0 and 2, TCP to rank 1; a correct sum."""
    res = run_scenario(_shm_on_separate_hosts, 3)
    for r, v in res.items():
        assert v == {"transport": "shm+tcp", "sum_ok": True}, (r, v)


def _shm_without_dev_shm(rank: int, ws: int, port: int, args: Any) -> dict:
    os.environ["RINGPG_TRANSPORT"] = "shm"
    if rank == 0:
        harness.tiny_private_dev_shm()
    kind, msg, took = _expect_error(lambda: _init(rank, ws, port, timeout_s=20.0))
    return {"type": kind, "msg": msg, "took": took}


@pytest.mark.skipif(not harness.can_make_mount_namespaces(), reason="needs root and mount namespaces")
def test_shm_transport_without_shared_memory_fails_every_rank_clearly() -> None:
    """Where one rank cannot create its region, RINGPG_TRANSPORT=shm fails the group's
    creation on every rank (auto would fall back to TCP), naming the cause."""
    res = run_scenario(_shm_without_dev_shm, 2)
    for v in res.values():
        assert v["type"] == "RuntimeError", v
        assert "RINGPG_TRANSPORT=shm" in v["msg"] and "cannot use shared memory" in v["msg"], v
        assert v["took"] < KILL_DETECT_S, v


def _different_calls(rank: int, ws: int, port: int, args: Any) -> dict:
    """Rank 0 and the others call different collectives (or ReduceOps) on buffers of one
    size, with no TORCH_DISTRIBUTED_DEBUG wrapper: ringpg's own frame check must name both."""
    (what, numel) = args
    _init(rank, ws, port, timeout_s=20.0)
    x = torch.ones(numel)
    if what == "collective":
        if rank == 0:
            call = lambda: dist.all_reduce(x)  # noqa: E731
        else:
            call = lambda: dist.all_gather_into_tensor(torch.empty(numel), x[: numel // ws])  # noqa: E731
    else:  # the same collective, another reduction
        call = lambda: dist.all_reduce(x, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)  # noqa: E731
    kind, msg, took = _expect_error(call)
    return {"type": kind, "msg": msg, "took": took, "transport": transport_of(dist.group.WORLD)}


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
@pytest.mark.parametrize(
    "what,numel,names",
    [
        ("collective", 1 << 20, ("op=allreduce", "op=_allgather_base")),  # the ring: c10d OpType names
        ("reduce-op", 1000, ("reduce_op=SUM", "reduce_op=MAX")),  # one-shot
        ("reduce-op", 1 << 20, ("reduce_op=SUM", "reduce_op=MAX")),  # the ring
    ],
)
def test_ranks_calling_different_collectives_get_one_clear_error(
    what: str, numel: int, names: tuple, transport: str
) -> None:
    res = run_scenario(_different_calls, 2, (what, numel), env=TRANSPORTS[transport])
    for r, v in res.items():
        assert v["transport"] == harness.transport_expected(transport, 2), v
        assert v["type"] in ("DistBackendError", "DistNetworkError"), (r, v)
        assert v["took"] < KILL_DETECT_S, v
    # The rank that saw it first names both calls.  The other hears it through that
    # rank's Abort frame ("aborted the group: <the same words>"), or, when the abort
    # could not follow a frame half written on that link, as a closed connection.
    naming = [
        v["msg"] for v in res.values() if "mismatch" in v["msg"] and all(n.lower() in v["msg"].lower() for n in names)
    ]
    assert naming, {r: v["msg"] for r, v in res.items()}


# ------------------------------------------------------------------ hostile peers


def _listening_ports() -> set[int]:
    """Ports this process listens on (from /proc/net/tcp*, matched by socket inode)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and parts[9] in inodes:  # 0A: LISTEN
                    ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def _hostile_during_rendezvous(rank: int, ws: int, port: int, args: Any) -> dict:
    import threading

    import ringpg  # noqa: F401

    torch.set_num_threads(1)
    store_ports = {port}
    attacks: list[str] = []

    def attacker() -> None:
        # Rank 0 attacks its own listener while rank 1 is held back (below).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            targets = _listening_ports() - store_ports
            if targets:
                break
            time.sleep(0.05)
        for p in targets:
            for payload in (b"", b"GARBAGE" * 1000, b"\x00" * 7, b"RPGH" + b"\xff" * 60, os.urandom(1 << 16)):
                try:
                    with socket.create_connection(("127.0.0.1", p), timeout=2) as s:
                        s.sendall(payload)
                        attacks.append(f"{p}:{len(payload)}")
                except OSError:
                    pass
            # And one that connects and says nothing at all.
            idle = socket.create_connection(("127.0.0.1", p), timeout=2)
            attacks.append(f"{p}:silent")
            time.sleep(0.5)
            idle.close()

    # A gloo default group first: its store-based init waits for every rank, which
    # would close the window.  Then rank 0 enters ringpg's rendezvous alone and waits
    # there for rank 1 (held back 3 s) while the attacker hits its listener.
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws, timeout=timedelta(seconds=60)
    )
    store_ports |= _listening_ports()  # the store's and gloo's own: not ours to attack
    if rank == 0:
        th = threading.Thread(target=attacker, daemon=True)
        th.start()
    else:
        time.sleep(3)
    group = dist.new_group(backend="ringpg")
    if rank == 0:
        th.join(timeout=30)
    x = torch.arange(1000, dtype=torch.float32) + rank
    dist.all_reduce(x, group=group)
    ok = torch.equal(x, 2 * torch.arange(1000, dtype=torch.float32) + 1)
    # After rendezvous ringpg listens on its own address only (peers connect on first
    # use), beside the store's and gloo's ports.
    leftover = _listening_ports() - store_ports
    backend = harness.cpu_backend(group)
    own = int(backend.local_address.rsplit(":", 1)[1])
    if rank == 0:
        # The listener stays open: hostile connections now, too, are dropped: garbage, a
        # hello in rank 1's name without its nonce, one that says nothing.
        forged = (0x48475052).to_bytes(4, "little") + (2).to_bytes(4, "little")
        forged += (1).to_bytes(4, "little") + (0).to_bytes(4, "little") + os.urandom(8)
        for payload in (b"GARBAGE" * 100, forged, b""):
            with socket.create_connection(("127.0.0.1", own), timeout=2) as s:
                s.sendall(payload)
                attacks.append(f"after:{len(payload)}")
                time.sleep(0.2)
    dist.barrier(group=dist.group.WORLD)  # gloo: the attacks are over on both ranks
    y = torch.arange(1000, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(y, group=group)
    ok = ok and torch.equal(y, 3 * torch.arange(1000, dtype=torch.float32))
    return {"ok": ok, "attacks": attacks, "leftover": sorted(leftover), "own": own}


def test_hostile_connections_during_rendezvous_are_dropped() -> None:
    res = run_scenario(_hostile_during_rendezvous, 2, timeout=120)
    assert res[0]["attacks"], "the attacker found no ringpg listener"
    assert any(a.startswith("after:") for a in res[0]["attacks"]), res[0]["attacks"]
    for r, v in res.items():
        assert v["ok"], v
        assert v["leftover"] == [v["own"]], f"rank {r} listens on {v['leftover']}, not only its own {v['own']}"


def _frame(key: int, op_numel: int, nbytes: int) -> bytes:
    """A collective all_reduce/float32 frame header as the wire format spells it."""
    return (
        (0x31475052).to_bytes(4, "little")
        + bytes([1, 1, 6, 0])
        + key.to_bytes(8, "little")
        + op_numel.to_bytes(8, "little")
        + nbytes.to_bytes(8, "little")
    )


def _healthy_start(rank: int, ws: int, port: int) -> tuple[Any, torch.Tensor]:
    """Init (20 s timeout), one healthy all_reduce (seq 1) finished on both ranks; then
    returns the backend (for its raw-send test hook) and the op's 4096 floats."""
    _init(rank, ws, port, timeout_s=20.0)
    backend = harness.cpu_backend(dist.group.WORLD)
    side = dist.new_group(backend="gloo")
    x = torch.ones(4096)
    dist.all_reduce(x)
    dist.barrier(group=side)
    return backend, x


def _hostile_frames(rank: int, ws: int, port: int, args: Any) -> dict:
    (payload,) = args
    backend, x = _healthy_start(rank, ws, port)
    if rank == 1:
        backend._debug_send_raw(0, payload)  # rank 1 turns hostile towards rank 0
        if len(payload) < 32:
            time.sleep(0.5)
            os._exit(0)  # a truncated frame, then the connection closes
    kind, msg, took = _expect_error(lambda: dist.all_reduce(x))
    res = {"type": kind, "msg": msg, "took": took, "x0": float(x[0]), "transport": transport_of(dist.group.WORLD)}
    if rank == 0 and not kind:
        # The op's data took the shared-memory ring, untouched by the garbage on the
        # socket; the group must still break on it, so the next op raises.
        res["next_type"], res["next_msg"], res["next_took"] = _expect_error(lambda: dist.all_reduce(x))
    return res


@pytest.mark.parametrize(
    "name,payload",
    [
        ("bad magic", b"\xde\xad\xbe\xef" * 8),
        # A valid-looking collective header for the next op announcing 1 TiB: never trusted.
        ("oversized", _frame(3, 4096, 1 << 40)),
        ("truncated", b"RPG1\x01"),
    ],
)
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_corrupt_frames_raise_instead_of_crashing(name: str, payload: bytes, transport: str) -> None:
    res = run_scenario(_hostile_frames, 2, (payload,), expect={0}, env=TRANSPORTS[transport])
    v = res[0]
    assert v["transport"] == harness.transport_expected(transport, 2), v
    if transport == "shm" and not v["type"]:
        # Over shared memory the op may finish before the socket is read: then its result
        # must be right (2 ranks x 1.0 x 2 ops) and the next op must raise.
        assert v["x0"] == 4.0, v
        assert v["next_type"] in ("DistNetworkError", "DistBackendError"), v
        assert "ringpg::all_reduce" in v["next_msg"] and v["next_took"] < KILL_DETECT_S, v
        return
    assert v["type"] in ("DistNetworkError", "DistBackendError"), v
    assert "ringpg::all_reduce" in v["msg"], v["msg"]
    assert v["took"] < KILL_DETECT_S, v


def _hostile_running_op(rank: int, ws: int, port: int, args: Any) -> dict:
    (payload,) = args
    backend, x = _healthy_start(rank, ws, port)
    if rank == 1:
        # Rank 0 is inside seq 2 by now; rank 1 never joins it, it only sends this header
        # (which rank 0's engine must judge while the op waits), then stays silent.
        time.sleep(0.5)
        backend._debug_send_raw(0, payload)
        time.sleep(6.0)
        os._exit(0)
    kind, msg, took = _expect_error(lambda: dist.all_reduce(x))
    return {"type": kind, "msg": msg, "took": took, "transport": transport_of(dist.group.WORLD)}


@pytest.mark.parametrize("name,payload", [("oversized", _frame(2, 4096, 1 << 40)), ("other numel", _frame(2, 999, 64))])
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_a_bad_header_for_the_running_op_fails_it_at_once(name: str, payload: bytes, transport: str) -> None:
    # Over shared memory the running op never posts a socket receive for this frame, so
    # the frame must be judged when it arrives, not when (never) a receive is posted.
    v = run_scenario(_hostile_running_op, 2, (payload,), expect={0}, env=TRANSPORTS[transport])[0]
    assert v["transport"] == harness.transport_expected(transport, 2), v
    assert v["type"] in ("DistNetworkError", "DistBackendError"), v
    assert "ringpg::all_reduce (seq 2" in v["msg"], v["msg"]
    assert "implausible" in v["msg"] or "mismatch" in v["msg"], v["msg"]
    assert v["took"] < 3.0, v  # before rank 1 exits: the header itself was the cause


# ------------------------------------------------------------------ load and lifecycle


def _thousand_async(rank: int, ws: int, port: int, args: Any) -> dict:
    _init(rank, ws, port)
    tensors = [torch.full((17,), float(i + rank)) for i in range(1000)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for w in works:
        w.wait()
    bad = [i for i, t in enumerate(tensors) if not torch.equal(t, torch.full((17,), float(2 * i + 1)))]
    return {"bad": bad[:5], "n": len(works)}


def test_thousand_async_ops_in_flight() -> None:
    res = run_scenario(_thousand_async, 2)
    for v in res.values():
        assert v["n"] == 1000 and v["bad"] == [], v


def _counts() -> tuple[int, int]:
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _lifecycle(rank: int, ws: int, port: int, args: Any) -> dict:
    _init(rank, ws, port)
    # Many groups alive at once.
    groups = [dist.new_group(backend="ringpg") for _ in range(12)]
    sums = []
    for i, g in enumerate(groups):
        t = torch.full((5,), float(i))
        dist.all_reduce(t, group=g)
        sums.append(float(t[0]))
    for g in groups:
        dist.destroy_process_group(g)

    def cycle() -> None:
        g = dist.new_group(backend="ringpg")
        t = torch.ones(1 << 16)
        dist.all_reduce(t, group=g)
        dist.destroy_process_group(g)

    cycle()  # warm-up: lazy allocations, thread pools
    before, rss0 = _counts(), _rss_mb()
    for _ in range(15):
        cycle()
    after, rss1 = _counts(), _rss_mb()
    dist.destroy_process_group()
    # A whole new default group in the same process, on a fresh store.
    _init(rank, ws, args)
    t = torch.ones(3)
    dist.all_reduce(t)
    return {"sums": sums, "before": before, "after": after, "rss": rss1 - rss0, "reinit": float(t[0])}


def test_many_groups_and_create_destroy_cycles_leak_nothing() -> None:
    res = run_scenario(_lifecycle, 2, free_port(), timeout=150)
    for v in res.values():
        assert v["sums"] == [2.0 * i for i in range(12)], v
        assert v["after"] == v["before"], f"threads/fds before {v['before']} after {v['after']}"
        assert v["rss"] < 64, f"RSS grew {v['rss']:.1f} MiB over 15 create/destroy cycles"
        assert v["reinit"] == 2.0


# ------------------------------------------------------------------ torch's checking wrapper


def _under_detail(rank: int, ws: int, port: int, args: Any) -> dict:
    (mismatch,) = args
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    _init(rank, ws, port, timeout_s=20.0)
    wrapped = type(harness.cpu_backend(dist.group.WORLD)).__name__
    import ringpg

    seen_through = type(ringpg.backend()).__name__  # ringpg.backend() unwraps the wrapper
    x = torch.arange(10, dtype=torch.float32) + rank
    dist.all_reduce(x)
    out = torch.empty(10 * ws)
    dist.all_gather_into_tensor(out, x)
    ok = torch.equal(x, sum(torch.arange(10, dtype=torch.float32) + r for r in range(ws)))
    ok = ok and torch.equal(out, x.repeat(ws))
    kind = msg = ""
    if mismatch:
        y = torch.ones(10)
        if rank == 0:
            kind, msg, _ = _expect_error(lambda: dist.all_reduce(y))
        else:
            kind, msg, _ = _expect_error(lambda: dist.broadcast(y, src=0))
    return {"ok": ok, "wrapped": wrapped, "seen_through": seen_through, "type": kind, "msg": msg}


def test_runs_inside_torchs_detail_wrapper() -> None:
    res = run_scenario(_under_detail, 2, (False,))
    for v in res.values():
        assert v["ok"], v
        assert v["seen_through"] == "RingBackend", v


def test_detail_wrapper_reports_mismatched_collectives() -> None:
    res = run_scenario(_under_detail, 2, (True,))
    for r, v in res.items():
        assert v["ok"], v
        assert v["type"], f"rank {r}: a mismatched collective raised nothing"
        assert "mismatch" in v["msg"].lower() or "detected" in v["msg"].lower(), v["msg"]


# ------------------------------------------------------------------ abort and shutdown


def _abort_while_peer_waits(rank: int, ws: int, port: int, args: Any) -> dict:
    _init(rank, ws, port, timeout_s=60.0)
    backend = harness.cpu_backend(dist.group.WORLD)
    side = dist.new_group(backend="gloo")
    x = torch.ones(1 << 18)
    dist.all_reduce(x)
    if rank == 0:
        dist.barrier(group=side)
        time.sleep(0.5)  # rank 1 is blocked in its all_reduce by now
        backend.abort()
        kind, msg, _ = _expect_error(lambda: dist.all_reduce(x))
        return {"type": kind, "msg": msg}
    work = dist.all_reduce(x, async_op=True)  # rank 0 never joins this one
    dist.barrier(group=side)
    kind, msg, took = _expect_error(work.wait)
    return {"type": kind, "msg": msg, "took": took}


def test_abort_fails_the_peers_pending_op_at_once() -> None:
    res = run_scenario(_abort_while_peer_waits, 2)
    assert res[0]["type"], "an op after abort() was accepted"
    assert "shut down" in res[0]["msg"], res[0]["msg"]
    v = res[1]
    assert v["type"] in ("DistNetworkError", "DistBackendError"), v
    # Usually the abort frame with its reason; the closing socket may be seen first.
    assert "ringpg::all_reduce" in v["msg"], v["msg"]
    assert "aborted" in v["msg"] or "lost its connection to rank 0" in v["msg"], v["msg"]
    assert v["took"] < KILL_DETECT_S, v


def _shutdown_then_use(rank: int, ws: int, port: int, args: Any) -> dict:
    _init(rank, ws, port)
    backend = harness.cpu_backend(dist.group.WORLD)
    x = torch.ones(10)
    dist.all_reduce(x)
    backend.shutdown()
    kind, msg, _ = _expect_error(lambda: dist.all_reduce(x))
    return {"sum": float(x[0]), "type": kind, "msg": msg}


def test_shutdown_is_orderly_and_later_ops_are_refused() -> None:
    res = run_scenario(_shutdown_then_use, 2)
    for v in res.values():
        assert v["sum"] == 2.0
        assert v["type"] and "shut down" in v["msg"], v


# ------------------------------------------------------------------ unmatched receive


def _recv_nobody_sends(rank: int, ws: int, port: int, args: Any) -> dict:
    _init(rank, ws, port, timeout_s=2.0)
    side = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))
    kind = msg = ""
    took = 0.0
    if rank == 0:
        kind, msg, took = _expect_error(lambda: dist.recv(torch.empty(4), src=1, tag=7))
    dist.barrier(group=side)
    # The group still works for what both ranks do call.
    x = torch.ones(3)
    dist.all_reduce(x)
    return {"type": kind, "msg": msg, "took": took, "sum": float(x[0])}


def test_a_receive_whose_sender_never_sends_times_out() -> None:
    res = run_scenario(_recv_nobody_sends, 2)
    v = res[0]
    assert v["type"] in ("DistBackendError", "DistNetworkError"), v
    assert "timed out" in v["msg"] and "rank 0" in v["msg"], v["msg"]
    assert 1.5 < v["took"] < 2.0 + KILL_DETECT_S, v
    assert res[1]["sum"] == 2.0 and v["sum"] == 2.0
