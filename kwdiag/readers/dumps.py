"""The lines under a ``Fatal Python error`` line of a text log (a faulthandler dump), read again once the scan found it.

Covers: plain files. The scan hands the readers only the lines some rule could match, and a dump's frame lines
(``  File "PATH", line N in FUNC``) match none; making them candidates would make every traceback line of every
log one. So after a plain file is scanned, each of the few ``Fatal Python error`` events it gave (at most
``MAX_DUMPS``) gets in ``fields["dump"]`` the lines after its own that belong to its dump: blank lines, thread
headers, frames, ``Extension modules``, up to the next ``Fatal Python error`` (another crash in a shared stream)
or the first line that is none of those, at most ``MAX_DUMP_LINES`` and ``MAX_DUMP_CHARS``. They come from one
more pass over the file that counts the lines of blocks holding no dump (``bytes.count``) and stops after the last
dump. In a file that merges processes behind collector prefixes (compose, kubectl), only the lines of the same
process are kept, prefixes removed. The analysis reads the crashing thread's frames from them
(``kwdiag.analysis.stack``).

Does not cover: gzip and stdin (not read twice: their dumps are not attached, and a death's ``stack`` stays
empty), dumps written to another file than the ``Fatal Python error`` line, kwdiag's own event files (their
worker-exit records carry the dump: ``crash_dump``, ``stderr_tail``), or a file rewritten between the two passes
(a dump whose first line is no longer the ``Fatal Python error`` line is dropped).
"""

from __future__ import annotations

import re

from kwdiag import crashdump
from kwdiag.events import Event
from kwdiag.readers.shapes import unwrap_from

# An RFC 3339 stamp a collector puts before each line (unwrap takes it off only before a Dask line of its own).
_SHIPPED_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)(?:\s+|$)")

MAX_DUMPS = 200
MAX_DUMP_LINES = crashdump.MAX_LINES
MAX_DUMP_CHARS = 256_000
MAX_LINE = 4096
BLOCK = 1 << 22


def attach_dumps(path: str, events: list[Event]) -> None:
    """Give each ``Fatal Python error`` event of ``path`` (a plain file) the lines of its dump that follow it."""
    wanted: dict[int, list[Event]] = {}
    for e in events:
        if e.origin is None or not crashdump.is_fatal(e.message) or not isinstance(e.fields, dict) \
                or "dump" in e.fields or e.fields.get("via") == "stderr_tail":
            continue
        line = e.origin.at   # the file's own line (a log with printed values among its lines renumbers the order)
        if line not in wanted and len(wanted) >= MAX_DUMPS:
            break
        wanted.setdefault(line, []).append(e)
    if not wanted:
        return
    try:
        found = _lines_from(path, sorted(wanted))
    except OSError:
        return
    for line, evs in wanted.items():
        raw = found.get(line) or []
        if not raw or not crashdump.is_fatal(raw[0]):
            continue   # the file changed since it was scanned: no dump rather than another one's
        for e in evs:
            e.fields["dump"] = _dump_of(e.fields.get("stream"), raw[1:])


def _lines_from(path: str, targets: list[int]) -> dict[int, list[str]]:
    """For each line number in ``targets`` (ascending), that line and the ``MAX_DUMP_LINES`` after it (each cut
    to ``MAX_LINE``; a window stops once it holds more than ``MAX_DUMP_CHARS``: at most ``MAX_DUMPS`` of them,
    whatever the lines). Blocks that hold none of them are only counted, so a dump near the end of a large log costs
    little more than reading the file."""
    out: dict[int, list[str]] = {t: [] for t in targets}
    size = dict.fromkeys(targets, 0)
    pending = list(targets)   # targets whose lines are not all read yet (ascending)
    lineno = 0                # lines before ``data``
    carry = b""               # the start of a line the last block cut (at most MAX_LINE bytes of it)
    with open(path, "rb") as f:
        while pending:
            block = f.read(BLOCK)
            data = carry + block
            if not block:
                if not data:
                    break
                whole, carry = data, b""                  # the last line, without a newline
            else:
                cut = data.rfind(b"\n")
                if cut < 0:
                    carry = data[:MAX_LINE]
                    continue
                whole, carry = data[:cut], data[cut + 1:][:MAX_LINE]
            n = whole.count(b"\n") + 1
            if pending[0] <= lineno + n:                  # a window starts in this block or goes on in it
                parts = whole.split(b"\n")
                for t in pending:
                    lo, hi = max(t, lineno + 1), min(t + MAX_DUMP_LINES, lineno + n)
                    for p in parts[lo - lineno - 1:hi - lineno] if lo <= hi else ():
                        if size[t] > MAX_DUMP_CHARS:
                            break
                        text = p[:MAX_LINE].decode("utf-8", "replace").rstrip("\r")
                        out[t].append(text)
                        size[t] += len(text) + 1
            lineno += n
            # a window is done at its last line, or once it holds more than a dump may (long lines: memory)
            pending = [t for t in pending if t + MAX_DUMP_LINES > lineno and size[t] <= MAX_DUMP_CHARS]
            if not block:
                break
    return out


def _dump_of(who: str | None, lines: list[str]) -> list[str]:
    """The lines of one dump: collector prefixes off; in a merged file, only those of the process ``who``
    names; ending before another crash's first line or the first line no dump has, and bounded."""
    out, chars = [], 0
    for line in lines:
        text, _, by = unwrap_from(line)   # the frame's indentation goes too: crash_stack does not need it
        text = _SHIPPED_STAMP.sub("", text)   # kubectl --timestamps, a shipper: the stamp before each line
        if who is not None and by != who:
            continue
        if crashdump.is_fatal(text) or not crashdump.is_dump_line(text):
            break
        chars += len(text)
        if chars > MAX_DUMP_CHARS:
            break
        out.append(text)
    return out
