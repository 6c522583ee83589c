"""``--format json``: the ``Report`` as one JSON document (schema ``kwdiag.explain/1``, docs/explain.md)."""

from __future__ import annotations

import json

from kwdiag.analysis.model import Report


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n"
