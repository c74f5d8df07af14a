"""Running a battery on each of ringpg's transports: conftest's ``bpool`` fixture gives a
pool whose group runs on ``transport`` (a name of :data:`harness.TRANSPORT_ENVS`);
:func:`on_transports` parametrizes the tests that take it; a worker checks that its
group really runs there (:func:`check_transport`, :func:`transport_worker`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import pytest
import torch.distributed as dist

from devkit.groups import transport_of

from .backend import transport_expected
from .checking import Checker
from .processes import Groups


def on_transports(*transports: str, world_sizes: Sequence[int] = (2, 3)) -> Callable[[Any], Any]:
    """Parametrizes a test that takes ``bpool`` over ``world_sizes`` and ``transports``
    (module scope: pytest groups the tests by both, and each pool starts once)."""

    def mark(fn: Any) -> Any:
        fn = pytest.mark.parametrize("transport", transports, scope="module")(fn)
        return pytest.mark.parametrize("world_size", world_sizes, ids=lambda ws: f"ws{ws}", scope="module")(fn)

    return mark


def check_transport(chk: Checker, groups: Groups, transport: str) -> None:
    """The group under test really runs on ``transport`` (ringpg only; TRANSPORT_ENVS's
    name, whose links harness.transport_expected names)."""
    if groups.backend == "ringpg":
        got = transport_of(groups.test)
        want = transport_expected(transport, dist.get_world_size(groups.test))
        chk.true(f"group runs on {want}", got == want, f"got {got!r}")


def transport_worker(rank: int, ws: int, groups: Groups, args: Any) -> Optional[str]:
    """The transport of the group under test (None unless ringpg)."""
    return transport_of(groups.test) if groups.backend == "ringpg" else None


def a2a_split(src: int, dst: int, ws: int, numel: int) -> int:
    """Elements ``src`` sends ``dst`` in the unequal all_to_all_single (some zero)."""
    return (src + dst) % ws * numel // ws + dst
