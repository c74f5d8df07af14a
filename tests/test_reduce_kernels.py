"""ringpg's vectorized reduction kernels against torch's own element-wise ops.

Every dtype x op the kernels implement is compared on random data of awkward
lengths (vector-tail handling) with torch as the reference: exact for integers,
bool and fp32/fp64 (same single operation), and for fp16/bf16 exact as well, since
both widen to fp32, combine once and round once to nearest-even.  Each compiled copy
of the kernels this CPU can run (AVX-512 with and without the bf16 converter, AVX2,
baseline) is tested by name, not only the one ringpg dispatches to.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

_C = pytest.importorskip("ringpg._C")

INT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
LENGTHS = [0, 1, 7, 31, 64, 1000, 4099]


def _data(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        x = torch.randn(n, generator=g, dtype=torch.float64) * 100
        if n > 3:
            x[3] = float("nan")  # NaN on both sides
        if n > 20:
            x[16 + seed] = float("nan")  # NaN on one side only, inside a vector block
            x[17 + seed] = float("inf") if seed == 1 else -float("inf")
        if n > 40:
            # Results below float's (and bf16's) smallest normal, in the second 32-lane
            # block: hardware converters flush these, torch does not.
            x[33] = 3e-39 * seed
            x[35] = -1e-40 if seed == 1 else 1e-19
        if n > 48:
            # float16's edges, inside a 16-lane block: results that are half denormals
            # (below 6.1e-5, down to its smallest, 6e-8) and a sum past its largest, 65504.
            x[40] = 1e-5 * seed
            x[41] = -6e-8 if seed == 1 else 2e-7
            x[42] = 60000.0 if seed == 1 else 6000.0
        return x.to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**62)), min(info.max, 2**62)
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


def _reference(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype == torch.bool:
        return {"SUM": a | b, "MAX": a | b, "BOR": a | b, "PRODUCT": a & b, "MIN": a & b, "BAND": a & b, "BXOR": a ^ b}[op]
    wide = a.dtype in (torch.uint16, torch.uint32, torch.uint64)
    x, y = (a.to(torch.int64), b.to(torch.int64)) if wide else (a, b)
    r = {
        "SUM": lambda: x + y,
        "PRODUCT": lambda: x * y,
        "MIN": lambda: torch.minimum(x, y),
        "MAX": lambda: torch.maximum(x, y),
        "BAND": lambda: x & y,
        "BOR": lambda: x | y,
        "BXOR": lambda: x ^ y,
    }[op]()
    if wide and op in ("MIN", "MAX"):
        # Unsigned order differs from the signed int64 view for values >= 2**63.
        r = torch.where((a.to(torch.float64) < b.to(torch.float64)) == (op == "MIN"), x, y)
    return r.to(a.dtype)


@pytest.mark.parametrize("isa", _C.reduce_isas())
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES + [torch.bool], ids=str)
def test_kernels_match_torch(dtype: torch.dtype, isa: str) -> None:
    ops = ["SUM", "PRODUCT", "MIN", "MAX"]
    if not dtype.is_floating_point:
        ops += ["BAND", "BOR", "BXOR"]
    for op in ops:
        for n in LENGTHS:
            a, b = _data(dtype, n, 1), _data(dtype, n, 2)
            out = torch.empty_like(a)
            _C.reduce_kernel(op, out, a, b, isa=isa)
            ref = _reference(op, a, b)
            assert torch.equal(out.view(torch.uint8), ref.view(torch.uint8)) or torch.equal(
                out, ref
            ) or (dtype.is_floating_point and torch.allclose(out.double(), ref.double(), equal_nan=True, rtol=0, atol=0)), (
                op, dtype, n, out[:8], ref[:8])


def test_in_place_accumulate_and_dispatch_name() -> None:
    a = torch.arange(1000, dtype=torch.float32)
    b = torch.ones(1000, dtype=torch.float32)
    _C.reduce_kernel("SUM", a, a, b)
    assert torch.equal(a, torch.arange(1000, dtype=torch.float32) + 1)
    assert _C.reduce_isa() in ("avx512+bf16", "avx512", "avx2", "baseline")
    # What ringpg dispatches to is the best copy this CPU runs; baseline always runs.
    assert _C.reduce_isas()[0] == _C.reduce_isa() and _C.reduce_isas()[-1] == "baseline"
    with pytest.raises(RuntimeError, match="cannot run on this CPU"):
        _C.reduce_kernel("SUM", a, a, b, isa="sse9")


def test_unsupported_pairs_are_refused() -> None:
    a = torch.ones(4)
    with pytest.raises(RuntimeError):
        _C.reduce_kernel("BAND", a, a, a)


def test_reduce_isa_setting_pins_a_copy_or_is_refused() -> None:
    """RINGPG_REDUCE_ISA picks the copy ringpg dispatches to; one the CPU cannot run is
    refused with the choices, at the first use (a group's creation)."""
    probe = "import ringpg._C as c; print(c.reduce_isa())"
    for isa in _C.reduce_isas():
        env = dict(os.environ, RINGPG_REDUCE_ISA=isa)
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == isa, out.stderr
    env = dict(os.environ, RINGPG_REDUCE_ISA="sse9")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "RINGPG_REDUCE_ISA=sse9 cannot run on this CPU" in out.stderr, out.stderr
    assert "baseline" in out.stderr
