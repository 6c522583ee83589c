"""``--format json``: the ``Report`` as one JSON document (schema ``kwdiag.explain/1``, docs/explain.md).

Indented for reading, except past ``COMPACT_AFTER`` deaths: a report of many thousands is read by programs,
and compact JSON is written by the standard library's C encoder, several times faster. ``write_json`` writes
such a report death by death (and incarnation by incarnation), the same bytes as ``render_json`` without the
whole document in memory twice, as dicts and as one string (~4 KB a death: 67 MB of 236 at 16,000 deaths)."""

from __future__ import annotations

from typing import TextIO

from kwdiag.analysis.model import Report
from kwdiag.escape import to_json


COMPACT_AFTER = 1000  # deaths


def render_json(report: Report) -> str:
    return to_json(report.to_dict(), indent=None if len(report.deaths) > COMPACT_AFTER else 2) + "\n"


_STREAMED = ("deaths", "incarnations")   # the lists that grow with the deaths


def write_json(report: Report, out: TextIO) -> None:
    """``render_json(report)`` written to ``out``; past ``COMPACT_AFTER`` deaths one death (and incarnation) at
    a time."""
    if len(report.deaths) <= COMPACT_AFTER:
        out.write(render_json(report))
        return
    from kwdiag.analysis.groups import group_ids

    marks = {name: f"__kwdiag_streamed_{name}_{id(report):x}__" for name in _STREAMED}
    doc = report.to_dict(lists=False)
    doc.update({name: mark for name, mark in marks.items()})
    text = to_json(doc, indent=None)
    ids = group_ids(report.deaths)
    items = {"deaths": (({**d.to_dict(), "group": ids[id(d)]}) for d in report.deaths),
             "incarnations": (i.to_dict() for i in report.incarnations)}
    for name in _STREAMED:
        head, text = text.split(f'"{marks[name]}"', 1)
        out.write(head + "[")
        first = True
        for chunk in _chunks(items[name], CHUNK):
            # a list's compact JSON without its brackets is its items joined by ", ", as in the whole document
            out.write(("" if first else ", ") + to_json(chunk, indent=None)[1:-1])
            first = False
        out.write("]")
    out.write(text + "\n")


CHUNK = 500  # items encoded at a time: one encoder call per item was ~20 us each


def _chunks(items, size: int):
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
