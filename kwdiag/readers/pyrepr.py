"""Log lines held in a printed Python value: what a notebook shows of Dask's own log-fetching calls. Pure.

Covers: ``client.get_worker_logs()`` (a dict of address -> ``(level, message)`` tuples), ``get_scheduler_logs()``
(a list of such tuples), ``cluster.get_logs()`` (a dict of name -> the lines joined by newlines), with or without
``timestamps=True``, printed (``print``: one line) or pretty-printed (``pprint``: long strings cut into adjacent
literals over several lines, which ``log_lines`` joins again), whole or cut off at any point (a paste that
stops mid-value keeps the lines before the cut). Each log line comes with the line of the text it starts on
and the dict key it is under (the worker's address, ``Scheduler``): the process that said it. Dask returns these
lines newest first; ``log_lines`` keeps the order printed, and the reader puts each key's lines in time order
(``kwdiag.readers.text``).

Does not cover: deciding what a line means (the rules), other Python values (a value holding no log line is not
this shape: ``log_lines`` returns None), or JSON (``kwdiag.readers.jsonlog``; a file of JSON objects is not read
here).
"""

from __future__ import annotations

import io
import json
import re
from typing import NamedTuple

LEVEL_NAMES = frozenset({"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"})
# A line of a Dask log inside the value: a logger of Dask's (or kwdiag's, tornado's) in Dask's layout.
_LOG_LINE = re.compile(r"\b(?:distributed|tornado|kwdiag)(?:\.\w+)* - [A-Z]+ - ")
# A log line outside any literal (a line of the text that starts with a time stamp or a logger): the text is a log
# (one whose first line happens to open with a bracket: "[2026-11-27 10:00:00] ..."), not a printed value.
_RAW_LOG_LINE = re.compile(r"^[ \t]*(?:\[?\d{4}-\d\d-\d\d[ T]\d|(?:distributed|tornado|kwdiag)\.\w+)", re.M)
# What a paste puts before the value: a markdown fence, IPython's "Out[N]:" prompt.
_LEAD = re.compile(r"\A\s*(?:(?:```|~~~)[\w+-]*[ \t]*\n|Out\[\d+\]:[ \t]*)?\s*")
# A value of Dask's log calls opens with its brackets and then a string (a key, a level, a line) or, with
# timestamps=True, a number: not a name, as in "[pod/x/worker] ..." (kubectl logs --prefix) or "[INFO] ...".
_VALUE_START = re.compile(r"""[\[{(][\s\[{(]*(?:[rRbBuU]{0,2}['"]|\d)""")


class ValueLine(NamedTuple):
    lineno: int  # the line of the text the log line starts on (1-based)
    key: str | None  # the dict key it is under: who said it
    text: str


def looks_like_value(head: str) -> bool:
    """Whether a text starting with ``head`` may be a printed Python value (not JSON lines, not a log)."""
    start = head[_LEAD.match(head).end():]
    if not _VALUE_START.match(start) or _RAW_LOG_LINE.search(head):
        return False
    first = start.split("\n", 1)[0]
    try:
        json.loads(first)
    except (ValueError, RecursionError):   # "[[[[..." deeper than json's recursion limit
        return True
    return False  # a JSON object on the first line: JSON lines (a logging formatter's), not a printed value


def log_lines(text: str) -> list[ValueLine] | None:
    """The log lines the printed value ``text`` holds, in the order printed; None when it holds none (or when the
    text is a log after all: a line of it, outside any literal, is a log line)."""
    if _RAW_LOG_LINE.search(text):
        return None
    out: list[ValueLine] = []
    for key, pieces in _strings(text):
        joined = "".join(piece for _, piece in pieces)
        offset = 0
        for part in joined.split("\n"):
            if part.strip() and part not in LEVEL_NAMES:   # ("INFO", "...") tuples: the level is its own string
                out.append(ValueLine(_line_at(pieces, offset), key, part))
            offset += len(part) + 1
    if not any(_LOG_LINE.search(v.text) for v in out):
        return None
    return out


def _line_at(pieces: list[tuple[int, str]], offset: int) -> int:
    """The text line of the literal that holds character ``offset`` of the joined string."""
    for lineno, piece in pieces:
        if offset < len(piece):
            return lineno
        offset -= len(piece)
    return pieces[-1][0]


def _strings(text: str) -> list[tuple[str | None, list[tuple[int, str]]]]:
    """Each string of the value (not a dict key) as its literals, (line, decoded text) each: adjacent literals
    are one string (Python's implicit concatenation, as pprint writes a long one), with the key of the outermost
    dict it is under. A cut end stops the reading; what came before stands."""
    import tokenize   # here: most inputs are not printed values, and the import costs ~2 ms at start-up

    out: list[tuple[str | None, list[tuple[int, str]]]] = []
    key: str | None = None
    depth = 0
    pending: list[tuple[int, str]] = []   # the literals of the string being read
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING:
                piece = _decode(tok.string)
                if piece is not None:
                    pending.append((tok.start[0], piece))
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
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    if pending:
        out.append((key, pending))
    return out


def _decode(literal: str) -> str | None:
    import ast   # here, as tokenize above (~7 ms)

    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None
