"""``--format markdown``: a report to paste into an issue or a CI summary.

Log text is inert: control sequences removed, HTML (``<script>``, ``<img onerror>``) and markdown
punctuation (links, emphasis, table cells) escaped in running text; inside code spans, where
markdown renders everything literally, only the backtick is replaced.
"""

from __future__ import annotations

import re

from kwdiag.analysis.model import Report
from kwdiag.escape import safe
from kwdiag.report.text import conf, when

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~#!])")


def _md(text: str) -> str:
    text = safe(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", text)


def _code(text: str) -> str:
    """Text for inside a code span (rendered literally; only a backtick could end it)."""
    return safe(text).replace("`", "'")


def render_markdown(report: Report) -> str:
    out = ["# kwdiag explain", ""]
    if report.deaths:
        out += ["| worker | incarnation | when | cause | detail | confidence |", "| --- | --- | --- | --- | --- | --- |"]
        for d in report.deaths:
            out.append(f"| {_md(d.worker)} | {d.incarnation} | {when(d.at)} | {d.cause} | {_md(d.detail)} | "
                       f"{conf(d.confidence)} |")
        out.append("")
        for d in report.deaths:
            out.append(f"## {_md(d.worker)} #{d.incarnation}: {d.cause} / {_md(d.detail)} ({conf(d.confidence)})")
            if d.summary:
                out.append(f"{_md(d.summary)}.")
            out.append("")
            for e in d.evidence:
                out.append(f"- `{_code(e.file)}:{e.line}` {_md(e.text)}")
            for h in d.hints:
                out.append(f"- **fix ({h.runtime})**: {_md(h.text)}")
            out.append("")
    for k in report.killed_workers:
        fair = {True: "fair", False: "unfair", None: "cannot tell"}[k.fair]
        out.append(f"## KilledWorker: `{_code(k.task)}` — blame looks {fair}")
        for d in k.deaths:
            out.append(f"- {_md(d.worker)} #{d.incarnation} at {when(d.at)}: {d.cause}/{_md(d.detail)}")
        for r in k.reasons:
            out.append(f"- {_md(r)}")
        for h in k.hints:
            out.append(f"- **fix ({h.runtime})**: {_md(h.text)}")
        out.append("")
    if report.task_errors:
        out.append("## Task errors (not worker deaths)")
        for t in report.task_errors:
            out.append(f"- `{_code(t.task or '?')}`: {_md(t.exception or '?')}")
        out.append("")
    if report.notes:
        out.append("## Cluster notes (not worker deaths)")
        for n in report.notes:
            ev = n.evidence[0] if n.evidence else None
            where = f" (`{_code(ev.file)}:{ev.line}`)" if ev else ""
            out.append(f"- {when(n.at)} **{_md(n.title)}**: {_md(n.text)}{where}")
        out.append("")
    for p in report.problems:
        out.append(f"- input {p.level}: `{_code(p.path)}`: {_md(p.message)}")
    out.append(f"**Verdict:** {_md(report.verdict())}")
    return "\n".join(out) + "\n"
