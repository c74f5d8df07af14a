"""Load the compiled extension, refusing a build made for another torch.

c10d's ``Backend`` and ``Work`` class layouts change between torch releases, so an
extension compiled against one torch can crash under another.  The version it was
built for is recorded by setup.py in ``_build_config.py``; it is compared with the
running torch *before* the shared object is loaded.
"""

from __future__ import annotations

import types
from typing import Dict

import torch

from ._features import FEATURES, install


class RingpgBuildMismatch(ImportError):
    """The compiled extension was built for a different torch than the one running."""


def _strip_local(version: str) -> str:
    return version.split("+", 1)[0]


def check_torch_version(built_for: str, running: str) -> None:
    """Raise RingpgBuildMismatch unless ``built_for`` and ``running`` share a release."""
    if _strip_local(built_for) != _strip_local(running):
        raise RingpgBuildMismatch(
            f"ringpg was compiled against torch {built_for} but torch {running} is installed; "
            "c10d's class layouts differ between releases. Rebuild it from the ringpg source "
            "checkout with: pip install --no-build-isolation --force-reinstall --no-deps ."
        )


def load_extension() -> types.ModuleType:
    """Return ``ringpg._C`` after checking it matches the running torch."""
    try:
        from . import _build_config
    except ImportError as e:  # pragma: no cover - only a broken install gets here
        raise RingpgBuildMismatch(
            "ringpg's build record is missing: the C++ extension was never built. Install with: "
            "pip install --no-build-isolation ."
        ) from e
    check_torch_version(_build_config.TORCH_VERSION, torch.__version__)
    import torch.distributed as _dist  # noqa: F401  (registers the c10d pybind base classes)

    from . import _C

    install(_C.RingBackend)
    return _C


def features() -> Dict[str, bool]:
    """Which of ringpg's torch-dependent features this build carries (_features.FEATURES)."""
    compiled = load_extension().torch_compat()
    return {name: bool(compiled[f.compat_flag]) for name, f in FEATURES.items()}
