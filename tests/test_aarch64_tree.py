"""The emulated aarch64 run has every repository module its Python files import.

``scripts/test_aarch64.sh`` copies part of the repository (its ``COPIED`` list, which
``--print-copied`` prints) into an arm64 root filesystem as ``/opt/ringpg`` and runs
Python files from there under qemu: the kernel tests of
``tests/test_reduce_ops_and_dtypes.py`` (stage 5) and ``scripts/aarch64_smoke.py``
(stage 6).  A module they import, directly or through another, from a folder left out of
the copy fails only there, after the long download and cross-build (as ``devkit/`` did
when the test helpers moved into it).  This test follows those imports here, in a second,
with ``ast``: the files the script runs (every ``/opt/ringpg/....py`` it names, and the
``conftest.py`` files pytest loads for them), then each repository module they import,
found on the paths the emulated processes search (``python/`` from ``PYTHONPATH``, the
repository root and ``tests/`` that ``tests/conftest.py`` and the smoke script add, the
run file's own folder), and asserts that ``COPIED`` holds every one.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "test_aarch64.sh"
# Where the emulated processes find the repository's modules (see the module docstring).
SEARCH_ROOTS = (REPO / "tests", REPO, REPO / "python")

pytestmark = pytest.mark.multiprocess  # asks the script (bash) for its list


def copied_paths() -> List[str]:
    """The script's ``COPIED``: paths relative to the repository root."""
    p = subprocess.run(["bash", str(SCRIPT), "--print-copied"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout.split()


def run_files() -> List[Path]:
    """The Python files the script runs under emulation, and the conftest.py files pytest loads for them."""
    files = sorted({REPO / rel for rel in re.findall(r"/opt/ringpg/([\w./-]+\.py)\b", SCRIPT.read_text())})
    confs = []
    for f in files:
        for folder in f.parents:
            if folder == REPO.parent:
                break
            if (folder / "conftest.py").is_file():
                confs.append(folder / "conftest.py")
    return sorted(set(files) | set(confs))


def find_module(name: str, roots: Tuple[Path, ...]) -> Optional[Path]:
    """The repository file of module ``name`` (a package's ``__init__.py``), on the first root that has it."""
    parts = name.split(".")
    for root in roots:
        base = root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def imported_names(tree: ast.AST, package: str) -> Iterator[str]:
    """Every module name an import statement (at any depth) of ``tree`` may load, with its
    parent packages; ``from X import n`` yields ``X.n`` too (``n`` may be a submodule)."""
    for node in ast.walk(tree):
        names: List[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".") if package else []
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [base] + [f"{base}.{a.name}" for a in node.names if a.name != "*"]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "importorskip")
        ):
            names = [node.args[0].value]
        for name in names:
            parts = [p for p in name.split(".") if p]
            for i in range(1, len(parts) + 1):
                yield ".".join(parts[:i])


def needed_files() -> Set[Path]:
    """The run files and every repository module they import, transitively."""
    needed: Set[Path] = set()
    todo: List[Tuple[Path, str, Tuple[Path, ...]]] = [(f, "", (f.parent, *SEARCH_ROOTS)) for f in run_files()]
    modules: Dict[str, Optional[Path]] = {}
    while todo:
        path, package, roots = todo.pop()
        if path in needed:
            continue
        needed.add(path)
        for name in imported_names(ast.parse(path.read_text(), str(path)), package):
            found = modules[name] if name in modules else find_module(name, roots)
            modules.setdefault(name, found)
            if found is not None and found not in needed:
                pkg = name if found.name == "__init__.py" else name.rpartition(".")[0]
                todo.append((found, pkg, SEARCH_ROOTS))
    return needed


def test_the_copy_holds_every_repository_module_the_emulated_files_import() -> None:
    copied = copied_paths()
    missing_paths = [c for c in copied if not (REPO / c).exists()]
    assert not missing_paths, f"COPIED names paths the repository lacks: {missing_paths}"
    runs = {f.relative_to(REPO).as_posix() for f in run_files()}
    assert {"tests/test_reduce_ops_and_dtypes.py", "scripts/aarch64_smoke.py", "tests/conftest.py"} <= runs, runs
    needed = sorted(f.relative_to(REPO).as_posix() for f in needed_files())
    # The imports were followed (not a list of the run files alone): the helpers they reach.
    assert {"tests/harness/__init__.py", "devkit/__init__.py", "devkit/groups.py", "python/ringpg/__init__.py"} <= set(
        needed
    ), needed
    uncovered = [f for f in needed if not any(f == c or f.startswith(c.rstrip("/") + "/") for c in copied)]
    assert not uncovered, (
        f"scripts/test_aarch64.sh copies {copied} into the emulated root, but its Python files "
        f"import {uncovered}: add their folders to COPIED"
    )


def setup_include_dirs() -> List[str]:
    """The include folders of setup.py's CppExtension, relative to the repository root
    (read from the call with ``ast``: each ``os.path.join(HERE, ...)`` of ``include_dirs``)."""
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "include_dirs" and isinstance(node.value, ast.List):
            dirs = []
            for item in node.value.elts:
                assert isinstance(item, ast.Call), ast.dump(item)
                parts = [a.value for a in item.args[1:] if isinstance(a, ast.Constant)]
                dirs.append("/".join(parts))
            return dirs
    raise AssertionError("setup.py has no include_dirs=[...]")


def test_the_cross_build_includes_what_setup_py_includes() -> None:
    """The cross-build's include folders are setup.py's: the aarch64 build broke once when
    csrc/shim (a header torch's wheel lacks) was added to setup.py alone."""
    p = subprocess.run(["bash", str(SCRIPT), "--print-includes"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    want = setup_include_dirs()
    assert "csrc/shim" in want, want
    assert sorted(p.stdout.split()) == sorted(want), (p.stdout.split(), want)
