"""Register the ``ringpg`` backend with torch.distributed (extended creator API).

The creator receives torch's ``_DistributedBackendOptions`` (store, group_rank,
group_size, timeout, group_id, global_ranks_in_group) and returns the C++
``RingBackend``; torch calls it once per process group, subgroups included.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Iterator, Optional

import torch.distributed as dist

BACKEND_NAME = "ringpg"


def _agree_on_transport(store: Any, rank: int, size: int, choice: str, timeout: Any) -> None:
    """Refuse, on every rank, a group whose ranks disagree about Gloo's pairs.

    ``auto`` and ``tcp`` mix (the whole group then stays on TCP), but a Gloo link needs
    its ProcessGroupGloo on every rank: one rank alone would wait for the others until
    the timeout.  Each rank publishes its choice through the group's store first.
    """
    store.set(f"{_CHOICE_KEY}/{rank}", choice)
    keys = [f"{_CHOICE_KEY}/{r}" for r in range(size)]
    store.wait(keys, timeout)
    choices = [store.get(k).decode() for k in keys]
    if "gloo" in choices and any(c != "gloo" for c in choices):
        # Every rank raises, so the store's host may soon be gone: leave once all have read.
        # (A store gone meanwhile means its host has read and left: the verdict stands.)
        read_key = f"{_CHOICE_KEY}/read"
        end = time.monotonic() + timeout.total_seconds()
        try:
            store.add(read_key, 1)
            while store.add(read_key, 0) < size and time.monotonic() < end:
                time.sleep(0.01)
        except dist.DistError:
            pass
        listed = ", ".join(f"rank {r}: {c}" for r, c in enumerate(choices))
        raise ValueError(
            f"ringpg: the ranks of a group disagree on RINGPG_TRANSPORT ({listed}); "
            "gloo must be set on every rank or on none"
        )


_CHOICE_KEY = "ringpg_transport_choice"


TRANSPORTS = ("auto", "tcp", "gloo")
_transport_override: Optional[str] = None


@contextmanager
def use_transport(name: str) -> Iterator[None]:
    """Groups of ringpg created inside the block use transport ``name`` (``auto``,
    ``tcp`` or ``gloo``), whatever ``RINGPG_TRANSPORT`` says; every rank must create
    them alike.  For comparing transports in one job (the benchmark's ``ringpg@gloo``)::

        with ringpg.use_transport("gloo"):
            g = dist.new_group(backend="ringpg")
    """
    global _transport_override
    if name not in TRANSPORTS:
        raise ValueError(f"ringpg: transport {name!r} is not one of {', '.join(TRANSPORTS)}")
    before, _transport_override = _transport_override, name
    try:
        yield
    finally:
        _transport_override = before


def new_ring_backend(store: Any, rank: int, size: int, timeout: timedelta, group_name: str) -> Any:
    """One C++ ``RingBackend`` of ``size`` ranks on ``store`` (every rank calls it alike).

    With ``RINGPG_TRANSPORT=gloo`` (or :func:`use_transport`) the collectives' data move
    over Gloo's TCP pairs: a ProcessGroupGloo of the same ranks, on its own prefix of
    the group's store (it honours ``GLOO_SOCKET_IFNAME``), is handed to the C++
    backend as its link.
    """
    from ._loader import load_extension

    _C = load_extension()
    choice = _transport_override or _C.transport_setting()
    gloo = None
    if size > 1:
        _agree_on_transport(store, rank, size, choice, timeout)
    if choice == "gloo":
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("ringpg_gloo_link/", store), rank, size, timeout)
    return _C.RingBackend(store, rank, size, timeout, group_name, transport=choice, gloo=gloo)


def _create_backend(dist_backend_opts: Any, pg_options: Any = None) -> Any:
    """Extended-API creator: build one RingBackend serving cpu and cuda tensors."""
    o = dist_backend_opts
    return new_ring_backend(o.store, o.group_rank, o.group_size, o.timeout, str(o.group_id))


def is_registered() -> bool:
    return hasattr(dist.Backend, BACKEND_NAME.upper())


def register() -> None:
    """Register "ringpg" once per process; repeated calls are no-ops."""
    if is_registered():
        return
    dist.Backend.register_backend(
        BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"]
    )
