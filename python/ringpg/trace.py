"""Read the timelines ``RINGPG_TRACE=DIR`` writes: merge them, walk through the ring, draw it.

Each rank of a traced group writes ``DIR/ringpg.<group>.rank<r>.json``, a Chrome
trace-event array (csrc/common/trace.h says what is in it).  From the command line::

    python -m ringpg.trace DIR -o ring.json     # one file, one track per rank (Perfetto, chrome://tracing)
    python -m ringpg.trace DIR --walkthrough    # the tutorial's table for a small traced all_reduce
    python -m ringpg.trace DIR --png ring.png   # the timeline of one op (needs matplotlib)

and from Python: :func:`load`, :func:`merge`, :func:`walkthrough` (with
:func:`format_walkthrough`) and :func:`draw_png`.  Nothing here needs torch.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import string
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["RankTrace", "load", "merge", "walkthrough", "format_walkthrough", "draw_png", "main"]

_FILE_RE = re.compile(r"^ringpg\..+\.rank(\d+)\.json$")


@dataclass
class RankTrace:
    """One rank's file: its metadata (the ``ringpg`` record) and its events."""

    path: str
    group: str
    rank: int
    size: int
    meta: Dict[str, Any]
    events: List[Dict[str, Any]]  # every event but the metadata ("M") ones
    metadata: List[Dict[str, Any]] = field(default_factory=list)

    def op_events(self, seq: int) -> List[Dict[str, Any]]:
        """The events of op ``seq`` (its span included), in time order."""
        return sorted((e for e in self.events if e.get("args", {}).get("seq") == seq), key=lambda e: e["ts"])

    def ops(self) -> List[Dict[str, Any]]:
        """The op spans, in time order."""
        return sorted((e for e in self.events if e.get("cat") == "op"), key=lambda e: e["ts"])


def _read_events(path: str) -> List[Dict[str, Any]]:
    """A trace-event array, also when the writer died before its closing bracket."""
    with open(path, encoding="utf-8") as f:
        text = f.read().strip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "\n]"
    data = json.loads(text)
    return data["traceEvents"] if isinstance(data, dict) else data


def load(trace_dir: str, group: Optional[str] = None) -> List[RankTrace]:
    """Every rank file in ``trace_dir`` (of ``group`` only, if given), by (group, rank)."""
    paths = [p for p in glob.glob(os.path.join(trace_dir, "ringpg.*.json")) if _FILE_RE.match(os.path.basename(p))]
    if not paths:
        raise FileNotFoundError(f"no ringpg.<group>.rank<r>.json files in {trace_dir!r} (was RINGPG_TRACE set?)")
    out = []
    for path in paths:
        events = _read_events(path)
        meta = next((e["args"] for e in events if e.get("ph") == "M" and e.get("name") == "ringpg"), None)
        if meta is None:
            raise ValueError(f"{path}: no 'ringpg' metadata record: not a ringpg trace")
        if group is not None and meta["group"] != group:
            continue
        out.append(
            RankTrace(
                path=path,
                group=meta["group"],
                rank=int(meta["rank"]),
                size=int(meta["size"]),
                meta=meta,
                events=[e for e in events if e.get("ph") != "M"],
                metadata=[e for e in events if e.get("ph") == "M"],
            )
        )
    if not out:
        raise FileNotFoundError(f"no trace of group {group!r} in {trace_dir!r}")
    return sorted(out, key=lambda t: (t.group, t.rank))


def _one_group(traces: List[RankTrace]) -> List[RankTrace]:
    groups = sorted({t.group for t in traces})
    if len(groups) > 1:
        raise ValueError(f"traces of several groups {groups}: pick one with group=/--group")
    return traces


# --------------------------------------------------------------------------- merge


def _flows(traces: List[RankTrace], pid_of: Dict[Tuple[str, int], int], shift: float) -> List[Dict[str, Any]]:
    """Arrows from each segment's send to the receive that took it on the next rank."""
    by_key: Dict[Tuple[str, int, int, int, int, int], Dict[str, Any]] = {}
    for t in traces:
        for e in t.events:
            if e.get("cat") == "recv":
                a = e["args"]
                by_key[(t.group, t.rank, a["seq"], a["step"], a["chunk"], a["segment"])] = e
    flows: List[Dict[str, Any]] = []
    next_id = 1
    for t in traces:
        for e in t.events:
            if e.get("cat") != "send":
                continue
            a = e["args"]
            r = by_key.get((t.group, a["peer"], a["seq"], a["step"], a["chunk"], a["segment"]))
            if r is None:
                continue
            common = {"name": "segment", "cat": "flow", "id": next_id}
            flows.append(
                {
                    **common,
                    "ph": "s",
                    "pid": pid_of[(t.group, t.rank)],
                    "tid": e["tid"],
                    "ts": e["ts"] - shift + e["dur"] / 2,
                }
            )
            flows.append(
                {
                    **common,
                    "ph": "f",
                    "bp": "e",
                    "pid": pid_of[(t.group, a["peer"])],
                    "tid": r["tid"],
                    "ts": r["ts"] - shift + r["dur"] * 0.999,
                }
            )
            next_id += 1
    return flows


def merge(trace_dir: str, out_path: str, group: Optional[str] = None, flows: bool = True) -> Dict[str, Any]:
    """Writes every rank's events into one trace file, one track (pid) per rank.

    Times start at 0 (the earliest event); ranks of several groups get a track each,
    named "group G rank r".  ``flows``: arrows from each send to its receive.
    Returns a summary (ranks, ops, events, the clock alignment's uncertainty).
    """
    traces = load(trace_dir, group)
    several = len({t.group for t in traces}) > 1
    pid_of = {(t.group, t.rank): (i if several else t.rank) for i, t in enumerate(traces)}
    stamps = [e["ts"] for t in traces for e in t.events]
    shift = min(stamps) if stamps else 0.0
    merged: List[Dict[str, Any]] = []
    for t in traces:
        pid = pid_of[(t.group, t.rank)]
        label = f"group {t.group} rank {t.rank}" if several else f"rank {t.rank}"
        merged.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}})
        merged.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for m in t.metadata:
            if m.get("name") in ("thread_name", "ringpg"):
                merged.append({**m, "pid": pid})
        for e in t.events:
            e2 = {**e, "pid": pid, "ts": round(e["ts"] - shift, 3)}
            if "posted_us" in e.get("args", {}):
                e2["args"] = {**e["args"], "posted_us": round(e["args"]["posted_us"] - shift, 3)}
            merged.append(e2)
    if flows:
        merged.extend(_flows(traces, pid_of, shift))
    uncertainty = max((t.meta.get("clock_rtt_ns", 0) / 2000.0 for t in traces), default=0.0)
    op_us = sum(e["dur"] for t in traces for e in t.ops())
    write_us = sum(e["dur"] for t in traces for e in t.events if e.get("cat") == "trace")
    summary = {
        "ranks": len(traces),
        "groups": sorted({t.group for t in traces}),
        "ops": sum(len(t.ops()) for t in traces),
        "events": sum(len(t.events) for t in traces),
        "clock_uncertainty_us": uncertainty,
        # The tracer's own cost: writing out each op's events after it ("trace_write").
        "trace_write_us": write_us,
        "trace_write_fraction": write_us / op_us if op_us else 0.0,
        "time_origin_us": shift,
    }
    doc = {"traceEvents": merged, "displayTimeUnit": "ns", "otherData": {"ringpg": summary}}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
    return summary


# ---------------------------------------------------------------------- walkthrough


def _letter(rank: int) -> str:
    letters = string.ascii_lowercase
    return letters[rank] if rank < len(letters) else f"r{rank}_"


def _term_text(terms: Sequence[Tuple[int, int]]) -> str:
    return "+".join(f"{_letter(q)}{c}" for q, c in sorted(terms)) if terms else "·"


@dataclass
class StepRow:
    """What one rank did at one ring step."""

    step: int
    phase: str  # "reduce-scatter" or "all-gather"
    rank: int
    send_chunk: Optional[int]
    sent: List[Tuple[int, int]]  # the terms that left: (rank, chunk) contributions
    send_to: Optional[int]
    recv_chunk: Optional[int]
    recv_from: Optional[int]
    reduced: bool  # the received chunk was added to this rank's own
    holds: List[Tuple[int, int]]  # the received chunk's terms afterwards
    done_us: Optional[float]  # when its last receive of the step landed, from the op's first start on any rank


@dataclass
class Walkthrough:
    name: str
    seq: int
    size: int
    count: int
    chunks: List[Tuple[int, int]]  # (offset, length) of each chunk
    rows: List[StepRow]  # by step, then rank
    final: List[List[List[Tuple[int, int]]]]  # final[r][c]: the terms rank r holds for chunk c


def _pick_op(traces: List[RankTrace], seq: Optional[int]) -> Dict[str, Any]:
    ops = traces[0].ops()
    if seq is not None:
        match = [o for o in ops if o["args"]["seq"] == seq]
        if not match:
            raise ValueError(f"rank {traces[0].rank} traced no op with seq {seq}")
        return match[0]
    ring = [o for o in ops if o["args"].get("algorithm") == "ring"]
    if not ring:
        algos = sorted({str(o["args"].get("algorithm")) for o in ops})
        raise ValueError(
            f"no op in this trace ran the ring (algorithms seen: {algos}); a small all_reduce takes the "
            f"one-shot exchange unless RINGPG_TUNING=oneshot_bytes=0"
        )
    reducing = [o for o in ring if o["name"] == "all_reduce"]
    return (reducing or ring)[0]


def _chunks(count: int, size: int) -> List[Tuple[int, int]]:
    base, rem = divmod(count, size)
    return [(c * base + min(c, rem), base + (1 if c < rem else 0)) for c in range(size)]


def walkthrough(trace_dir: str, seq: Optional[int] = None, group: Optional[str] = None) -> Walkthrough:
    """The tutorial's table for one traced ring op (default: the first ring all_reduce).

    Every chunk index and whether a step reduced come from the trace: what rank r
    sent at step k is what it held for that chunk before the step, and what it
    receives either joins its own contribution (a reduce step: "a1+c1") or replaces
    it (a gather step).  A send and the receive that took it must name the same
    chunk, or this raises.
    """
    traces = _one_group(load(trace_dir, group))
    size = traces[0].size
    if len(traces) != size:
        raise ValueError(f"group of {size} ranks but {len(traces)} rank files")
    op = _pick_op(traces, seq)
    seq = op["args"]["seq"]
    if op["args"].get("algorithm") != "ring":
        raise ValueError(f"op {op['name']} seq {seq} ran {op['args'].get('algorithm')!r}, not the ring")
    count = int(op["args"]["count"])
    if count < size:
        raise ValueError(f"op seq {seq} has {count} elements over {size} ranks: some chunks are empty")
    reduce_scatter = bool(op["args"]["reduce_scatter"])
    per_rank = {t.rank: t.op_events(seq) for t in traces}
    start = min(e["ts"] for evs in per_rank.values() for e in evs if e.get("cat") == "op")

    def chunk_of(r: int, cat: str, step: int) -> Optional[int]:
        got = {e["args"]["chunk"] for e in per_rank[r] if e.get("cat") == cat and e["args"]["step"] == step}
        if len(got) > 1:
            raise ValueError(f"rank {r} step {step}: {cat} events name chunks {sorted(got)}")
        return got.pop() if got else None

    steps = sorted({e["args"]["step"] for r in per_rank for e in per_rank[r] if e.get("cat") == "recv"})
    # What each rank holds for each chunk, as (rank, chunk) terms: its own contribution
    # to start with (an all-gather alone starts with its own chunk only).
    held = [[[(r, c)] if (reduce_scatter or c == r) else [] for c in range(size)] for r in range(size)]
    rows: List[StepRow] = []
    for k in steps:
        sends = {r: chunk_of(r, "send", k) for r in range(size)}
        recvs = {r: chunk_of(r, "recv", k) for r in range(size)}
        msgs = {r: list(held[r][sends[r]]) if sends[r] is not None else [] for r in range(size)}
        for r in range(size):
            left = (r - 1) % size
            if recvs[r] != sends[left]:
                raise ValueError(f"step {k}: rank {left} sent chunk {sends[left]} but rank {r} received {recvs[r]}")
        for r in range(size):
            left = (r - 1) % size
            c = recvs[r]
            reduced = any(e.get("cat") == "reduce" and e["args"]["step"] == k for e in per_rank[r])
            if c is not None:
                held[r][c] = sorted(set(held[r][c]) | set(msgs[left])) if reduced else list(msgs[left])
            done = [e["ts"] + e["dur"] for e in per_rank[r] if e.get("cat") == "recv" and e["args"]["step"] == k]
            rows.append(
                StepRow(
                    step=k,
                    phase="reduce-scatter" if reduced else "all-gather",
                    rank=r,
                    send_chunk=sends[r],
                    sent=msgs[r],
                    send_to=(r + 1) % size if sends[r] is not None else None,
                    recv_chunk=c,
                    recv_from=left if c is not None else None,
                    reduced=reduced,
                    holds=list(held[r][c]) if c is not None else [],
                    done_us=(max(done) - start) if done else None,
                )
            )
    return Walkthrough(
        name=op["name"], seq=seq, size=size, count=count, chunks=_chunks(count, size), rows=rows, final=held
    )


def format_walkthrough(w: Walkthrough) -> str:
    """The walkthrough as text: who starts with what, then one line per step and rank."""
    names = ", ".join(f"{_letter(r)} = rank {r}'s" for r in range(w.size))
    chunks = ", ".join(f"{c}: [{o}, {o + n})" for c, (o, n) in enumerate(w.chunks))
    lines = [
        f"{w.name} (seq {w.seq}) on {w.size} ranks: {w.count} elements in {w.size} chunks ({chunks}).",
        f"a1 is rank 0's contribution to chunk 1 ({names} input); a1+b1 a partial sum.",
        "",
        f"{'step':>4}  {'phase':<14}  {'rank':>4}  {'sends':<24}  {'receives':<24}  {'now holds':<28}  {'landed':>10}",
    ]
    for i, row in enumerate(w.rows):
        if i > 0 and row.step != w.rows[i - 1].step:
            lines.append("")
        send = (
            f"chunk {row.send_chunk} ({_term_text(row.sent)}) -> {row.send_to}" if row.send_chunk is not None else "-"
        )
        recv = (
            f"chunk {row.recv_chunk} <- {row.recv_from}" + (" (+ own)" if row.reduced else "")
            if row.recv_chunk is not None
            else "-"
        )
        holds = f"chunk {row.recv_chunk} = {_term_text(row.holds)}" if row.recv_chunk is not None else "-"
        landed = f"{row.done_us:.1f} us" if row.done_us is not None else ""
        lines.append(
            f"{row.step:>4}  {row.phase:<14}  {row.rank:>4}  {send:<24}  {recv:<24}  {holds:<28}  {landed:>10}"
        )
    lines.append("")
    lines.append("At the end:")
    for r in range(w.size):
        lines.append(f"  rank {r}: " + "  ".join(f"chunk {c} = {_term_text(t)}" for c, t in enumerate(w.final[r])))
    lines.append(
        "(landed: when the step's last segment arrived on that rank, counted from the first rank's "
        "start of the op, clocks aligned)"
    )
    return "\n".join(lines)


# ------------------------------------------------------------------------------ png


_LANES = ("in flight", "recv wait", "reduce", "send")


def draw_png(
    trace_dir: str, out_path: str, seq: Optional[int] = None, group: Optional[str] = None, title: Optional[str] = None
) -> None:
    """Draws one op's timeline (default: the last ring op) to a PNG.

    One band per rank, four lanes each: receives in flight (posted until landed;
    overlapping ones darken), this thread waiting for a segment, reducing one, and
    posting a send; colours are ring steps.  Needs matplotlib (``pip install
    matplotlib``, or the ``bench`` extra); raises RuntimeError without it.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as e:
        raise RuntimeError(
            "ringpg.trace --png needs matplotlib: pip install matplotlib "
            "(or ringpg's bench extra: pip install 'ringpg[bench]')"
        ) from e
    traces = _one_group(load(trace_dir, group))
    ops = [o for o in traces[0].ops() if o["args"].get("algorithm") == "ring"]
    if seq is None:
        if not ops:
            raise ValueError("no ring op in this trace: pass seq=/--seq")
        seq = ops[-1]["args"]["seq"]
    per_rank = {t.rank: t.op_events(seq) for t in traces}
    t0 = min(e["ts"] for evs in per_rank.values() for e in evs if e.get("cat") == "op")
    op = next(e for e in per_rank[traces[0].rank] if e.get("cat") == "op")
    steps = sorted({e["args"]["step"] for evs in per_rank.values() for e in evs if e.get("cat") in ("send", "recv")})
    cmap = plt.get_cmap("tab10")
    colour = {k: cmap(i % 10) for i, k in enumerate(steps)}
    fig, ax = plt.subplots(figsize=(12, 1.1 + 1.0 * len(traces)))
    lane_h = 0.2
    yticks, ylabels = [], []
    for band, t in enumerate(traces):
        base = (len(traces) - 1 - band) * (len(_LANES) * lane_h + 0.3)
        for i, lane in enumerate(_LANES):
            yticks.append(base + (len(_LANES) - 1 - i) * lane_h + lane_h / 2)
            ylabels.append(f"rank {t.rank}  {lane}" if i == 0 else lane)
        for e in per_rank[t.rank]:
            cat = e.get("cat")
            a = e.get("args", {})
            if cat == "recv":
                spans = [
                    ("recv wait", e["ts"], e["dur"], 0.9),
                    ("in flight", a["posted_us"], e["ts"] + e["dur"] - a["posted_us"], 0.25),
                ]
            elif cat == "reduce":
                spans = [("reduce", e["ts"], e["dur"], 0.9)]
            elif cat == "send":
                spans = [("send", e["ts"], e["dur"], 0.9)]
            else:
                continue
            for lane, start, dur, alpha in spans:
                y = base + (len(_LANES) - 1 - _LANES.index(lane)) * lane_h
                ax.broken_barh(
                    [((start - t0) / 1000.0, max(dur, 0.5) / 1000.0)],
                    (y + 0.02, lane_h - 0.04),
                    facecolors=colour[a["step"]],
                    alpha=alpha,
                    linewidth=0,
                )
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels, fontsize=7)
    ax.set_xlabel("ms from the op's start (clocks aligned to rank 0)")
    mib = op["args"]["bytes"] / 2**20
    ax.set_title(
        title
        or f"{op['name']} seq {seq}: {mib:g} MiB on {len(traces)} ranks, "
        f"{op['args'].get('segments')} segments per chunk"
    )
    ax.legend(
        handles=[Patch(color=colour[k], label=f"step {k}") for k in steps],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=7,
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------ cli


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ringpg.trace", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the RINGPG_TRACE directory")
    ap.add_argument("-o", "--output", help="merged trace file (default DIR/ring.json when nothing else is asked)")
    ap.add_argument("--walkthrough", action="store_true", help="print the step table of a ring op")
    ap.add_argument("--png", metavar="PATH", help="draw one op's timeline (needs matplotlib)")
    ap.add_argument("--seq", type=int, default=None, help="which op (its sequence number) to walk through or draw")
    ap.add_argument("--group", default=None, help="which group, when DIR holds several")
    ap.add_argument("--no-flows", action="store_true", help="no send-to-receive arrows in the merged file")
    args = ap.parse_args(argv)
    try:
        out = args.output or (None if (args.walkthrough or args.png) else os.path.join(args.dir, "ring.json"))
        if out:
            s = merge(args.dir, out, args.group, flows=not args.no_flows)
            print(
                f"{out}: {s['ranks']} ranks, {s['ops']} op spans, {s['events']} events; clocks aligned to "
                f"rank 0 within {s['clock_uncertainty_us']:.1f} us (half the best round trip); writing the "
                f"trace took {100 * s['trace_write_fraction']:.2f}% of the ops' time"
            )
        if args.walkthrough:
            print(format_walkthrough(walkthrough(args.dir, args.seq, args.group)))
        if args.png:
            draw_png(args.dir, args.png, args.seq, args.group)
            print(f"{args.png}: written")
    except (RuntimeError, ValueError, FileNotFoundError) as e:
        print(f"ringpg.trace: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
