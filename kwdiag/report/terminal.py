"""The terminal report: a summary table, each death's evidence and fix, KilledWorker blame, a verdict.

Covers: a rich rendering for terminals (colour unless ``NO_COLOR``) and a plain, stable rendering
when the output is not a terminal (pipes, files, snapshot tests). A death whose memory the nanny
sampled gets a one-line sparkline against its limit (``report.sparkline``). Log text never reaches rich as
markup: it goes in ``Text`` objects after control sequences are stripped (``report.text.safe``).

Does not cover: JSON or Markdown (``jsonout``, ``markdown``).
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from kwdiag.analysis.model import Death, Report
from kwdiag.report.sparkline import sparkline
from kwdiag.escape import safe
from kwdiag.report.text import conf, when

FAIR = {True: "fair", False: "unfair", None: "cannot tell"}


def render_plain(report: Report, *, files: bool = True) -> str:
    """Plain text: stable, no colour, no box drawing."""
    lines: list[str] = []
    add = lines.append
    if report.deaths:
        rows = [("WORKER", "#", "WHEN", "CAUSE", "DETAIL", "CONF")]
        for d in report.deaths:
            rows.append((safe(d.worker, 40), str(d.incarnation), when(d.at), d.cause, safe(d.detail, 40),
                         conf(d.confidence)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            add("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        add("")
        for d in report.deaths:
            _plain_death(d, add)
    else:
        add("No worker deaths found.")
        add("")
    for k in report.killed_workers:
        add(f"KilledWorker: task {safe(k.task, 200)}: blame looks {FAIR[k.fair]}")
        for d in k.deaths:
            add(f"  counted: {safe(d.worker)} #{d.incarnation} at {when(d.at)}: {d.cause}/{safe(d.detail)}")
        for r in k.reasons:
            add(f"  - {safe(r, 400)}")
        for e in k.evidence[:4]:
            add(f"  {safe(e.file, 200)}:{e.line}: {safe(e.text)}")
        for h in k.hints:
            add(f"  fix ({h.runtime}): {safe(h.text, 600)}")
        add("")
    if report.task_errors:
        add(f"Task errors (a task raised; no worker died): {len(report.task_errors)}")
        for t in report.task_errors[:10]:
            ev = t.evidence[0] if t.evidence else None
            where = f" ({safe(ev.file, 200)}:{ev.line})" if ev else ""
            add(f"  {safe(t.task or '?', 120)}: {safe(t.exception or '?', 120)}{where}")
        add("")
    if report.notes:
        add(f"Cluster notes (not worker deaths): {len(report.notes)}")
        for n in report.notes:
            add(f"  {when(n.at)} {safe(n.title, 200)}")
            add(f"    {safe(n.text, 600)}")
            for e in n.evidence:
                add(f"    {safe(e.file, 200)}:{e.line}")
            if n.advice:
                add(f"    fix (kwdiag): {safe(n.advice, 600)}")
        add("")
    for p in report.problems:
        add(f"input {p.level}: {safe(p.path, 200)}: {safe(p.message, 400)}")
    add(f"Verdict: {report.verdict()}")
    return "\n".join(lines) + "\n"


def _plain_death(d: Death, add) -> None:
    head = f"{safe(d.worker)} #{d.incarnation}: {d.cause}/{safe(d.detail)} (confidence {conf(d.confidence)})"
    add(head)
    if d.summary:
        add(f"  {safe(d.summary, 300)}")
    extra = []
    if d.address:
        extra.append(f"address {safe(d.address, 80)}")
    if d.pid:
        extra.append(f"pid {d.pid}")
    if d.started is not None:
        extra.append(f"started {when(d.started)}")
    if d.noticed_by:
        extra.append(f"noticed by the {d.noticed_by}"
                     + (f" after {d.noticed_after:.1f}s" if d.noticed_after is not None else ""))
    if d.running:
        extra.append("running " + ", ".join(safe(t, 60) for t in d.running[:5]))
    if extra:
        add("  " + "; ".join(extra))
    spark = sparkline(d.memory)
    if spark:
        add("  " + spark)
    if d.disagreement:
        add("  other explanations seen: " + ", ".join(safe(x, 60) for x in d.disagreement))
    for e in d.evidence:
        add(f"  {safe(e.file, 200)}:{e.line}: {safe(e.text)}")
    for h in d.hints:
        add(f"  fix ({h.runtime}): {safe(h.text, 600)}")
    add("")


def render_rich(report: Report, console) -> None:
    from rich.table import Table
    from rich.text import Text

    colour = {"chose_to_exit": "green", "unknown": "yellow"}
    if report.deaths:
        table = Table(title="Worker deaths", show_lines=False)
        for col in ("worker", "#", "when", "cause", "detail", "confidence"):
            table.add_column(col)
        for d in report.deaths:
            table.add_row(Text(safe(d.worker, 40)), Text(str(d.incarnation)), Text(when(d.at)),
                          Text(d.cause, style=colour.get(d.cause, "red")), Text(safe(d.detail, 40)),
                          Text(conf(d.confidence)))
        console.print(table)
        for d in report.deaths:
            t = Text()
            t.append(f"{safe(d.worker)} #{d.incarnation}: ", style="bold")
            t.append(f"{d.cause}/{safe(d.detail)}", style=colour.get(d.cause, "bold red"))
            t.append(f" (confidence {conf(d.confidence)})")
            console.print(t)
            buf: list[str] = []
            _plain_death(d, buf.append)
            for line in buf[1:]:
                style = ("cyan" if line.lstrip().startswith("fix (")
                         else "magenta" if line.lstrip().startswith("memory ") else None)
                console.print(Text(line, style=style), soft_wrap=True)
    else:
        console.print(Text("No worker deaths found."))
    buf = []
    tail = render_plain(Report(killed_workers=report.killed_workers, task_errors=report.task_errors,
                               problems=report.problems, notes=report.notes))
    for line in tail.splitlines()[2:-1]:
        buf.append(line)
    for line in buf:
        style = "bold magenta" if line.startswith(("KilledWorker", "Cluster notes")) else None
        console.print(Text(line, style=style), soft_wrap=True)
    fails = bool(report.failures or report.killed_workers)
    console.print(Text(f"Verdict: {report.verdict()}", style="bold red" if fails else "bold green"))


def render_terminal(report: Report, out: TextIO | None = None, *, force_terminal: bool | None = None) -> None:
    out = out or sys.stdout
    is_tty = force_terminal if force_terminal is not None else (hasattr(out, "isatty") and out.isatty())
    if not is_tty:
        out.write(render_plain(report))
        return
    from rich.console import Console

    console = Console(file=out, force_terminal=True, no_color=bool(os.environ.get("NO_COLOR")),
                      highlight=False, markup=False, emoji=False)
    render_rich(report, console)
