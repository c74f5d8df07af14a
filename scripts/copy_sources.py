"""Bring a build copy of the sources up to date with a checkout, keeping its build/.

    git -C REPO ls-files -z -co --exclude-standard | python scripts/copy_sources.py REPO DEST

(scripts/build_wheels.sh and scripts/test_torch.sh, for the copy in a torch release's
venv.)  A file whose bytes DEST already has is left alone; one that differs or is new is
written afresh, so its time is now; anything else in DEST but build/ is removed.  The
times are the point: ninja rebuilds an object only when a source is newer than it, and
a copy that kept the checkout's times (tar does) could be older than objects another
checkout compiled into the same build/ (CI's clone, say, at another commit), which would
then go into this build unchanged.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import sys
from typing import List


def sync(repo: str, dest: str, names: List[str]) -> int:
    """Make DEST hold exactly ``names`` (paths under REPO) besides build/; return how many were written."""
    wanted = {os.path.normpath(n) for n in names}
    os.makedirs(dest, exist_ok=True)
    for root, dirs, files in os.walk(dest, topdown=False):
        rel = os.path.relpath(root, dest)
        if rel == "build" or rel.startswith("build" + os.sep):
            continue
        for f in files:
            if os.path.normpath(os.path.join(rel, f)) not in wanted:
                os.remove(os.path.join(root, f))
        for d in dirs:
            path = os.path.join(root, d)
            if rel == "." and d == "build":
                continue
            if os.path.islink(path):
                os.remove(path)
            elif not os.listdir(path):
                os.rmdir(path)
    written = 0
    for name in sorted(wanted):
        src, dst = os.path.join(repo, name), os.path.join(dest, name)
        if os.path.isfile(dst) and not os.path.islink(dst) and filecmp.cmp(src, dst, shallow=False):
            continue
        if os.path.isdir(dst) and not os.path.islink(dst):
            shutil.rmtree(dst)
        elif os.path.lexists(dst):
            os.remove(dst)
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        shutil.copyfile(src, dst)
        shutil.copymode(src, dst)
        written += 1
    return written


def main(argv: List[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    repo, dest = argv
    names = [p for p in sys.stdin.read().split("\0") if p and os.path.isfile(os.path.join(repo, p))]
    written = sync(repo, dest, names)
    print(f"copy_sources: {len(names)} files in {dest}, {written} written (new or changed)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
