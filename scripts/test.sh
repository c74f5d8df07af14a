#!/usr/bin/env bash
# The tests: the multi-process pytest suite (every test has a timeout), then the
# benchmark in --check mode (correctness at small sizes only; speed is never asserted),
# both on the installed torch; then a build and the quick subset on the oldest torch
# ringpg supports; then the wheel of the installed torch, installed into a fresh venv with
# no compiler, and the quick subset from there.
set -euo pipefail
cd "$(dirname "$0")/.."
# A compiler cache: CI builds the extension twice from a clean clone (for this torch and
# the oldest), about 9 of its minutes on 2 cores; ccache makes unchanged sources cache
# hits.  Paths under the checkout are hashed relative to it (CCACHE_BASEDIR), so clones
# at other paths share the cache; torch's own wrapping is turned off for one ccache per
# call.  Installed where missing and this runs as root; without it the builds are full.
if ! command -v ccache >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  { apt-get install -y -qq ccache || { apt-get update -qq && apt-get install -y -qq ccache; }; } >/dev/null 2>&1 \
    || echo "test: could not install ccache; the builds are full"
fi
if command -v ccache >/dev/null && [ -d /usr/lib/ccache ]; then
  export PATH="/usr/lib/ccache:$PATH" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 TORCH_NO_COMPILER_WRAPPER=1
fi
# Style first (seconds): ruff and clang-format, pinned (scripts/lint.sh).
bash scripts/lint.sh
# The suite's optional extras too (torchft by default in setup.sh; matplotlib for the
# trace's --png test), so that their tests run rather than skip.
RINGPG_WITH_PLOTS=${RINGPG_WITH_PLOTS:-1} bash scripts/setup.sh
# aarch64: the reduction kernels (baseline, NEON and SVE copies) cross-compiled, in
# seconds (plus an apt-get install of the cross compiler where it is missing and this
# runs as root; skipped, saying so, where it cannot be had).  The full cross-build and
# emulated run take longer than CI can spare: `bash scripts/test_aarch64.sh` (docs/support.md).
# RINGPG_SKIP_AARCH64=1 skips it.
if [ "${RINGPG_SKIP_AARCH64:-0}" != 1 ]; then
  bash scripts/test_aarch64.sh --compile-only-kernels
fi
python3 -m pytest -q --timeout=300 tests "$@"
python3 -m benchmarks.bench --check
# The oldest supported torch, in a virtual environment of its own: build, then the quick
# multi-process subset (scripts/test_torch.sh).  RINGPG_SKIP_OLDEST_TORCH=1 skips it in
# dev loops; CI runs it.
if [ "${RINGPG_SKIP_OLDEST_TORCH:-0}" != 1 ]; then
  bash scripts/test_torch.sh --quick "${RINGPG_OLDEST_TORCH:-2.6.0}"
fi
# The wheel (scripts/build_wheels.sh) for the installed torch: the objects setup.sh
# compiled are in build/, so this links and packages; then installed into a fresh venv
# with torch and no compiler (timed), the quick subset from there, and, with the oldest
# torch's venv at hand, the same wheel under that torch: `import torch` works and a group
# fails naming the command that fixes it (scripts/test_wheel.sh).  RINGPG_SKIP_WHEEL=1 skips it.
if [ "${RINGPG_SKIP_WHEEL:-0}" != 1 ]; then
  wheelhouse=$(mktemp -d)
  start=$(date +%s)
  bash scripts/build_wheels.sh "$wheelhouse"
  echo "test: wheelhouse built in $(( $(date +%s) - start )) s"
  oldest=${RINGPG_VENV_DIR:-$HOME/.cache/ringpg-venvs}/torch-${RINGPG_OLDEST_TORCH:-2.6.0}/bin/python
  mismatch=()
  if [ -x "$oldest" ]; then mismatch=(--mismatch-python "$oldest"); fi
  bash scripts/test_wheel.sh "${mismatch[@]}" "$wheelhouse"
  echo "test: wheel step took $(( $(date +%s) - start )) s"
  rm -rf "$wheelhouse"
fi
