"""The engine's receive state machine (csrc/transport/receiver.h) on its own, in one
process and in milliseconds: a byte stream of frames, handed over in reads of every
size, each whole header routed as the engine would route it (into a posted receive,
read aside, dropped, or the end of the stream), through ``ringpg._C.run_frame_receiver``.

What must hold for any split of the stream into reads: the same frames come out with
the same payloads, a frame's payload never spills into the next, a header waits
(paused, the socket unread) until it is routed, a goodbye ends the stream, and where
the stream stops mid-frame the receiver says how much of that frame it holds (what the
engine reads on from to find why a connection was lost).
"""

from __future__ import annotations

import struct

import pytest

_C = pytest.importorskip("ringpg._C")

pytestmark = pytest.mark.inprocess

MAGIC = 0x31475052  # "RPG1" (transport/wire.h)
KINDS = {"collective": 1, "p2p": 2, "goodbye": 3, "abort": 4}
HEADER = 32


def frame(kind: str, key: int = 0, payload: bytes = b"", op_numel: int = 0) -> bytes:
    """A frame as the wire format spells it: the 32-byte header, then the payload."""
    return struct.pack("<IBBBBQQQ", MAGIC, KINDS[kind], 1, 6, 0, key, op_numel, len(payload)) + payload


STREAM = [
    (frame("collective", 1, bytes(range(200)) * 3, op_numel=150), "deliver"),
    (frame("p2p", 7), "deliver"),  # an empty payload
    (frame("p2p", 8, b"aside" * 40), "stash"),
    (frame("collective", 2, b"\xff" * 1000), "discard"),
    (frame("abort", 0, b"rank 3 timed out"), "stash"),
    (frame("collective", 3, b"after the discard"), "deliver"),
    (frame("goodbye"), "close"),
]


def expected_events() -> list[tuple[str, str, int, int, bytes]]:
    out = []
    for raw, route in STREAM:
        kind = next(k for k, v in KINDS.items() if v == raw[4])
        key, nbytes = struct.unpack_from("<Q", raw, 8)[0], struct.unpack_from("<Q", raw, 24)[0]
        payload = raw[HEADER:] if route in ("deliver", "stash") else b""
        out.append((route, kind, key, nbytes, payload))
    return out


@pytest.mark.parametrize("chunk", [1, 3, 31, 32, 33, 257, 1 << 20])
@pytest.mark.parametrize("budget", [1, 100, 1 << 20])
def test_any_split_of_the_stream_gives_the_same_frames(chunk: int, budget: int) -> None:
    stream = b"".join(raw for raw, _ in STREAM)
    tail = b"ignored: the peer said goodbye"
    out = _C.run_frame_receiver(stream + tail, chunk, [r for _, r in STREAM], budget)
    assert [tuple(e) for e in out["events"]] == expected_events()
    assert out["closed"]
    assert out["consumed"] == len(stream)  # nothing read past the goodbye


def test_a_header_waits_until_it_is_routed() -> None:
    first, second = frame("collective", 5, b"x" * 64), frame("collective", 6, b"y" * 8)
    out = _C.run_frame_receiver(first + second, 7, ["deliver"])
    # The first frame went through; the second's header is whole and waits, unrouted,
    # and not one byte of its payload was read.
    assert [e[0] for e in out["events"]] == ["deliver"]
    assert out["paused"] and out["header_got"] == HEADER
    assert out["consumed"] == len(first) + HEADER


@pytest.mark.parametrize("cut", [0, 1, 31])
def test_a_stream_cut_inside_a_header_says_how_much_of_it_came(cut: int) -> None:
    raw = frame("collective", 9, b"z" * 10)
    out = _C.run_frame_receiver(raw[:cut], 5, [])
    assert out["events"] == [] and not out["paused"]
    assert out["header_got"] == cut and out["payload_left"] == 0


@pytest.mark.parametrize("route", ["deliver", "stash", "discard"])
def test_a_stream_cut_inside_a_payload_says_how_much_is_left(route: str) -> None:
    raw = frame("p2p", 4, bytes(100))
    out = _C.run_frame_receiver(raw[: HEADER + 30], 16, [route])
    assert out["events"] == []
    assert out["payload_left"] == 70


def test_an_abort_cut_short_keeps_the_part_of_its_reason_that_came() -> None:
    # The engine reads on from here after a lost connection, to report the peer's reason.
    reason = b"rank 2 timed out waiting for rank 0"
    out = _C.run_frame_receiver(frame("abort", 0, reason)[: HEADER + 14], 4, ["stash"])
    assert out["abort_so_far"] == reason[:14]
    assert out["payload_left"] == len(reason) - 14


# ------------------------------------------------ why a connection was lost


def test_an_abort_in_flight_is_the_cause_of_a_lost_connection() -> None:
    # The peer's group failed first: it said why, then closed, while this rank was in
    # the middle of another frame's payload (delivered to a receive).
    first = frame("collective", 3, b"d" * 100)
    after = first[HEADER + 40 :] + frame("abort", 0, b"rank 1 timed out in all_reduce")
    reason, network, remote = _C.cause_of_loss(first[: HEADER + 40], ["deliver"], after)
    assert "rank 1 aborted the group: rank 1 timed out in all_reduce" in reason
    assert remote and network


@pytest.mark.parametrize("cut", [0, 5, HEADER, HEADER + 7])
def test_an_abort_cut_anywhere_by_the_loss_still_gives_its_reason(cut: int) -> None:
    raw = frame("abort", 0, b"the reason, whole")
    reason, _, remote = _C.cause_of_loss(raw[:cut], ["stash"], raw[cut:])
    assert reason.endswith("aborted the group: the reason, whole") and remote


def test_a_frame_of_the_running_op_that_disagrees_is_a_mismatch() -> None:
    # The ranks called different collectives: the peer's frame for this sequence number
    # has another op (a broadcast's opcode, 2 elements) than the one running here.
    running = frame("collective", 4, op_numel=1000)[:HEADER]
    theirs = bytearray(frame("collective", 4, b"x" * 8, op_numel=2))
    theirs[5] = 0  # opcode: broadcast
    reason, network, remote = _C.cause_of_loss(b"", [], bytes(theirs), running)
    assert "collective mismatch" in reason and "rank 1 sent" in reason and not network and not remote


def test_frames_that_say_nothing_leave_the_loss_unexplained() -> None:
    # Ordinary frames of the op running here, then the end: the caller reports the lost
    # connection itself.
    running = frame("collective", 4, op_numel=10)[:HEADER]
    after = frame("collective", 4, b"y" * 40, op_numel=10) + frame("p2p", 9, b"z" * 3)
    assert _C.cause_of_loss(b"", [], after, running) == ("", True, False)
    # So does garbage (a header with no magic), read no further.
    assert _C.cause_of_loss(b"", [], b"\x00" * 64 + frame("abort", 0, b"too late"))[0] == ""
