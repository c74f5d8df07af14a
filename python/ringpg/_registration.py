"""Register the ``ringpg`` backend with torch.distributed (extended creator API).

The creator receives torch's ``_DistributedBackendOptions`` (store, group_rank,
group_size, timeout, group_id, global_ranks_in_group) and returns the C++
``RingBackend``; torch calls it once per process group, subgroups included.
"""
from __future__ import annotations

from typing import Any

import torch.distributed as dist

BACKEND_NAME = "ringpg"


def _create_backend(dist_backend_opts: Any, pg_options: Any = None) -> Any:
    """Extended-API creator: build one RingBackend serving cpu and cuda tensors."""
    from ._loader import load_extension

    _C = load_extension()
    return _C.RingBackend(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        dist_backend_opts.timeout,
        str(dist_backend_opts.group_id),
    )


def is_registered() -> bool:
    return hasattr(dist.Backend, BACKEND_NAME.upper())


def register() -> None:
    """Register "ringpg" once per process; repeated calls are no-ops."""
    if is_registered():
        return
    dist.Backend.register_backend(
        BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"]
    )
