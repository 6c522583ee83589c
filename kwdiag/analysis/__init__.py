"""The analyzer's public entry points: ``analyze(paths) -> Report`` and ``analyze_events(events) -> Report``.

Covers: wiring readers → timeline → classification → blame into one ``Report`` (types in
``kwdiag.analysis.model``). ``kwdiag explain``, ``kwdiag check`` and ``kwdiag run`` all call these.

Does not cover: rendering (``kwdiag.report``) or the command line (``kwdiag.cli_analysis``).
Never imports ``kwdiag.runtime``.
"""

from __future__ import annotations

from typing import Iterable

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
    "analyze", "analyze_events", "load_rules", "Report", "Death", "Evidence", "Hint", "KilledWorkerBlame",
    "TaskError", "Note", "InputProblem", "MemoryTrace", "IncarnationSpan", "CAUSES", "SCHEMA", "SCHEMA_VERSION",
]


def load_rules(rules_dirs: Iterable[str] = ()):
    """The built-in rules plus ``rules_dirs``; raises ``KwdiagError`` (USAGE) if any rule file is broken."""
    from kwdiag.analysis.engine import load_ruleset
    from kwdiag.errors import USAGE, KwdiagError

    ruleset, errors = load_ruleset(list(rules_dirs))
    if errors:
        raise KwdiagError("cannot load rules: " + "; ".join(errors[:3]) + (" ..." if len(errors) > 3 else ""), USAGE)
    return ruleset


def analyze_events(events, rules=None, *, file_runtime: dict | None = None, problems=(), files=(),
                   lines: int = 0, nbytes: int = 0) -> Report:
    """Pure analysis of already-read ``Event``s (with origins)."""
    from kwdiag.analysis.classify import blame, classify, task_errors
    from kwdiag.analysis.notes import cluster_notes
    from kwdiag.timeline import build_timeline

    if rules is None:
        rules = load_rules()
    events = list(events)
    if file_runtime is None:
        file_runtime = _infer_runtimes(events)
    tl = build_timeline(events)
    deaths = classify(tl, rules, file_runtime)
    kws = blame(tl, deaths, rules, file_runtime)
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


def analyze(paths: Iterable[str], rules_dirs: Iterable[str] = (), *, rules=None) -> Report:
    """Read ``paths`` (files, directories, ``-``, gzip) and explain every worker death in them.

    Never raises for bad input: unreadable inputs become ``Report.problems``.
    """
    from kwdiag.readers import read_events

    if rules is None:
        rules = load_rules(rules_dirs)
    events, results, problems = read_events(list(paths), rules)
    file_runtime = {r.name: r.runtime for r in results}
    return analyze_events(events, rules, file_runtime=file_runtime, problems=problems,
                          files=[r.name for r in results], lines=sum(r.lines for r in results),
                          nbytes=sum(r.bytes for r in results))
