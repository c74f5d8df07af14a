"""Write the indexes of a wheelhouse of ringpg (scripts/build_wheels.sh runs it).

    python scripts/wheel_index.py WHEELHOUSE

Over every ``ringpg-*.whl`` and ``ringpg-*.tar.gz`` in WHEELHOUSE it writes

* ``WHEELHOUSE/simple/``: a PEP 503 simple repository (``simple/index.html``, then
  ``simple/ringpg/index.html`` linking the files with their sha256), for
  ``pip install --index-url file://WHEELHOUSE/simple ringpg`` or served over HTTP;
* ``WHEELHOUSE/index.html``: the same links in one page, for ``--find-links`` when the
  wheelhouse is served over HTTP (a local directory needs no page);

and prints which torch and Python each wheel is for.  pip then picks, of these, the
wheel whose torch requirement the installed torch meets and whose tags the Python
accepts, else the sdist: each wheel requires exactly the torch it was built for.
"""

from __future__ import annotations

import hashlib
import html
import os
import re
import sys
import zipfile
from typing import List, Tuple

PROJECT = "ringpg"
REQUIRES_PYTHON = ">=3.9"


def distributions(wheelhouse: str) -> List[str]:
    return sorted(f for f in os.listdir(wheelhouse) if re.match(rf"{PROJECT}-.*\.(whl|tar\.gz)$", f))


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def torch_requirement(path: str) -> str:
    """The wheel's Requires-Dist on torch (its METADATA), or '' for an sdist."""
    if not path.endswith(".whl"):
        return ""
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(name).decode().splitlines():
            if line.startswith("Requires-Dist: torch"):
                return line.split(":", 1)[1].strip()
    return ""


def page(title: str, links: List[Tuple[str, str]]) -> str:
    body = "\n".join(
        f'    <a href="{html.escape(href)}" data-requires-python="{html.escape(REQUIRES_PYTHON)}">{html.escape(text)}</a><br/>'
        for href, text in links
    )
    return (
        '<!DOCTYPE html>\n<html>\n  <head><meta name="pypi:repository-version" content="1.0">'
        f"<title>{html.escape(title)}</title></head>\n  <body>\n{body}\n  </body>\n</html>\n"
    )


def write_indexes(wheelhouse: str) -> List[str]:
    files = distributions(wheelhouse)
    hashed = [(f, sha256(os.path.join(wheelhouse, f))) for f in files]
    os.makedirs(os.path.join(wheelhouse, "simple", PROJECT), exist_ok=True)
    with open(os.path.join(wheelhouse, "simple", "index.html"), "w") as out:
        out.write(page("Simple index", [(f"{PROJECT}/", PROJECT)]))
    with open(os.path.join(wheelhouse, "simple", PROJECT, "index.html"), "w") as out:
        out.write(page(f"Links for {PROJECT}", [(f"../../{f}#sha256={h}", f) for f, h in hashed]))
    with open(os.path.join(wheelhouse, "index.html"), "w") as out:
        out.write(page(f"Links for {PROJECT}", [(f"{f}#sha256={h}", f) for f, h in hashed]))
    return files


def main(argv: List[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    wheelhouse = argv[0]
    files = write_indexes(wheelhouse)
    for f in files:
        need = torch_requirement(os.path.join(wheelhouse, f)) or "any torch (a source build)"
        print(f"wheel_index: {f}  [{need}]")
    print(f"wheel_index: {len(files)} files; {os.path.join(wheelhouse, 'simple')} (PEP 503) and index.html written")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
