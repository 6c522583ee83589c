"""Shared helpers for reporters: safe log text and short human formats."""

from __future__ import annotations

import time

from kwdiag.readers.text import clean


def safe(text: str, limit: int = 300) -> str:
    """Log text fit for any output: no control sequences, bounded length."""
    text = clean(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) + f".{int((ts % 1) * 1000):03d}"


def conf(c: float) -> str:
    return f"{c:.2f}"
