"""``--format markdown``: a report to paste into an issue or a CI summary, in the terminal report's order.

Log text is inert: control sequences removed, HTML (``<script>``, ``<img onerror>``) and markdown
punctuation (links, emphasis, table cells) escaped in running text; inside code spans, where
markdown renders everything literally, only the backtick is replaced.
"""

from __future__ import annotations

import re

from kwdiag.analysis.groups import group_deaths
from kwdiag.analysis.model import Report
from kwdiag.escape import safe
from kwdiag.report.text import BLAME, base_dir, conf, crash_frames, hint_for, proof, short, when
from kwdiag.units import format_bytes

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~#!])")


def _md(text: str, limit: int = 300) -> str:
    text = safe(text, limit).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", text)


def _code(text: str) -> str:
    """Text for inside a code span (rendered literally; only a backtick could end it)."""
    return safe(text).replace("`", "'")


def _fence(text: str) -> str:
    """Text for inside a fenced code block (literal; only a run of three backticks could end it)."""
    return safe(text, 500).replace("```", "'''")


def render_markdown(report: Report) -> str:
    """The terminal report's order (verdict, what to do, groups, KilledWorker, chosen exits), with each
    group's evidence and every death in collapsible ``<details>`` sections."""
    base = base_dir(report.files)
    groups = group_deaths(report.deaths)
    group_of = {id(d): g.id for g in groups for d in g.deaths}
    bad = [g for g in groups if g.cause != "chose_to_exit"]
    out = ["# kwdiag explain", "", f"**Verdict:** {_md(report.verdict())}", ""]
    out += _what_to_do(bad, report)
    for g in bad:
        out += _group(g, base)
    out += _killed_workers(report, group_of)
    out += _other_sections(report, base)
    out += _deaths_table(report, groups, group_of)
    for p in report.problems:
        out.append(f"- input {p.level}: `{_code(p.path)}`: {_md(p.message)}")
    return "\n".join(out).rstrip("\n") + "\n"


def _what_to_do(bad, report: Report) -> list[str]:
    todo = [(g, hint_for(g.deaths[0].hints, report.runtimes)) for g in bad]
    todo = [(g, h) for g, h in todo if h is not None]
    if not todo:
        return []
    out = ["## What to do", ""]
    for g, h in todo:
        task = f" (`{_code(g.task)}`)" if g.task else ""
        out.append(f"- **[{g.id}] {len(g.deaths)}× {g.cause} / {_md(g.detail)}**{task}: {_md(h.text, 1000)}")
    return out + [""]


def _group(g, base: str | None) -> list[str]:
    who = ", ".join(f"{_md(d.worker)} #{d.incarnation}" for d in g.deaths[:10])
    more = f" and {len(g.deaths) - 10} more" if len(g.deaths) > 10 else ""
    out = [f"## [{g.id}] {g.cause} / {_md(g.detail)}: {len(g.deaths)} death(s)", "", f"Workers: {who}{more}.", ""]
    d = g.deaths[0]
    if d.summary:
        out += [f"{_md(d.summary)}.", ""]
    if d.alternatives:
        out += ["Could be " + ", ".join(f"`{_md(a)}`" for a in d.alternatives) + ": the lines cannot tell which.", ""]
    peaks = [x.memory.peak for x in g.deaths if x.memory and x.memory.peak]
    limit = next((x.memory.limit for x in g.deaths if x.memory and x.memory.limit), None)
    if peaks:
        out += [f"Peak memory {format_bytes(max(peaks))}" + (f" of a {format_bytes(limit)} limit." if limit else "."), ""]
    if d.stack:
        frames, _ = crash_frames(d.stack, brief=True)
        out += ["Crashed in " + " ← ".join("…" if f is None else f"`{_code(str(f))}`" for f in frames) + ".", ""]
    out += ["<details><summary>Evidence</summary>", "", "```"]
    out += [f"{_fence(short(e.file, base))}:{e.line + i}: {_fence(part)}"
            for e in proof(d) for i, part in enumerate(e.text.split("\n")[:12])]
    return out + ["```", "", "</details>", ""]


def _killed_workers(report: Report, group_of: dict[int, str]) -> list[str]:
    out = []
    for k in report.killed_workers:
        fair = BLAME[k.fair]
        ids = sorted({group_of[id(d)] for d in k.deaths if id(d) in group_of})
        where = (f"; its {len(k.deaths)} counted death(s) are in " + ", ".join(f"[{i}]" for i in ids)) if ids else ""
        out += [f"## KilledWorker: `{_code(k.task)}`: {fair}{where}", ""]
        out += [f"- {_md(r)}" for r in k.reasons]
        out += [f"- **fix ({h.runtime})**: {_md(h.text, 1000)}" for h in k.hints]
        out.append("")
    return out


def _other_sections(report: Report, base: str | None) -> list[str]:
    out = []
    if report.task_errors:
        out.append("## Task errors (not worker deaths)")
        out += [f"- `{_code(t.task or '?')}`: {_md(t.exception or '?')}" for t in report.task_errors]
        out.append("")
    if report.notes:
        out.append("## Cluster notes (not worker deaths)")
        for n in report.notes:
            ev = n.evidence[0] if n.evidence else None
            where = f" (`{_code(short(ev.file, base))}:{ev.line}`)" if ev else ""
            out.append(f"- {when(n.at)} **{_md(n.title)}**: {_md(n.text)}{where}")
        out.append("")
    return out


def _deaths_table(report: Report, groups, group_of: dict[int, str]) -> list[str]:
    chosen = [g for g in groups if g.cause == "chose_to_exit"]
    out = []
    if chosen:
        kinds = ", ".join(f"{_md(g.detail)} {len(g.deaths)}" for g in chosen)
        out += [f"Chose to exit: {sum(len(g.deaths) for g in chosen)} ({kinds}).", ""]
    if not report.deaths:
        return out + [f"No worker deaths found in {len(report.files)} file(s), {report.lines:,} line(s) "
                      f"({'/'.join(report.runtimes) or 'no known'} format); {len(report.workers)} worker(s) seen.", ""]
    out += ["<details><summary>Every death</summary>", "",
            "| group | worker | incarnation | when | cause | detail | confidence |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for d in report.deaths:
        out.append(f"| {group_of[id(d)]} | {_md(d.worker)} | {d.incarnation} | {when(d.at)} | {d.cause} | "
                   f"{_md(d.detail)} | {conf(d.confidence)} |")
    return out + ["", "</details>", ""]
