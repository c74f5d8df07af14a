#!/usr/bin/env bash
# Builds ringpg against one torch release from PyPI and runs the test suite on it, in a
# virtual environment of its own (never the system's packages):
#
#   bash scripts/test_torch.sh 2.8.0            # full suite
#   bash scripts/test_torch.sh --quick 2.6.0    # the quick subset (pytest -m quick: tests/conftest.py QUICK)
#   bash scripts/test_torch.sh --rm 2.9.1 -x    # delete the venv afterwards; options go to pytest
#   bash scripts/test_torch.sh --build-only 2.7.1   # venv and build, no tests
#   bash scripts/test_torch.sh 2.8.0 tests/test_faults.py   # test paths replace tests/ (with
#                                   --quick: its quick tests); give option values joined: -kEXPR
#
# The venv lives in $RINGPG_VENV_DIR (default ~/.cache/ringpg-venvs)/torch-VERSION and
# is kept for the next run (torch's CUDA wheels pull some GB of nvidia-* packages: keep
# two or three at most, or use --rm).  The sources of this checkout (tracked and
# untracked, not ignored) are copied to VENV/src and installed from there with
# `pip install --no-build-isolation`, as a user would, so building for one release never
# touches the in-place build of another; the tests then run in that copy (edits to the
# checkout meanwhile do not reach a run) with the venv's python.  MAX_JOBS (default 2)
# bounds the compile jobs.
set -euo pipefail
{ # one compound command: bash reads it whole, so editing this file cannot upset a run
cd "$(dirname "$0")/.."
REPO=$PWD

quick=0
remove=0
build_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --rm) remove=1; shift ;;
    --build-only) build_only=1; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
VERSION=${1:?usage: scripts/test_torch.sh [--quick] [--rm] TORCH_VERSION [pytest args...]}
shift

VENV_ROOT=${RINGPG_VENV_DIR:-$HOME/.cache/ringpg-venvs}
VENV=$VENV_ROOT/torch-$VERSION
PY=$VENV/bin/python
log() { echo "test_torch[$VERSION]: $*"; }

if [ ! -x "$PY" ]; then
  log "creating $VENV"
  mkdir -p "$VENV_ROOT"
  ${PYTHON:-python3} -m venv "$VENV"
fi
have=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null || true)
if [ "$have" != "$VERSION" ]; then
  log "installing torch==$VERSION and the test dependencies"
  "$PY" -m pip install -q "torch==$VERSION" numpy pytest pytest-timeout ninja setuptools wheel
fi

# The sources, brought up to date in VENV/src; VENV/src/build (the compiled objects) is
# kept, and the files that changed are written afresh, so a rerun recompiles only what
# changed, whichever checkout built there last (scripts/copy_sources.py).
SRC=$VENV/src
git -C "$REPO" ls-files -z -co --exclude-standard | "$PY" "$REPO/scripts/copy_sources.py" "$REPO" "$SRC"

log "building ringpg (MAX_JOBS=${MAX_JOBS:-2})"
start=$(date +%s)
if ! MAX_JOBS=${MAX_JOBS:-2} "$PY" -m pip install -q --no-build-isolation --no-deps --force-reinstall "$SRC" \
    > "$VENV/build.log" 2>&1; then
  tail -40 "$VENV/build.log"
  log "BUILD FAILED (full log: $VENV/build.log)"
  exit 1
fi
log "built in $(( $(date +%s) - start )) s: $("$PY" -c 'import ringpg._C as c, ringpg._build_config as b; print("torch", b.TORCH_VERSION, "kernels", c.reduce_isa())')"

[ "$build_only" = 1 ] && exit 0

# The venv's python (and torchrun) first; nothing from this checkout's python/ on the path.
export PATH="$VENV/bin:$PATH"
unset PYTHONPATH
# Test paths among the arguments replace tests/; options add to it.  --quick selects the
# tests marked quick (tests/conftest.py lists them) among those.
paths=0
for a in "$@"; do case "$a" in -*) ;; *) paths=1 ;; esac; done
if [ "$paths" = 0 ]; then set -- tests "$@"; fi
if [ "$quick" = 1 ]; then set -- -m quick "$@"; fi
rc=0
(cd "$SRC" && "$PY" -m pytest -q --timeout=300 -p no:cacheprovider "$@") || rc=$?
if [ "$remove" = 1 ]; then
  log "removing $VENV"
  rm -rf "$VENV"
fi
exit $rc
}
