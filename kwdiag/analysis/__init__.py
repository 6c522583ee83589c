"""The analysis stage: ``analyze_events(events) -> Report``, pure (events in, report out, no file I/O).

Covers: wiring timeline → classification → blame → task errors into one ``Report`` (types in
``kwdiag.analysis.model``). ``kwdiag.pipeline.analyze(paths)`` reads files and calls this.

Does not cover: reading logs (``kwdiag.readers``), rendering (``kwdiag.report``) or the command line.
Never imports ``kwdiag.runtime``.
"""

from __future__ import annotations

from kwdiag.analysis.model import (
    CAUSES,
    SCHEMA,
    SCHEMA_VERSION,
    Death,
    Evidence,
    Hint,
    IncarnationSpan,
    InputProblem,
    KilledWorkerBlame,
    MemoryTrace,
    Note,
    Report,
    TaskError,
)

__all__ = [
    "analyze_events", "Report", "Death", "Evidence", "Hint", "KilledWorkerBlame",
    "TaskError", "Note", "InputProblem", "MemoryTrace", "IncarnationSpan", "CAUSES", "SCHEMA", "SCHEMA_VERSION",
]


def analyze_events(events, rules=None, *, file_runtime: dict | None = None, problems=(), files=(),
                   lines: int = 0, nbytes: int = 0) -> Report:
    """Pure analysis of already-read ``Event``s (with origins)."""
    from kwdiag.analysis.blame import blame
    from kwdiag.analysis.classify import classify
    from kwdiag.analysis.notes import cluster_notes
    from kwdiag.analysis.task_errors import task_errors
    from kwdiag.timeline import build_timeline

    if rules is None:
        from kwdiag.engine import load_rules

        rules = load_rules()
    events = list(events)
    if file_runtime is None:
        file_runtime = _infer_runtimes(events)
    tl = build_timeline(events)
    deaths = classify(tl, rules, file_runtime)
    kws, unseen = blame(tl, deaths, rules, file_runtime)
    deaths = [*deaths, *unseen]
    terrs = task_errors(tl, rules)
    rts = sorted({r for r in (file_runtime or {}).values() if r})
    times = [e.ts for e in events if not e.get("ts_unknown")]
    return Report(deaths=tuple(deaths), killed_workers=tuple(kws), task_errors=tuple(terrs),
                  problems=tuple(problems), runtimes=tuple(rts), files=tuple(files),
                  workers=tuple(sorted(tl.workers)), events=len(events), lines=lines, bytes=nbytes,
                  incarnations=tuple(tl.spans()), first_ts=min(times, default=None),
                  last_ts=max(times, default=None), notes=tuple(cluster_notes(events, rules)))


def _infer_runtimes(events) -> dict:
    """Which runtime wrote each file, from the events alone: structured events are kwdiag's."""
    out: dict = {}
    for e in events:
        if e.origin is None:
            continue
        rid = e.fields.get("rule") if hasattr(e.fields, "get") else None
        rt = "kwdiag" if rid is None else ("dask" if str(rid).startswith("dask-") else None)
        if rt and out.get(e.origin.file) != "kwdiag":
            out[e.origin.file] = rt
        out.setdefault(e.origin.file, None)
    return out
