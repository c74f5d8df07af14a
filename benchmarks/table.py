"""Reporting: nccl-tests style table rows, and a progress line that does not garble them.

:class:`TableFormatter` prints size, count, type, op and redop, then per backend time,
algbw, busbw and ``#wrong`` (with an emulated link also busbw against the link rate and
the TCP ring ceiling), then baseline time / backend time per other backend (named
``ringpg/gloo``, or ``(ringpg/ring)/gloo`` for a label that holds a '/').  With MPI peers
(``--peers``) their columns follow the backends' and each backend besides the baseline gets
one more ratio: the best peer's time / its time, naming that peer (``ringpg/best-peer``).
With torch's floor among the backends (``--backends ringpg,gloo,floor``) it gets no ratio
of its own; with peers too, each backend gets one more: the best peer's time / the
backend's time less the floor's (``(ringpg-floor)/best-peer``), what the backend itself
adds to torch's cost of an op against a peer's whole op.
"""

from __future__ import annotations

import sys
from typing import Dict, List, Optional, Sequence

from benchmarks.timing import BackendResult, CaseResult


class TableFormatter:
    """nccl-tests style rows: size, count, type, op, redop | per backend time algbw busbw #wrong
    [busbw/link [busbw/ring probe]] | ratio per non-baseline backend (= baseline time / backend time, which is
    also backend busbw / baseline busbw)."""

    def __init__(
        self,
        labels: Sequence[str],
        baseline: str,
        link_GBps: Optional[float] = None,
        ceiling_GBps: Optional[float] = None,
        peers: Sequence[str] = (),
        floor: Optional[str] = None,
    ) -> None:
        self.labels = list(labels) + [p for p in peers if p not in labels]
        self.baseline = baseline
        self.peers = list(peers)
        self.floor = floor
        self.others = [lb for lb in self.labels if lb not in (baseline, floor) and lb not in self.peers]
        self.link = link_GBps
        # %probe: busbw against the TCP ring ceiling measured on the emulated links.
        self.ceiling = ceiling_GBps if link_GBps else None
        self.bw = 37 + (7 if self.link else 0) + (7 if self.ceiling else 0)
        # Ratio columns: named "label/baseline", labels holding a '/' (ringpg/ring) in
        # parentheses, "(ringpg/ring)/gloo"; each at least 13 wide, wider for a long name.
        self.ratio_names = [f"{_operand(lb)}/{_operand(baseline)}" for lb in self.others]
        # Against the best peer of each row: "1.23x impi" (best peer time / backend time).
        self.peer_ratio_names = [f"{_operand(lb)}/best-peer" for lb in self.others] if self.peers else []
        # With the floor: the backend's own time (its time less torch's floor) against the
        # best peer's whole op, "(ringpg-floor)/best-peer" (best peer time / own time).
        self.own_ratio_names = (
            [f"({lb}-{floor})/best-peer" for lb in self.others] if self.peers and floor is not None else []
        )
        self.peer_ratio_names += self.own_ratio_names
        self.ratio_widths = [max(13, len(n)) for n in self.ratio_names]
        self.ratio_widths += [max(14, len(n), 7 + max(map(len, self.peers))) for n in self.peer_ratio_names]

    def _extra(self, link: str, probe: str) -> str:
        return (f" {link:>6}" if self.link else "") + (f" {probe:>6}" if self.ceiling else "")

    def header(self) -> str:
        left = f"{'':>12} {'':>12} {'':>9} {'':>22} {'':>5}"
        groups = "".join(f"  {lb:^{self.bw}}" for lb in self.labels)
        ratio_names = "".join(f" {n:>{w}}" for n, w in zip(self.ratio_names + self.peer_ratio_names, self.ratio_widths))
        l1 = f"#{left[1:]}{groups}{'  busbw ratio' if self.others else ''}"
        col = f"  {'time':>9} {'algbw':>8} {'busbw':>8} {'#wrong':>7}" + self._extra("%link", "%probe")
        unit = f"  {'(us)':>9} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}" + self._extra("", "")
        l2 = f"#{'size':>11} {'count':>12} {'type':>9} {'op':>22} {'redop':>5}" + col * len(self.labels) + ratio_names
        l3 = (
            f"#{'(B)':>11} {'(elements)':>12} {'':>9} {'':>22} {'':>5}"
            + unit * len(self.labels)
            + "".join(f" {'(=time ratio)':>{w}}" for w in self.ratio_widths)
        )
        return "\n".join([l1, l2, l3])

    def row(self, res: CaseResult) -> str:
        c = res.case
        paired = len({v.dtype for v in res.variants.values()}) > 1
        # Paired dtypes: the count is the first label's, the type column says "paired".
        s = f"{c.size_bytes:>12} {c.numel:>12} {'paired' if paired else c.dtype:>9} {c.op:>22} {c.redop:>5}"
        for lb in self.labels:
            r = res.backends.get(lb)
            if r is None or r.error is not None or r.time_us is None:
                what = "skip" if r is not None and r.skipped else "ERR"
                s += f"  {what:>9} {'-':>8} {'-':>8} {r.wrong if r else '-':>7}" + self._extra("-", "-")
                continue
            s += f"  {r.time_us:>9.1f} {r.algbw_GBps or 0:>8.3f} {r.busbw_GBps or 0:>8.3f} {r.wrong:>7}"
            busbw = r.busbw_GBps or 0
            s += self._extra(
                f"{busbw / self.link:.1%}" if self.link else "", f"{busbw / self.ceiling:.1%}" if self.ceiling else ""
            )
        base = res.backends.get(self.baseline)
        for lb, w in zip(self.others, self.ratio_widths):
            r = res.backends.get(lb)
            if base and r and base.time_us and r.time_us and base.error is None and r.error is None:
                s += f" {base.time_us / r.time_us:>{w - 1}.2f}x"
            else:
                s += f" {'-':>{w}}"
        best = _best(res.backends, self.peers)
        n = len(self.others)
        for lb, w in zip(self.others, self.ratio_widths[n : 2 * n]):
            r = res.backends.get(lb)
            if best and r and r.time_us and r.error is None:
                s += f" {f'{(best.time_us or 0) / r.time_us:.2f}x {best.label}':>{w}}"
            else:
                s += f" {'-':>{w}}"
        floor = res.backends.get(self.floor) if self.floor else None
        for lb, w in zip(self.others, self.ratio_widths[2 * n :]):  # none without own_ratio_names
            r = res.backends.get(lb)
            ok = r and r.time_us and r.error is None and floor and floor.time_us and floor.error is None
            own = r.time_us - floor.time_us if ok else None
            if best and own and own > 0:
                s += f" {f'{(best.time_us or 0) / own:.2f}x {best.label}':>{w}}"
            else:
                s += f" {'-':>{w}}"
        return s

    def errors(self, res: CaseResult) -> List[str]:
        return [f"#   ! {lb}: {r.error}" for lb, r in res.backends.items() if r.error]


def _best(results: Dict[str, BackendResult], peers: Sequence[str]) -> Optional[BackendResult]:
    """The fastest of ``peers`` in a case (least median time), or None if none has a time."""
    timed = [results[p] for p in peers if p in results and results[p].time_us and results[p].error is None]
    return min(timed, key=lambda r: r.time_us or 0.0) if timed else None


def _operand(label: str) -> str:
    """A label as one side of a ratio's name: in parentheses if it holds a '/' itself."""
    return f"({label})" if "/" in label else label


class Progress:
    """One-line progress on stderr (rewritten in place on a terminal, plain lines otherwise)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self._shown = False

    def update(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            sys.stderr.write("\r\033[K" + text)
            self._shown = True
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def clear(self) -> None:
        if self.enabled and self.tty and self._shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self._shown = False


def emit(line: str, progress: Optional[Progress] = None) -> None:
    """Print a table line on stdout without garbling a progress line on the same terminal."""
    if progress is not None:
        progress.clear()
    print(line, flush=True)
