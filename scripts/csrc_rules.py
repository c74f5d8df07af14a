"""Two house rules on the C++ sources (issue 60), run by scripts/lint.sh: no function in
csrc/ over 80 lines, outside the pybind11 bindings and the settings table; and no
measured figure in a comment (a ratio such as 0.45x or 1.2-1.7x, a percentage, a GB/s):
a comment gives its reason in a line, the figures live in docs/internals.md ("Why these
constants") and the dated entries of benchmarks/RESULTS.md.

A function is found as clang-format leaves it: a line that opens a brace at namespace
(or class) scope and is not a namespace, class, struct, enum or extern block starts one,
and the line where the depth falls back ends it; comments and string literals are left
out of the brace count.  Usage: python3 scripts/csrc_rules.py [FILE ...] (default: every
csrc/ source git knows, but the vendored csrc/shim/).  Exit 1, listing them, where any
function is too long or any comment quotes a figure.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

LIMIT = 80
# (file, first line of the function) exempt: the bindings and the settings table.
EXEMPT = (
    ("csrc/bindings/module.cpp", "void bindBackend("),
    ("csrc/bindings/module.cpp", "void bindTestSeams("),
    ("csrc/common/config.cpp", "const std::vector<TuningKey>& tuningKeys()"),
)
# A measured figure in a `//` comment: a decimal ratio (0.45x, 1.2×), a range of ratios
# or percentages (2-5x, 9–41%), a percentage, a rate.  Not a formula ("N x 2"), a hex
# literal or a duration (a constant's value, not a measurement).
FIGURE = re.compile(r"\d\.\d+\s?[x×](?![0-9A-Za-z_])|\d+(\.\d+)?\s?[-–]\s?\d+(\.\d+)?\s?[x×%]|\d+(\.\d+)?\s?%|[GM]B/s")
SCOPE = re.compile(r"\s*(template\s*<.*>\s*)?(namespace|struct|class|union|extern|enum)\b")


def functions(path: Path) -> Iterator[Tuple[int, int, str]]:
    """(first line, length, signature line) of each function body in ``path``."""
    depth, start, scopes = 0, None, {0}
    sig, start_depth = "", 0
    for i, line in enumerate(path.read_text().split("\n")):
        code = re.sub(r'"(\\.|[^"\\])*"', '""', re.sub(r"//.*", "", line))
        code = re.sub(r"'(\\.|[^'\\])'", "''", code)
        opens, closes = code.count("{"), code.count("}")
        scope = SCOPE.match(code)
        if start is None and opens > closes and depth in scopes and not scope:
            start, sig, start_depth = i, line.strip(), depth
        if scope and opens > closes and start is None:
            scopes.add(depth + 1)
        depth += opens - closes
        scopes = {d for d in scopes if d <= depth}
        if start is not None and depth <= start_depth:
            yield start + 1, i - start + 1, sig
            start = None


def too_long(files: List[str]) -> List[str]:
    found = []
    for f in files:
        for first, length, sig in functions(Path(f)):
            if length > LIMIT and not any(f.endswith(e) and sig.startswith(s) for e, s in EXEMPT):
                found.append(f"{f}:{first}: {length} lines: {sig[:80]}")
    return found


def figures(files: List[str]) -> List[str]:
    """Each comment line of ``files`` that quotes a measured figure (FIGURE)."""
    found = []
    for f in files:
        for i, line in enumerate(Path(f).read_text().split("\n")):
            comment = line.split("//", 1)[1] if "//" in line else ""
            if FIGURE.search(comment):
                found.append(f"{f}:{i + 1}: {comment.strip()[:80]}")
    return found


def main(argv: List[str]) -> int:
    files = (
        argv
        or subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "csrc/*.cpp", "csrc/*.h", "csrc/*.inc"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    )
    files = [f for f in files if not f.startswith("csrc/shim/")]
    long, quoted = too_long(files), figures(files)
    for line in long:
        print(f"csrc_rules: over {LIMIT} lines: {line}")
    for line in quoted:
        print(f"csrc_rules: a figure in a comment (docs/internals.md takes it): {line}")
    return 1 if long or quoted else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
