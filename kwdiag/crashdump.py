"""What a faulthandler dump looks like, for those who keep one (the nannies) and those who read one. Standard library only.

Covers: the first line of a dump (``Fatal Python error: ...``, ``Windows fatal exception: ...``), the lines a dump
is made of after it (blank lines, thread headers, frames, ``<no Python frame>``, ``Extension modules``, the
runtime state, faulthandler's ``...`` for what it left out), and ``fit``: lines cut to a budget of bytes as they
will be encoded in a JSON record (a control character takes 6, a non-ASCII one 2 to 4), so a worker-exit record
that carries a dump stays one line every reader takes (``kwdiag.readers`` reads lines up to 1 MiB).

Does not cover: finding the crashing thread's frames in a dump (``kwdiag.analysis.stack``), or reading dumps
out of text logs (``kwdiag.readers.dumps``).
"""

from __future__ import annotations

import json
import re
from typing import Iterable

FATAL_MARKERS = ("Fatal Python error", "Windows fatal exception")
# How much of a dump and of a stderr tail a worker-exit record keeps: lines, and bytes as encoded in the record,
# which must stay one JSONL line readers take (< 1 MiB; 100 lines of control characters would take 600 KB).
MAX_LINES = 2000          # a worker of 100 threads prints ~1,500
TAIL_BYTES, DUMP_BYTES = 300_000, 400_000
_DUMP_LINE = re.compile(r'^\s*(?:$|File "|<no Python frame>|<tstate is freed>|<freed frame>|Garbage-collecting'
                        r"|(?:Current thread|Thread) 0x|Stack \(most recent call first\)|Extension modules: |\.\.\."
                        r"|Python runtime state: )")


def is_fatal(line: str) -> bool:
    """The first line of a dump."""
    return any(m in line for m in FATAL_MARKERS)


def is_dump_line(line: str) -> bool:
    """A line that can follow a dump's first line within the dump (its indentation and a collector's prefix
    already taken off or not)."""
    return _DUMP_LINE.match(line) is not None


def fit(lines: Iterable[str], budget: int, *, keep_end: bool = False) -> list[str]:
    """The first lines (``keep_end``: the last) whose JSON encoding takes at most ``budget`` bytes in all."""
    lines = list(lines)
    out, used = [], 0
    for line in (reversed(lines) if keep_end else lines):
        used += len(json.dumps(line, ensure_ascii=False).encode("utf-8", "replace")) + 2
        if used > budget:
            break
        out.append(line)
    return out[::-1] if keep_end else out
