"""Hostile peers (ringpg's own sockets: skipped for other backends): garbage, forged
hellos and silent connections during and after the rendezvous are dropped; corrupt
frames, and a bad header for the running op, raise instead of crashing.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from typing import Any

import harness
import pytest
import torch
import torch.distributed as dist
from harness import (
    KILL_DETECT_S,
    expect_error,
    run_scenario,
    transport_of,
)
from harness import TRANSPORT_ENV_DICTS as TRANSPORTS
from harness import init_ringpg as _init

pytestmark = [pytest.mark.multiprocess, harness.ringpg_only("ringpg's own sockets")]


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
    kind, msg, took = expect_error(lambda: dist.all_reduce(x))
    res = {"type": kind, "msg": msg, "took": took, "x0": float(x[0]), "transport": transport_of(dist.group.WORLD)}
    if rank == 0 and not kind:
        # The op's data took the shared-memory ring, untouched by the garbage on the
        # socket; the group must still break on it, so the next op raises.
        res["next_type"], res["next_msg"], res["next_took"] = expect_error(lambda: dist.all_reduce(x))
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
    kind, msg, took = expect_error(lambda: dist.all_reduce(x))
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
