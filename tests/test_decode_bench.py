"""The tensor-parallel decode benchmark (``benchmarks/decode.py``), run for real at N=2.

``--quick --check``: a few tokens of a few layers per mode and backend, every token's
result compared exactly with what the ranks' known contributions sum to. The compiled
mode runs under ``aot_eager`` here (inductor's C++ compile would take most of a minute
on 2 cores); where torch.compile cannot run at all, the bench says so and the test still
requires the eager mode on both backends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import pytest
from harness.commands import run_module

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.multiprocess
@pytest.mark.slow
def test_decode_quick_check_reports_both_backends_exact() -> None:
    p = run_module("benchmarks.decode", "--quick", "--check", "--compile-backend", "aot_eager", timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    rows: Dict[str, List[str]] = {}
    for line in p.stdout.splitlines():
        cols = line.split()
        if cols and cols[0] in ("eager", "compiled") and cols[1] in ("ringpg", "gloo"):
            assert cols[-1] == "0", line  # #wrong
            rows.setdefault(cols[0], []).append(cols[1])
    assert sorted(rows.get("eager", [])) == ["gloo", "ringpg"], p.stdout
    if "compiled(unavailable)" in p.stdout:
        assert "# compiled: SKIPPED" in p.stdout, p.stdout
    else:
        assert "compiled(aot_eager)" in p.stdout, p.stdout
        assert sorted(rows.get("compiled", [])) == ["gloo", "ringpg"], p.stdout
    assert "every token exact on every rank" in p.stdout, p.stdout
