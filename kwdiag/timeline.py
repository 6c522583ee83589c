"""Build per-worker, per-incarnation timelines from events: a pure function, no I/O.

Covers: resolving who each event is about (worker name, incarnation address, pid, kwdiag
incarnation numbers), splitting a worker's life into incarnations (a nanny restart starts a new
one), finding which incarnations ended (``Incarnation.ended``), and collecting the cluster-wide
facts the classifier needs: scheduler close, ``KilledWorker`` records, task errors, and
environment evidence (kernel, Kubernetes, SLURM) that names no worker.

Does not cover: why an incarnation ended (``kwdiag.analysis.classify``) or reading files.
The event kinds used here are those of ``docs/events.md``; the Dask text rules emit the same kinds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from kwdiag.analysis.model import IncarnationSpan
from kwdiag.events import Event

START_KINDS = {"worker-start", "worker-registered"}
# Any of these means the incarnation is over (or was given up on).
END_KINDS = {"worker-exit", "worker-removed", "worker-closing", "worker-end", "worker-closed", "worker-fatal",
             "heartbeat-missed", "nanny-memory-terminate"}
CLUSTER_KINDS = {"scheduler-close", "scheduler-start", "killed-worker", "restart"}
# Sources outside the cluster's own processes: their events name a pid or nothing, never a worker.
ENV_SOURCES = {"kernel", "k8s", "slurm"}
TASK_ERROR_KINDS = {"task-erred"}


@dataclass
class Incarnation:
    worker: str
    number: int
    address: str | None = None
    started: float | None = None
    pid: int | None = None
    events: list[Event] = field(default_factory=list)

    @property
    def end_events(self) -> list[Event]:
        return [e for e in self.events if e.kind in END_KINDS]

    @property
    def ended(self) -> bool:
        return bool(self.end_events)

    @property
    def ended_at(self) -> float | None:
        ts = [e.ts for e in self.end_events if not e.get("ts_unknown")]
        return min(ts) if ts else None

    @property
    def pids(self) -> set[int]:
        out = set()
        if self.pid is not None:
            out.add(self.pid)
        for e in self.events:
            if e.kind in ("worker-exit", "worker-spawn", "nanny-memory-terminate") and isinstance(e.get("pid"), int):
                out.add(e.get("pid"))
            if e.kind == "worker-start" and e.source == "worker" and e.pid is not None:
                out.add(e.pid)
        return out


@dataclass
class Timeline:
    workers: dict[str, list[Incarnation]] = field(default_factory=dict)
    cluster: list[Event] = field(default_factory=list)
    environment: list[Event] = field(default_factory=list)  # names no worker: kernel, k8s, slurm, ...
    killed: list[Event] = field(default_factory=list)
    task_errors: list[Event] = field(default_factory=list)
    scheduler_close: float | None = None
    scheduler_close_reason: str | None = None
    allowed_failures: int | None = None

    def spans(self) -> list[IncarnationSpan]:
        """When each incarnation lived, by worker and number: from its start (or first event) to its end
        (None while alive at the end of the logs)."""
        out = []
        for name in sorted(self.workers):
            for inc in self.workers[name]:
                times = [e.ts for e in inc.events if not e.get("ts_unknown")]
                started = inc.started if inc.started is not None else min(times, default=None)
                out.append(IncarnationSpan(worker=name, incarnation=inc.number, started=started,
                                           ended=inc.ended_at if inc.ended else None, address=inc.address))
        return out

    def incarnations(self) -> list[Incarnation]:
        out = [i for incs in self.workers.values() for i in incs]
        out.sort(key=lambda i: (i.ended_at if i.ended_at is not None else float("inf"), i.worker, i.number))
        return out


def build_timeline(events: Iterable[Event]) -> Timeline:
    """Group ``events`` (any order) into a ``Timeline``."""
    evs = sorted(events, key=lambda e: e.ts)
    tl = Timeline()
    addr_name: dict[str, str] = {}
    for e in evs:
        addr = e.get("address")
        if e.worker and isinstance(addr, str) and e.kind != "nanny-start":
            addr_name.setdefault(addr, e.worker)
    # incarnations: one per (worker, address) or kwdiag incarnation number, ordered by first sight
    keys: dict[str, dict[object, Incarnation]] = {}

    def who(e: Event) -> str | None:
        if e.worker:
            return e.worker
        addr = e.get("address")
        if isinstance(addr, str):
            # no name anywhere (e.g. LocalCluster at WARNING level): the address is the identity
            return addr_name.get(addr, addr if e.kind in END_KINDS else None)
        return None

    pending: list[Event] = []
    for e in evs:
        if e.kind in TASK_ERROR_KINDS:
            tl.task_errors.append(e)
            continue
        if e.kind == "killed-worker":
            tl.killed.append(e)
            continue
        if e.kind == "scheduler-start" and isinstance(e.get("allowed_failures"), int):
            tl.allowed_failures = e.get("allowed_failures")
        if e.kind == "scheduler-close" and tl.scheduler_close is None:
            tl.scheduler_close = e.ts
            tl.scheduler_close_reason = e.get("reason")
        name = who(e)
        if name is None:
            if e.source in ENV_SOURCES:
                tl.environment.append(e)
            else:
                tl.cluster.append(e)
            continue
        if e.kind in START_KINDS or (e.kind == "worker-spawn"):
            key = _inc_key(e)
            incs = keys.setdefault(name, {})
            if key is not None and key not in incs:
                inc = Incarnation(worker=name, number=0, started=e.ts)
                incs[key] = inc
            if key is not None:
                inc = incs[key]
                if isinstance(e.get("address"), str):
                    inc.address = inc.address or e.get("address")
                if isinstance(e.get("pid"), int) and e.kind != "worker-registered":
                    inc.pid = inc.pid or e.get("pid")
                elif e.kind == "worker-registered" and isinstance(e.get("pid"), int):
                    inc.pid = inc.pid or e.get("pid")
                if inc.started is None or e.ts < inc.started:
                    inc.started = e.ts
        pending.append(e)
    for name, incs in keys.items():
        ordered = sorted(incs.values(), key=lambda i: i.started or 0.0)
        merged: list[Incarnation] = []
        for inc in ordered:  # a kwdiag spawn (by number) and a start (by address) may be one incarnation
            if merged and _same(merged[-1], inc):
                m = merged[-1]
                m.address = m.address or inc.address
                m.pid = m.pid or inc.pid
                continue
            merged.append(inc)
        for n, inc in enumerate(merged, 1):
            inc.number = n
        tl.workers[name] = merged
    for e in pending:
        name = who(e)
        incs = tl.workers.get(name)
        if not incs:  # none seen, or only starts that name no incarnation (an empty list)
            incs = tl.workers[name] = [Incarnation(worker=name, number=1, started=None)]
        _place(e, incs).events.append(e)
    return tl


def _inc_key(e: Event):
    n = e.get("incarnation")
    if isinstance(n, int):
        return ("n", n)
    addr = e.get("address")
    if isinstance(addr, str):
        return ("a", addr)
    return None


def _same(a: Incarnation, b: Incarnation) -> bool:
    if a.address and b.address and a.address != b.address:
        return False
    if a.pid and b.pid and a.pid != b.pid:
        return False
    if (a.started is not None and b.started is not None and abs(a.started - b.started) < 5.0
            and (a.address is None or b.address is None)):
        return True
    return bool(a.address and a.address == b.address)


def _place(e: Event, incs: list[Incarnation]) -> Incarnation:
    n = e.get("incarnation")
    if isinstance(n, int):
        for inc in incs:
            if inc.number == n:
                return inc
    addr = e.get("address")
    if isinstance(addr, str):
        for inc in incs:
            if inc.address == addr:
                return inc
    pid = e.get("pid")
    if isinstance(pid, int) and e.kind in ("worker-exit", "nanny-memory-terminate"):
        for inc in incs:
            if inc.pid == pid:
                return inc
    chosen = incs[0]
    for inc in incs:
        if inc.started is not None and inc.started <= e.ts + 0.001:
            chosen = inc
    return chosen
