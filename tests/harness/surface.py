"""Helpers of the API-surface and integration tests: data, references and checks that
the rest of :mod:`harness` does not give.

(Their worker pools, one per world size for the whole session, are conftest's
``shared_pool`` fixture.)

* raw-byte data and comparisons for dtypes gloo cannot move or reduce
  (:func:`random_raw`, :func:`raw_bytes`, :func:`check_bits`);
* :func:`ref_reduce`, a reduction reference for every (dtype, ReduceOp) pair ringpg
  accepts, computed with gloo where gloo has the reduction and otherwise from a
  gloo all-gather of the raw bytes followed by a single-process reduction;
* :func:`guarded`, which turns an exception raised by one case into a recorded
  failure, so the rest of a battery still runs and is reported.

What gloo lacks (for runs that substitute it for ringpg) is in the one registry,
:mod:`harness.gloo_gaps`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, TypeVar

import torch
import torch.distributed as dist

from .checking import Checker, CheckReport
from .data import DTYPES, case_seed, make_data
from .references import divide_by_world, ref_all_reduce

T = TypeVar("T")

BITWISE_OPS: tuple[str, ...] = ("BAND", "BOR", "BXOR")
# Integer dtypes ringpg reduces but gloo has no kernel (or transport) for.
WIDE_INT_DTYPES: tuple[torch.dtype, ...] = (torch.int16, torch.uint16, torch.uint32, torch.uint64)
INT_DTYPES: tuple[torch.dtype, ...] = (
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
)
FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# Dtypes that non-reducing collectives must move as raw bytes.
RAW_DTYPES: tuple[torch.dtype, ...] = (
    torch.int16,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.complex64,
    torch.bool,
)


# ------------------------------------------------------------------------ data


def random_raw(rank: int, case: str, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Deterministic random bit patterns of ``dtype`` (every byte random; bool as 0/1).

    Floating dtypes may hold NaNs and infinities: compare with :func:`check_bits`.
    """
    g = torch.Generator().manual_seed(case_seed(rank, case))
    numel = 1
    for s in shape:
        numel *= int(s)
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=g).to(torch.bool)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (numel * itemsize,), generator=g, dtype=torch.int64).to(torch.uint8)
    return raw.view(dtype).reshape(tuple(shape))


def small_ints(rank: int, case: str, shape: Sequence[int], dtype: torch.dtype, kind: str = "small") -> torch.Tensor:
    """harness.make_data for any integer dtype: unsigned dtypes get uint8's non-negative values."""
    unsigned = dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64)
    base = make_data(rank, case, shape, torch.uint8 if unsigned else torch.int64, kind)
    return base.to(dtype)


def small_complex(rank: int, case: str, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Complex tensor with small-integer real and imaginary parts (exact sums)."""
    real_dtype = torch.float32 if dtype == torch.complex64 else torch.float64
    re = make_data(rank, case + " re", shape, real_dtype)
    im = make_data(rank, case + " im", shape, real_dtype)
    return torch.complex(re, im)


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` (row-major), as a flat uint8 tensor."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def check_bits(chk: Checker, what: str, got: Any, expected: torch.Tensor) -> bool:
    """Bitwise comparison (dtype, shape, then every byte); NaN payloads must survive too."""
    if not isinstance(got, torch.Tensor) or got.dtype != expected.dtype or got.shape != expected.shape:
        return chk.equal(what, got, expected)  # records the dtype/shape mismatch
    return chk.equal(what + " [bytes]", raw_bytes(got), raw_bytes(expected))


# ------------------------------------------------------------------- references


def gather_raw(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's ``x`` stacked on a new dim 0, moved as bytes by a gloo all-gather.

    Works for any dtype (gloo moves uint8), so it is the transport of last resort
    for references on dtypes gloo cannot handle.
    """
    ws = dist.get_world_size(group)
    mine = raw_bytes(x)
    out = torch.empty(ws * mine.numel(), dtype=torch.uint8)
    dist.all_gather_into_tensor(out, mine, group=group)
    return out.view(x.dtype).reshape(ws, *x.shape)


def local_reduce(stack: torch.Tensor, op: str) -> torch.Tensor:
    """Reduce ``stack`` over dim 0 with ``op``, with torch's semantics, in a single process.

    SUM, PRODUCT and AVG are evaluated in int64 (float64 for floating dtypes) and
    cast back; callers keep values small enough for that to be exact.  AVG on
    integers truncates toward zero, as harness.divide_by_world does.
    """
    n = stack.shape[0]
    if op in ("MIN", "MAX") and stack.dtype in UNSIGNED_AS_SIGNED:
        # torch 2.6 has no CPU minimum/maximum for uint16/32/64: flipping the sign bit maps
        # them onto the signed type of their width in order.
        signed = UNSIGNED_AS_SIGNED[stack.dtype]
        flip = torch.iinfo(signed).min
        return (local_reduce(stack.view(signed) ^ flip, op) ^ flip).view(stack.dtype)
    if op in BITWISE_OPS or op in ("MIN", "MAX"):
        fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = {
            "BAND": torch.bitwise_and,
            "BOR": torch.bitwise_or,
            "BXOR": torch.bitwise_xor,
            "MIN": torch.minimum,
            "MAX": torch.maximum,
        }[op]
        acc = stack[0].clone()
        for i in range(1, n):
            acc = fn(acc, stack[i])
        return acc
    wide = torch.float64 if stack.dtype.is_floating_point else torch.int64
    s = stack.to(wide)
    if op in ("SUM", "AVG"):
        red = s.sum(0)
        if op == "AVG":
            red = divide_by_world(red, n)
    elif op == "PRODUCT":
        red = s.prod(0)
    else:
        raise ValueError(f"no local reduction for {op!r}")
    return red.to(stack.dtype)


UNSIGNED_AS_SIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}

BOOL_AS_UINT8 = {
    "SUM": "MAX",
    "MAX": "MAX",
    "BOR": "MAX",
    "MIN": "MIN",
    "PRODUCT": "MIN",
    "BAND": "MIN",
    "BXOR": "BXOR",
}


def ref_reduce(x: torch.Tensor, op: str, ref_group: Any) -> torch.Tensor:
    """Reference all-reduce of ``x`` under ``op`` (a ReduceOp name), for any dtype ringpg reduces.

    * bool: gloo on 0/1 uint8 values (SUM/MAX/BOR = or = MAX, MIN/PRODUCT/BAND =
      and = MIN, BXOR = BXOR);
    * complex: gloo on ``view_as_real`` (SUM and AVG are componentwise);
    * gloo's dtypes (harness.DTYPES): harness.ref_all_reduce (gloo; AVG = SUM / n);
    * anything else: gloo all-gather of the bytes, then :func:`local_reduce`.
    """
    if x.dtype == torch.bool:
        return ref_all_reduce(x.to(torch.uint8), BOOL_AS_UINT8[op], ref_group).to(torch.bool)
    if x.dtype.is_complex:
        assert op in ("SUM", "AVG"), op
        return torch.view_as_complex(ref_all_reduce(torch.view_as_real(x).contiguous(), op, ref_group))
    if x.dtype in DTYPES:
        return ref_all_reduce(x, op, ref_group)
    return local_reduce(gather_raw(x, ref_group), op)


# --------------------------------------------------------------------- running


def error_text(e: BaseException, limit: int = 400) -> str:
    """Exception type and the start of its message, on one line."""
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg[:limit]}"


def guarded(chk: Checker, what: str, fn: Callable[[], T]) -> Optional[T]:
    """Run ``fn``; if it raises, record a failure naming ``what`` and return None.

    For batteries where every rank raises alike (argument validation): the ranks
    stay in step and the remaining cases still run.  End such a task with
    :func:`finish`, which notices a group the failure left broken.
    """
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - recorded as a failed check
        chk.true(f"{what}: raised", False, error_text(e))
        return None


class BrokenGroupError(RuntimeError):
    """A task's failures left the group under test unusable; the pool must restart."""


def finish(chk: Checker, group: Any, restart_on_failure: bool = False) -> CheckReport:
    """The task's report; if a check failed, first make sure ``group`` still works.

    A failure inside a collective can leave the group failed for good (every later
    op raises at once).  Then the workers must not serve further tasks: this raises
    :class:`BrokenGroupError` carrying every recorded failure, so the harness
    reports them and restarts the pool for the next test.  ``restart_on_failure``
    does the same after any failure, for cases where a wrong result may mean the
    backend wrote out of bounds (the process state is then suspect).
    """
    if not chk.failures:
        return chk.report()
    lines = "\n".join(chk.failures[:40])
    if restart_on_failure:
        raise BrokenGroupError(f"{len(chk.failures)} failed checks (workers restarted as a precaution):\n{lines}")
    try:
        probe = torch.ones(1)
        dist.all_reduce(probe, group=group)
    except Exception as e:  # noqa: BLE001
        raise BrokenGroupError(
            f"{len(chk.failures)} failed checks, after which the group no longer works ({error_text(e, 200)}):\n{lines}"
        ) from None
    return chk.report()
