"""Sizes and link rates as people type them: ``256MiB``, ``1gbit``.

Parsing and printing only, with no torch import, so that ``netns.py`` can use it
when it runs on its own.
"""

from __future__ import annotations

import re
from typing import Dict

_UNITS: Dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
}


def parse_bytes(text: str) -> int:
    """Parse a byte count such as ``4096``, ``1K``, ``1KiB``, ``256MiB``, ``1G`` (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot parse size {text!r} (examples: 4096, 1KiB, 4M, 256MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n: int) -> str:
    """Human form of a byte count: ``1 KiB``, ``4 MiB``, ``1000 B``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.2f} KiB"
    return f"{n} B"


def parse_rate(text: str) -> int:
    """Parse a link rate in tc's notation (``1gbit``, ``100mbit``, ``2.5gbit``, ``500kbit``) to bit/s."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|bps)?\s*", text.lower())
    if not m:
        raise ValueError(f"cannot parse rate {text!r} (examples: 1gbit, 100mbit, 10gbit)")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    bits = float(m.group(1)) * scale
    if m.group(3) == "bps":  # tc's "bps" means bytes per second
        bits *= 8
    if bits < 8000:
        raise ValueError(f"rate {text!r} is too low to be useful")
    return int(bits)


def format_rate(bits_per_s: int) -> str:
    """``1000000000`` -> ``1gbit`` (tc notation)."""
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits_per_s % scale == 0:
            return f"{bits_per_s // scale}{unit}"
    return f"{bits_per_s}bit"
