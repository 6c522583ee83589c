"""The public result types of an analysis: ``Death``, ``Evidence``, ``Hint``, ``KilledWorkerBlame``,
``TaskError``, ``Note`` and ``Report`` (``InputProblem`` is the readers').

Covers: plain, frozen dataclasses with a stable ``to_dict()`` (the JSON output is built from these,
schema ``SCHEMA``), ``MemoryTrace`` (what the logs show of one incarnation's memory) and
``IncarnationSpan`` (when each incarnation lived), both for charts, and a ``fingerprint`` for each
death that stays the same when the same failure is seen again (no timestamps, no ports, no pids), for CI gating (`kwdiag check`) and de-duplication.

Does not cover: how deaths are found (``kwdiag.timeline``) or classified (``kwdiag.analysis.classify``),
nor rendering (``kwdiag.report``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kwdiag.analysis.stack import Frame
from kwdiag.events import iso_time
from kwdiag.engine import CAUSES, SEVERITIES  # noqa: F401  (re-exported: the vocabulary of Death.cause)
from kwdiag.readers.inputs import InputProblem
from kwdiag.timeline.model import IncarnationSpan

SCHEMA = "kwdiag.explain/1"
SCHEMA_VERSION = 1



def iso(ts: float | None) -> str | None:
    """``ts`` (epoch seconds) as ISO 8601 UTC with milliseconds, or None."""
    return None if ts is None else iso_time(ts)


@dataclass(frozen=True, slots=True)
class Evidence:
    """One log line that supports a verdict: where it is, what it says, which rule read it."""

    file: str
    line: int
    text: str
    rule: str | None = None
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "text": self.text, "rule": self.rule}


@dataclass(frozen=True, slots=True)
class Hint:
    """One remediation, written for one runtime (``kwdiag``, ``dask`` or ``coiled``)."""

    text: str
    runtime: str
    rule: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "text": self.text, "rule": self.rule}


@dataclass(frozen=True, slots=True)
class MemoryTrace:
    """What the logs show of one incarnation's memory (bytes; timestamps in epoch seconds).

    ``samples`` are the nanny's regular RSS samples (kwdiag: the last ~30 s before the exit);
    ``readings`` are the few values log lines state (Dask: ``Process memory: 248.09 MiB``), never
    resampled. ``limit`` is the memory limit, ``terminate_fraction`` the fraction of it at which the
    nanny terminates the worker, ``peak`` the highest RSS any of them shows.
    """

    samples: tuple[tuple[float, float], ...] = ()
    readings: tuple[tuple[float, float], ...] = ()
    limit: float | None = None
    terminate_fraction: float | None = None
    peak: float | None = None

    @property
    def terminate_at(self) -> float | None:
        """The RSS at which the nanny terminates the worker (limit × terminate fraction)."""
        if self.limit and self.terminate_fraction:
            return self.limit * self.terminate_fraction
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"limit": self.limit, "terminate_fraction": self.terminate_fraction, "peak": self.peak,
                "samples": [[t, v] for t, v in self.samples], "readings": [[t, v] for t, v in self.readings]}


@dataclass(frozen=True, slots=True)
class Death:
    """The end of one incarnation of one worker, and why.

    ``cause`` is one of ``CAUSES``; ``detail`` refines it (``sigkill``, ``segfault``, ``shutdown``...).
    ``confidence`` is 0..1: it rises with agreeing evidence from several sources and falls when
    sources disagree. ``failure`` is False for deaths nobody needs to act on (``chose_to_exit``).
    """

    worker: str
    incarnation: int
    cause: str
    detail: str
    confidence: float
    at: float | None
    address: str | None = None
    pid: int | None = None
    started: float | None = None
    evidence: tuple[Evidence, ...] = ()
    hints: tuple[Hint, ...] = ()
    rules: tuple[str, ...] = ()
    noticed_by: str | None = None
    noticed_after: float | None = None
    running: tuple[str, ...] = ()
    severity: str = "error"
    summary: str = ""
    disagreement: tuple[str, ...] = ()  # other explanations the evidence also supported
    # An ``unknown`` death: the classes (``cause/detail``) its lines cannot tell apart, for the report to name.
    alternatives: tuple[str, ...] = ()
    memory: MemoryTrace | None = None  # what the logs show of its memory, if anything
    # A crash with a faulthandler dump: the crashing thread's frames, innermost first (``kwdiag.analysis.stack``).
    stack: tuple[Frame, ...] = ()

    @property
    def failure(self) -> bool:
        return self.cause != "chose_to_exit"

    @property
    def fingerprint(self) -> str:
        """Stable across reruns and timestamps (``kwdiag.analysis.fingerprint``); ``kwdiag check`` uses the same."""
        from kwdiag.analysis.fingerprint import signature_id

        return signature_id(self.worker, self.cause, self.detail)

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "incarnation": self.incarnation,
            "address": self.address,
            "pid": self.pid,
            "cause": self.cause,
            "detail": self.detail,
            "confidence": round(self.confidence, 2),
            "failure": self.failure,
            "severity": self.severity,
            "summary": self.summary,
            "at": iso(self.at),
            "ts": self.at,
            "started": iso(self.started),
            "noticed_by": self.noticed_by,
            "noticed_after": None if self.noticed_after is None else round(self.noticed_after, 3),
            "running": list(self.running),
            "rules": list(self.rules),
            "disagreement": list(self.disagreement),
            "alternatives": list(self.alternatives),
            "fingerprint": self.fingerprint,
            "evidence": [e.to_dict() for e in self.evidence],
            "hints": [h.to_dict() for h in self.hints],
            "memory": self.memory.to_dict() if self.memory is not None else None,
            "stack": [f.to_dict() for f in self.stack],
        }


@dataclass(frozen=True, slots=True)
class KilledWorkerBlame:
    """A task the scheduler gave up on (``KilledWorker``) and whether blaming it looks fair."""

    task: str
    deaths: tuple[Death, ...]
    causes: tuple[str, ...]
    fair: bool | None  # None: the logs cannot tell
    reasons: tuple[str, ...]
    allowed_failures: int | None = None
    at: float | None = None
    evidence: tuple[Evidence, ...] = ()
    hints: tuple[Hint, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "at": iso(self.at),
            "allowed_failures": self.allowed_failures,
            "deaths": [{"worker": d.worker, "incarnation": d.incarnation, "at": iso(d.at), "cause": d.cause,
                        "detail": d.detail, "fingerprint": d.fingerprint} for d in self.deaths],
            "causes": list(self.causes),
            "fair": self.fair,
            "reasons": list(self.reasons),
            "evidence": [e.to_dict() for e in self.evidence],
            "hints": [h.to_dict() for h in self.hints],
        }


@dataclass(frozen=True, slots=True)
class TaskError:
    """A task that raised: reported so users see it, and never counted as a worker death."""

    task: str | None
    exception: str | None
    worker: str | None
    at: float | None
    evidence: tuple[Evidence, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "exception": self.exception, "worker": self.worker, "at": iso(self.at),
                "evidence": [e.to_dict() for e in self.evidence]}


@dataclass(frozen=True, slots=True)
class Note:
    """A cluster fact that is not a worker death: the scheduler died and another recovered its work, a
    journal was torn or set aside, events are missing from a file (``kwdiag.analysis.notes``)."""

    kind: str
    at: float | None
    source: str
    worker: str | None
    title: str
    severity: str
    text: str
    rule: str | None = None
    advice: str = ""
    evidence: tuple[Evidence, ...] = ()
    fields: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "at": iso(self.at), "ts": self.at, "source": self.source, "worker": self.worker,
                "title": self.title, "severity": self.severity, "text": self.text, "rule": self.rule,
                "advice": self.advice, "fields": dict(self.fields), "evidence": [e.to_dict() for e in self.evidence]}


@dataclass(frozen=True)
class Report:
    """Everything ``kwdiag explain`` found. Deaths are in time order."""

    deaths: tuple[Death, ...] = ()
    killed_workers: tuple[KilledWorkerBlame, ...] = ()
    task_errors: tuple[TaskError, ...] = ()
    problems: tuple[InputProblem, ...] = ()
    runtimes: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    workers: tuple[str, ...] = ()
    events: int = 0
    lines: int = 0
    bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    incarnations: tuple[IncarnationSpan, ...] = ()  # every incarnation seen, dead or alive, by worker
    first_ts: float | None = None  # the earliest and latest timestamps in the input
    last_ts: float | None = None
    notes: tuple[Note, ...] = ()  # cluster facts that are not worker deaths (scheduler recoveries, lost events)

    @property
    def failures(self) -> tuple[Death, ...]:
        return tuple(d for d in self.deaths if d.failure)

    @property
    def input_errors(self) -> tuple[InputProblem, ...]:
        return tuple(p for p in self.problems if p.level == "error")

    def verdict(self, *, brief: bool = False) -> str:
        """One line: the overall result. A KilledWorker or a task error is a failure even when no death in
        the input explains it: the line then says so, never "no failures". ``brief``: without the count per
        cause (a grouped report lists the causes right below)."""
        fails = self.failures
        chosen = len(self.deaths) - len(fails)
        kinds = len({(d.cause, d.detail) for d in fails})
        if fails and brief and kinds > 1:
            base = f"{len(fails)} worker death(s) need attention, of {kinds} kinds"
        elif fails:
            from collections import Counter

            counts = Counter(f"{d.cause}/{d.detail}" for d in fails)
            parts = ", ".join(f"{n}× {k}" for k, n in counts.most_common())
            base = f"{len(fails)} worker death(s) need attention: {parts}"
        elif self.killed_workers:
            base = (f"KilledWorker on {len(self.killed_workers)} task(s), and no worker death in these logs says why"
                    + (f" ({chosen} chosen exit(s) only)" if chosen else "")
                    + ": collect the workers' and nannies' INFO-level logs and the hosts' kernel log (dmesg)")
        elif self.task_errors:
            base = f"{len(self.task_errors)} task(s) failed with an exception; no worker died of it"
        elif self.deaths:
            base = f"no failures: {len(self.deaths)} worker exit(s), all chosen (shutdown, retirement, ...)"
        else:
            base = "no worker deaths found"
        if self.killed_workers and fails:
            base += f"; {len(self.killed_workers)} KilledWorker task(s)"
        if self.task_errors and (fails or self.killed_workers):
            base += f"; {len(self.task_errors)} task error(s) (not deaths)"
        recoveries = sum(1 for n in self.notes if n.kind == "scheduler-recovered")
        if recoveries:
            base += f"; the scheduler died and was recovered {recoveries} time(s)"
        if any(n.kind == "events-lost" for n in self.notes):
            base += "; some events are missing from the logs (see the notes)"
        return base

    def _deaths_with_groups(self) -> list[dict[str, Any]]:
        from kwdiag.analysis.groups import group_ids  # groups imports this module's types

        ids = group_ids(self.deaths)
        return [{**d.to_dict(), "group": ids[id(d)]} for d in self.deaths]

    def to_dict(self, lists: bool = True) -> dict[str, Any]:
        """The JSON document; ``lists=False`` leaves out the two lists that grow with the deaths (``deaths``,
        ``incarnations``), for a writer that streams them (``kwdiag.report.jsonout.write_json``)."""
        doc = {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "verdict": self.verdict(),
            "runtimes": list(self.runtimes),
            "files": list(self.files),
            "workers": list(self.workers),
            "stats": {"events": self.events, "lines": self.lines, "bytes": self.bytes,
                      "first": iso(self.first_ts), "last": iso(self.last_ts)},
            "deaths": self._deaths_with_groups() if lists else None,
            "killed_workers": [k.to_dict() for k in self.killed_workers],
            "task_errors": [t.to_dict() for t in self.task_errors],
            "problems": [p.to_dict() for p in self.problems],
            "incarnations": [i.to_dict() for i in self.incarnations] if lists else None,
            "notes": [n.to_dict() for n in self.notes],
        }
        return doc
