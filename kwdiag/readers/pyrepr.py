"""Log lines held in a printed Python value: what a notebook shows of Dask's own log-fetching calls. Pure.

Covers: ``client.get_worker_logs()`` (a dict of address -> ``(level, message)`` tuples), ``get_scheduler_logs()``
(a list of such tuples), ``cluster.get_logs()`` (a dict of name -> the lines joined by newlines), with or without
``timestamps=True``, printed (``print``: one line) or pretty-printed (``pprint``: long strings cut into adjacent
literals over several lines, which ``log_lines`` joins again), whole or cut off at any point (a paste that
stops mid-value keeps the lines before the cut), after a few lines of what a paste puts first (a sentence, a
markdown fence, the cell's ``In [N]:`` code, ``Out[N]:``), several values in one paste (a notebook's cells: a
line one value shares with an earlier one is not counted again), and values among the lines of a log
(``values_among_lines``: a cell's output, the cluster's stderr lines around the printed value). Each log line comes
with the line of the text it starts on and the dict key it is under (the worker's address, ``Scheduler``): the process that said it. Dask returns these
lines newest first; ``log_lines`` keeps the order printed, and the reader puts each key's lines in time order
(``kwdiag.readers.text``).

Does not cover: deciding what a line means (the rules), other Python values (a value holding no log line is not
this shape: ``log_lines`` returns None), or JSON (``kwdiag.readers.jsonlog``; a file of JSON objects is not read
here).
"""

from __future__ import annotations

import io
import itertools
import json
import re
from collections import Counter
from typing import NamedTuple

LEVEL_NAMES = frozenset({"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"})
# A line of a Dask log inside the value: a logger of Dask's (or kwdiag's, tornado's) in Dask's layout.
_LOG_LINE = re.compile(r"\b(?:distributed|tornado|kwdiag)(?:\.\w+)* - [A-Z]+ - ")
# A log line outside any literal (a line of the text that starts with a time stamp or a logger): the text is a log
# (one whose first line happens to open with a bracket: "[2026-11-27 10:00:00] ..."), not a printed value.
_RAW_LOG_LINE = re.compile(r"^[ \t]*(?:\[?\d{4}-\d\d-\d\d[ T]\d|(?:distributed|tornado|kwdiag)\.\w+)", re.M)
# A value of Dask's log calls opens with its brackets and then a string (a key, a level, a line) or, with
# timestamps=True, a number: not a name, as in "[pod/x/worker] ..." (kubectl logs --prefix) or "[INFO] ...". It
# starts a line of the paste, after IPython's "Out[N]:" prompt if any; what comes before it (a markdown fence, the
# cell's "In [N]:" code, a sentence of the user's) is at most ``LEAD_LINES`` lines that are not log lines.
_VALUE_START = re.compile(r"""^[ \t]*(?:Out\[\d+\]:[ \t]*)?(?P<value>[\[{(][\s\[{(]*(?:[rRbBuU]{0,2}['"]|\d))""", re.M)
LEAD_LINES = 12
MAX_VALUES = 1000   # values read in one text (a notebook's cells); a text of more small ones is some program's output


class ValueLine(NamedTuple):
    lineno: int  # the line of the text the log line starts on (1-based)
    key: str | None  # the dict key it is under: who said it
    text: str


def looks_like_value(head: str) -> bool:
    """Whether a text starting with ``head`` may be a printed Python value (not JSON lines, not a log)."""
    m = _VALUE_START.search(head)
    if m is None or head.count("\n", 0, m.start()) > LEAD_LINES or _RAW_LOG_LINE.search(head):
        return False
    first = head[m.start("value"):].split("\n", 1)[0]
    try:
        json.loads(first)
    except (ValueError, RecursionError):   # "[[[[..." deeper than json's recursion limit
        return True
    return False  # a JSON object on the first line: JSON lines (a logging formatter's), not a printed value


def log_lines(text: str) -> list[ValueLine] | None:
    """The log lines the printed value ``text`` holds, in the order printed; None when it holds none (or when the
    text is a log after all: a line of it, outside any literal, is a log line). Of several values (a notebook's
    cells, the same call run again), a line a value shares with one before it is that line again, not a new one."""
    if _RAW_LOG_LINE.search(text):
        return None
    out = _new_lines(strings for _, strings in _strings(text))
    if not any(_LOG_LINE.search(v.text) for v in out):
        return None
    return out


class Span(NamedTuple):
    """Where a printed value holding log lines sits among a log's lines (``values_among_lines``)."""
    first: int   # its first line and last line (1-based, inclusive)
    last: int
    lines: list[ValueLine]   # its log lines not held by a value before it, in the order printed


# The start of a log line inside a literal: a quote, then a time stamp or a logger of Dask's (pprint may cut the line
# anywhere after). A log's own lines may start with a bracket too ("[2026-11-27 10:00:00] distributed..."); only a
# value start with such a literal within its first lines is tokenized (a log of bracketed lines would otherwise be
# tokenized line by line).
_QUOTED_LOG = re.compile(r"""['"](?:\d{4}-\d\d-\d\d[ T]\d\d:\d\d|(?:distributed|tornado|kwdiag)\.\w)""")
_QUOTED_LOG_ANCHORS = tuple(q + w for q in (b"'", b'"') for w in (b"20", b"distributed.", b"tornado.", b"kwdiag."))


def may_hold_values(data: bytes) -> bool:
    """Whether ``data`` may hold a printed value of log lines (a quote before a time stamp or a logger), and is not
    JSON lines (a first line that is a JSON object: kwdiag's events, a JSON logging formatter's records); cheap, no
    regex: a log of any size is asked."""
    first = data[:65536].lstrip().split(b"\n", 1)[0]
    if first.startswith(b"{"):
        try:
            json.loads(first)
            return False
        except (ValueError, RecursionError):
            pass
    return any(a in data for a in _QUOTED_LOG_ANCHORS)


def values_among_lines(text: str) -> list[Span] | None:
    """The printed values holding log lines among the lines of a log: a notebook cell's output, where the
    cluster's own log lines (stderr) come before and after what ``print(client.get_worker_logs())`` shows. Each
    value's lines are what ``log_lines`` reads of it (a line an earlier value held is not new); None when no value
    holds a log line. Values are looked for on any line, not only near the start (``looks_like_value``)."""
    spans: list[Span] = []
    seen: Counter = Counter()
    for (first, last), strings in _strings(text, _QUOTED_LOG):
        lines = _new_lines([strings], seen)
        # a value that only repeats an earlier one (print(logs), then logs as Out[N]) is still a value: its lines
        # are not read again, and not as the log's own lines either
        if any(_LOG_LINE.search("".join(piece for _, piece in pieces)) for _, pieces in strings):
            spans.append(Span(first, last, lines))
    return spans if any(span.lines for span in spans) else None


def _new_lines(values, seen: Counter | None = None) -> list[ValueLine]:
    """The lines of ``values`` (each its strings, as ``_strings`` gives them) in the order printed, less those an
    earlier value held (``seen``: the (key, line)s of the values before, as many times as one held them)."""
    out: list[ValueLine] = []
    seen = Counter() if seen is None else seen
    for strings in values:
        mine: Counter = Counter()
        for key, pieces in strings:
            joined = "".join(piece for _, piece in pieces)
            ends = list(itertools.accumulate(len(piece) for _, piece in pieces))   # where each literal ends in it
            offset = at = 0   # where the part starts in the joined string, and the literal that holds it
            for part in joined.split("\n"):
                while at < len(ends) - 1 and offset >= ends[at]:   # forward only: linear in the literals
                    at += 1
                if part.strip() and part not in LEVEL_NAMES:   # ("INFO", "...") tuples: the level is its own string
                    mine[key, part] += 1
                    if mine[key, part] > seen[key, part]:   # a line of an earlier value printed again is not new
                        out.append(ValueLine(pieces[at][0], key, part))
                offset += len(part) + 1
        seen |= mine
    return out


def _strings(text: str, near: re.Pattern | None = None
             ) -> list[tuple[tuple[int, int], list[tuple[str | None, list[tuple[int, str]]]]]]:
    """Per value printed in ``text``, its first and last line and each of its strings (not a dict key) as its
    literals, (line, decoded text) each: adjacent literals are one string (Python's implicit concatenation, as pprint
    writes a long one), with the key of the outermost dict it is under. A value is read from where it starts
    (``_VALUE_START``) to its closing bracket; then the next one is looked for (a notebook's cells: "In [5]: ...",
    "Out[5]: {...}", "In [6]: ..."). A cut end stops the reading; what came before stands. With ``near``, a start
    is read only when ``near`` matches within its first ``NEAR_LINES`` lines (not read: the next line is looked at)."""
    out: list = []
    stream = io.StringIO(text)   # each value is tokenized from where it starts, without copying the rest of the text
    pos, lineno = 0, 1   # where the search goes on, and the text's line there
    while len(out) < MAX_VALUES:
        m = _VALUE_START.search(text, pos)
        if m is None:
            return out
        lineno += text.count("\n", pos, m.start("value"))
        skip = near is not None and (_RAW_LOG_LINE.match(text, m.start()) is not None   # a log's own line
                                     or not _near(text, m.start("value"), near) or _json(text, m))
        if skip:
            newline = text.find("\n", m.start("value"))
            if newline < 0:
                return out
            lineno, pos = lineno + 1, newline + 1   # the next line is looked at
            continue
        stream.seek(m.start("value"))
        strings: list = []
        end = _read_value(stream, lineno, strings)
        last = lineno + text.count("\n", m.start("value"), len(text) if end is None else end)
        out.append(((lineno, last), strings))
        if end is None:
            return out
        lineno, pos = last, end
    return out


NEAR_LINES = 40   # a printed dict's first keys may hold no line (a healthy worker's empty tuple)


def _json(text: str, start: re.Match) -> bool:
    """Whether the line a value seems to start on is a JSON object or array (a JSON logging record, a kwdiag event)."""
    end = text.find("\n", start.start("value"))
    try:
        json.loads(text[start.start("value"): len(text) if end < 0 else end])
    except (ValueError, RecursionError):
        return False
    return True


def _near(text: str, start: int, pattern: re.Pattern) -> bool:
    end = start
    for _ in range(NEAR_LINES):
        end = text.find("\n", end + 1)
        if end < 0:
            end = len(text)
            break
    return pattern.search(text, start, end) is not None


def _read_value(stream: io.StringIO, first_line: int, out: list) -> int | None:
    """Add the strings of the value ``stream`` is at (``_strings``), its lines numbered from ``first_line``; the
    offset in the text just after its closing bracket, None when the text ends (or breaks off) inside it."""
    import tokenize   # here: most inputs are not printed values, and the import costs ~2 ms at start-up

    key: str | None = None
    depth = 0
    pending: list[tuple[int, str]] = []   # the literals of the string being read
    starts: list[int] = []   # the offset in the text of each line the tokenizer read

    def readline() -> str:
        starts.append(stream.tell())
        return stream.readline()

    try:
        for tok in tokenize.generate_tokens(readline):
            if tok.type == tokenize.STRING:
                piece = _decode(tok.string)
                if piece is not None:
                    pending.append((tok.start[0] + first_line - 1, piece))
                continue
            if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
                continue
            if pending:
                if tok.type == tokenize.OP and tok.string == ":" and depth == 1:
                    key = "".join(piece for _, piece in pending)   # whose lines follow
                else:
                    out.append((key, pending))
                pending = []
            if tok.type == tokenize.OP:
                depth += tok.string in "([{"
                depth -= tok.string in ")]}"
                if depth == 0:
                    return starts[tok.end[0] - 1] + tok.end[1]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    if pending:
        out.append((key, pending))
    return None


def _decode(literal: str) -> str | None:
    import ast   # here, as tokenize above (~7 ms)

    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None
