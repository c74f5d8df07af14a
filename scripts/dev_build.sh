#!/usr/bin/env bash
# Developer rebuild that is safe while other processes use the extension: builds
# out of place, then swaps the shared object in with an atomic rename.
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_JOBS=${MAX_JOBS:-2} python3 setup.py -q build_ext >/dev/null
so=$(ls -t build/lib*/ringpg/_C*.so | head -1)
cp "$so" python/ringpg/.C.so.tmp
mv -f python/ringpg/.C.so.tmp "python/ringpg/$(basename "$so")"
echo "dev_build: installed $(basename "$so")"
