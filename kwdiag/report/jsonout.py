"""``--format json``: the ``Report`` as one JSON document (schema ``kwdiag.explain/1``, docs/explain.md).

Indented for reading, except past ``COMPACT_AFTER`` deaths: a report of many thousands is read by programs,
and compact JSON is written by the standard library's C encoder, several times faster. ``write_json`` writes
such a report a few hundred deaths (and incarnations) at a time, the same bytes as ``render_json`` without the
whole document in memory twice, as dicts and as one string (~4 KB a death: 67 MB of 236 at 16,000 deaths)."""

from __future__ import annotations

from typing import TextIO

from kwdiag.analysis.model import Report
from kwdiag.escape import to_json


COMPACT_AFTER = 1000  # deaths


def render_json(report: Report) -> str:
    return to_json(report.to_dict(), indent=None if len(report.deaths) > COMPACT_AFTER else 2) + "\n"


def write_json(report: Report, out: TextIO) -> None:
    """``render_json(report)`` written to ``out``; past ``COMPACT_AFTER`` deaths key by key, the deaths and
    incarnations ``CHUNK`` at a time (compact JSON joins items and keys with ``", "`` and ``": "``)."""
    if len(report.deaths) <= COMPACT_AFTER:
        out.write(render_json(report))
        return
    from kwdiag.analysis.groups import group_ids

    ids = group_ids(report.deaths)
    streamed = {"deaths": (({**d.to_dict(), "group": ids[id(d)]}) for d in report.deaths),
                "incarnations": (i.to_dict() for i in report.incarnations)}
    out.write("{")
    for n, (key, value) in enumerate(report.to_dict(lists=False).items()):
        out.write((", " if n else "") + to_json(key, indent=None) + ": ")
        if key not in streamed:
            out.write(to_json(value, indent=None))
            continue
        out.write("[")
        for k, chunk in enumerate(_chunks(streamed[key], CHUNK)):
            # a list's compact JSON without its brackets is its items joined by ", ", as in the whole document
            out.write(("" if k == 0 else ", ") + to_json(chunk, indent=None)[1:-1])
        out.write("]")
    out.write("}\n")


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
