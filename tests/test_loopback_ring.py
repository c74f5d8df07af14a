"""Collectives over in-process loopback links (csrc/transport/loopback_link.h), in one
process and in milliseconds, through ``ringpg._C.run_in_process``: N ranks, a thread
each, every one a RingBackend built over the links it is given (its constructor over
GroupLinks), so each op takes the backend's whole path: validation, the worker, the
algorithm choice, the ring and its plan, with frames copied through in-memory queues
instead of sockets.

Each rank's result is compared with what torch computes from every rank's input, for
world sizes 1 to 9 (the odd ones among them), numel 0, numel below the world size and
sizes that take several ring segments; with the ring forced (``oneshot_bytes=0``) and
with the small-buffer algorithms the choice takes by default (one-shot up to 8 ranks,
recursive doubling past).  Ranks that call mismatched ops must all fail, fast, not at
their timeout.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

_C = pytest.importorskip("ringpg._C")

pytestmark = pytest.mark.inprocess

WORLD_SIZES = list(range(1, 10))


def inputs_for(world: int, numel: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> list[torch.Tensor]:
    """Each rank's input: small integers, so float sums are exact in any order."""
    g = torch.Generator().manual_seed(seed * 1000 + world * 31 + numel)
    return [torch.randint(-50, 50, (numel,), generator=g).to(dtype) for _ in range(world)]


def run(op: str, inputs: list[torch.Tensor], **kw: Any) -> dict[str, Any]:
    """Runs `op` in process and checks that every rank succeeded."""
    out = _C.run_in_process(op, inputs, **kw)
    assert out["errors"] == [""] * len(inputs), out["errors"]
    return out


def stacked(inputs: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(inputs) if inputs[0].numel() else torch.empty(len(inputs), 0, dtype=inputs[0].dtype)


@pytest.mark.parametrize("world", WORLD_SIZES)
@pytest.mark.parametrize("numel", [0, 1, 5, 1000, 40_003])
def test_ring_allreduce_sums(world: int, numel: int) -> None:
    inputs = inputs_for(world, numel)
    out = run("allreduce", inputs, oneshot_bytes=0)
    expected = stacked(inputs).sum(0)
    for r in range(world):
        torch.testing.assert_close(out["outputs"][r], expected, rtol=0, atol=0)
    assert out["algorithm"] == ("local" if world == 1 or numel == 0 else "ring")


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_small_allreduce_takes_the_choice_of_algorithm(world: int) -> None:
    inputs = inputs_for(world, 37, torch.int64)
    out = run("allreduce", inputs)
    expected = stacked(inputs).sum(0)
    for r in range(world):
        assert torch.equal(out["outputs"][r], expected)
    assert out["algorithm"] == ("local" if world == 1 else "oneshot" if world <= 8 else "doubling")


@pytest.mark.parametrize("world", [2, 3, 7])
@pytest.mark.parametrize("reduce_op", ["max", "min", "product", "bxor"])
def test_ring_allreduce_other_ops(world: int, reduce_op: str) -> None:
    inputs = [t.to(torch.int64) % 7 + 1 for t in inputs_for(world, 1001, seed=1)]
    out = run("allreduce", inputs, reduce_op=reduce_op, oneshot_bytes=0)
    s = stacked(inputs)
    if reduce_op == "max":
        expected = s.max(0).values
    elif reduce_op == "min":
        expected = s.min(0).values
    elif reduce_op == "product":
        expected = s.prod(0)
    else:
        expected = s[0].clone()
        for t in s[1:]:
            expected ^= t
    for r in range(world):
        assert torch.equal(out["outputs"][r], expected), r


@pytest.mark.parametrize("world", [3, 5, 8])
def test_ring_allreduce_over_many_segments(world: int) -> None:
    # 4 KiB segments: each chunk of 100k floats crosses the ring in many pieces.
    inputs = inputs_for(world, 100_000, torch.float64, seed=2)
    out = run("allreduce", inputs, oneshot_bytes=0, segment_bytes=4096)
    expected = stacked(inputs).sum(0)
    for r in range(world):
        torch.testing.assert_close(out["outputs"][r], expected, rtol=0, atol=0)


@pytest.mark.parametrize("world", WORLD_SIZES)
@pytest.mark.parametrize("per_rank", [0, 1, 3, 1001])
def test_reduce_scatter_sums_each_ranks_chunk(world: int, per_rank: int) -> None:
    inputs = inputs_for(world, per_rank * world)
    out = run("reduce_scatter", inputs)
    total = stacked(inputs).sum(0)
    for r in range(world):
        torch.testing.assert_close(out["outputs"][r], total[r * per_rank : (r + 1) * per_rank], rtol=0, atol=0)
    assert out["algorithm"] == ("local" if world == 1 or per_rank == 0 else "ring")


@pytest.mark.parametrize("world", WORLD_SIZES)
@pytest.mark.parametrize("numel", [0, 1, 2, 777])
def test_all_gather_concatenates_in_rank_order(world: int, numel: int) -> None:
    inputs = inputs_for(world, numel, torch.int32)
    out = run("all_gather", inputs)
    expected = torch.cat(inputs)
    for r in range(world):
        assert torch.equal(out["outputs"][r], expected), r


@pytest.mark.parametrize("world", [2, 4, 9])
def test_broadcast_and_reduce_from_the_last_rank(world: int) -> None:
    root = world - 1
    inputs = inputs_for(world, 513, seed=3)
    out = run("broadcast", inputs, root=root)
    for r in range(world):
        assert torch.equal(out["outputs"][r], inputs[root]), r
    out = run("reduce", inputs, root=root)
    torch.testing.assert_close(out["outputs"][root], stacked(inputs).sum(0), rtol=0, atol=0)


def test_ops_in_sequence_keep_in_step() -> None:
    # Five ops back to back: each op's frames carry its sequence number, and a rank that
    # finishes first sends the next op's frames while its neighbours still receive.
    inputs = inputs_for(5, 9999, seed=4)
    out = run("allreduce", inputs, oneshot_bytes=0, repeat=5)
    for r in range(5):
        torch.testing.assert_close(out["outputs"][r], stacked(inputs).sum(0), rtol=0, atol=0)


def test_mismatched_ranks_all_fail_fast() -> None:
    # Rank 2 calls allreduce on one more element: every rank must fail (with the
    # mismatch, or with the group's failure that the mismatch caused), long before the
    # 20 s timeout.
    inputs = inputs_for(4, 1000)
    inputs[2] = torch.cat([inputs[2], torch.zeros(1)])
    out = _C.run_in_process("allreduce", inputs, oneshot_bytes=0, timeout_ms=20_000)
    assert all("collective mismatch" in e for e in out["errors"]), out["errors"]
    # The rank that saw it broke the group; the others heard (as from an Abort frame).
    assert any("aborted the group" in e for e in out["errors"]), out["errors"]
    assert out["seconds"] < 2, out
    assert all(o is None for o in out["outputs"])


def test_ranks_waiting_on_an_absent_rank_time_out_and_say_so() -> None:
    # Rank 2 never calls: every other rank's op ends at its 300 ms deadline (no hang),
    # and its right neighbour's error names it.
    inputs = inputs_for(4, 1000)
    out = _C.run_in_process("allreduce", inputs, oneshot_bytes=0, absent_rank=2, timeout_ms=300)
    assert out["errors"][2] == "" and out["outputs"][2] is None
    others = [e for r, e in enumerate(out["errors"]) if r != 2]
    assert all(("Timed out" in e or "aborted the group" in e) for e in others), others
    assert "Timed out waiting for rank 2" in out["errors"][3], out["errors"]
    assert 0.3 <= out["seconds"] < 3, out
