"""``--format text`` (the default) and ``--format markdown`` of ``kwdiag check``.

Covers: a plain, stable text report (no colour, no terminal escape sequences: log text goes through
``kwdiag.report.text.safe``) and a markdown report (also the GitHub job summary) in which log text
is escaped so it cannot become markup, links, HTML or table cells.

Does not cover: machine formats (``jsonout``, ``junit``, ``sarif``, ``github``).
"""

from __future__ import annotations

import re

from kwdiag.check import Finding, Outcome
from kwdiag.check.policy import ALLOWED, BASELINED, FAIL, PASSED
from kwdiag.escape import safe
from kwdiag.report.text import conf

LABEL = {FAIL: "FAIL", BASELINED: "KNOWN", ALLOWED: "ALLOWED", PASSED: "PASSED"}
ORDER = {FAIL: 0, BASELINED: 1, PASSED: 2, ALLOWED: 3}
MAX_EVIDENCE = 4
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~#])")  # the rest only acts at a line start, which log text never is


def policy_line(outcome: Outcome) -> str:
    p = outcome.policy
    parts = []
    if p.threshold:
        parts.append(f"severity >= {p.threshold}")
    parts += [str(s) for s in p.fail_on]
    line = f"fail on {' or '.join(parts) if parts else 'nothing'}; allow {', '.join(map(str, p.allow)) or 'nothing'}"
    if outcome.baseline:
        line += f"; baseline {outcome.baseline}"
    return line


def ordered(outcome: Outcome) -> list[Finding]:
    """Failing first, then known, passed and allowed; time order within each."""
    return sorted(outcome.findings, key=lambda f: ORDER[f.status])


def render_text(outcome: Outcome) -> str:
    out: list[str] = [f"kwdiag check: {outcome.summary()}", f"policy: {policy_line(outcome)}", ""]
    for f in ordered(outcome):
        d = f.death
        out.append(f"{LABEL[f.status]:8} {safe(d.worker, 60)} #{d.incarnation}  {f.verdict}  {d.severity}  "
                   f"confidence {conf(d.confidence)}  [{f.fingerprint}]")
        if f.status in (FAIL, BASELINED):
            if d.summary:
                out.append(f"  {safe(d.summary, 300)}")
            for e in d.evidence[:MAX_EVIDENCE]:
                out.append(f"  {safe(e.file, 200)}:{e.line}: {safe(e.text)}")
            for h in d.hints:
                out.append(f"  fix ({h.runtime}): {safe(h.text, 800)}")
        out.append(f"  why: {f.reason}")
    if outcome.findings:
        out.append("")
    for k in outcome.report.killed_workers:
        out.append(f"KilledWorker: task {safe(k.task, 200)} (counted {len(k.deaths)} death(s): "
                   f"{', '.join(sorted(set(k.causes))) or '?'})")
    if outcome.report.task_errors:
        out.append(f"task errors (a task raised; not worker deaths, never a failure): {len(outcome.report.task_errors)}")
    for p in outcome.report.problems:
        out.append(f"input {p.level}: {safe(p.path, 200)}: {safe(p.message, 400)}")
    if not outcome.findings:
        out.append("no worker deaths found")
    return "\n".join(out).rstrip("\n") + "\n"


def md(text: str, limit: int = 300) -> str:
    """Log text as inert markdown: control sequences removed, punctuation and HTML escaped."""
    text = safe(text, limit).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", text)


def render_markdown(outcome: Outcome) -> str:
    icon = {0: "✅", 1: "❌", 2: "⚠️"}[outcome.exit_code]
    out = [f"## {icon} kwdiag check", "", md(outcome.summary(), 400), "", f"Policy: {md(policy_line(outcome), 600)}", ""]
    if outcome.findings:
        out += ["| status | worker | verdict | severity | confidence | fingerprint |",
                "| --- | --- | --- | --- | --- | --- |"]
        for f in ordered(outcome):
            d = f.death
            out.append(f"| {LABEL[f.status]} | {md(d.worker, 60)} \\#{d.incarnation} | {md(f.verdict)} | {d.severity} "
                       f"| {conf(d.confidence)} | `{f.fingerprint}` |")
        out.append("")
    for f in ordered(outcome):
        if f.status not in (FAIL, BASELINED):
            continue
        d = f.death
        out.append(f"### {LABEL[f.status]}: {md(d.worker, 60)} \\#{d.incarnation}: {md(f.verdict)}")
        if d.summary:
            out += ["", md(d.summary)]
        out.append("")
        for e in d.evidence[:MAX_EVIDENCE]:
            out.append(f"- {md(e.file, 200)}:{e.line}: {md(e.text)}")
        for h in d.hints:
            out.append(f"- **fix ({md(h.runtime)})**: {md(h.text, 800)}")
        out.append("")
    for k in outcome.report.killed_workers:
        out.append(f"- KilledWorker: task {md(k.task, 200)} counted {len(k.deaths)} death(s)")
    for p in outcome.report.problems:
        out.append(f"- input {p.level}: {md(p.path, 200)}: {md(p.message, 400)}")
    return "\n".join(out).rstrip("\n") + "\n"
