"""Load the compiled extension, refusing a build made for another torch.

c10d's ``Backend`` and ``Work`` class layouts change between torch releases, so an
extension compiled against one torch can crash under another.  The version it was
built for is recorded by setup.py in ``_build_config.py``; it is compared with the
running torch *before* the shared object is loaded.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import sys
import types
import urllib.parse
from typing import Dict, Optional, Tuple

import torch

from ._features import FEATURES, install


class RingpgBuildMismatch(ImportError):
    """The compiled extension was built for a different torch than the one running."""


def _strip_local(version: str) -> str:
    return version.split("+", 1)[0]


def fix_command(
    version: str, wheelhouse: Optional[str], source: Optional[Tuple[str, bool]] = None, python: str = sys.executable
) -> str:
    """The command that replaces this ringpg with a build for the running torch.

    A wheel of ``scripts/build_wheels.sh`` (``wheelhouse`` set) is replaced from its
    wheelhouse by any other ringpg there: with pip held to the wheelhouse (``--no-index``) it
    cannot swap torch, so the only candidates it can install are the wheel built for the
    running torch and Python, else the sdist, compiled against that torch.  A source build
    is rebuilt from its checkout (``source``: the path, and whether the install is editable,
    from pip's direct_url.json), else from wherever the user keeps it.  ``python``: the
    interpreter of the environment to fix, this one.
    """
    pip = f"{shlex.quote(python)} -m pip install --no-build-isolation"
    if wheelhouse:
        return f"{pip} --no-index --find-links {shlex.quote(wheelhouse)} {shlex.quote('ringpg!=' + version)}"
    if source is not None:
        path, editable = source
        return (
            f"{pip} --no-deps -e {shlex.quote(path)}"
            if editable
            else f"{pip} --no-deps --force-reinstall {shlex.quote(path)}"
        )
    return f"{pip} --no-deps --force-reinstall ."


def mismatch_message(version: str, built_for: str, running: str, fix: str) -> str:
    """One sentence: both torches and the command that fixes it."""
    return (
        f"ringpg{' ' + version if version else ''} was compiled against torch {built_for} but torch {running} is running "
        f"(c10d's class layouts differ between releases), so it cannot serve a group: fix it with `{fix}`"
        + (" in ringpg's source checkout" if fix.endswith(" .") else "")
    )


def check_torch_version(built_for: str, running: str, version: str = "", fix: Optional[str] = None) -> None:
    """Raise RingpgBuildMismatch unless ``built_for`` and ``running`` share a release."""
    if _strip_local(built_for) != _strip_local(running):
        raise RingpgBuildMismatch(mismatch_message(version, built_for, running, fix or fix_command(version, None)))


def _source_install() -> Optional[Tuple[str, bool]]:
    """Where this source build was installed from (pip's direct_url.json), if it is this package."""
    try:
        dist = importlib.metadata.distribution("ringpg")
        info = json.loads(dist.read_text("direct_url.json") or "null")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    if not info or not str(info.get("url", "")).startswith("file://"):
        return None
    path = urllib.parse.unquote(urllib.parse.urlparse(info["url"]).path)
    here = os.path.dirname(os.path.realpath(__file__))
    editable = bool(info.get("dir_info", {}).get("editable"))
    # The metadata must describe the ringpg that is running, not another one on sys.path.
    if editable and not here.startswith(os.path.realpath(path) + os.sep):
        return None
    if not editable and os.path.realpath(str(dist.locate_file("ringpg"))) != here:
        return None
    return path, editable


def load_extension() -> types.ModuleType:
    """Return ``ringpg._C`` after checking it matches the running torch."""
    try:
        from . import _build_config
    except ImportError as e:  # pragma: no cover - only a broken install gets here
        raise RingpgBuildMismatch(
            "ringpg's build record is missing: the C++ extension was never built. Install with: "
            "pip install --no-build-isolation ."
        ) from e
    built_for = _build_config.TORCH_VERSION
    if _strip_local(built_for) != _strip_local(torch.__version__):
        version = getattr(_build_config, "VERSION", "")
        wheelhouse = getattr(_build_config, "WHEELHOUSE", None)
        fix = fix_command(version, wheelhouse, None if wheelhouse else _source_install())
        check_torch_version(built_for, torch.__version__, version, fix)
    import torch.distributed as _dist  # noqa: F401  (registers the c10d pybind base classes)

    from . import _C

    install(_C.RingBackend)
    return _C


def features() -> Dict[str, bool]:
    """Which of ringpg's torch-dependent features this build carries (_features.FEATURES)."""
    compiled = load_extension().torch_compat()
    return {name: bool(compiled[f.compat_flag]) for name, f in FEATURES.items()}
