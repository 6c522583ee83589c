"""The few lines kwdiag adds to a ``KilledWorker`` traceback: why the workers that ran its task died.

Covers: finding the blame analysis of one task (a ``KilledWorker``) in a report, and saying in a few
plain lines which deaths counted against it, their causes (and exit status or signal where known),
whether the blame looks fair, and the one fix for them. Used as a PEP 678 exception note by kwdiag's
runtime (through ``kwdiag explain --note-for TASK``) and by ``kwdiag.dask.recording``.

Does not cover: the rest of the report, or attaching the note (the callers do).
"""

from __future__ import annotations

from kwdiag.analysis.model import Report
from kwdiag.escape import safe
from kwdiag.report.text import hint_for

MAX_DEATHS = 6


def _matches(task: str, wanted: str) -> bool:
    return task == wanted or task.strip("'\"") == wanted.strip("'\"")


def killed_worker_note(report: Report, task: str, *, where: str | None = None) -> str | None:
    """The note for the ``KilledWorker`` of ``task``, or None when the report has no blame for it."""
    blame = next((k for k in report.killed_workers if _matches(k.task, task)), None)
    if blame is None:
        return None
    lines = [f"kwdiag: {len(blame.deaths)} worker death(s) counted against this task"
             + ("" if blame.fair is None else " — the blame looks fair" if blame.fair else
                " — the blame does NOT look fair") + ":"]
    for d in blame.deaths[:MAX_DEATHS]:
        full = next((x for x in report.deaths if (x.worker, x.incarnation) == (d.worker, d.incarnation)), d)
        status = f" (pid {full.pid})" if getattr(full, "pid", None) else ""
        summary = getattr(full, "summary", "") or ""
        lines.append(f"  {safe(full.worker, 80)} #{full.incarnation}: {full.cause}/{full.detail}{status}"
                     + (f" — {safe(summary, 200)}" if summary else ""))
    if len(blame.deaths) > MAX_DEATHS:
        lines.append(f"  ... and {len(blame.deaths) - MAX_DEATHS} more")
    # The fix for the deaths themselves (the blame's own hint points at it as "the fix above").
    first = next((x for x in report.deaths if (x.worker, x.incarnation) == (blame.deaths[0].worker,
                                                                            blame.deaths[0].incarnation)), None)
    own = hint_for(first.hints, report.runtimes) if first is not None and first.hints else None
    hint = own.text if own is not None else next((h.text for h in blame.hints), None)
    if hint:
        lines.append(f"What to do: {safe(hint, 600)}")
    if where:
        lines.append(f"Every death, with its evidence: kwdiag explain {where}")
    return "\n".join(lines)
