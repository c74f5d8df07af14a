"""The plan of an op (csrc/algorithms/choice.h, ``planOp``): one pure function that says,
for every collective, size and group shape, the algorithm, how device tensors reach the
host, whether same-host messages are lent and whether an all-gather's output is written
past the caches — asked here through ``ringpg._C.plan_op`` with no process started.

* Staging: host tensors are never staged; device tensors below ``staged_min_bytes()``, or
  not contiguous, or overlapping (but an all-gather's own chunk), are staged whole and
  run the host tensors' algorithm; from it, the staged ring or the arena.
* Lending follows the op's size class (``single_copy_for``) for every collective.
* Streaming: a plain all-gather only, on the ring, the pair or the arena, never one the
  caller reads back, never an allreduce or reduce-scatter, never the staged ring.
* The device reach of the arena is asked only where a plan could stage on the arena.

The algorithm part of the plan is tested shape by shape in test_arena.py.
"""

from __future__ import annotations

from typing import Any

import pytest

try:
    import ringpg._C as _C
except ModuleNotFoundError:
    _C = None

pytestmark = [pytest.mark.inprocess, pytest.mark.skipif(_C is None, reason="could not import 'ringpg._C'")]

STAGED = ("allreduce", "reduce_scatter", "all_gather")
OTHERS = ("broadcast", "reduce", "gather", "scatter")
# Two ranks with no arena, two with one, four with one: (size, arena).
SHAPES = ((2, False), (2, True), (4, True), (4, False))


def _plan(op: str, size: int, nbytes: int, **kw: Any) -> dict:
    kw.setdefault("ring_fused", size > 1)
    return _C.plan_op(op=op, size=size, nbytes=nbytes, **kw)


def test_the_binding_takes_keywords_only() -> None:
    with pytest.raises(TypeError):
        _C.plan_op("allreduce", 2, 4096)  # type: ignore[misc]


@pytest.mark.parametrize("size,arena", SHAPES)
def test_host_tensors_are_never_staged(size: int, arena: bool) -> None:
    for op in (*STAGED, *OTHERS):
        for nbytes in (0, 4, 4096, 1 << 20, 1 << 26):
            p = _plan(op, size, nbytes, arena=arena)
            assert p["staging"] == "host", (op, nbytes, p)
            assert p["algorithm"] != "staged_ring", (op, nbytes, p)
            assert not p["asks_device_reach"], (op, nbytes, p)


@pytest.mark.parametrize("size,arena", SHAPES)
def test_small_or_unstageable_device_ops_run_the_host_algorithm(size: int, arena: bool) -> None:
    floor = _C.staged_min_bytes()
    cases = [(4096, {}), (floor - 4, {}), (1 << 26, {"contiguous": False}), (1 << 26, {"apart": False})]
    for op in (*STAGED, *OTHERS):
        # Ops the staged paths do not serve: whole at any size.
        for nbytes, layout in cases + ([(1 << 26, {})] if op in OTHERS else []):
            host = _plan(op, size, nbytes, arena=arena)
            dev = _plan(op, size, nbytes, arena=arena, device=True, **layout)
            assert dev["staging"] == "whole", (op, nbytes, layout, dev)
            assert dev["algorithm"] == host["algorithm"], (op, nbytes, layout, dev, host)
            assert not dev["asks_device_reach"], (op, nbytes, layout, dev)


@pytest.mark.parametrize("size,arena", SHAPES)
@pytest.mark.parametrize("reaches", [False, True])
def test_large_device_ops_are_staged_in_pieces_where_they_run(size: int, arena: bool, reaches: bool) -> None:
    for op in STAGED:
        for nbytes in (_C.staged_min_bytes(), 1 << 26):
            p = _plan(op, size, nbytes, arena=arena, device=True, arena_reaches_device=reaches)
            # The arena runs it where the group has one: from three ranks always, at two
            # only where device copies reach its buffers; else the staged ring.
            on_arena = arena and (size >= 3 or reaches)
            want = ("on_arena", "arena") if on_arena else ("on_ring", "staged_ring")
            assert (p["staging"], p["algorithm"]) == want, (op, nbytes, p)
            assert p["asks_device_reach"] == arena, (op, nbytes, p)


def test_an_all_gather_into_its_own_chunk_stages_in_pieces() -> None:
    # The caller says apart (collectives.cpp: an input that is exactly its own chunk of the
    # output is apart); a reduce-scatter or all-gather that overlaps otherwise is whole.
    for op in ("reduce_scatter", "all_gather"):
        assert _plan(op, 2, 1 << 26, device=True)["staging"] == "on_ring"
        assert _plan(op, 2, 1 << 26, device=True, apart=False)["staging"] == "whole"


@pytest.mark.parametrize("size,arena", SHAPES)
@pytest.mark.parametrize("cached,streaming", [(False, False), (True, False), (False, True), (True, True)])
def test_every_op_lends_as_its_size_class_does(size: int, arena: bool, cached: bool, streaming: bool) -> None:
    copy = {"copy_cached": cached, "copy_streaming": streaming}
    for op in (*STAGED, *OTHERS, "barrier", "all_to_all"):
        for nbytes in (0, 4096, _C.streaming_op_bytes() - 1, _C.streaming_op_bytes(), 1 << 26):
            for device in (False, True):
                p = _plan(op, size, nbytes, arena=arena, device=device, **copy)
                lends = _C.single_copy_for(cached, streaming, nbytes)
                if p["algorithm"] == "pair":  # a pair's small message is copied whatever its class
                    lends = lends and nbytes > _C.pair_copied_most_bytes()
                assert p["lends"] == lends, (op, nbytes, device, p)


def test_only_a_plain_all_gather_streams() -> None:
    at = 1 << 20  # stream_bytes: outputs from 1 MiB are written past the caches
    for size, arena in SHAPES:
        for nbytes in (at // 2, at, 1 << 26):
            for lends in (False, True):
                kw = {"arena": arena, "stream_bytes": at, "copy_cached": lends, "copy_streaming": lends}
                p = _plan("all_gather", size, nbytes, **kw)
                assert p["algorithm"] in ("ring", "pair", "arena"), p
                assert p["streams"] == (nbytes >= at), (size, arena, nbytes, p)
                # Read back at once (a list of outputs): kept in the caches.
                assert not _plan("all_gather", size, nbytes, read_back=True, **kw)["streams"]
                # On a device: the arena's staged rounds stream as the host's do; the staged ring never.
                dev = _plan("all_gather", size, nbytes, device=True, **kw)
                assert dev["streams"] == (nbytes >= at and dev["staging"] != "on_ring"), dev
                for op in ("allreduce", "reduce_scatter", "broadcast", "gather"):
                    assert not _plan(op, size, nbytes, **kw)["streams"], (op, size, nbytes)
    # Never streamed: with streaming off (0), and across hosts, where the hierarchical
    # phases move pieces the caches hold.
    assert not _plan("all_gather", 2, 1 << 26, stream_bytes=0)["streams"]
    hier = {"hosts": 2, "most_per_host": 2, "hierarchical": True, "ring_fused": False}
    p = _plan("all_gather", 4, 1 << 26, stream_bytes=at, **hier)
    assert p["algorithm"] == "hier" and not p["streams"], p


@pytest.mark.parametrize("size", range(1, 13))
@pytest.mark.parametrize("tuning", ["", "alltoall=direct", "alltoall=bruck"])
@pytest.mark.parametrize("algo", ["auto", "arena", "ring"])
def test_a_group_maps_its_same_host_links_only_where_an_op_can_use_them(size: int, tuning: str, algo: str) -> None:
    # Where the links do not serve, the plan of every op (host and device tensors, every
    # size) runs in the arena or moves nothing; where the arena is missing, the links serve.
    serve = _C.same_host_links_serve(size=size, algo=algo, tuning=tuning)
    assert _C.same_host_links_serve(size=size, arena=False, algo=algo, tuning=tuning)
    assert _C.same_host_links_serve(size=size, hosts=2, algo=algo, tuning=tuning)
    assert serve == (size < 3 or algo == "ring" or tuning != ""), (size, algo, tuning, serve)
    if serve:
        return
    for op in (*STAGED, *OTHERS, "barrier", "all_to_all"):
        for nbytes in (0, 4, 4096, 1 << 16, 1 << 20, 1 << 26):
            if op in ("barrier", "all_to_all") and nbytes:
                continue
            for device in (False, True):
                p = _plan(op, size, nbytes, arena=True, algo=algo, device=device, ring_fused=False)
                assert p["algorithm"] in ("arena", "arena_oneshot", "local"), (op, nbytes, device, p)
