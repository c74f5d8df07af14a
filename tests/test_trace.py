"""RINGPG_TRACE: per-step timelines of real multi-process runs, checked against the ring plan.

One 3-rank pool per transport (shared memory, where the reduction is fused into the
receive, and TCP, where it follows it) runs a small and a multi-segment all_reduce
and an all_gather_into_tensor with RINGPG_TRACE set, then shuts down so every rank closes its file; the tests read
those files.  Nothing here asserts speed (benchmarks/RESULTS.md has the overhead).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List

import pytest
import torch
import torch.distributed as dist
from harness import Groups, InitSpec, WorkerPool, backend_under_test
from harness.commands import run_module

from devkit.settings import tuning

pytestmark = pytest.mark.skipif(backend_under_test() != "ringpg", reason="RINGPG_TRACE is ringpg's")

_C = pytest.importorskip("ringpg._C")
from ringpg import trace as rtrace  # noqa: E402

WS = 3
SMALL = 12  # one segment per chunk: the walkthrough's op
MEDIUM = 3 * 80000 + 1  # several segments per chunk, chunks of unequal length
SMALL_SEQ, MEDIUM_SEQ = 1, 2
GATHER = 80000 + 1  # elements a rank contributes to the traced all-gather: several segments
GATHER_SEQ = 6
TOL_US = 0.002  # timestamps are printed in us with 3 decimals


def small_input(rank: int) -> torch.Tensor:
    return torch.arange(SMALL, dtype=torch.float32) + 100.0 * (rank + 1)


def traced_worker(rank: int, ws: int, groups: Groups, args: Any) -> Dict[str, Any]:
    """The two traced all_reduces (seq 1 and 2 of the ringpg group), a profiled one (3), one with
    tracing switched off (4), one after it is switched back on (5), and an all-gather from a
    separate input (6)."""
    small = small_input(rank)
    dist.all_reduce(small, group=groups.test)
    medium = torch.full((MEDIUM,), float(rank + 1))
    dist.all_reduce(medium, group=groups.test)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dist.all_reduce(torch.ones(8), group=groups.test)
    import ringpg

    b = ringpg.backend(groups.test)
    was = b.tracing
    b.tracing = False  # seq 4 runs untraced
    dist.all_reduce(torch.ones(8), group=groups.test)
    b.tracing = True  # seq 5 traced again
    dist.all_reduce(torch.ones(8), group=groups.test)
    gathered = torch.empty(ws * GATHER)
    dist.all_gather_into_tensor(gathered, torch.full((GATHER,), float(rank + 1)), group=groups.test)
    return {
        "gathered_ok": bool(torch.equal(gathered, torch.arange(1, ws + 1).float().repeat_interleave(GATHER))),
        "tracing_was_on": was,
        "small": small.tolist(),
        "medium_ok": bool(torch.all(medium == float(sum(range(1, ws + 1))))),
        "profiled": sorted({e.name for e in prof.events()}),
        "summary": _C.config_summary(),
    }


@pytest.fixture(scope="module", params=["shm", "tcp"])
def traced(request: Any, tmp_path_factory: Any) -> Dict[str, Any]:
    transport = request.param
    trace_dir = str(tmp_path_factory.mktemp(f"trace-{transport}"))
    # The ring is this file's subject: on shared memory, without the host arena.
    env = [("RINGPG_TRACE", trace_dir), tuning(oneshot_bytes=0), ("RINGPG_ALGO", "ring")]
    if transport == "tcp":
        env.append(("RINGPG_TRANSPORT", "tcp"))
    with WorkerPool(WS, InitSpec(env=tuple(env))) as pool:
        results = pool.run(traced_worker)
    # Leaving the pool destroyed the groups: every file is closed.
    return {"dir": trace_dir, "transport": transport, "results": results, "traces": rtrace.load(trace_dir)}


def _op(t: rtrace.RankTrace, seq: int) -> Dict[str, Any]:
    return next(e for e in t.op_events(seq) if e["cat"] == "op")


def _of(t: rtrace.RankTrace, seq: int, cat: str) -> List[Dict[str, Any]]:
    return [e for e in t.op_events(seq) if e["cat"] == cat]


def _chunk_of(count: int, offset: int) -> int:
    for c in range(WS):
        off, n = _C.chunk_range(count, WS, c)
        if off <= offset < off + n:
            return c
    raise AssertionError(f"offset {offset} in no chunk of {count}")


@pytest.mark.multiprocess
def test_files_are_complete_json_one_per_rank(traced: Dict[str, Any]) -> None:
    files = sorted(os.listdir(traced["dir"]))
    assert files == [f"ringpg.0.rank{r}.json" for r in range(WS)], files
    for name in files:
        with open(os.path.join(traced["dir"], name)) as f:
            events = json.load(f)  # closed by the group's destruction: a complete array
        meta = next(e["args"] for e in events if e["name"] == "ringpg")
        assert meta["transport"] == traced["transport"] and meta["size"] == WS
    assert all(f"trace={traced['dir']}" in r["summary"] and r["tracing_was_on"] for r in traced["results"])


@pytest.mark.multiprocess
def test_op_spans_name_op_seq_and_bytes(traced: Dict[str, Any]) -> None:
    for t in traced["traces"]:
        ops = t.ops()
        assert [o["name"] for o in ops] == ["all_reduce"] * 4 + ["all_gather_into_tensor"]
        assert [o["args"]["seq"] for o in ops] == [1, 2, 3, 5, GATHER_SEQ]  # 4 ran with tracing switched off
        assert [o["args"]["bytes"] for o in ops][:4] == [SMALL * 4, MEDIUM * 4, 8 * 4, 8 * 4]
        assert ops[1]["args"]["algorithm"] == "ring" and ops[1]["args"]["fused"] == (traced["transport"] == "shm")
        assert ops[1]["args"]["segments"] > 1
        # The tracer's own cost follows each op: writing out its events.
        writes = [e for e in t.events if e["cat"] == "trace"]
        assert [w["args"]["op_seq"] for w in writes] == [1, 2, 3, 5, GATHER_SEQ]
        assert all(w["ts"] >= o["ts"] + o["dur"] - TOL_US for w, o in zip(writes, ops))
        for seq in (SMALL_SEQ, MEDIUM_SEQ):
            op = _op(t, seq)
            for e in t.op_events(seq):  # every step inside its op, on the op's thread
                assert e["tid"] == op["tid"]
                assert op["ts"] - TOL_US <= e["ts"] and e["ts"] + e["dur"] <= op["ts"] + op["dur"] + TOL_US


@pytest.mark.multiprocess
@pytest.mark.parametrize("seq", [SMALL_SEQ, MEDIUM_SEQ])
def test_steps_and_chunks_match_the_ring_plan(traced: Dict[str, Any], seq: int) -> None:
    for t in traced["traces"]:
        args = _op(t, seq)["args"]
        count, es, seg_elems = args["count"], args["elem_size"], args["seg_elems"]
        assert tuple(_C.segment_plan(count, WS, seg_elems)) == (args["segments"], seg_elems)
        sends = {(e["args"]["step"], e["args"]["segment"]): e["args"] for e in _of(t, seq, "send")}
        recvs = {(e["args"]["step"], e["args"]["segment"]): e["args"] for e in _of(t, seq, "recv")}
        assert len({s for s, _ in sends}) == 2 * (WS - 1) == len({s for s, _ in recvs})
        expected_sends, expected_recvs = set(), set()
        for step, j, s_off, s_len, r_off, r_len in _C.ring_schedule(count, WS, t.rank, seg_elems):
            if s_len > 0:
                expected_sends.add((step, j))
                got = sends[(step, j)]
                assert (got["chunk"], got["bytes"], got["peer"]) == (
                    _chunk_of(count, s_off),
                    s_len * es,
                    (t.rank + 1) % WS,
                )
            if r_len > 0:
                expected_recvs.add((step, j))
                got = recvs[(step, j)]
                assert (got["chunk"], got["bytes"], got["peer"]) == (
                    _chunk_of(count, r_off),
                    r_len * es,
                    (t.rank - 1) % WS,
                )
        assert set(sends) == expected_sends and set(recvs) == expected_recvs
        # The named primitives, in NCCL's order.
        names = [e["name"] for e in _of(t, seq, "step")]
        assert names == ["send", "recvReduceSend", "recvReduceCopySend", "recvCopySend", "recv", "finish"]


@pytest.mark.multiprocess
def test_all_gather_from_its_own_input_starts_with_copy_send(traced: Dict[str, Any]) -> None:
    # Its own chunk leaves and lands in the output segment by segment (NCCL's copySend),
    # then the gather steps: one recvCopySend at three ranks, and the last recv.
    assert all(r["gathered_ok"] for r in traced["results"])
    for t in traced["traces"]:
        names = [e["name"] for e in _of(t, GATHER_SEQ, "step")]
        assert names == ["copySend", "recvCopySend", "recv", "finish"]
        first_sends = [e for e in _of(t, GATHER_SEQ, "send") if e["args"]["step"] == WS - 1]
        assert len(first_sends) == _op(t, GATHER_SEQ)["args"]["segments"] > 1
        assert {e["args"]["chunk"] for e in first_sends} == {t.rank}


@pytest.mark.multiprocess
@pytest.mark.parametrize("seq", [SMALL_SEQ, MEDIUM_SEQ])
def test_receives_precede_the_reductions_that_use_them(traced: Dict[str, Any], seq: int) -> None:
    fused = traced["transport"] == "shm"
    for t in traced["traces"]:
        recvs = {(e["args"]["step"], e["args"]["segment"]): e for e in _of(t, seq, "recv")}
        reduced: Dict[Any, int] = {}
        for red in _of(t, seq, "reduce"):
            key = (red["args"]["step"], red["args"]["segment"])
            recv = recvs[key]
            assert red["args"]["chunk"] == recv["args"]["chunk"]
            if fused:
                # Reduced fragment by fragment as it is pulled: after the receive was
                # posted, done by the time the wait for it returned.
                assert red["ts"] >= recv["args"]["posted_us"] - TOL_US
                assert red["ts"] + red["dur"] <= recv["ts"] + recv["dur"] + TOL_US
            else:
                assert red["ts"] >= recv["ts"] + recv["dur"] - TOL_US, (key, red, recv)
            reduced[key] = reduced.get(key, 0) + red["args"]["bytes"]
        # Every segment of the reduce steps (0 .. WS-2) reduced whole; no other.
        expected = {k: e["args"]["bytes"] for k, e in recvs.items() if k[0] < WS - 1}
        assert reduced == expected


@pytest.mark.multiprocess
def test_sends_precede_their_receives_on_the_aligned_clock(traced: Dict[str, Any]) -> None:
    traces = {t.rank: t for t in traced["traces"]}
    slack = {r: t.meta["clock_rtt_ns"] / 2000.0 for r, t in traces.items()}
    checked = 0
    for r, t in traces.items():
        right = (r + 1) % WS
        recvs = {
            (e["args"]["seq"], e["args"]["step"], e["args"]["segment"]): e
            for e in traces[right].events
            if e["cat"] == "recv"
        }
        for s in (e for e in t.events if e["cat"] == "send"):
            recv = recvs[(s["args"]["seq"], s["args"]["step"], s["args"]["segment"])]
            # The segment left rank r before rank r+1's wait for it ended, within the
            # two ranks' alignment error (each within half its best round trip of rank 0).
            assert s["ts"] <= recv["ts"] + recv["dur"] + slack[r] + slack[right] + TOL_US
            checked += 1
    assert checked > 0


@pytest.mark.multiprocess
def test_clock_offsets_within_half_the_round_trip(traced: Dict[str, Any]) -> None:
    for t in traced["traces"]:
        off, rtt = t.meta["clock_offset_ns"], t.meta["clock_rtt_ns"]
        if t.rank == 0:
            assert off == 0 and rtt == 0
        else:
            # One host, one CLOCK_MONOTONIC: the true offset is 0, and the min-RTT estimate
            # is within half that round trip of it.
            assert rtt > 0 and abs(off) <= rtt / 2 + 1


@pytest.mark.multiprocess
def test_merged_file_one_track_per_rank(traced: Dict[str, Any], tmp_path: Any) -> None:
    out = str(tmp_path / "ring.json")
    summary = rtrace.merge(traced["dir"], out)
    with open(out) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(WS)}
    timed = [e for e in events if e["ph"] != "M"]
    assert {e["pid"] for e in timed} == set(range(WS))
    assert min(e["ts"] for e in timed if e["ph"] == "X") == 0
    starts = [e for e in timed if e["ph"] == "s"]
    ends = [e for e in timed if e["ph"] == "f"]
    assert starts and len(starts) == len(ends) == sum(1 for e in timed if e.get("cat") == "send")
    assert summary["ranks"] == WS and summary["ops"] == 5 * WS


@pytest.mark.multiprocess
def test_walkthrough_sums_match_the_result(traced: Dict[str, Any]) -> None:
    w = rtrace.walkthrough(traced["dir"])
    assert (w.name, w.seq, w.size, w.count) == ("all_reduce", SMALL_SEQ, WS, SMALL)
    assert len(w.rows) == 2 * (WS - 1) * WS
    for row in w.rows:
        assert row.send_chunk == (row.rank - row.step - 1) % WS and row.recv_chunk == (row.rank - row.step - 2) % WS
        if row.step < WS - 1:  # a partial sum of step + 2 contributions
            assert row.phase == "reduce-scatter" and len(row.holds) == row.step + 2
        else:
            assert row.phase == "all-gather" and len(row.holds) == WS
    inputs = [small_input(q) for q in range(WS)]
    for r, result in enumerate(traced["results"]):
        got = torch.tensor(result["small"])
        for c, (off, n) in enumerate(w.chunks):
            terms = w.final[r][c]
            assert sorted(terms) == [(q, c) for q in range(WS)]
            expected = sum(inputs[q][off : off + n] for q, _ in terms)
            assert torch.equal(got[off : off + n], expected)
    text = rtrace.format_walkthrough(w)
    assert "chunk 1 = a1+b1+c1" in text and "chunk 1 = a1+c1" in text


@pytest.mark.multiprocess
def test_cli_merges_and_walks_through(traced: Dict[str, Any], tmp_path: Any) -> None:
    out = tmp_path / "cli.json"
    proc = run_module("ringpg.trace", traced["dir"], "-o", str(out), "--walkthrough", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "3 ranks" in proc.stdout and "a0+b0+c0" in proc.stdout
    json.loads(out.read_text())


@pytest.mark.multiprocess
def test_ringpg_ops_appear_in_torch_profiler(traced: Dict[str, Any]) -> None:
    for r in traced["results"]:
        assert "ringpg:all_reduce" in r["profiled"], r["profiled"]


@pytest.mark.multiprocess
def test_png(traced: Dict[str, Any], tmp_path: Any) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "ring.png"
    rtrace.draw_png(traced["dir"], str(out), seq=MEDIUM_SEQ)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.inprocess
def test_png_without_matplotlib_says_how_to_get_it(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(RuntimeError, match="pip install matplotlib"):
        rtrace.draw_png(str(tmp_path), str(tmp_path / "x.png"))


@pytest.mark.inprocess
def test_tracing_is_off_by_default() -> None:
    if os.environ.get("RINGPG_TRACE"):
        pytest.skip("RINGPG_TRACE is set in this environment")
    assert "trace=off" in _C.config_summary()
