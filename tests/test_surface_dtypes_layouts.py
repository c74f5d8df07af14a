"""Raw-byte dtypes on the non-reducing collectives, and non-contiguous tensors.

Raw-byte dtypes (harness.surface.RAW_DTYPES: int16, uint16, uint32, uint64,
float8_e4m3fn, float8_e5m2, complex64, bool) must cross broadcast,
all_gather_into_tensor, gather, scatter, all_to_all_single and send/recv bit for
bit.  The data are random bytes (NaN and infinity patterns included for the
floating types), and every result is compared as bytes with what the sender sent,
which every rank can regenerate (harness.surface.random_raw).

Non-contiguous tensors (a transposed view, a strided 1-D slice, a column slice)
for all_reduce, broadcast, the input of all_gather_into_tensor and the output of
reduce_scatter_tensor: the result must equal gloo on a contiguous copy, and the
elements of the underlying storage outside the view must be left alone.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist
from harness import (
    Checker,
    CheckReport,
    Groups,
    WorkerPool,
    assert_reports_ok,
    dtype_name,
    known_gap,
    make_data,
    reduce_op,
    ref_all_gather,
    ref_all_reduce,
    ref_broadcast,
    ref_reduce_scatter,
    sentinel_like,
)
from harness.surface import (
    RAW_DTYPES,
    check_bits,
    finish,
    guarded,
    random_raw,
)

pytestmark = pytest.mark.parametrize("world_size", [2, 3], ids=lambda ws: f"ws{ws}", scope="module")

RAW_SHAPES = ((0,), (1001,), (3, 7))
GLOO_RAW_DTYPES = (torch.complex64, torch.bool)  # the RAW_DTYPES gloo itself can move


def _raw_dtypes(backend: str) -> tuple[torch.dtype, ...]:
    return GLOO_RAW_DTYPES if known_gap(backend, "raw dtypes") else RAW_DTYPES


def _zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An output buffer of zero bytes (any byte value could occur in random data)."""
    return torch.zeros(shape, dtype=dtype)


# ------------------------------------------------------------------ raw bytes


def raw_dtype_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """Every raw dtype x shape through each non-reducing collective, every root."""
    chk = Checker(rank)
    g = groups.test
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    for dtype in _raw_dtypes(groups.backend):
        for shape in RAW_SHAPES:
            tag = f"dtype={dtype_name(dtype)} ws={ws} shape={shape}"
            sent = lambda src, case, shp=shape: random_raw(src, case, shp, dtype)  # noqa: E731
            stacked = (shape[0] * ws, *shape[1:])

            for src in range(ws):
                case = f"broadcast {tag} src={src}"
                y = sent(rank, case)
                guarded(chk, case, lambda: dist.broadcast(y, src=src, group=g))
                check_bits(chk, case, y, sent(src, case))

            case = f"all_gather_into_tensor {tag}"
            out = _zeros(stacked, dtype)
            guarded(chk, case, lambda: dist.all_gather_into_tensor(out, sent(rank, case), group=g))
            check_bits(chk, case, out, torch.cat([sent(i, case) for i in range(ws)]))

            for root in range(ws):
                case = f"gather {tag} dst={root}"
                if dtype.is_complex and known_gap(groups.backend, "complex gather"):
                    continue
                outs = [_zeros(shape, dtype) for _ in range(ws)] if rank == root else None
                guarded(chk, case, lambda: dist.gather(sent(rank, case), outs, dst=root, group=g))
                for i, o in enumerate(outs or []):
                    check_bits(chk, f"{case} [from {i}]", o, sent(i, case))

                case = f"scatter {tag} src={root}"
                got = _zeros(shape, dtype)
                ins = [sent(rank, f"{case} [{i}]") for i in range(ws)] if rank == root else None
                guarded(chk, case, lambda: dist.scatter(got, ins, src=root, group=g))
                check_bits(chk, case, got, sent(root, f"{case} [{rank}]"))

            case = f"all_to_all_single {tag}"
            got = _zeros(stacked, dtype)
            guarded(chk, case, lambda: dist.all_to_all_single(got, sent(rank, case, stacked), group=g))
            expected = torch.cat(
                [sent(i, case, stacked).chunk(ws)[rank] if shape[0] else sent(i, case, stacked) for i in range(ws)]
            )
            check_bits(chk, case, got, expected)

            case = f"isend/recv ring {tag}"
            got = _zeros(shape, dtype)

            def ring() -> None:
                w = dist.isend(sent(rank, case), dst=nxt, group=g)
                dist.recv(got, src=prv, group=g)
                w.wait()

            guarded(chk, case, ring)
            check_bits(chk, case, got, sent(prv, case))
    return finish(chk, groups.test)


# ------------------------------------------------------------ non-contiguous

# name -> (shape of the contiguous base, how to take a non-contiguous view of it)
TRANSPOSED = "transposed (7,5).t()"  # dense, unlike the slices, which have gaps
LAYOUTS: dict[str, tuple[tuple[int, ...], Callable[[torch.Tensor], torch.Tensor]]] = {
    TRANSPOSED: ((7, 5), lambda b: b.t()),
    "strided slice (2001,)[::2]": ((2001,), lambda b: b[::2]),
    "column slice (6,9)[:, 1::3]": ((6, 9), lambda b: b[:, 1::3]),
}
LAYOUT_DTYPES = (torch.float32, torch.int64, torch.bfloat16)


def with_view_replaced(
    base: torch.Tensor, view_fn: Callable[[torch.Tensor], torch.Tensor], value: torch.Tensor
) -> torch.Tensor:
    """A copy of ``base`` whose view region holds ``value`` and is otherwise unchanged."""
    out = base.clone()
    view_fn(out).copy_(value)
    return out


def non_contiguous_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """Non-contiguous views in all_reduce, broadcast, all_gather_into_tensor (input) and
    reduce_scatter_tensor (output), compared with gloo on contiguous copies; the whole
    base storage is checked, so writes outside the view are caught too."""
    chk = Checker(rank)
    g = groups.test
    for (name, (base_shape, view_fn)), dtype in [(item, d) for item in LAYOUTS.items() for d in LAYOUT_DTYPES]:
        tag = f"layout={name} dtype={dtype_name(dtype)} ws={ws}"
        in_place = name == TRANSPOSED or not known_gap(groups.backend, "in-place collectives on views with gaps")
        for op in ("SUM", "MAX") if in_place else ():
            case = f"all_reduce op={op} {tag}"
            base = make_data(rank, case, base_shape, dtype)
            before, view = base.clone(), view_fn(base)
            expected = ref_all_reduce(view.contiguous(), op, groups.ref)
            guarded(chk, case, lambda: dist.all_reduce(view, op=reduce_op(op), group=g))
            chk.equal(case, view, expected)
            chk.equal(case + " [whole base]", base, with_view_replaced(before, view_fn, expected))

        for src in range(ws) if in_place else ():
            case = f"broadcast src={src} {tag}"
            base = make_data(rank, case, base_shape, dtype)
            before, view = base.clone(), view_fn(base)
            expected = ref_broadcast(view.contiguous(), src, groups.ref)
            guarded(chk, case, lambda: dist.broadcast(view, src=src, group=g))
            chk.equal(case, view, expected)
            chk.equal(case + " [whole base]", base, with_view_replaced(before, view_fn, expected))

        case = f"all_gather_into_tensor non-contiguous input {tag}"
        base = make_data(rank, case, base_shape, dtype)
        before, view = base.clone(), view_fn(base)
        out = sentinel_like((view.shape[0] * ws, *view.shape[1:]), dtype)
        guarded(chk, case, lambda: dist.all_gather_into_tensor(out, view, group=g))
        chk.equal(case, out, ref_all_gather(view.contiguous(), groups.ref))
        chk.equal(case + " [input untouched]", base, before)

        for op in ("SUM", "MAX"):
            case = f"reduce_scatter_tensor non-contiguous output op={op} {tag}"
            out_base = sentinel_like(base_shape, dtype)
            out = view_fn(out_base)
            x = make_data(rank, case, (out.shape[0] * ws, *out.shape[1:]), dtype)
            expected = ref_reduce_scatter(x, op, groups.ref)
            guarded(chk, case, lambda: dist.reduce_scatter_tensor(out, x, op=reduce_op(op), group=g))
            chk.equal(case, out, expected)
            chk.equal(
                case + " [whole output base]",
                out_base,
                with_view_replaced(sentinel_like(base_shape, dtype), view_fn, expected),
            )
    return finish(chk, groups.test)


# ------------------------------------------------------------------------ tests


def test_raw_byte_dtypes(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(raw_dtype_worker))


def test_non_contiguous(shared_pool: WorkerPool) -> None:
    assert_reports_ok(shared_pool.run(non_contiguous_worker))
