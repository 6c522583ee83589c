"""The lines under a ``Fatal Python error`` line of a text log (a faulthandler dump), read again once the scan found it.

Covers: plain files. The scan hands the readers only the lines some rule could match, and a dump's frame lines
(``  File "PATH", line N in FUNC``) match none; making them candidates would make every traceback line of every
log one. So after a plain file is scanned, the few ``Fatal Python error`` events it gave (at most ``MAX_DUMPS``)
get the ``MAX_DUMP_LINES`` lines after theirs in ``fields["dump"]``, from one more pass over the file that stops
at the last of them. In a file that merges processes behind collector prefixes (compose, kubectl), only the lines
of the same process are kept, prefixes removed. The analysis reads the crashing thread's frames from them
(``kwdiag.analysis.stack``).

Does not cover: gzip and stdin (not read twice: their dumps are not attached, and a death's ``stack`` stays
empty), or dumps written to another file than the ``Fatal Python error`` line.
"""

from __future__ import annotations

from kwdiag.events import Event
from kwdiag.readers.shapes import unwrap_from

MAX_DUMPS = 200
MAX_DUMP_LINES = 80
MAX_LINE = 4096
BLOCK = 1 << 22
FATAL = "Fatal Python error"


def attach_dumps(path: str, events: list[Event]) -> None:
    """Give each ``Fatal Python error`` event of ``path`` (a plain file) the lines that follow it."""
    wanted: dict[int, list[Event]] = {}
    for e in events:
        if e.origin is not None and FATAL in e.message and isinstance(e.fields, dict) and "dump" not in e.fields:
            if e.origin.line not in wanted and len(wanted) >= MAX_DUMPS:
                break
            wanted.setdefault(e.origin.line, []).append(e)
    if not wanted:
        return
    try:
        found = _lines_after(path, sorted(wanted))
    except OSError:
        return
    for line, evs in wanted.items():
        for e in evs:
            e.fields["dump"] = _same_process(e.fields.get("stream"), found.get(line, []))


def _lines_after(path: str, targets: list[int]) -> dict[int, list[str]]:
    """For each line number in ``targets`` (ascending), the ``MAX_DUMP_LINES`` lines after it. Blocks whose
    lines hold no target are only counted (``bytes.count`` runs at memory speed), so a dump near the end of a
    large log costs little more than reading the file."""
    out: dict[int, list[str]] = {t: [] for t in targets}
    pending = list(targets)   # targets whose lines are not all read yet
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
            if pending[0] < lineno + n:                   # some window starts before this block ends
                for i, raw in enumerate(whole.split(b"\n"), lineno + 1):
                    for t in pending:
                        if t < i <= t + MAX_DUMP_LINES:
                            out[t].append(raw[:MAX_LINE].decode("utf-8", "replace").rstrip("\r"))
            lineno += n
            pending = [t for t in pending if t + MAX_DUMP_LINES > lineno]
            if not block:
                break
    return out


def _same_process(who: str | None, lines: list[str]) -> list[str]:
    """``lines`` without collector prefixes; in a merged file, only those of the process ``who`` names."""
    out = []
    for line in lines:
        text, _, by = unwrap_from(line)
        if who is None or by == who:
            out.append(text)
    return out
