#!/usr/bin/env bash
# Installs ringpg from a wheelhouse (scripts/build_wheels.sh) into a fresh virtual
# environment that has torch but no compiler, no ninja and no ringpg, times the install,
# and runs the quick multi-process subset (pytest -m quick) from there:
#
#   bash scripts/test_wheel.sh WHEELHOUSE                      # torch of python3
#   bash scripts/test_wheel.sh --torch-python ~/.cache/ringpg-venvs/torch-2.6.0/bin/python WHEELHOUSE
#   bash scripts/test_wheel.sh --mismatch-python OTHER_PY WHEELHOUSE   # and the torch-upgrade check
#
# The venv (scripts/fresh_venv.py) links torch, pytest, numpy and setuptools (pip reads an
# sdist's metadata with it; a compiler it cannot find) from the interpreter
# given (--torch-python, default python3) and nothing else; its PATH is the venv's bin and
# the system's programs less every compiler, so pip can install a wheel and nothing else.
# --mismatch-python OTHER_PY (a python with another torch release): a second such venv
# with OTHER_PY's torch gets the wheel just tested, as if torch had been upgraded under
# it; then `import torch` must work, init_process_group("ringpg") must fail naming both
# torches and a command, and that command (pip --dry-run, then for real where the
# wheelhouse has a wheel for OTHER_PY's torch) must pick the build for OTHER_PY's torch.
# Arguments after WHEELHOUSE go to pytest.  RINGPG_KEEP_VENV=1 keeps the venvs.
set -euo pipefail
{ # one compound command: bash reads it whole, so editing this file cannot upset a run
cd "$(dirname "$0")/.."
REPO=$PWD
TORCH_PY=python3
MISMATCH_PY=
while [ $# -gt 0 ]; do
  case "$1" in
    --torch-python) TORCH_PY=$2; shift 2 ;;
    --mismatch-python) MISMATCH_PY=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
WHEELHOUSE=$(cd "${1:?usage: scripts/test_wheel.sh [--torch-python PY] [--mismatch-python PY] WHEELHOUSE [pytest args]}" && pwd)
shift
log() { echo "test_wheel: $*"; }
export TORCH_DEVICE_BACKEND_AUTOLOAD=1
unset CC CXX PYTHONPATH
WORK=$(mktemp -d)
[ "${RINGPG_KEEP_VENV:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT

fresh_venv() {  # PY VENV -> a venv with PY's torch, no compiler on its PATH
  TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$1" "$REPO/scripts/fresh_venv.py" "$2" torch pytest pytest-timeout numpy setuptools wheel
}
in_venv() {  # VENV CMD... : run with the venv's python first and no compiler on PATH
  local venv=$1
  shift
  PATH="$venv/bin:$venv/nocc-bin" "$@"
}

VENV=$WORK/venv
fresh_venv "$TORCH_PY" "$VENV"
for tool in cc c++ gcc g++ ninja ccache; do
  if in_venv "$VENV" bash -c "command -v $tool" >/dev/null; then log "a compiler is on the venv's PATH: $tool"; exit 1; fi
done
start=$(date +%s.%N)
in_venv "$VENV" python -m pip install -q --disable-pip-version-check --no-build-isolation --no-index \
  --find-links "$WHEELHOUSE" ringpg
took=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
info=$(in_venv "$VENV" python -c 'import ringpg, ringpg._build_config as b; print(b.VERSION, "for torch", b.TORCH_VERSION, "at", ringpg.__file__)')
log "installed ringpg $info in $took s (no compiler on PATH)"
case "$info" in *"$VENV"/*) ;; *) log "ringpg did not come from the venv"; exit 1 ;; esac

cd "$REPO"
in_venv "$VENV" python -m pytest -q -m quick -p no:cacheprovider --timeout=300 tests "$@"

[ -n "$MISMATCH_PY" ] || exit 0
# After a torch upgrade: the wheel just tested, under another torch.
VERSION=$(in_venv "$VENV" python -c 'import ringpg._build_config as b; print(b.VERSION)')
WHEEL=$(in_venv "$VENV" python -c '
import glob, sys
from pip._internal.utils.compatibility_tags import get_supported
from pip._internal.models.wheel import Wheel
tags = get_supported()
print(next(w for w in sorted(glob.glob(sys.argv[1] + "/ringpg-" + sys.argv[2] + "-*.whl")) if Wheel(w.rsplit("/", 1)[1]).supported(tags)))
' "$WHEELHOUSE" "$VERSION")
OTHER=$WORK/upgraded
fresh_venv "$MISMATCH_PY" "$OTHER"
in_venv "$OTHER" python -m pip install -q --disable-pip-version-check --no-deps --no-index "$WHEEL"
log "$(basename "$WHEEL") installed under torch $(in_venv "$OTHER" python -c 'import importlib.metadata as m; print(m.version("torch"))')"
FIXFILE=$WORK/fix_command in_venv "$OTHER" python - <<'EOF'
import os
import re
import subprocess
import sys

# `import torch` (which runs ringpg's entry point) must work: a warning at most.
out = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True)
assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
print("test_wheel: import torch works" + (f" (stderr: {out.stderr.strip()})" if out.stderr.strip() else ", silently"))

import torch
import torch.distributed as dist

import ringpg._build_config as b

try:
    dist.init_process_group("ringpg", store=dist.HashStore(), rank=0, world_size=1)
except Exception as e:  # noqa: BLE001 - whatever torch wraps it in, the message is the point
    msg = f"{type(e).__name__}: {e}"
else:
    raise SystemExit("test_wheel: init_process_group('ringpg') worked under another torch")
print(f"test_wheel: init_process_group('ringpg') fails: {msg}")
assert b.TORCH_VERSION in msg and torch.__version__ in msg, msg
command = re.search(r"`([^`]*pip install[^`]*)`", msg)
assert command, msg
with open(os.environ["FIXFILE"], "w") as f:
    f.write(command.group(1))
EOF
FIX=$(cat "$WORK/fix_command")
# The command, as printed, with --dry-run: which ringpg it would install here (where that
# is the sdist, pip's dry run prepares its metadata, which may fail without setuptools).
dry=$(in_venv "$OTHER" bash -c "$FIX --dry-run" 2>&1) || true
would=$(sed -n 's/^Would install //p' <<<"$dry")
log "the message's command would install: ${would:-nothing}"
case "$would" in
  *ringpg-*+pt*)
    in_venv "$OTHER" bash -c "$FIX -q"
    in_venv "$OTHER" python -c '
import torch.distributed as dist, torch
dist.init_process_group("ringpg", store=dist.HashStore(), rank=0, world_size=1)
t = torch.ones(4); dist.all_reduce(t); assert t.tolist() == [1.0] * 4
import ringpg._build_config as b
print("test_wheel: after the command, ringpg", b.VERSION, "serves a group under torch", torch.__version__)
dist.destroy_process_group()'
    ;;
  ringpg-*) log "(the wheelhouse has no wheel for that torch: the command would build the sdist, which needs a compiler)" ;;
  *) echo "$dry"; log "the message's command picks no ringpg"; exit 1 ;;
esac
}
