"""A fresh virtual environment that already has torch, in a second, for testing ringpg's wheels.

    python scripts/fresh_venv.py VENV [DIST ...]       (default DIST: torch)

creates VENV with the interpreter that runs this script and links into its
site-packages the installed distributions named (torch, say, and pytest), with every
distribution they require, from this interpreter's environment: symbolic links to
the packages and their ``.dist-info``, so pip in VENV sees them installed and
nothing of torch's gigabytes is copied.  Nothing else of this environment is
visible there (no ringpg of a checkout).  pip is linked too, so ``VENV/bin/python -m
pip`` works.  ``VENV/nocc-bin`` holds links to the system's programs (/usr/bin,
/bin, ...) but no compiler, no ninja and no ccache: ``PATH=VENV/bin:VENV/nocc-bin``
is a machine with no way to build ringpg, where only a wheel installs.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import re
import sys
import sysconfig
import venv
from typing import Dict, Iterable, List, Set, Tuple

SYSTEM_BIN = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# Compiler drivers, their target-prefixed and versioned names (x86_64-linux-gnu-g++-12),
# and what builds a C++ extension besides: ninja, ccache, nvcc.
COMPILER = re.compile(
    r"^([\w.]+-)?(cc|c\+\+|c89|c99|cpp|gcc|g\+\+|clang|clang\+\+|nvcc|ninja|ccache|icx|icpx)(-[\d.]+)?$"
)


def _requirements(dist: md.Distribution, extras: Set[str]) -> List[Tuple[str, Set[str]]]:
    """What ``dist`` requires, with ``extras`` of it asked for: (name, extras of that) pairs."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip's own copy
        from pip._vendor.packaging.requirements import Requirement
    out = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in [""] + sorted(extras)):
            out.append((req.name, set(req.extras)))
    return out


def closure(names: Iterable[str]) -> List[md.Distribution]:
    """The named distributions and every one they require (with the extras asked for), installed here."""
    extras: Dict[str, Set[str]] = {}
    out: Dict[str, md.Distribution] = {}
    todo: List[Tuple[str, Set[str]]] = [(n, set()) for n in names]
    while todo:
        name, want = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in out and want <= extras[key]:
            continue
        extras.setdefault(key, set()).update(want)
        try:
            dist = out.get(key) or md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional dependency this environment lacks
        out[key] = dist
        todo.extend(_requirements(dist, extras[key]))
    return list(out.values())


def top_level_entries(dist: md.Distribution) -> Set[str]:
    """What ``dist`` put directly in site-packages (its packages, modules, .dist-info)."""
    entries = set()
    for f in dist.files or []:
        parts = f.parts
        if parts and parts[0] != "..":
            entries.add(parts[0])
    entries.add(os.path.basename(str(dist._path)))  # type: ignore[attr-defined]
    return entries


def link_distributions(site: str, names: Iterable[str]) -> List[str]:
    linked = []
    for dist in closure(names):
        root = str(dist.locate_file(""))
        for entry in sorted(top_level_entries(dist)):
            src, dst = os.path.join(root, entry), os.path.join(site, entry)
            if os.path.exists(src) and not os.path.lexists(dst):  # nvidia/: one link serves every nvidia-* dist
                os.symlink(src, dst)
        linked.append(f"{dist.metadata['Name']}=={dist.version}")
    return linked


def no_compiler_bin(path: str) -> None:
    os.makedirs(path, exist_ok=True)
    for d in SYSTEM_BIN:
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            src, dst = os.path.join(d, name), os.path.join(path, name)
            if COMPILER.match(name) or os.path.lexists(dst) or not os.access(src, os.X_OK) or os.path.isdir(src):
                continue
            os.symlink(src, dst)


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("venv")
    ap.add_argument("dists", nargs="*", default=["torch"])
    args = ap.parse_args(argv)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(args.venv)
    site = sysconfig.get_path("purelib", vars={"base": args.venv, "platbase": args.venv})
    linked = link_distributions(site, list(args.dists) + ["pip"])
    no_compiler_bin(os.path.join(args.venv, "nocc-bin"))
    print(f"fresh_venv: {args.venv} with {len(linked)} distributions linked: {' '.join(sorted(linked))[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
