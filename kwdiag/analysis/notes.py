"""Cluster notes: facts in kwdiag's logs that are not worker deaths but change how to read them.

Covers: the scheduler's own death and its recovery by the scheduler that took over its journal
(``scheduler-recovered``: how long the cluster was headless, what was replayed, reused and
recomputed), a journal with a torn tail, one set aside or that could not be written, and event files
with events missing (``events-lost``: a full disk, a deleted log directory). Each becomes a ``Note``
whose title, severity and advice come from the event rule that reads it
(``rules/kwdiag/kwdiag-scheduler-recovered.toml`` and its siblings); an event no rule reads is no note.

Does not cover: worker deaths (``kwdiag.analysis.classify``). Pure: no files, no runtime imports.
"""

from __future__ import annotations

from typing import Iterable

from kwdiag.analysis.model import Evidence, Note
from kwdiag.events import Event
from kwdiag.kinds import NOTE

# The figures a note keeps from its event (for --format json); everything else stays in the logs.
NOTE_FIELDS = ("previous_pid", "previous_address", "died_at", "headless_for", "waited", "workers_back",
               "workers_missing", "replayed", "reused", "recomputed", "rerun", "adopted", "finished_while_headless",
               "lost_scattered", "skipped_bytes", "problem", "moved_to", "reason", "file", "lost", "first", "last")


def cluster_notes(events: Iterable[Event], rules) -> list[Note]:
    """One ``Note`` per note-worthy event a rule reads, in time order."""
    out = []
    for e in events:
        if e.kind not in NOTE:
            continue
        matched = rules.match_event(e.kind, e.fields)
        if not matched:
            continue
        rule = matched[0]
        origin = e.origin
        evidence = (Evidence(file=origin.file if origin else "?", line=origin.at if origin else 0,
                             text=(e.message or e.kind)[:500], rule=rule.id, source=e.source),)
        out.append(Note(kind=e.kind, at=e.ts, source=e.source, worker=e.worker, title=rule.title,
                        severity=rule.severity, text=e.message or e.kind, rule=rule.id,
                        advice=rule.remediation.get("kwdiag", ""), evidence=evidence,
                        fields={k: e.fields[k] for k in NOTE_FIELDS if k in e.fields}))
    out.sort(key=lambda n: n.at or 0.0)
    return out
