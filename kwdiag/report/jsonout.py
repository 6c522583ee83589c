"""``--format json``: the ``Report`` as one JSON document (schema ``kwdiag.explain/1``, docs/explain.md)."""

from __future__ import annotations

from kwdiag.analysis.model import Report
from kwdiag.escape import to_json


def render_json(report: Report) -> str:
    return to_json(report.to_dict()) + "\n"
