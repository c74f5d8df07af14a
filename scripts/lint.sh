#!/usr/bin/env bash
# Style check (CI): ruff's lint and format rules (pyproject.toml) over the Python, and
# clang-format (.clang-format) over csrc/, and the house rules on csrc/ (no function over
# 80 lines, no measured figure in a comment: scripts/csrc_rules.py), and a README of at most 250 lines.  The tools are pinned and installed once from
# PyPI into a cache directory of their own (not the environment ringpg runs in), so every
# machine checks with the same versions.  --fix rewrites the files instead of checking.
set -euo pipefail
cd "$(dirname "$0")/.."
RUFF_VERSION=0.14.14
CLANG_FORMAT_VERSION=18.1.8
TOOLS="${RINGPG_LINT_DIR:-$HOME/.cache/ringpg-lint}/ruff-$RUFF_VERSION-clang-format-$CLANG_FORMAT_VERSION"
if [ ! -x "$TOOLS/bin/ruff" ] || [ ! -x "$TOOLS/bin/clang-format" ]; then
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --target "$TOOLS" \
    "ruff==$RUFF_VERSION" "clang-format==$CLANG_FORMAT_VERSION"
fi
ruff() { PYTHONPATH="$TOOLS" "$TOOLS/bin/ruff" "$@"; }
clang_format() { PYTHONPATH="$TOOLS" "$TOOLS/bin/clang-format" "$@"; }
# Tracked files and new ones not yet added (but not what .gitignore leaves out).
mapfile -t CXX < <(git ls-files --cached --others --exclude-standard 'csrc/*.cpp' 'csrc/*.h' 'csrc/*.inc')
if [ "${1:-}" = "--fix" ]; then
  ruff check --fix .
  ruff format .
  clang_format -i "${CXX[@]}"
  exit 0
fi
ruff check .
ruff format --check .
clang_format --dry-run -Werror "${CXX[@]}"
# No C++ function over 80 lines (the bindings and the settings table aside), no figure in a comment.
python3 scripts/csrc_rules.py
# The README is the user's document, at most 250 lines: dated figures belong in benchmarks/RESULTS.md.
readme_lines=$(wc -l < README.md)
if [ "$readme_lines" -gt 250 ]; then
  echo "lint: README.md has $readme_lines lines, over 250: move figures to benchmarks/RESULTS.md" >&2
  exit 1
fi
echo "lint: clean (ruff $RUFF_VERSION, clang-format $CLANG_FORMAT_VERSION)"
