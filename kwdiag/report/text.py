"""Shared helpers for reporters: safe log text and short human formats."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from kwdiag.readers.text import clean

# JSON leaves these raw with ensure_ascii=False: C1 controls (\x9b is CSI to some terminals), lone
# surrogates (no UTF-8 encoder can write them), and the JavaScript line separators. Outside
# strings JSON has none of them, so escaping each as \uXXXX keeps the document equal.
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def to_json(doc: Any) -> str:
    """``doc`` as indented JSON: readable UTF-8, with every character a terminal could act on escaped."""
    text = json.dumps(doc, indent=2, ensure_ascii=False)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def safe(text: str, limit: int = 300) -> str:
    """Log text fit for any output: no control sequences, bounded length."""
    text = clean(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def when(ts: float | None, *, utc: bool = False) -> str:
    """``2026-11-21 09:53:19.534`` in local time (or UTC, suffixed so); ``-`` when unknown."""
    if ts is None:
        return "-"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", (time.gmtime if utc else time.localtime)(ts))
    return stamp + f".{int((ts % 1) * 1000):03d}" + (" UTC" if utc else "")


def conf(c: float) -> str:
    return f"{c:.2f}"
