"""Sizes and durations, parsed and printed in one dialect. Standard library only.

Covers: ``parse_size`` (a size found in text: ``"2 GiB"``, ``"248.09 MiB"``, ``"300MB"``, a number of bytes;
None when there is none), ``parse_bytes`` (a size setting: the same units, strict, an error naming the value
when it is not one), and ``format_bytes`` (``412 MiB``, ``1.5 GiB``; ``compact=True`` drops the space, for a
value that goes into a command-line flag such as ``--memory-limit 2GiB``) — for reports, the runtime's log
lines and its settings alike (the runtime imports this module, as it does the event format).

Does not cover: ``"auto"`` memory limits (the runtime asks the machine).
"""

from __future__ import annotations

import math
import re
from typing import Any

_SIZE = re.compile(r"([\d.]+)\s*([KMGTP]?i?B)\b", re.I)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "pb": 1e15, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5}
_SETTING = re.compile(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)([a-z]*)")
_STEPS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def parse_size(value: Any) -> float | None:
    """Bytes in ``value`` (a number, or text holding ``<number> <unit>``), or None."""
    if value is None:   # most fields asked for are absent (every event is asked for each size it might hold)
        return None
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


def parse_bytes(value: Any) -> int | None:
    """A size setting: ``"2GiB"`` -> 2147483648, ``"500MB"``, ``1e9``; None, 0 or ``"none"`` -> None (no limit).
    ``ValueError`` naming the value when it is not a size."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value) or None
    text = str(value).strip().lower().replace(" ", "")
    if text in ("", "none", "0"):
        return None
    match = _SETTING.fullmatch(text)
    if not match or match.group(2) not in _UNITS:
        raise ValueError(f"not a size: {value!r} (try 2GiB, 500MB, 1e9)")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


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

