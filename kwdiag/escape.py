"""Log text made inert for every place kwdiag shows it: a terminal, JSON, HTML. Standard library only.

Covers: ``clean`` (a log line without terminal control sequences), ``safe`` (clean and bounded in
length), ``to_json`` (an indented JSON document with every character a terminal could act on
escaped) and ``html`` (text for an HTML element or a quoted attribute).

Does not cover: markup of rich (the terminal reporter prints log text as plain ``Text``, never as
markup) or Markdown (``kwdiag.report.markdown`` escapes its own syntax).
"""

from __future__ import annotations

import json
import re
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff]")
# JSON leaves these raw with ensure_ascii=False: C1 controls (\x9b is CSI to some terminals), lone
# surrogates (no UTF-8 encoder can write them), and the JavaScript line separators. Outside
# strings JSON has none of them, so escaping each as \uXXXX keeps the document equal.
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def clean(text: str) -> str:
    """A log line without terminal control sequences: ANSI/OSC sequences removed; other C0 and C1
    controls (``\\x9b`` is CSI to some terminals) and lone surrogates (no encoder can write them)
    become U+FFFD; tabs are kept."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return _UNSAFE.sub("\ufffd", text)


def safe(text: str, limit: int = 300) -> str:
    """Log text fit for any output: no control sequences, bounded length."""
    text = clean(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def to_json(doc: Any, *, indent: int | None = 2) -> str:
    """``doc`` as JSON (indented unless ``indent=None``: the standard library encodes indented JSON in
    Python, compact JSON in C, about 5x faster): readable UTF-8, with every character a terminal could act
    on escaped."""
    text = json.dumps(doc, indent=indent, ensure_ascii=False)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def html(text: object, limit: int = 300) -> str:
    """Log text (or anything) fit for HTML element text or a quoted attribute value."""
    import html  # only pages need it: kept off the terminal's start-up path

    return html.escape(safe(str(text), limit), quote=True)
