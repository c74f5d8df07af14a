"""What a live ringpg group chose: the backend object behind a process group.

``ringpg.backend(group)`` returns the C++ ``RingBackend`` serving ``group`` (default:
the world group) for a device, so a script can read its choices::

    b = ringpg.backend()
    b.transport      # "shm" (all ranks on this host) or "tcp"
    b.wait_spin_us   # how long waits poll before sleeping (RINGPG_TUNING spin_us / auto)

It sees through torch's checking wrapper (``TORCH_DISTRIBUTED_DEBUG=DETAIL``) and
returns None for groups that ringpg does not serve on that device.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist


def backend(group: Optional[Any] = None, device: str = "cpu") -> Optional[Any]:
    """The ``RingBackend`` serving ``group``'s ``device`` tensors, or None."""
    from ._loader import load_extension

    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        return None
    try:
        b = pg._get_backend(torch.device(device))
    except (RuntimeError, ValueError):  # the group has no backend for that device
        return None
    while b is not None and not isinstance(b, load_extension().RingBackend) and hasattr(b, "wrapped_pg"):
        b = b.wrapped_pg
    return b if isinstance(b, load_extension().RingBackend) else None
