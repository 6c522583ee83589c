"""``--format json``: the ``Report`` as one JSON document (schema ``kwdiag.explain/1``, docs/explain.md).

Indented for reading, except past ``COMPACT_AFTER`` deaths: a report of many thousands is read by programs,
and compact JSON is written by the standard library's C encoder, several times faster."""

from __future__ import annotations

from kwdiag.analysis.model import Report
from kwdiag.escape import to_json


COMPACT_AFTER = 1000  # deaths


def render_json(report: Report) -> str:
    return to_json(report.to_dict(), indent=None if len(report.deaths) > COMPACT_AFTER else 2) + "\n"
