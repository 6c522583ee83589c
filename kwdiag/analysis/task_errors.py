"""Task errors: tasks that raised, reported so users see them and never counted as worker deaths. Pure.

Covers: one ``TaskError`` per erred task; the lines of one Dask ``Compute Failed`` block (its ``Key:``
and ``Exception:`` lines, in a text log or inside one JSON record's message) are merged into one.

Does not cover: worker deaths (``kwdiag.analysis.classify``).
"""

from __future__ import annotations

from kwdiag.analysis.blame import task_key
from kwdiag.analysis.classify import evidence_of, rules_for
from kwdiag.analysis.model import TaskError
from kwdiag.engine import RuleSet
from kwdiag.events import Event
from kwdiag.timeline import Timeline


def task_errors(tl: Timeline, rules: RuleSet) -> list[TaskError]:
    """Task errors, one per erred task: the lines of one Dask ``Compute Failed`` block are merged."""
    out: list[TaskError] = []
    groups: list[list[Event]] = []
    for e in sorted(tl.task_errors, key=lambda e: (e.origin.file if e.origin else "", e.origin.line if e.origin else 0)):
        part = e.get("part")
        prev = groups[-1][-1] if groups else None
        if (part and prev is not None and prev.origin and e.origin and prev.origin.file == e.origin.file
                and 0 <= e.origin.line - prev.origin.line <= 8):   # 0: one JSON record carries the whole block
            groups[-1].append(e)
        else:
            groups.append([e])
    seen = set()
    for g in groups:
        key = next((task_key(e) for e in g if task_key(e)), None)
        exc = next((e.get("exception") for e in g if e.get("exception")), None)
        if exc is not None and not isinstance(exc, str):  # a JSONL event may carry any JSON value
            exc = str(exc)
        if key is not None and (key, exc) in seen:
            continue
        seen.add((key, exc))
        head = g[0]
        out.append(TaskError(task=key, exception=exc, worker=head.worker, at=head.ts,
                             evidence=tuple(evidence_of(e, (rules_for(e, rules) or [None])[0]) for e in g)))
    out.sort(key=lambda t: t.at or 0.0)
    return out
