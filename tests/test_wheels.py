"""The wheelhouse (scripts/build_wheels.sh): what a mismatched build says, and what pip picks.

* The refusal of a build made for another torch is one sentence naming both torches
  and the command that fixes it, for a wheel of the wheelhouse and for a source build.
* The wheelhouse's indexes (scripts/wheel_index.py), read by the real pip in a fresh
  venv that has this torch (scripts/fresh_venv.py): of two wheels, one requiring another
  torch release and one requiring this one, pip picks this torch's, through
  ``--find-links`` and through the PEP 503 ``--index-url``; and the command the refusal
  prints picks it too (pip in two dry runs: slow, under 20 s on 2 cores).  The wheels are small stand-ins (pure Python, named and tagged as
  the real ones, with the real ones' torch requirement), so no compiler runs: the real
  wheels are built and installed end to end by scripts/test_wheel.sh (CI).
* The copy of the sources a torch release's venv builds from (scripts/copy_sources.py)
  rewrites only the files that changed, newer than any object in its build/.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shlex
import subprocess
import sys
import zipfile
from typing import List

import pytest
import torch
from ringpg import _loader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE = torch.__version__.split("+", 1)[0]


def _tag(release: str) -> str:
    major, minor, patch = release.split(".")[:3]
    return f"pt{major}{minor}" + (f".{patch}" if patch != "0" else "")


OTHER = "2.6.0" if RELEASE != "2.6.0" else "2.15.0"


@pytest.mark.inprocess
def test_a_wheel_for_another_torch_names_both_and_the_wheelhouse_command() -> None:
    fix = _loader.fix_command("0.1.0+pt26", "/srv/ringpg wheels", python="/venv/bin/python")
    with pytest.raises(_loader.RingpgBuildMismatch) as e:
        _loader.check_torch_version("2.6.0+cpu", "2.15.0+cu132", "0.1.0+pt26", fix)
    msg = str(e.value)
    assert "ringpg 0.1.0+pt26" in msg and "torch 2.6.0+cpu" in msg and "torch 2.15.0+cu132" in msg, msg
    # The command, verbatim and quoted for a shell: held to the wheelhouse, any ringpg but this one.
    assert f"`{fix}`" in msg, msg
    assert shlex.split(fix) == [
        "/venv/bin/python",
        "-m",
        "pip",
        "install",
        "--no-build-isolation",
        "--no-index",
        "--find-links",
        "/srv/ringpg wheels",
        "ringpg!=0.1.0+pt26",
    ]
    # One sentence: no full stop followed by another sentence outside the command.
    assert not re.search(r"\.\s+[A-Z]", msg.replace(f"`{fix}`", "")), msg


@pytest.mark.inprocess
@pytest.mark.parametrize(
    "source, want",
    [
        (("/src/ringpg", True), "--no-deps -e /src/ringpg"),
        (("/src/ringpg", False), "--no-deps --force-reinstall /src/ringpg"),
        (None, "--no-deps --force-reinstall ."),
    ],
    ids=["editable", "from-a-checkout", "unknown"],
)
def test_a_source_build_for_another_torch_names_its_rebuild(source, want) -> None:
    fix = _loader.fix_command("0.1.0", None, source, python="py")
    assert fix == f"py -m pip install --no-build-isolation {want}"
    msg = _loader.mismatch_message("0.1.0", "2.14.0", "2.15.0", fix)
    assert f"`{fix}`" in msg and "2.14.0" in msg and "2.15.0" in msg
    assert msg.endswith("in ringpg's source checkout") == (source is None), msg


def _stand_in_wheel(directory: str, local: str, torch_requirement: str) -> str:
    """A pure-Python wheel of a ringpg stand-in: real name, version and torch requirement."""
    version = f"0.1.0+{local}"
    name = f"ringpg-{version}-py3-none-any.whl"
    info = f"ringpg-{version}.dist-info"
    files = {
        "ringpg/__init__.py": f"BUILT_FOR = {torch_requirement!r}\n",
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: ringpg\nVersion: {version}\nRequires-Python: >=3.9\n"
            f"Requires-Dist: {torch_requirement}\n"
        ),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(os.path.join(directory, name), "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return name


def _would_install(command: List[str]) -> str:
    # The venv alone: no PYTHONPATH (a checkout's python/ holds an egg-info pip would count as installed).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(command + ["--dry-run"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return " ".join(re.findall(r"^Would install (.*)$", out.stdout, re.M))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_pip_picks_the_wheel_for_the_installed_torch(tmp_path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    _stand_in_wheel(str(wheelhouse), _tag(OTHER), f"torch=={OTHER}")
    _stand_in_wheel(str(wheelhouse), _tag(RELEASE), f"torch=={RELEASE}")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "wheel_index.py"), str(wheelhouse)], check=True)
    venv = tmp_path / "venv"
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "fresh_venv.py"), str(venv), "torch"], check=True, env=env
    )
    py = str(venv / "bin" / "python")
    want = f"ringpg-0.1.0+{_tag(RELEASE)}"
    # The PEP 503 index alone (no PyPI, so torch cannot be swapped to fit the other wheel).
    index = (wheelhouse / "simple").as_uri()
    assert (
        _would_install([py, "-m", "pip", "install", "--disable-pip-version-check", "--index-url", index, "ringpg"])
        == want
    )
    # The refusal's command, from an install of the other torch's wheel (--no-index
    # --find-links: the directory itself): this torch's.
    fix = _loader.fix_command(f"0.1.0+{_tag(OTHER)}", str(wheelhouse), python=py)
    assert _would_install(shlex.split(fix)) == want


@pytest.mark.inprocess
def test_the_build_copy_rewrites_only_what_changed(tmp_path) -> None:
    """scripts/copy_sources.py, the copy of the sources a torch release's venv builds from:
    a changed file gets a time newer than the objects in build/ (so ninja recompiles it,
    even where the checkout's copy is older than they are), an unchanged one keeps its
    time, and what the checkout lacks goes, but build/."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("copy_sources", os.path.join(ROOT, "scripts", "copy_sources.py"))
    copy_sources = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy_sources)
    repo, dest = tmp_path / "repo", tmp_path / "dest"
    (repo / "csrc").mkdir(parents=True)
    (repo / "csrc" / "same.cpp").write_text("same")
    (repo / "csrc" / "changed.cpp").write_text("new")
    (repo / "setup.py").write_text("setup")
    (dest / "csrc" / "gone").mkdir(parents=True)
    (dest / "csrc" / "same.cpp").write_text("same")
    (dest / "csrc" / "changed.cpp").write_text("old")
    (dest / "csrc" / "gone" / "old.cpp").write_text("old")
    (dest / "build" / "temp").mkdir(parents=True)
    (dest / "build" / "temp" / "changed.o").write_text("object of old")
    long_ago, then = 1_000_000_000, 1_500_000_000
    for p in (dest / "csrc" / "same.cpp", dest / "csrc" / "changed.cpp"):
        os.utime(p, (long_ago, long_ago))
    os.utime(dest / "build" / "temp" / "changed.o", (then, then))
    os.utime(repo / "csrc" / "changed.cpp", (long_ago, long_ago))  # older than the object

    written = copy_sources.sync(str(repo), str(dest), ["csrc/same.cpp", "csrc/changed.cpp", "setup.py"])
    assert written == 2
    assert (dest / "csrc" / "changed.cpp").read_text() == "new"
    assert os.stat(dest / "csrc" / "changed.cpp").st_mtime > then
    assert os.stat(dest / "csrc" / "same.cpp").st_mtime == long_ago
    assert (dest / "setup.py").read_text() == "setup"
    assert not (dest / "csrc" / "gone").exists()
    assert (dest / "build" / "temp" / "changed.o").read_text() == "object of old"
    assert copy_sources.sync(str(repo), str(dest), ["csrc/same.cpp", "csrc/changed.cpp", "setup.py"]) == 0
