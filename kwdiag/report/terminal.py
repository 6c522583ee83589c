"""The terminal report, answer first: the verdict and what to do, then the deaths grouped by cause.

Covers: ``report_lines`` (the report as ``(style, text)`` lines, at most 80 columns): the verdict; one
fix per group of deaths that needs attention; each group (cause, detail and task, from
``kwdiag.analysis.groups``) with its workers, key figures (the task, peak memory against the limit,
a memory sparkline), the one to three lines that prove the cause (paths relative to the inputs'
folder, a multi-line message as indented lines with their own line numbers) and its fix; KilledWorker
blame referring to the groups; chosen exits (shutdown, retirement) in one line; what was read. With
``verbose`` every death and every evidence line and hint follow. ``render_plain`` joins the lines
(stable, for pipes, files and snapshot tests); ``render_rich`` prints them in colour on a terminal
(none under ``NO_COLOR``). Log text never reaches rich as markup: it goes in ``Text`` objects after
control sequences are stripped (``kwdiag.escape.safe``).

Does not cover: JSON or Markdown (``jsonout``, ``markdown``), which keep every death.
"""

from __future__ import annotations

import os
import sys
import textwrap
from typing import TextIO

from kwdiag.analysis.groups import DeathGroup, group_deaths
from kwdiag.analysis.groups import task_family as _family
from kwdiag.analysis.model import Death, Evidence, Report
from kwdiag.escape import safe
from kwdiag.report.sparkline import sparkline
from kwdiag.report.text import BLAME, base_dir, conf, crash_frames, from_here, hint_for, proof, short, when, who

WIDTH = 80
Line = tuple[str, str]  # (style, text): style is a name the rich renderer colours, "" for none


def _wrap(text: str, indent: str = "", first: str | None = None) -> list[str]:
    first = indent if first is None else first
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=indent + "  ",
                         break_long_words=True, break_on_hyphens=False) or [first.rstrip()]


def _figures(g: DeathGroup, *, killed: bool = False) -> str:
    """The figures a reader checks first: the task, the pid and time of a lone death (memory against the
    limit is the sparkline's)."""
    d = g.deaths[0]
    out = []
    if g.task:
        out.append(f"task {safe(g.task, 60)}" + (" (KilledWorker, blame fair)" if killed else ""))
    if len(g.deaths) == 1 and d.pid:
        out.append(f"pid {d.pid}")
    if len(g.deaths) == 1 and d.at is not None:
        out.append(when(d.at))
    return "; ".join(out)


SPARK_WIDTH = 24  # blocks: the grouped line fits 80 columns with its figures
CONTINUATION_LINES = 2  # of a multi-line message in the grouped report (-v: all, up to VERBOSE_LINES)
VERBOSE_LINES = 40
_NOISE = set(" ^~+-=")  # a traceback's carets, a table's borders


def _fit(text: str, width: int) -> str:
    """One line cut to ``width`` columns (code, tables: wrapping would break them)."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _evidence_lines(e: Evidence, base: str | None, indent: str, *, verbose: bool = True,
                    seen: set[tuple[str, ...]] | None = None) -> list[str]:
    """``file:line: text``. A message of several lines (a traceback, a version table) keeps its lines,
    indented below the first, each cut to the width; in a text log each has its own line number (the
    lines follow each other in the file), in JSONL they are one event's message (one line number). The
    grouped report keeps the last ``CONTINUATION_LINES`` (a traceback ends with its error) and drops
    caret-only lines and a message already shown in full (the scheduler's and the worker's copy of one
    version table)."""
    where = safe(short(e.file, base), 120)
    first, *rest = e.text.split("\n")
    out = _wrap(safe(first.rstrip(), 500), indent + "  ", first=f"{indent}{where}:{e.line}: ")
    rest = [r.rstrip() for r in rest if r.strip() and not set(r) <= _NOISE]
    keep = VERBOSE_LINES if verbose else CONTINUATION_LINES
    key = tuple(rest[-keep:])
    if seen is not None:
        if rest and key in seen:
            return out
        seen.add(key)
    numbered = not e.file.endswith(".jsonl")
    if len(rest) > keep:  # the lines left out are the middle of a traceback: -v shows them
        offset, rest = len(rest) - keep, rest[-keep:]
    else:
        offset = 0
    for i, part in enumerate(rest, 1 + offset):
        label = f"{indent}  {e.line + i}: " if numbered else f"{indent}  "
        out.append(label + _fit(safe(part, 500), WIDTH - len(label)))
    return out


MEMORY_CAUSES = {"nanny_memory_restart"}
NEAR_THE_LIMIT = 0.8


def _memory_matters(g: DeathGroup, trace) -> bool:
    """Memory is worth a line for a memory death, or when the worker was near its limit whatever the
    cause (a SIGKILL at 95 % of the limit is likely the kernel's OOM killer); not beside a segfault at 10 %."""
    if trace is None:
        return False
    if g.cause in MEMORY_CAUSES or "memory" in g.detail or g.detail == "oom_killer":
        return True
    return bool(trace.limit and trace.peak and trace.peak >= NEAR_THE_LIMIT * trace.limit)


def _told_in_groups(report: Report, group_of: dict[int, str]) -> dict[str, list[str]]:
    """KilledWorker tasks whose blame is fair and whose counted deaths are all in one group: group id ->
    tasks. The group's line says so, and the KilledWorker needs no lines of its own."""
    out: dict[str, list[str]] = {}
    for k in report.killed_workers:
        ids = {group_of.get(id(d)) for d in k.deaths}
        if k.fair is True and len(ids) == 1 and None not in ids:
            out.setdefault(ids.pop(), []).append(k.task)
    return out


def _group_lines(g: DeathGroup, report: Report, base: str | None, verbose: bool,
                 killed: list[str] = ()) -> list[Line]:
    """A group in a few lines: what happened and to whom, its figures, the lines that prove it. Its fix is
    in "What to do" (once); ``-v`` repeats it here and lists every death below."""
    n = len(g.deaths)
    d = g.deaths[0]
    head = f"[{g.id}] {n}× {g.label}" + (f": {safe(d.summary, 200)}" if d.summary else "")
    out: list[Line] = [("group-" + ("unknown" if g.cause == "unknown" else "bad"), x) for x in _wrap(head)]
    trace = max((x.memory for x in g.deaths if x.memory and x.memory.samples), default=None,
                key=lambda m: m.peak or 0)
    spark = sparkline(trace, width=SPARK_WIDTH, brief=True) if _memory_matters(g, trace) else None
    own = [t for t in killed if g.task and t and _family(t) == g.task]
    others = [t for t in killed if t not in own]
    told = f"KilledWorker {', '.join(safe(t, 60) for t in others)} (blame fair)" if others else ""
    figures = "; ".join(x for x in (safe(who(g.deaths), 400), _figures(g, killed=bool(own)), told) if x)
    out += [("", x) for x in _wrap(figures, "    ")]
    if d.alternatives:
        out += [("", x) for x in _wrap("could be: " + ", ".join(safe(a, 60) for a in d.alternatives)
                                       + " (the lines cannot tell which)", "    ")]
    if spark:
        out += [("memory", x) for x in _wrap(spark, "    ")]
    if d.stack:
        out += [("", x) for x in _wrap(_crashed_in(d.stack, brief=True), "    ")]
    seen: set[tuple[str, ...]] = set()
    for e in proof(d):
        out += [("", x) for x in _evidence_lines(e, base, "    ", verbose=verbose, seen=seen)]
    if verbose:
        hint = hint_for(d.hints, report.runtimes)
        if hint is not None:
            out += [("fix", x) for x in _wrap(safe(hint.text, 800), "    ", first=f"    fix ({hint.runtime}): ")]
    return out


def _death_lines(d: Death, base: str | None) -> list[Line]:
    """Everything about one death (``-v``): identity, every evidence line, every hint."""
    out: list[Line] = [("death", f"{safe(d.worker)} #{d.incarnation}: {d.cause}/{safe(d.detail)} "
                                 f"(confidence {conf(d.confidence)})")]
    extra = []
    if d.address:
        extra.append(f"address {safe(d.address, 80)}")
    if d.pid:
        extra.append(f"pid {d.pid}")
    if d.started is not None:
        extra.append(f"started {when(d.started)}")
    if d.at is not None:
        extra.append(f"ended {when(d.at)}")
    if d.noticed_by:
        extra.append(f"noticed by the {d.noticed_by}"
                     + (f" after {d.noticed_after:.1f}s" if d.noticed_after is not None else ""))
    if d.running:
        extra.append("running " + ", ".join(safe(t, 60) for t in d.running[:5]))
    out += [("", x) for x in _wrap("; ".join(extra), "  ")] if extra else []
    spark = sparkline(d.memory)
    if spark:
        out += [("memory", x) for x in _wrap(spark, "  ")]
    if d.alternatives:
        out += [("", x) for x in _wrap("the lines cannot tell apart: " + ", ".join(safe(x, 60) for x in d.alternatives),
                                       "  ")]
    if d.disagreement:
        out += [("", x) for x in _wrap("other explanations seen: " + ", ".join(safe(x, 60) for x in d.disagreement), "  ")]
    if d.stack:
        out += [("", x) for x in _wrap(_crashed_in(d.stack), "  ")]
    for e in d.evidence:
        out += [("", x) for x in _evidence_lines(e, base, "  ")]
    for h in d.hints:
        out += [("fix", x) for x in _wrap(safe(h.text, 800), "  ", first=f"  fix ({h.runtime}): ")]
    out.append(("", ""))
    return out


def _chosen_line(groups: list[DeathGroup]) -> list[Line]:
    chosen = [g for g in groups if g.cause == "chose_to_exit"]
    if not chosen:
        return []
    deaths = tuple(d for g in chosen for d in g.deaths)
    kinds = ", ".join(f"{g.detail} {len(g.deaths)}" for g in chosen)
    text = f"Chose to exit: {len(deaths)} ({kinds}): {safe(who(deaths, 8), 600)}"
    return [("ok", x) for x in _wrap(text)]


def _read_line(report: Report, base: str | None, verbose: bool = False) -> list[Line]:
    """What was read, so a reader knows the input was understood (and where the paths above are)."""
    runtimes = "/".join(report.runtimes) or "no known"
    text = (f"Read {len(report.files)} file(s), {report.lines:,} line(s), {runtimes} format"
            + (f" under {safe(from_here(base), 200)}" if base and (verbose or not report.deaths) else "")
            + f"; {len(report.workers)} worker(s), {len(report.incarnations)} incarnation(s)"
            + ("." if verbose or not report.deaths else "; -v: every death."))
    return [("dim", x) for x in _wrap(text)]


def _killed_lines(report: Report, group_of: dict[int, str], verbose: bool, told: set[str] = frozenset()) -> list[Line]:
    """One line per KilledWorker when its blame is fair and its deaths are in the groups above (their fix is
    the task's fix); the reasons and the advice when the blame is unfair or cannot be told, or with ``-v``."""
    out: list[Line] = []
    for k in report.killed_workers:
        if k.task in told and not verbose:
            continue  # its group's line names it
        groups = sorted({group_of[id(d)] for d in k.deaths if id(d) in group_of})
        counted = f"{len(k.deaths)} death(s) counted" + (f", in {', '.join(f'[{g}]' for g in groups)}" if groups else "")
        out += [("killed", x) for x in _wrap(f"KilledWorker: task {safe(k.task, 200)}: {BLAME[k.fair]}; "
                                             f"{counted}")]
        if k.fair is True and groups and not verbose:
            continue
        for r in k.reasons:
            out += [("", x) for x in _wrap(safe(r, 400), "  ", first="  - ")]
        if verbose:
            for e in k.evidence[:4]:
                out += [("", x) for x in _evidence_lines(e, None, "  ")]
        for h in k.hints:
            out += [("fix", x) for x in _wrap(safe(h.text, 600), "  ", first=f"  fix ({h.runtime}): ")]
    return out + ([("", "")] if out else [])


def report_lines(report: Report, *, verbose: bool = False) -> list[Line]:
    base = base_dir(report.files)
    groups = group_deaths(report.deaths)
    group_of = {id(d): g.id for g in groups for d in g.deaths}
    bad = [g for g in groups if g.cause != "chose_to_exit"]
    fails = bool(report.failures or report.killed_workers or report.task_errors)
    out: list[Line] = [("verdict-bad" if fails else "verdict-ok", x)
                       for x in _wrap("Verdict: " + report.verdict(brief=not verbose))]
    todo = [g for g in bad if hint_for(g.deaths[0].hints, report.runtimes)]
    if todo:
        out.append(("", "What to do:"))
        for g in todo:  # the one fix of each group, here and nowhere else (-v repeats it per death)
            hint = hint_for(g.deaths[0].hints, report.runtimes)
            text = f"[{g.id}] {safe(g.detail, 40)} ×{len(g.deaths)}" + (f" ({safe(g.task, 40)})" if g.task else "") + ": "
            out += [("fix", x) for x in _wrap(text + safe(hint.text, 800), "  ", first="  ")]
    out.append(("", ""))
    told = _told_in_groups(report, group_of)
    for g in bad:
        out += _group_lines(g, report, base, verbose, told.get(g.id, [])) + [("", "")]
    if not report.deaths:
        out.append(("", "No worker deaths found."))
        out += _read_line(report, base) + [("", "")]
    out += _killed_lines(report, group_of, verbose, {t for ts in told.values() for t in ts})
    if report.task_errors:
        out.append(("", f"Task errors (a task raised; no worker died): {len(report.task_errors)}"))
        for t in report.task_errors[:10]:
            ev = t.evidence[0] if t.evidence else None
            where = f" ({safe(short(ev.file, base), 200)}:{ev.line})" if ev else ""
            out += [("", x) for x in _wrap(f"{safe(t.task or '?', 120)}: {safe(t.exception or '?', 120)}{where}", "  ")]
        out.append(("", ""))
    if report.notes:
        out.append(("killed", f"Cluster notes (not worker deaths): {len(report.notes)}"))
        for n in report.notes:
            out += [("", x) for x in _wrap(f"{when(n.at)} {safe(n.title, 200)}", "  ")]
            out += [("", x) for x in _wrap(safe(n.text, 600), "    ")]
            for e in n.evidence:
                out.append(("", f"    {safe(short(e.file, base), 200)}:{e.line}"))
            if n.advice:
                out += [("fix", x) for x in _wrap(safe(n.advice, 600), "    ", first="    fix (kwdiag): ")]
        out.append(("", ""))
    out += _chosen_line(groups)
    if report.deaths:
        out += _read_line(report, base, verbose)
    if verbose and report.deaths:
        out += [("", ""), ("", "Every death:")]
        for d in report.deaths:
            out += _death_lines(d, base)
    for p in report.problems:
        out += [("problem", x) for x in _wrap(f"input {p.level}: {safe(p.path, 200)}: {safe(p.message, 400)}")]
    return out


def render_plain(report: Report, *, verbose: bool = False) -> str:
    """Plain text: stable, no colour, no box drawing, at most 80 columns (a long word may run over)."""
    lines = [text for _, text in _final(report_lines(report, verbose=verbose), report, verbose)]
    return "\n".join(lines) + "\n"


REPEAT_VERDICT_AFTER = 24  # lines: a -v report longer than a screen ends with its verdict again


def _final(lines: list[Line], report: Report, verbose: bool) -> list[Line]:
    while lines and not lines[-1][1]:
        lines.pop()
    if len(lines) > REPEAT_VERDICT_AFTER and verbose:
        lines = lines + [("", "")] + [(lines[0][0], x) for x in _wrap("Verdict: " + report.verdict())]
    return lines


STYLES = {"verdict-bad": "bold red", "verdict-ok": "bold green", "group-bad": "bold red", "group-unknown": "bold yellow",
          "fix": "cyan", "memory": "magenta", "killed": "bold magenta", "ok": "green", "dim": "dim", "death": "bold",
          "problem": "yellow"}


def render_rich(report: Report, console, *, verbose: bool = False) -> None:
    from rich.text import Text

    for style, text in _final(report_lines(report, verbose=verbose), report, verbose):
        console.print(Text(text, style=STYLES.get(style, "")), soft_wrap=True)


def render_terminal(report: Report, out: TextIO | None = None, *, force_terminal: bool | None = None,
                    verbose: bool = False) -> None:
    out = out or sys.stdout
    is_tty = force_terminal if force_terminal is not None else (hasattr(out, "isatty") and out.isatty())
    if not is_tty:
        out.write(render_plain(report, verbose=verbose))
        return
    from rich.console import Console

    console = Console(file=out, force_terminal=True, no_color=bool(os.environ.get("NO_COLOR")),
                      highlight=False, markup=False, emoji=False)
    render_rich(report, console, verbose=verbose)


def _crashed_in(stack, brief: bool = False) -> str:
    """``crashed in f (file:line) ← caller (file:line) ...``; ``brief``: the frames other than the one a fix
    names by function only (``crashed in string_at ← crash (run/job.py:40)``), to keep a group to its few lines."""
    frames, named = crash_frames(stack, brief)
    shown = ["..." if f is None else safe(f.function, 60) if brief and named is not None and f is not named
             else safe(str(f), 120)
             for f in frames]
    return "crashed in " + " ← ".join(shown)
