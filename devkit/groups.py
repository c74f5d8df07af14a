"""What a live process group says about itself: the rank a rooted op names, and, for
ringpg's groups, its transport, algorithm and same-host copy (``ringpg.backend(g)``).
Shared by the tests (``tests/harness``) and the benchmarks."""

from __future__ import annotations

from typing import Any, Optional

import torch.distributed as dist


def global_rank(group: Any, group_rank: int) -> int:
    """Global rank of ``group_rank`` in ``group`` (what ``src``/``dst`` of a rooted op name)."""
    if group is None or group is dist.group.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


def _ringpg_says(group: Any, device: str, attr: str) -> Optional[str]:
    """Attribute ``attr`` of a live ringpg group's backend; None for other backends, or
    where ringpg is absent or cannot load."""
    try:
        import ringpg  # type: ignore[import-not-found]

        b = ringpg.backend(group, device)
    except Exception:  # noqa: BLE001 - ringpg absent or unloadable: not a ringpg group
        return None
    return getattr(b, attr) if b is not None else None


def transport_of(group: Any, device: str = "cpu") -> Optional[str]:
    """How a live group moves its ring traffic, for backends that say (ringpg: "shm",
    "shm+tcp", "tcp" or "gloo"); None for other backends, or where ringpg is absent or cannot load."""
    return _ringpg_says(group, device, "transport")


def algorithm_of(group: Any, device: str = "cpu") -> Optional[str]:
    """What a live group's allreduce, reduce-scatter and all-gather run, for backends that
    say (ringpg: "arena", "hier" or "ring"); None for other backends."""
    return _ringpg_says(group, device, "allreduce_algorithm")


def algorithm_for(group: Any, op: str, nbytes: int, device: str = "cpu") -> Optional[str]:
    """What a live group runs for collective ``op`` (ringpg's name: "allreduce",
    "reduce_scatter", "all_gather", "broadcast", "all_to_all", ...) on ``nbytes`` of
    contiguous tensors on ``device`` (reduce_scatter's input, all_gather's output), for
    backends that say (ringpg's ``algorithm_for``: "oneshot", "pair", "ring", "arena",
    "staged_ring", ...); None for other backends."""
    try:
        import ringpg  # type: ignore[import-not-found]

        b = ringpg.backend(group, "cpu")
    except Exception:  # noqa: BLE001 - ringpg absent or unloadable: not a ringpg group
        return None
    if b is None:
        return None
    return b.algorithm_for(op, nbytes) if device == "cpu" else b.algorithm_for(op, nbytes, device)


def copy_of(group: Any, device: str = "cpu") -> Optional[str]:
    """How a live ringpg group moves large same-host messages, with what it measured to
    choose: "cma", "slots" or "slots+cma" (by op size class), followed by
    "(measured:cma=X/Yus,slots=Z/Wus)" (warm/cold, ``same_host_copy_probe``) where it
    measured; None for other backends and groups with no same-host link."""
    copy = _ringpg_says(group, device, "same_host_copy")
    if not copy:
        return None
    probe = _ringpg_says(group, device, "same_host_copy_probe")
    if probe is None:
        return copy
    cma = f"{probe['cma_us']:.0f}/{probe['cold_cma_us']:.0f}"
    slots = f"{probe['slots_us']:.0f}/{probe['cold_slots_us']:.0f}"
    return f"{copy}(measured:cma={cma}us,slots={slots}us)"
