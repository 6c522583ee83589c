"""Sizes and durations, parsed and printed in one dialect. Standard library only.

Covers: ``parse_size`` (``"2 GiB"``, ``"248.09 MiB"``, ``"300MB"``, a number of bytes) and
``format_bytes`` (``412 MiB``, ``1.5 GiB``; ``compact=True`` drops the space, for a value that goes
into a command-line flag such as ``--memory-limit 2GiB``).

Does not cover: the runtime's own parsing of its settings (``kwdiag.runtime.config``: the runtime
imports nothing of kwdiag but the event module).
"""

from __future__ import annotations

import math
import re
from typing import Any

_SIZE = re.compile(r"([\d.]+)\s*([KMGTP]?i?B)\b", re.I)
_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15, "kib": 1024, "mib": 1024**2,
          "gib": 1024**3, "tib": 1024**4, "pib": 1024**5}
_STEPS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def parse_size(value: Any) -> float | None:
    """Bytes in ``value`` (a number, or text holding ``<number> <unit>``), or None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) and value >= 0 else None
    if isinstance(value, str):
        m = _SIZE.search(value)
        if m:
            try:
                return float(m.group(1)) * _UNITS.get(m.group(2).lower(), 1)
            except ValueError:  # "1.2.3 GB"
                return None
    return None


def format_bytes(n: float | None, *, compact: bool = False) -> str:
    """``412 MiB``, ``1.5 GiB``, ``900 KiB``, ``12 B``; ``?`` for None."""
    if n is None:
        return "?"
    sep = "" if compact else " "
    for unit, size in _STEPS:
        if n >= size:
            v = n / size
            return f"{v:.0f}{sep}{unit}" if v >= 10 or v == int(v) else f"{v:.1f}{sep}{unit}"
    return f"{n:.0f}{sep}B"

