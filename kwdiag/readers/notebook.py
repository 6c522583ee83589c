"""Jupyter notebooks (``.ipynb``): the log lines a notebook keeps in its cells' outputs. Pure.

Covers: nbformat 4 documents, as Jupyter saves them. Each code cell's outputs, in order, become the text a user
would paste of that cell: a stream's text (stderr: the cluster's own log lines; stdout: what the cell printed,
a printed ``client.get_worker_logs()`` included), an ``execute_result``'s or ``display_data``'s ``text/plain``
(the ``Out[N]`` repr of a value) and an ``error``'s traceback (its ANSI colours removed: a ``KilledWorker``).
Each line of that text comes with the line of the ``.ipynb`` file that holds it: Jupyter writes every line of an
output as a JSON string on a line of its own, so evidence points into the file.

Does not cover: reading the text (``kwdiag.readers.text``, the same as a pasted cell's output), notebooks older
than nbformat 4, or the cells' source code (what the user ran is not what the cluster logged).
"""

from __future__ import annotations

import json
import re

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def looks_like_notebook(head: bytes) -> bool:
    """Whether a text starting with ``head`` may be a notebook: a JSON object whose first key is ``cells``."""
    return head.lstrip()[:1] == b"{" and b'"cells"' in head[:200]


def notebook_text(data: bytes) -> tuple[str, list[int]] | None:
    """The text of the cells' outputs of notebook ``data`` and, per line of it, the file's line (1-based) that
    holds it; None when ``data`` is not an nbformat 4 notebook."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    version = doc.get("nbformat")
    if not isinstance(doc.get("cells"), list) or not isinstance(version, int) or version < 4:
        return None
    physical = data.decode("utf-8", "replace").split("\n")
    lines: list[str] = []
    where: list[int] = []
    cursor = 0   # the file's line the search for the next output line starts at: outputs are stored in order
    misses = 0   # output lines not found where Jupyter writes them: past MAX_MISSES, no more are looked for
    for cell in doc["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code" or not isinstance(cell.get("outputs"), list):
            continue
        for output in cell["outputs"]:
            for piece in _pieces(output):
                found = _line_holding(physical, piece, cursor) if misses <= MAX_MISSES else None
                misses += found is None
                cursor = cursor if found is None else found
                for line in _ANSI.sub("", piece).split("\n"):
                    lines.append(line)
                    where.append(cursor + 1)
                if piece.endswith("\n"):
                    lines.pop()   # the piece's own line end, not an empty line
                    where.pop()
    return "\n".join(lines) + "\n", where


def _pieces(output) -> list[str]:
    """The strings of one output, as stored (a list of lines, or one string)."""
    if not isinstance(output, dict):
        return []
    kind = output.get("output_type")
    if kind == "stream":
        value = output.get("text")
    elif kind in ("execute_result", "display_data"):
        data = output.get("data")
        value = data.get("text/plain") if isinstance(data, dict) else None
    elif kind == "error":
        value = output.get("traceback")
    else:
        return []
    if isinstance(value, str):
        return [value]
    return [x for x in value if isinstance(x, str)] if isinstance(value, list) else []


SEARCH_LINES = 5000   # how far after the last output line the next one is looked for (a long cell's source between)
MAX_MISSES = 20   # another writer's layout: its lines are not looked for any more (each miss reads SEARCH_LINES)


def _line_holding(physical: list[str], piece: str, start: int) -> int | None:
    """The first line from ``start`` (within ``SEARCH_LINES``) that holds ``piece`` as Jupyter writes it (a JSON
    string, non-ASCII kept or escaped); None when none does (another writer's layout: the evidence then points at
    the line of the output line before)."""
    end = min(len(physical), start + SEARCH_LINES)
    for encoded in {json.dumps(piece, ensure_ascii=False), json.dumps(piece)}:
        for i in range(start, end):
            if encoded in physical[i]:
                return i
    return None
