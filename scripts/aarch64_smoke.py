"""One rank of the aarch64 smoke run: ringpg's collectives against gloo's, in one process.

scripts/test_aarch64.sh starts every rank of a group under qemu-user in an arm64 root
filesystem (a child of an emulated process cannot exec a foreign binary, so the ranks
are started from the host, each with RANK, WORLD_SIZE and MASTER_PORT in its
environment, and rendezvous over tcp://127.0.0.1).  Each rank runs all_reduce,
reduce_scatter_tensor and all_gather_into_tensor on the default group (ringpg, on the
transport RINGPG_TRANSPORT names) and the same op on a gloo group of the same ranks,
for every dtype and ReduceOp ringpg's reduction kernels serve, and compares the two
exactly (tests/harness/surface.ref_reduce: gloo where gloo has the reduction, else a gloo
all-gather of the bytes and a local reduction).  Inputs are small integers (every
reduction exact in every dtype, in any order), plus, at two ranks, random floats:
there each element is one operation of two operands, whatever the order, so the
results must be equal bit for bit too.

Prints one line per rank (checks, failures, seconds) and exits 1 on any failure.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (os.path.join(ROOT, "python"), ROOT, os.path.join(ROOT, "tests")):
    sys.path.insert(0, path)

import ringpg  # noqa: E402
import ringpg._C  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from harness import Checker, data_kind, dtype_name, make_random_float, rank_block  # noqa: E402
from harness.surface import (  # noqa: E402
    BITWISE_OPS,
    FLOAT_DTYPES,
    INT_DTYPES,
    check_bits,
    gather_raw,
    random_raw,
    ref_reduce,
    small_ints,
)

from devkit.groups import transport_of  # noqa: E402

# Per-rank block sizes: one element, a short vector with a tail, and a buffer that the
# ring moves in several segments (tuning key segment_bytes, set small by the launcher).
BLOCK_NUMELS = (1, 257, 40003)
ARITH_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")


def ops_of(dtype: torch.dtype) -> tuple[str, ...]:
    if dtype == torch.bool:
        return ("SUM", "PRODUCT", "MIN", "MAX", *BITWISE_OPS)
    if dtype.is_floating_point:
        return ARITH_OPS
    return (*ARITH_OPS, *BITWISE_OPS)


def make_input(rank: int, case: str, n: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    if dtype == torch.bool:
        return random_raw(rank, case, (n,), dtype)
    return small_ints(rank, case, (n,), dtype, data_kind(op))


def check_reducing(chk: Checker, ref: Any, case: str, x: torch.Tensor, op: str) -> None:
    """all_reduce and reduce_scatter_tensor of x (ws blocks) on ringpg vs the gloo reference."""
    full = ref_reduce(x, op, ref)
    got = x.clone()
    dist.all_reduce(got, op=getattr(dist.ReduceOp, op))
    check_bits(chk, f"all_reduce {case}", got, full)
    ws = dist.get_world_size()
    out = torch.empty(x.numel() // ws, dtype=x.dtype)
    dist.reduce_scatter_tensor(out, x.clone(), op=getattr(dist.ReduceOp, op))
    check_bits(chk, f"reduce_scatter_tensor {case}", out, rank_block(full, ref))


def run(rank: int, ws: int, ref: Any) -> Checker:
    chk = Checker(rank)
    for dtype in (*FLOAT_DTYPES, *INT_DTYPES, torch.bool):
        for n in BLOCK_NUMELS:
            tag = f"dtype={dtype_name(dtype)} ws={ws} numel={ws * n}"
            for op in ops_of(dtype):
                case = f"op={op} {tag}"
                check_reducing(chk, ref, case, make_input(rank, case, ws * n, dtype, op), op)
            case = f"all_gather_into_tensor {tag}"
            x = make_input(rank, case, n, dtype, "SUM")
            out = torch.empty(ws * n, dtype=dtype)
            dist.all_gather_into_tensor(out, x)
            check_bits(chk, case, out, gather_raw(x, ref).reshape(-1))
        if dtype.is_floating_point:
            # PREMUL_SUM: the factor scales each rank's input before the SUM.
            for n in BLOCK_NUMELS:
                case = f"op=PREMUL_SUM(0.5) dtype={dtype_name(dtype)} ws={ws} numel={ws * n}"
                x = small_ints(rank, case, (ws * n,), dtype)
                got = x.clone()
                dist.all_reduce(got, op=dist._make_nccl_premul_sum(0.5))
                check_bits(chk, f"all_reduce {case}", got, ref_reduce(x * 0.5, "SUM", ref))
        if dtype.is_floating_point and ws == 2:
            # Random floats: one rounding per element at two ranks, so gloo must agree
            # bit for bit (NaN-free: gloo's MIN/MAX need not keep NaN as torch does).
            for op in ("SUM", "PRODUCT", "MIN", "MAX"):
                for n in BLOCK_NUMELS:
                    case = f"op={op} random dtype={dtype_name(dtype)} ws={ws} numel={ws * n}"
                    x = make_random_float(rank, case, (ws * n,), dtype, "product" if op == "PRODUCT" else "normal")
                    check_reducing(chk, ref, case, x, op)
    return chk


def main() -> int:
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    want = os.environ.get("RINGPG_TRANSPORT", "auto")
    dist.init_process_group(
        "ringpg",
        rank=rank,
        world_size=ws,
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        timeout=timedelta(seconds=600),
    )
    ref = dist.new_group(backend="gloo")
    t0 = time.monotonic()
    chk = run(rank, ws, ref)
    chk.true("transport", transport_of(None) == want, f"{transport_of(None)!r}, wanted {want!r}")
    dist.barrier(ref)
    seconds = time.monotonic() - t0
    dist.destroy_process_group()
    print(
        f"aarch64 smoke rank {rank}/{ws} transport={want} isa={ringpg._C.reduce_isa()} "
        f"checks={chk.n_checks} failed={len(chk.failures)} ({seconds:.1f} s)",
        flush=True,
    )
    for line in chk.failures[:20]:
        print("  " + line, flush=True)
    return 1 if chk.failures else 0


if __name__ == "__main__":
    sys.exit(main())
