"""ringpg's vectorized reduction kernels against torch's own element-wise ops.

Every dtype x op the kernels implement is compared on random data of awkward
lengths (vector-tail handling) with torch as the reference: exact for integers,
bool and fp32/fp64 (same single operation), and for fp16/bf16 exact as well, since
both widen to fp32, combine once and round once to nearest-even.  Each compiled copy
of the kernels this CPU can run (x86-64: AVX-512 with and without the bf16 converter,
AVX2, baseline; aarch64: SVE, NEON, baseline) is tested by name, not only the one
ringpg dispatches to.

Under emulation (scripts/test_aarch64.sh) two variables adapt the tests:
``RINGPG_TEST_PYTHON`` is the command that starts this Python in a child process (the
emulator in front of it, as a child cannot exec a foreign binary by itself), and
``RINGPG_TEST_EXPECT_ISAS`` the copies the emulated CPU must be found to run.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from typing import Any

import pytest
import torch
from harness.processes import worker_context

_C = pytest.importorskip("ringpg._C")

INT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
LENGTHS = [0, 1, 7, 31, 64, 1000, 4099]
ISA_NAMES = ("avx512+bf16", "avx512", "avx2", "sve", "neon", "baseline")


def _python_cmd() -> list[str]:
    """How to start this Python in a child process."""
    cmd = os.environ.get("RINGPG_TEST_PYTHON")
    return shlex.split(cmd) if cmd else [sys.executable]


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
    if dtype == torch.uint64:
        return _uint64_data(n, seed, g)
    info = torch.iinfo(dtype)
    # Signed int64 stays within +-2**62 so that SUM cannot overflow (undefined in C++).
    lo, hi = max(info.min, -(2**62)), min(info.max, 2**62)
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


def _uint64_data(n: int, seed: int, g: torch.Generator) -> torch.Tensor:
    """uint64 over its whole range (wrap-around is defined for unsigned), with pairs that
    only an unsigned 64-bit comparison orders right: across 2**63, where a signed view
    flips the order, and neighbours above 2**53, which a float64 view cannot tell apart."""
    bits = torch.randint(-(2**63), 2**63 - 1, (n,), generator=g, dtype=torch.int64)
    # (seed 1, seed 2) values as int64 bit patterns: 2**64-2 vs 2**64-1, 2**63 vs
    # 2**63+1, 2**63-1 vs 2**63, 2**60+1 vs 2**60, and the extremes 0 vs 2**64-1.
    edges = [(-2, -1), (-(2**63), -(2**63) + 1), (2**63 - 1, -(2**63)), (2**60 + 1, 2**60), (0, -1)]
    for i, pair in enumerate(edges):
        if 5 + 9 * i < n:
            bits[5 + 9 * i] = pair[seed - 1]
    return bits.view(torch.uint64)


def _reference(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype == torch.bool:
        return {"SUM": a | b, "MAX": a | b, "BOR": a | b, "PRODUCT": a & b, "MIN": a & b, "BAND": a & b, "BXOR": a ^ b}[
            op
        ]
    if a.dtype == torch.uint64:
        return _uint64_reference(op, a, b)
    wide = a.dtype in (torch.uint16, torch.uint32)
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
    return r.to(a.dtype)


def _uint64_reference(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """uint64 through its int64 bit pattern: SUM, PRODUCT and the bitwise ops are the same
    bits modulo 2**64; for MIN/MAX, flipping the top bit maps unsigned order onto signed
    order exactly (no float64 rounding)."""
    x, y = a.view(torch.int64), b.view(torch.int64)
    if op in ("MIN", "MAX"):
        top = torch.tensor(-(2**63), dtype=torch.int64)
        a_first = ((x ^ top) < (y ^ top)) == (op == "MIN")
        return torch.where(a_first, x, y).view(torch.uint64)
    r = {"SUM": x + y, "PRODUCT": x * y, "BAND": x & y, "BOR": x | y, "BXOR": x ^ y}[op]
    return r.view(torch.uint64)


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
            assert (
                torch.equal(out.view(torch.uint8), ref.view(torch.uint8))
                or torch.equal(out, ref)
                or (
                    dtype.is_floating_point
                    and torch.allclose(out.double(), ref.double(), equal_nan=True, rtol=0, atol=0)
                )
            ), (op, dtype, n, out[:8], ref[:8])


def test_in_place_accumulate_and_dispatch_name() -> None:
    a = torch.arange(1000, dtype=torch.float32)
    b = torch.ones(1000, dtype=torch.float32)
    _C.reduce_kernel("SUM", a, a, b)
    assert torch.equal(a, torch.arange(1000, dtype=torch.float32) + 1)
    assert _C.reduce_isa() in ISA_NAMES
    # What ringpg dispatches to is the best copy this CPU runs; baseline always runs.
    assert _C.reduce_isas()[0] == _C.reduce_isa() and _C.reduce_isas()[-1] == "baseline"
    with pytest.raises(RuntimeError, match="cannot run on this CPU"):
        _C.reduce_kernel("SUM", a, a, b, isa="sse9")


def test_unsupported_pairs_are_refused() -> None:
    a = torch.ones(4)
    with pytest.raises(RuntimeError):
        _C.reduce_kernel("BAND", a, a, a)


def _isa_in_fresh_process(setting: str, out: Any) -> None:
    """In a process that has not loaded ringpg yet: what RINGPG_REDUCE_ISA=setting gives."""
    os.environ["RINGPG_REDUCE_ISA"] = setting
    try:
        import ringpg._C as c

        out.put((setting, True, c.reduce_isa()))
    except Exception as e:  # noqa: BLE001 - the refusal is what the test reads
        out.put((setting, False, str(e)))


def _isas_chosen(settings: list[str]) -> dict[str, tuple[bool, str]]:
    """RINGPG_REDUCE_ISA is read once per process, so each setting needs a process of
    its own: forked from the harness's server, which has torch loaded and not ringpg
    (milliseconds each, where a fresh interpreter costs seconds), or, under emulation
    (RINGPG_TEST_PYTHON), interpreters started together."""
    if os.environ.get("RINGPG_TEST_PYTHON"):
        probe = "import ringpg._C as c; print(c.reduce_isa())"
        procs = {
            s: subprocess.Popen(
                [*_python_cmd(), "-c", probe],
                env=dict(os.environ, RINGPG_REDUCE_ISA=s),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for s in settings
        }
        got = {}
        for s, p in procs.items():
            stdout, stderr = p.communicate(timeout=300)
            got[s] = (p.returncode == 0, stdout.strip() if p.returncode == 0 else stderr)
        return got
    ctx = worker_context()
    q = ctx.Queue()
    procs = [ctx.Process(target=_isa_in_fresh_process, args=(s, q)) for s in settings]
    for p in procs:
        p.start()
    try:
        return {s: (ok, what) for s, ok, what in (q.get(timeout=120) for _ in procs)}
    finally:
        for p in procs:
            p.join(timeout=10)


def test_reduce_isa_setting_pins_a_copy_or_is_refused() -> None:
    """RINGPG_REDUCE_ISA picks the copy ringpg dispatches to; one the CPU cannot run is
    refused with the choices, at the first use (a group's creation)."""
    got = _isas_chosen([*_C.reduce_isas(), "sse9"])
    for isa in _C.reduce_isas():
        assert got[isa] == (True, isa), (isa, got[isa])
    ok, why = got["sse9"]
    assert not ok and "RINGPG_REDUCE_ISA=sse9 cannot run on this CPU" in why, why
    assert "baseline" in why


def test_copies_found_for_this_cpu() -> None:
    """The copies the CPU runs, as its architecture makes them: on aarch64 NEON always
    (Advanced SIMD is part of the base ISA) and SVE where the kernel reports it
    (HWCAP_SVE); under emulation exactly those the emulated CPU offers."""
    isas = _C.reduce_isas()
    assert set(isas) <= set(ISA_NAMES) and isas[-1] == "baseline", isas
    expected = os.environ.get("RINGPG_TEST_EXPECT_ISAS")
    if expected:
        assert isas == expected.split(","), (isas, expected)
    if os.uname().machine == "aarch64":
        assert isas[-2:] == ["neon", "baseline"] and not any(i.startswith("avx") for i in isas), isas
    elif os.uname().machine == "x86_64":
        assert not {"sve", "neon"} & set(isas), isas
