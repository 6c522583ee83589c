"""Shared helpers for reporters: short human formats (times, confidences). Escaping is ``kwdiag.escape``."""

from __future__ import annotations

import time


def when(ts: float | None, *, utc: bool = False) -> str:
    """``2026-11-21 09:53:19.534`` in local time (or UTC, suffixed so); ``-`` when unknown."""
    if ts is None:
        return "-"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", (time.gmtime if utc else time.localtime)(ts))
    return stamp + f".{int((ts % 1) * 1000):03d}" + (" UTC" if utc else "")


def conf(c: float) -> str:
    return f"{c:.2f}"
