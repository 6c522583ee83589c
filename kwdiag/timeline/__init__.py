"""Worker incarnations from events: who each line is about, and where each process's life ended. Pure.

Covers: ``build_timeline(events) -> Timeline``. Lines that speak for the process whose log they are in
(a worker's or nanny's own lines, kwdiag's worker and nanny events) are attributed within their file
(``streams``); lines about other processes (the scheduler's) form the scheduler's view; the views are
joined into one ``Incarnation`` per process (``merge``); a worker the scheduler refused for its name is a process
of its own (``refused``). An incarnation with end evidence is a death;
a worker restarted on a fixed port is a new incarnation per start or per end, never one per address.
Cluster-wide lines (the scheduler closing, KilledWorker, task errors) and environment lines (kernel,
Kubernetes, SLURM) are kept beside them for the classifier.

Does not cover: why an incarnation ended (``kwdiag.analysis``) or reading files (``kwdiag.readers``).
The event kinds are those of ``docs/events.md``; Dask's text lines become the same kinds through rules.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from kwdiag.events import Event
from kwdiag.kinds import NAMED, SCHEDULER_VIEW, TASK_ERROR
from kwdiag.timeline.environment import environment_deaths, join_to_their_own_files
from kwdiag.timeline.merge import join_views, scheduler_view
from kwdiag.timeline.refused import refused_deaths
from kwdiag.timeline.model import (
    ENV_SOURCES,
    IncarnationSpan,
    Incarnation,
    Timeline,
    known_ts,
    slot_of,
    stream_of,
)
from kwdiag.timeline.streams import StreamAttributor

__all__ = ["build_timeline", "Timeline", "Incarnation", "IncarnationSpan", "known_ts", "slot_of", "stream_of"]

_OWN_SOURCES = {"worker", "nanny"}


def speaks_for_its_file(e: Event) -> bool:
    """Whether ``e`` is a line of the process whose log holds it (so the file tells whom it is about)."""
    ctx = e.get("ctx")
    if ctx is not None:  # a text line: its rule says whether it is about the file's own process
        return bool(ctx)
    return e.source in _OWN_SOURCES  # kwdiag JSONL: nanny and worker events are their own


def build_timeline(events: Iterable[Event]) -> Timeline:
    """Group ``events`` (any order; each with an origin where it was read) into a ``Timeline``."""
    tl = Timeline()
    streams: dict[str, list[Event]] = defaultdict(list)
    about_others: list[Event] = []
    named: list[Event] = []  # the scheduler's lines about a worker it names only by name
    refused: list[Event] = []  # the scheduler's refusals of a worker for its name (not the name's holder)
    for e in events:
        if e.kind in TASK_ERROR:
            tl.task_errors.append(e)
        elif e.kind == "killed-worker":
            tl.killed.append(e)
        elif e.source in ENV_SOURCES:
            tl.environment.append(e)
        elif speaks_for_its_file(e):
            streams[stream_of(e)].append(e)
        elif e.kind in SCHEDULER_VIEW and (isinstance(e.get("address"), str) or e.worker):
            about_others.append(e)
        elif e.kind == "worker-exit" and isinstance(e.get("pid"), int) and (e.worker or e.get("address")):
            # kwdiag's record of another process's exit: the launcher of nanny-less workers (source
            # ``cluster``) or a nanny's death report forwarded to the scheduler. Joined by pid and address.
            about_others.append(e)
        elif e.worker and e.kind in NAMED:
            named.append(e)
        elif e.kind == "worker-refused":
            refused.append(e)
        else:
            _cluster_fact(tl, e)
    procs: list[Incarnation] = []
    procs_by_stream: dict[str, list[Incarnation]] = {}
    for index, (name, evs) in enumerate(streams.items()):
        evs.sort(key=lambda e: e.origin.line if e.origin else 0)
        att = StreamAttributor(name, index)
        for e in evs:
            att.feed(e)
        att.finish()
        procs.extend(att.procs)
        procs_by_stream[name] = att.procs
        if att.context:
            tl.stream_context[name] = att.context
    tl.environment = join_to_their_own_files(tl.environment, procs_by_stream)
    about_others.sort(key=lambda e: (e.ts, e.origin.line if e.origin else 0))
    procs.extend(scheduler_view(about_others))
    procs = join_views(procs)
    for e in named:
        _attach_by_name(tl, procs, e)
    deaths_seen = any(p.ended for p in procs)
    procs.extend(refused_deaths(refused, procs))   # after the names are given: none of these is the name's holder
    if not deaths_seen:   # a refusal is no account of the holder's end: the environment's (an OOM kill) may be
        procs.extend(environment_deaths(tl.environment))
    _name_and_number(tl, procs)
    return tl


def _attach_by_name(tl: Timeline, procs: list[Incarnation], e: Event) -> None:
    """Give ``e`` to the process of that name alive at its time (the latest one started before it)."""
    ts = known_ts(e)
    best = None
    for p in procs:
        if p.name != e.worker:
            continue
        start = p.started if p.started is not None else p.first_ts
        if ts is None or start is None or start <= ts + 1.0:
            if best is None or (start or 0.0) >= (best.started or best.first_ts or 0.0):
                best = p
    if best is None:
        tl.cluster.append(e)
    else:
        best.add(e)


def _cluster_fact(tl: Timeline, e: Event) -> None:
    tl.cluster.append(e)
    if e.kind == "scheduler-start" and isinstance(e.get("allowed_failures"), int):
        tl.allowed_failures = e.get("allowed_failures")
    if e.kind == "scheduler-close" and tl.scheduler_close is None and known_ts(e) is not None:
        tl.scheduler_close = e.ts
        tl.scheduler_close_reason = e.get("reason")


def _label(p: Incarnation) -> str:
    if p.name:
        return p.name
    if p.address:
        return p.address
    if p.pid is not None:
        return f"process {p.pid}"
    return "unnamed worker"


def _name_and_number(tl: Timeline, procs: list[Incarnation]) -> None:
    by_worker: dict[str, list[Incarnation]] = defaultdict(list)
    for p in procs:
        if not p.events or not (p.ended or p.name or p.address or p.pid is not None):
            continue  # lines of a file that say nothing about any worker: not a worker of their own
        p.worker = _label(p)
        by_worker[p.worker].append(p)
    for name, incs in by_worker.items():
        incs.sort(key=lambda p: (_start_key(p), p.order))
        for n, p in enumerate(incs, 1):
            p.number = n
        tl.workers[name] = incs


def _start_key(p: Incarnation) -> float:
    t = p.started if p.started is not None else p.first_ts
    return t if t is not None else float("-inf")
