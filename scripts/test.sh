#!/usr/bin/env bash
# The tests: the multi-process pytest suite (every test has a timeout), then the
# benchmark in --check mode (correctness at small sizes only; speed is never asserted).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 -m pytest -q --timeout=300 tests "$@"
python3 -m benchmarks.bench --check
