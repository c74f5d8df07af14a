"""The TCP ceiling: what raw sockets move over the path the backends use, beside the table.

:func:`tcp_probe` streams between ranks 0 and 1 (one direction, then both at once on
one socket); :func:`tcp_ring_probe` has every rank stream to the next at once, the
steady state of a ring, whose pace is its slowest link's.  :func:`format_probe` gives
the lines printed next to the table.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, Optional

import torch
import torch.distributed as dist

from devkit.groups import global_rank


def _stream(sock: socket.socket, seconds: float, chunk: memoryview) -> None:
    """Send ``chunk`` repeatedly for ``seconds``, then half-close."""
    deadline = time.perf_counter() + seconds
    try:
        while time.perf_counter() < deadline:
            sock.sendall(chunk)
    finally:
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _drain(sock: socket.socket, buf: bytearray) -> float:
    """Receive until EOF; return bytes/s from the first byte to EOF."""
    view = memoryview(buf)
    total = 0
    start: Optional[float] = None
    while True:
        n = sock.recv_into(view)
        if n == 0:
            break
        if start is None:
            start = time.perf_counter()
        total += n
    end = time.perf_counter()
    return total / (end - start) if start is not None and end > start else 0.0


def tcp_probe(
    rank: int, bind_addr: str, group: Any, seconds: float = 1.0, chunk_bytes: int = 1 << 20
) -> Optional[Dict[str, float]]:
    """Raw TCP throughput between ranks 0 and 1 over the path the backends use.

    Collective over ``group`` (gloo; every rank calls it; ranks >= 2 only wait).  Phase 1:
    rank 1 streams to rank 0 on one socket (one direction).  Phase 2: both stream at once
    on one socket (both directions), each side measuring what it receives.  Returns, on
    rank 0, ``{"one_direction_GBps", "both_directions_each_GBps", "both_directions_total_GBps"}``.
    """
    ws = dist.get_world_size(group)
    if ws < 2:
        return None
    srv: Optional[socket.socket] = None
    port = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((bind_addr, 0))
        srv.listen(2)
        srv.settimeout(60)
        port[0] = srv.getsockname()[1]
    dist.broadcast(port, src=global_rank(group, 0), group=group)
    results = torch.zeros(3, dtype=torch.float64)
    buf = bytearray(chunk_bytes)
    payload = memoryview(bytes(chunk_bytes))
    error = torch.zeros(1)
    try:
        for phase in (1, 2):
            dist.barrier(group=group)
            conn: Optional[socket.socket] = None
            try:
                if rank == 0:
                    assert srv is not None
                    conn, _ = srv.accept()
                elif rank == 1:
                    conn = socket.create_connection((bind_addr, int(port[0])), timeout=60)
                if conn is not None:
                    conn.settimeout(seconds + 60)
                    if phase == 1:
                        if rank == 1:
                            _stream(conn, seconds, payload)
                            conn.recv(1)  # wait for rank 0's close
                        else:
                            results[0] = _drain(conn, buf)
                    else:
                        sender = threading.Thread(target=_stream, args=(conn, seconds, payload), daemon=True)
                        sender.start()
                        results[1 + rank] = _drain(conn, buf)
                        sender.join(timeout=seconds + 60)
            except OSError as e:
                print(f"# tcp probe (rank {rank}, phase {phase}) failed: {e}", file=sys.stderr)
                error[0] = 1
            finally:
                if conn is not None:
                    conn.close()
    finally:
        if srv is not None:
            srv.close()
    dist.all_reduce(results, group=group)
    dist.all_reduce(error, op=dist.ReduceOp.MAX, group=group)
    if rank != 0 or error[0] > 0:
        return None
    one, a, b = (float(x) / 1e9 for x in results)
    return {
        "one_direction_GBps": one,
        "both_directions_each_GBps": (a + b) / 2,
        "both_directions_total_GBps": a + b,
        "seconds_per_phase": seconds,
    }


def _local_address_towards(addr: str) -> str:
    """This host's address on the route to ``addr`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        return str(s.getsockname()[0])


def tcp_ring_probe(
    rank: int, master_addr: str, group: Any, seconds: float = 1.0, chunk_bytes: int = 1 << 20
) -> Optional[Dict[str, float]]:
    """Raw TCP ring: every rank streams to rank + 1 and drains rank - 1, all at once.

    The ceiling of a ring collective on this path: all links busy in the same direction,
    as in a ring's steady state, and a ring moves at the pace of its slowest link.
    Collective over ``group``; returns, on rank 0, ``{"ring_slowest_GBps",
    "ring_mean_GBps"}`` (what each rank received per second).
    """
    ws = dist.get_world_size(group)
    if ws < 2:
        return None
    me = dist.get_rank(group)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    rate = torch.zeros(ws, dtype=torch.float64)
    error = torch.zeros(1)
    tx: Optional[socket.socket] = None
    rx: Optional[socket.socket] = None
    try:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((_local_address_towards(master_addr), 0))
        srv.listen(1)
        srv.settimeout(60)
        addrs: List[Any] = [None] * ws
        dist.all_gather_object(addrs, srv.getsockname(), group=group)
        try:
            # Connect first (the backlog holds it), then accept the left neighbour.
            tx = socket.create_connection(tuple(addrs[(me + 1) % ws]), timeout=60)
            rx, _ = srv.accept()
            for sock in (tx, rx):
                sock.settimeout(seconds + 60)
        except OSError as e:
            print(f"# tcp ring probe (rank {rank}) failed to connect: {e}", file=sys.stderr)
            error[0] = 1
        dist.all_reduce(error, op=dist.ReduceOp.MAX, group=group)
        if error[0] == 0 and tx is not None and rx is not None:
            dist.barrier(group=group)
            sender = threading.Thread(target=_stream, args=(tx, seconds, memoryview(bytes(chunk_bytes))), daemon=True)
            sender.start()
            rate[me] = _drain(rx, bytearray(chunk_bytes))
            sender.join(timeout=seconds + 60)
    finally:
        for sock in (tx, rx, srv):
            if sock is not None:
                sock.close()
    dist.all_reduce(rate, group=group)
    if rank != 0 or error[0] > 0:
        return None
    return {"ring_slowest_GBps": float(rate.min()) / 1e9, "ring_mean_GBps": float(rate.mean()) / 1e9}


def format_probe(probe: Optional[Mapping[str, float]], path: str, link_GBps: Optional[float] = None) -> str:
    """The ceiling lines printed next to the table."""
    if not probe:
        return "# TCP ceiling probe: not run"
    s = (
        f"# TCP ceiling ({path}, raw sockets, rank 0 <-> rank 1): "
        f"one direction {probe['one_direction_GBps']:.3f} GB/s; "
        f"both directions on one socket {probe['both_directions_each_GBps']:.3f} GB/s each way "
        f"({probe['both_directions_total_GBps']:.3f} GB/s total)"
    )
    if "ring_slowest_GBps" in probe:
        s += (
            f"\n# TCP ring ceiling (every rank streams to the next at once): slowest link "
            f"{probe['ring_slowest_GBps']:.3f} GB/s, mean {probe['ring_mean_GBps']:.3f} GB/s"
        )
    if link_GBps:
        s += (
            f"\n# emulated link rate {link_GBps:.4f} GB/s per direction; probe reaches "
            f"{probe['one_direction_GBps'] / link_GBps:.0%} one way, "
            f"{probe['both_directions_each_GBps'] / link_GBps:.0%} each way both ways"
        )
        if "ring_slowest_GBps" in probe:
            s += f", {probe['ring_slowest_GBps'] / link_GBps:.1%} on the slowest link of a ring"
    return s
