#!/usr/bin/env bash
# The main job: 4 processes under torchrun run all_reduce, reduce_scatter_tensor and
# all_gather_into_tensor with ringpg and with gloo on the same data, and print whether
# the results agree and how long each took.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
NPROC=${NPROC:-4}
exec python3 -m torch.distributed.run --standalone --nproc-per-node "$NPROC" benchmarks/compare.py "$@"
