"""The TCP engine's connection set-up and matching (csrc/transport/engine*.cpp), in one
process and in milliseconds, through ``ringpg._C.EngineProbe``: a real Engine, rank 0
of a group of two, listening on 127.0.0.1, whose peer (rank 1) this test plays with raw
sockets, hostile or faithful.

What must hold:
  * the hello (engine_dial.cpp): a connection whose hello has the wrong magic, version,
    destination or nonce, names an impossible source, comes a second time, or stops
    short is closed without an answer, and the engine stays healthy; a silent one
    holds up nobody; a good one is welcomed and dialled back with a hello of the
    engine's own that quotes the peer's nonce;
  * dialling: a peer that answers the hello with an unknown byte, closes instead of
    answering, or listens nowhere breaks the engine, naming it; one that answers
    "leaving" is a peer that said goodbye, not a failure;
  * matching (engine_frames.cpp): point-to-point frames go to the receive posted for
    their tag, whatever the order, or wait aside until one is; an any-source receive
    takes any peer's; a size that differs fails that receive alone; collective frames
    go to the running op's receives in order, a later op's wait aside, and a frame of
    another op, an older op, an Abort or a corrupt header breaks the engine;
  * leaving (engine_failure.cpp, issue 60 item 5): a peer whose stream ends between
    frames while nothing of it is expected has left, which breaks nothing: what it sent
    first is still delivered (a running op's frame waiting in the socket, a later op's
    or a p2p frame waiting aside), and only a later receive from it or send to it
    fails, naming it in gloo's words; a stream that ends inside a frame, or while a
    receive from the peer is posted, is a lost connection and breaks the engine.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Iterator

import pytest

_C = pytest.importorskip("ringpg._C")

pytestmark = pytest.mark.inprocess

HELLO = struct.Struct("<IIiiQ")  # magic, version, src, dst, nonce (transport/rendezvous.h)
HELLO_MAGIC = 0x48475052
HELLO_VERSION = 2
WELCOME, LEAVING = b"\x01", b"\x02"
FRAME_MAGIC = 0x31475052
KINDS = {"collective": 1, "p2p": 2, "goodbye": 3, "abort": 4}
HEADER = struct.Struct("<IBBBBQQQ")  # wire.h's FrameHeader
ENGINE_NONCE = 0x1234_5678_9ABC_DEF0
PEER_NONCE = 0x0FED_CBA9_8765_4321
WAIT = 2.0  # seconds any socket step may take before the test fails


def header(
    kind: str, key: int = 0, nbytes: int = 0, dtype: int = 6, op_numel: int = 0, magic: int = FRAME_MAGIC
) -> bytes:
    """A frame header; collective fields: opcode 1, `dtype` (6: float), no ReduceOp."""
    return HEADER.pack(magic, KINDS[kind], 1, dtype, 9, key, op_numel, nbytes)


def frame(kind: str, key: int = 0, payload: bytes = b"", **kw: int) -> bytes:
    return header(kind, key, len(payload), **kw) + payload


def hello(
    src: int = 1, dst: int = 0, nonce: int = ENGINE_NONCE, magic: int = HELLO_MAGIC, version: int = HELLO_VERSION
) -> bytes:
    return HELLO.pack(magic, version, src, dst, nonce)


def recv_exactly(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = s.recv(n - len(out))
        if not got:
            break
        out += got
    return out


class Peer:
    """Rank 1, played here: a listener the engine dials, and the engine's own probe."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.listener.settimeout(WAIT)
        port = self.listener.getsockname()[1]
        self.engine = _C.EngineProbe(0, 2, ["", f"127.0.0.1:{port}"], [0, PEER_NONCE], ENGINE_NONCE)
        self.sockets: list[socket.socket] = [self.listener]

    def dial(self, hello_bytes: bytes) -> socket.socket:
        """Connects to the engine and says `hello_bytes`."""
        host, port = self.engine.address.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=WAIT)
        self.sockets.append(s)
        s.sendall(hello_bytes)
        return s

    def accept(self) -> tuple[socket.socket, tuple[int, ...]]:
        """Takes the engine's dial and reads its hello."""
        s, _ = self.listener.accept()
        s.settimeout(WAIT)
        self.sockets.append(s)
        return s, HELLO.unpack(recv_exactly(s, HELLO.size))

    def connect(self) -> tuple[socket.socket, socket.socket]:
        """A faithful pair: (socket the peer writes frames on, socket the engine writes on)."""
        inbound = self.dial(hello())
        assert inbound.recv(1) == WELCOME
        outbound, _ = self.accept()  # the engine dials back
        outbound.sendall(WELCOME)
        self.engine.connect_peers([1], 2000)
        return inbound, outbound

    def close(self) -> None:
        for s in self.sockets:
            s.close()


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


# ---- The hello, the engine listening ---------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        hello(magic=0xDEADBEEF),
        hello(version=HELLO_VERSION + 1),
        hello(dst=1),  # meant for another rank
        hello(nonce=ENGINE_NONCE + 1),  # never read the Store
        hello(src=2),  # no such rank
        hello(src=-1),
        hello(src=0),  # the engine's own rank
    ],
    ids=["magic", "version", "dst", "nonce", "src-out-of-range", "src-negative", "src-self"],
)
def test_a_wrong_hello_is_closed_without_an_answer(peer: Peer, bad: bytes) -> None:
    s = peer.dial(bad)
    assert s.recv(1) == b""  # closed, no acknowledgement byte
    assert peer.engine.broken_reason() == ""
    assert peer.engine.connected_peers() == []
    # A good hello afterwards is still welcome.
    assert peer.dial(hello()).recv(1) == WELCOME


def test_a_hello_cut_short_is_dropped_and_harms_nothing(peer: Peer) -> None:
    s = peer.dial(hello()[:10])
    s.shutdown(socket.SHUT_WR)
    assert s.recv(1) == b""
    assert peer.engine.broken_reason() == ""
    assert peer.dial(hello()).recv(1) == WELCOME


def test_a_silent_connection_holds_up_nobody(peer: Peer) -> None:
    silent = peer.dial(b"")
    start = time.monotonic()
    assert peer.dial(hello()).recv(1) == WELCOME
    assert time.monotonic() - start < 1.0
    silent.settimeout(0.2)
    with pytest.raises(socket.timeout):
        silent.recv(1)  # no answer for a hello never said


def test_a_second_hello_from_a_connected_rank_is_refused(peer: Peer) -> None:
    assert peer.dial(hello()).recv(1) == WELCOME
    assert peer.dial(hello()).recv(1) == b""
    assert peer.engine.broken_reason() == ""


def test_a_welcomed_peer_is_dialled_back_with_its_own_nonce(peer: Peer) -> None:
    assert peer.dial(hello()).recv(1) == WELCOME
    out, theirs = peer.accept()
    assert theirs == (HELLO_MAGIC, HELLO_VERSION, 0, 1, PEER_NONCE)
    out.sendall(WELCOME)
    peer.engine.connect_peers([1], 2000)
    assert peer.engine.connected_peers() == [1]


# ---- Dialling: the engine's first use of the peer --------------------------------


def test_an_unknown_answer_to_the_hello_breaks_the_engine(peer: Peer) -> None:
    send = peer.engine.post_send(1, header("p2p", key=1), b"x")
    s, theirs = peer.accept()
    assert theirs == (HELLO_MAGIC, HELLO_VERSION, 0, 1, PEER_NONCE)
    s.sendall(b"\x07")
    state, error, _, _ = peer.engine.wait(send, 2000)
    assert state == "failed"
    assert "could not connect to rank 1" in error and "unknown byte" in error
    assert "unknown byte" in peer.engine.broken_reason()


def test_a_peer_that_closes_instead_of_answering_breaks_the_engine(peer: Peer) -> None:
    send = peer.engine.post_send(1, header("p2p", key=1), b"x")
    s, _ = peer.accept()
    s.close()
    state, error, _, _ = peer.engine.wait(send, 2000)
    assert state == "failed"
    assert "closed the connection before welcoming" in error


def test_a_peer_listening_nowhere_breaks_the_engine(peer: Peer) -> None:
    peer.listener.close()  # its port now refuses connections
    with pytest.raises(Exception, match=r"could not connect to rank 1 at 127\.0\.0\.1:\d+ \(the first use"):
        peer.engine.connect_peers([1], 2000)
    assert "could not connect to rank 1" in peer.engine.broken_reason()


def test_a_peer_that_answers_leaving_has_said_goodbye(peer: Peer) -> None:
    send = peer.engine.post_send(1, header("p2p", key=1), b"x")
    s, _ = peer.accept()
    s.sendall(LEAVING)
    state, error, _, _ = peer.engine.wait(send, 2000)
    assert state == "failed"
    assert "has shut down this process group" in error
    assert peer.engine.broken_reason() == ""  # a peer leaving is no failure
    assert "rank 1" in peer.engine.gone_from(1)


# ---- Matching, over a faithful connection -----------------------------------------


def test_p2p_frames_match_by_tag_whatever_the_order(peer: Peer) -> None:
    inbound, _ = peer.connect()
    seven = peer.engine.post_recv(1, header("p2p", key=7), 5)
    inbound.sendall(frame("p2p", 5, b"five") + frame("p2p", 7, b"seven"))
    assert peer.engine.wait(seven, 2000) == ("done", "", b"seven", 1)
    # Tag 5 came first, with no receive for it: it waited aside.
    five = peer.engine.post_recv(1, header("p2p", key=5), 4)
    assert peer.engine.wait(five, 2000) == ("done", "", b"five", 1)


def test_an_any_source_receive_takes_the_peers_frame(peer: Peer) -> None:
    inbound, _ = peer.connect()
    anyone = peer.engine.post_recv(-1, header("p2p", key=9), 3)
    inbound.sendall(frame("p2p", 9, b"abc"))
    assert peer.engine.wait(anyone, 2000) == ("done", "", b"abc", 1)


def test_a_p2p_size_mismatch_fails_that_receive_alone(peer: Peer) -> None:
    inbound, _ = peer.connect()
    wrong = peer.engine.post_recv(1, header("p2p", key=3), 10)
    inbound.sendall(frame("p2p", 3, b"four") + frame("p2p", 4, b"next"))
    state, error, _, _ = peer.engine.wait(wrong, 2000)
    assert state == "failed" and "10" in error and "4" in error
    assert peer.engine.broken_reason() == ""
    # The odd payload was read and dropped: the stream is still in step.
    nxt = peer.engine.post_recv(1, header("p2p", key=4), 4)
    assert peer.engine.wait(nxt, 2000) == ("done", "", b"next", 1)


def test_collective_frames_go_to_the_running_op_and_a_later_ops_wait_aside(peer: Peer) -> None:
    inbound, _ = peer.connect()
    peer.engine.set_current_collective(header("collective", key=1, op_numel=2))
    inbound.sendall(
        frame("collective", 1, b"a" * 8, op_numel=2)
        + frame("collective", 1, b"b" * 4, op_numel=2)
        + frame("collective", 2, b"c" * 4, op_numel=1)
    )
    first = peer.engine.post_recv(1, header("collective", key=1, op_numel=2), 8)
    second = peer.engine.post_recv(1, header("collective", key=1, op_numel=2), 4)
    assert peer.engine.wait(first, 2000) == ("done", "", b"a" * 8, 1)
    assert peer.engine.wait(second, 2000) == ("done", "", b"b" * 4, 1)
    peer.engine.set_current_collective(header("collective", key=2, op_numel=1))
    later = peer.engine.post_recv(1, header("collective", key=2, op_numel=1), 4)
    assert peer.engine.wait(later, 2000) == ("done", "", b"c" * 4, 1)


def test_a_collective_of_another_dtype_breaks_the_engine(peer: Peer) -> None:
    inbound, _ = peer.connect()
    peer.engine.set_current_collective(header("collective", key=1, op_numel=4))
    recv = peer.engine.post_recv(1, header("collective", key=1, op_numel=4), 16)
    inbound.sendall(frame("collective", 1, b"\0" * 16, op_numel=4, dtype=7))
    state, error, _, _ = peer.engine.wait(recv, 2000)
    assert state == "failed" and "collective mismatch" in error
    assert "collective mismatch" in peer.engine.broken_reason()


@pytest.mark.parametrize(
    "sent, why",
    [
        (frame("collective", 3, b"\0" * 4, op_numel=1), "already finished here"),  # an older op
        (frame("collective", 5, b"\0" * 8, op_numel=2), "runs seq 5"),  # this op, as another size
    ],
    ids=["older-op", "running-op-differs"],
)
def test_a_frame_no_receive_was_posted_for_is_still_checked(peer: Peer, sent: bytes, why: str) -> None:
    # The running op (seq 5) has posted no receive yet: the engine judges the header alone.
    inbound, _ = peer.connect()
    peer.engine.set_current_collective(header("collective", key=5, op_numel=1))
    bystander = peer.engine.post_recv(1, header("p2p", key=99), 1)  # fails when the engine breaks
    inbound.sendall(sent)
    state, error, _, _ = peer.engine.wait(bystander, 2000)
    assert state == "failed" and why in error
    assert why in peer.engine.broken_reason()


def test_an_abort_frame_breaks_the_engine_with_the_peers_reason(peer: Peer) -> None:
    inbound, _ = peer.connect()
    recv = peer.engine.post_recv(1, header("p2p", key=1), 4)
    inbound.sendall(frame("abort", 0, b"rank 1 timed out"))
    state, error, _, _ = peer.engine.wait(recv, 2000)
    assert state == "failed"
    assert "rank 1 aborted the group: rank 1 timed out" in peer.engine.broken_reason()


def test_a_corrupt_header_breaks_the_engine(peer: Peer) -> None:
    inbound, _ = peer.connect()
    recv = peer.engine.post_recv(1, header("p2p", key=1), 4)
    inbound.sendall(frame("p2p", 1, b"oops", magic=0xBAD))
    state, error, _, _ = peer.engine.wait(recv, 2000)
    assert state == "failed" and "bad magic" in error


def test_the_engines_send_reaches_the_peer_as_one_frame(peer: Peer) -> None:
    _, outbound = peer.connect()
    send = peer.engine.post_send(1, header("p2p", key=11), b"hello")
    assert peer.engine.wait(send, 2000)[0] == "done"
    got = recv_exactly(outbound, HEADER.size + 5)
    assert HEADER.unpack(got[: HEADER.size]) == (FRAME_MAGIC, KINDS["p2p"], 1, 6, 9, 11, 0, 5)
    assert got[HEADER.size :] == b"hello"


def test_shutdown_says_goodbye_to_the_peer(peer: Peer) -> None:
    _, outbound = peer.connect()
    peer.engine.shutdown(2000)
    got = recv_exactly(outbound, HEADER.size)
    assert HEADER.unpack(got)[1] == KINDS["goodbye"]


def test_a_failure_recorded_outside_the_engine_stops_it_and_reaches_its_peer(peer: Peer) -> None:
    # As the shared-memory links, the arena or the op context record theirs (GroupFailure).
    _, outbound = peer.connect()
    recv = peer.engine.post_recv(1, header("p2p", key=5), 4)
    peer.engine.fail_group("rank 0 found a corrupt shared-memory fragment")
    state, error, _, _ = peer.engine.wait(recv, 2000)
    assert state == "failed" and "corrupt shared-memory fragment" in error
    got = recv_exactly(outbound, HEADER.size)
    h = HEADER.unpack(got)
    assert h[1] == KINDS["abort"]
    assert recv_exactly(outbound, h[-1]) == b"rank 0 found a corrupt shared-memory fragment"
    send = peer.engine.post_send(1, header("p2p", key=6), b"late")
    state, error, _, _ = peer.engine.wait(send, 2000)
    assert state == "failed" and "corrupt shared-memory fragment" in error  # later posts fail at once


# ---- Leaving: the peer's stream ends -------------------------------------------------


def wait_gone(peer: Peer) -> str:
    """Waits for the engine to see the peer's end of stream as a departure."""
    deadline = time.monotonic() + WAIT
    while not peer.engine.gone_from(1) and not peer.engine.broken_reason() and time.monotonic() < deadline:
        time.sleep(0.005)
    return peer.engine.gone_from(1)


def left_named(error: str) -> bool:
    return "needs rank 1, which left the group" in error and "Connection closed by peer" in error


def test_a_peer_that_closes_between_frames_with_nothing_expected_has_left(peer: Peer) -> None:
    inbound, outbound = peer.connect()
    inbound.close()
    outbound.close()  # the process exited: both directions end
    assert left_named(wait_gone(peer))
    assert peer.engine.broken_reason() == ""  # leaving is not failing
    # Whatever needs it now fails, naming it; the engine stays healthy for the rest.
    peer.engine.set_current_collective(header("collective", key=1, op_numel=1))
    recv = peer.engine.post_recv(1, header("collective", key=1, op_numel=1), 4)
    state, error, _, _ = peer.engine.wait(recv, 2000)
    assert state == "failed" and left_named(error)
    send = peer.engine.post_send(1, header("p2p", key=2), b"x")
    state, error, _, _ = peer.engine.wait(send, 2000)
    assert state == "failed" and left_named(error)
    p2p = peer.engine.post_recv(1, header("p2p", key=3), 1)
    assert peer.engine.wait(p2p, 2000)[0] == "failed"
    assert peer.engine.broken_reason() == ""


def test_what_a_peer_sent_before_it_left_is_still_delivered(peer: Peer) -> None:
    # The running op (seq 1) has not posted its receive: its frame waits in the socket,
    # and so does the end of stream behind it.  Once it is taken, a later op's frame and
    # a p2p frame are read aside before the end of stream, and delivered from there.
    inbound, _ = peer.connect()
    peer.engine.set_current_collective(header("collective", key=1, op_numel=2))
    inbound.sendall(
        frame("collective", 1, b"a" * 8, op_numel=2)
        + frame("collective", 2, b"b" * 4, op_numel=1)
        + frame("p2p", 7, b"seven")
    )
    inbound.close()
    time.sleep(0.05)
    assert peer.engine.gone_from(1) == ""  # not seen yet: behind the running op's frame
    first = peer.engine.post_recv(1, header("collective", key=1, op_numel=2), 8)
    assert peer.engine.wait(first, 2000) == ("done", "", b"a" * 8, 1)
    assert left_named(wait_gone(peer))
    peer.engine.set_current_collective(header("collective", key=2, op_numel=1))
    later = peer.engine.post_recv(1, header("collective", key=2, op_numel=1), 4)
    assert peer.engine.wait(later, 2000) == ("done", "", b"b" * 4, 1)
    seven = peer.engine.post_recv(1, header("p2p", key=7), 5)
    assert peer.engine.wait(seven, 2000) == ("done", "", b"seven", 1)
    # Nothing more comes from it.
    more = peer.engine.post_recv(1, header("collective", key=2, op_numel=1), 4)
    state, error, _, _ = peer.engine.wait(more, 2000)
    assert state == "failed" and left_named(error)
    assert peer.engine.broken_reason() == ""


@pytest.mark.parametrize(
    "sent",
    [header("p2p", key=1, nbytes=4)[:10], frame("p2p", 1, b"four")[:-2]],
    ids=["inside-a-header", "inside-a-payload"],
)
def test_a_stream_that_ends_inside_a_frame_is_a_lost_connection(peer: Peer, sent: bytes) -> None:
    inbound, _ = peer.connect()
    inbound.sendall(sent)
    inbound.close()
    deadline = time.monotonic() + WAIT
    while not peer.engine.broken_reason() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert "lost its connection to rank 1" in peer.engine.broken_reason()
    assert peer.engine.gone_from(1) == ""


def test_a_stream_that_ends_while_a_receive_waits_for_the_peer_is_a_lost_connection(peer: Peer) -> None:
    inbound, _ = peer.connect()
    peer.engine.set_current_collective(header("collective", key=1, op_numel=1))
    recv = peer.engine.post_recv(1, header("collective", key=1, op_numel=1), 4)
    inbound.close()
    state, error, _, _ = peer.engine.wait(recv, 2000)
    assert state == "failed" and "lost its connection to rank 1" in error
    assert "Connection closed by peer" in peer.engine.broken_reason()
