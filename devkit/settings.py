"""ringpg's expert setting as tests and benchmarks set and read it.

``RINGPG_TUNING`` holds comma-separated ``key=value`` items (docs/configuration.md,
"Expert tuning"); ringpg reads a repeated key's last value, so settings are added to an
environment by appending.  Values are read back through ringpg's own parser
(``ringpg._C.tuning``), never a second one here.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping, Union

TUNING = "RINGPG_TUNING"

Env = Union[Mapping[str, str], Iterable[tuple[str, str]]]


def tuning(**keys: object) -> tuple[str, str]:
    """The environment pair ``(RINGPG_TUNING, "k=v,...")`` that sets ``keys``."""
    return (TUNING, ",".join(f"{k}={v}" for k, v in keys.items()))


def merged_env(base: Mapping[str, str], env: Env) -> dict[str, str]:
    """``base`` updated by ``env`` (pairs or a mapping), except that RINGPG_TUNING values
    are joined rather than replaced, the later's keys winning as ringpg reads them."""
    out = dict(base)
    for k, v in env.items() if isinstance(env, Mapping) else env:
        out[k] = ",".join(x for x in (out.get(k, ""), v) if x) if k == TUNING else v
    return out


def with_tuning(env: Env, **keys: object) -> tuple[tuple[str, str], ...]:
    """``env`` as pairs with ``keys`` added to its RINGPG_TUNING."""
    return tuple(merged_env(merged_env({}, env), (tuning(**keys),)).items())


def tuning_value(key: str, env: Mapping[str, str] = os.environ) -> str:
    """The value a process with ``env`` runs tuning ``key`` with (its default where unset)."""
    from ringpg import _C

    return str(_C.tuning(env.get(TUNING, ""))[key])
