#!/usr/bin/env bash
# Installs what ringpg needs on a fresh machine and builds the extension in place.
# Idempotent: packages already present are not reinstalled; the build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
# Setting up must not depend on a ringpg already installed: `import torch` imports the
# torch.backends entry point of an installed ringpg, and an editable install whose
# checkout is gone (or was built for another torch) makes that import fail
# ("Failed to load the backend extension: ringpg"), torch and the build with it.
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
need=()
$PY -c "import torch" 2>/dev/null || need+=(torch)
$PY -c "import numpy" 2>/dev/null || need+=(numpy)
$PY -c "import pytest" 2>/dev/null || need+=(pytest)
$PY -c "import pytest_timeout" 2>/dev/null || need+=(pytest-timeout)
$PY -c "import ninja" 2>/dev/null || need+=(ninja)
$PY -c "import setuptools, wheel" 2>/dev/null || need+=(setuptools wheel)
if [ "${RINGPG_WITH_PLOTS:-0}" = 1 ]; then
  $PY -c "import matplotlib" 2>/dev/null || need+=(matplotlib)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  $PY -m pip install -q "${need[@]}"
fi

# The torchft extra (tests/test_torchft.py): optional, so a failed install (no
# network, no wheel for this platform or torch) leaves setup working and those tests
# skip.  RINGPG_WITH_TORCHFT=0 leaves it out.
if [ "${RINGPG_WITH_TORCHFT:-1}" = 1 ] && ! $PY -c "import torchft" 2>/dev/null; then
  echo "setup: installing the torchft extra (torchft==0.2.0)"
  # torch pinned to the one installed: the extra must not swap the torch ringpg builds against.
  # The public version: PyPI's wheels may report a local label (2.15.0+cu132) that no
  # index lists, and `torch==2.15.0` matches the installed 2.15.0+cu132 (PEP 440).
  tv=$($PY -c "import torch; print(torch.__version__.split('+')[0])")
  $PY -m pip install -q "torchft==0.2.0" "torch==$tv" \
    || echo "setup: could not install torchft; tests/test_torchft.py will skip"
fi

# Build against the torch installed above (no build isolation), in place, so that
# `import ringpg` and the torch.backends entry point both work.
if ! $PY -c "import ringpg._C" 2>/dev/null || [ "${RINGPG_REBUILD:-0}" = 1 ]; then
  echo "setup: building ringpg (a few minutes on 2 cores)"
  MAX_JOBS=${MAX_JOBS:-2} $PY -m pip install -q --no-build-isolation --no-deps -e .
fi
$PY -c "import ringpg._C as c; print('setup: ringpg ready, kernels:', c.reduce_isa())"
