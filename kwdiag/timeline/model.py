"""The timeline's types: ``Incarnation`` (one worker process, from its start to its end) and ``Timeline``.

Covers: the *slots* an incarnation's end can fill (the nanny's exit line, its restart, the scheduler's
removal, the worker's own closing lines, ...): each kind of end evidence has a slot, and one process
ends once, so a second line for a slot that is already filled (a second "killed by signal 9") is a
second process, whatever address it had. ``Incarnation`` keeps its identity (name, address, pid,
kwdiag's incarnation number, the file holding its own lines) and its events; ``Timeline`` keeps the
incarnations by worker plus the cluster-wide facts (scheduler close, KilledWorker, task errors,
environment evidence that names no worker, per-file context that names no process).

Does not cover: building a timeline (``kwdiag.timeline.streams`` and ``kwdiag.timeline.merge``) or
deciding why an incarnation ended (``kwdiag.analysis``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any

from kwdiag.kinds import END, NEAR_REMOVAL, REGISTERED, START, keyed
from kwdiag.events import Event, iso_time
from kwdiag.records import record

# The kinds of evidence that a process ended (or is being ended), and the slot each fills. The kinds are
# ``kwdiag.kinds.END`` (checked at import); the slots are the timeline's own vocabulary, so the table is here.
SLOT_OF_KIND = keyed(END, {
    "worker-exit": "exit",                  # the nanny: exit status or signal (kwdiag: the whole record)
    "nanny-memory-terminate": "memory",     # the nanny terminates it for memory
    "nanny-memory-escalate": "memory-kill", # ... and, as it did not stop on SIGTERM, kills it
    "worker-restarting": "restart",         # the nanny restarts it after an exit it did not ask for
    "nanny-unregister": "unregister",       # the nanny tells the scheduler its worker is gone
    "worker-removed": "removed",            # the scheduler removed it
    "heartbeat-missed": "heartbeat",        # the scheduler gave up on its heartbeats
    "worker-closing": "closing",            # the worker closes itself ("Stopping worker ... Reason: ...")
    "nanny-closing": "nanny-closing",       # its nanny closes it ("Nanny asking worker to close")
    "worker-closed": "closed",              # "Worker closed": the close finished
    "worker-end": "end",                    # the last line of a worker that ended on purpose
    "worker-fatal": "fatal",                # an unrecoverable exception in the worker process itself
    "worker-startup-failed": "startup",     # the process failed while starting (before it registered)
    "worker-refused": "startup",            # the scheduler refused its registration (its name was taken)
    "nanny-kill-after-close": "escalate",   # the nanny killed a worker that did not close in time
    "fatal-signal": "crash",                # a faulthandler dump or a shell's "Segmentation fault"
    "worker-reaped": "reaped",              # terminated by an exit hook as the process that started it exited
    "nanny-start-timeout": "start-timeout", # the nanny killed a worker process that did not start in time
    # the environment's word on a process (kernel OOM killer, Kubernetes, SLURM, YARN)
    "kernel-oom-kill": "env", "k8s-status": "env", "slurm-oom": "env", "slurm-time-limit": "env",
    "slurm-cancel": "env", "yarn-kill": "env",
})
# Slots one end may fill more than once (several closing lines, a traceback's several frames).
REPEATABLE = {"closing", "nanny-closing", "fatal", "startup", "crash", "env"}
# Slots that can open a process of their own when no known process can take them: the evidence
# that a process died even when nothing says which one (LocalCluster's WARNING-level stream).
SELF_STANDING = {"exit", "memory", "restart", "unregister", "fatal", "startup", "crash", "heartbeat", "removed",
                 "reaped", "start-timeout"}
# Sources outside the cluster's own processes: their events name a pid or nothing, never a worker.
# Lines joined to a death by time (they name no worker): the environment's (kernel, Kubernetes, SLURM,
# YARN), and a server's complaint about an unnamed peer ("peer": a message it could not take).
ENV_SOURCES = {"kernel", "k8s", "slurm", "yarn", "peer"}


def _iso(ts: float | None) -> str | None:
    return None if ts is None else iso_time(ts)



@dataclass(frozen=True, slots=True)
class IncarnationSpan:
    """When one incarnation of a worker lived: ``ended`` is None if it was alive when the logs end."""

    worker: str
    incarnation: int
    started: float | None
    ended: float | None
    address: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"worker": self.worker, "incarnation": self.incarnation, "address": self.address,
                "started": _iso(self.started), "ended": _iso(self.ended), "ts_started": self.started,
                "ts_ended": self.ended}



def stream_of(e: Event) -> str:
    """The stream a line of a process's own log belongs to: its file, or, in a file that merges several
    processes behind a collector's prefixes (compose, kubectl, journald), the file and that prefix."""
    file = e.origin.file if e.origin else "?"
    who = e.fields.get("stream")
    return f"{file} | {who}" if isinstance(who, str) else file


def slot_of(e: Event) -> str | None:
    return SLOT_OF_KIND.get(e.kind)


def known_ts(e: Event) -> float | None:
    """``e``'s time, or None when its line carried none (pasted fragments, old Dask layouts)."""
    return None if e.fields.get("ts_unknown") else e.ts


@record(eq=False)
class Incarnation:
    """One worker process: its identity as far as the lines tell, its events and its end evidence."""

    worker: str = ""  # who it is in the report: its name, else its address, else a description
    number: int = 0  # per worker, in order of start
    address: str | None = None
    started: float | None = None
    pid: int | None = None
    events: list[Event] = field(default_factory=list)
    name: str | None = None  # the worker's name, when a line gives it
    kw_incarnation: int | None = None  # kwdiag's incarnation number
    stream: str | None = None  # the file (or prefixed stream, ``stream_of``) holding its own lines (None: seen only by the scheduler)
    registered: bool = False
    host: str | None = None
    slots: dict[str, list[Event]] = field(default_factory=dict)
    order: tuple[int, int] = (0, 0)  # (file index, line) where it was first seen

    def add(self, e: Event) -> None:
        self.events.append(e)
        slot = slot_of(e)
        if slot is not None:
            self.slots.setdefault(slot, []).append(e)
        ts = known_ts(e)
        if e.kind in START and ts is not None and (self.started is None or ts < self.started):
            self.started = ts
        if e.kind in REGISTERED or e.get("key") is not None or e.get("running_tasks"):
            self.registered = True  # it reached the scheduler (or ran a task, so it must have)

    def can_take(self, e: Event) -> bool:
        """Whether ``e`` can be more evidence of this process (its slot, if any, is still free)."""
        slot = slot_of(e)
        return slot is None or slot in REPEATABLE or slot not in self.slots

    @property
    def end_events(self) -> list[Event]:
        return [e for evs in self.slots.values() for e in evs]

    @property
    def ended(self) -> bool:
        return bool(self.slots)

    @property
    def ended_at(self) -> float | None:
        earliest = None   # a loop, not lists: asked ~13 times per death, the lists were 4 % of a large explain
        for evs in self.slots.values():
            for e in evs:
                t = known_ts(e)
                if t is not None and (earliest is None or t < earliest):
                    earliest = t
        return earliest

    @property
    def first_ts(self) -> float | None:
        ts = [t for t in (known_ts(e) for e in self.events) if t is not None]
        return min(ts) if ts else None

    @property
    def last_ts(self) -> float | None:
        ts = [t for t in (known_ts(e) for e in self.events) if t is not None]
        return max(ts) if ts else None

    @property
    def pids(self) -> set[int]:
        return {self.pid} if self.pid is not None else set()


@record
class Timeline:
    workers: dict[str, list[Incarnation]] = field(default_factory=dict)
    cluster: list[Event] = field(default_factory=list)  # cluster-wide lines that name no process
    environment: list[Event] = field(default_factory=list)  # names no worker: kernel, k8s, slurm, ...
    killed: list[Event] = field(default_factory=list)
    task_errors: list[Event] = field(default_factory=list)
    scheduler_close: float | None = None
    scheduler_close_reason: str | None = None
    allowed_failures: int | None = None
    # lines of a file that name no process and belong to none (several workers share the file)
    stream_context: dict[str, list[Event]] = field(default_factory=dict)
    _by_line: dict | None = field(default=None, repr=False)
    _cluster_by_kind: dict | None = field(default=None, repr=False)
    _context_by_time: dict | None = field(default=None, repr=False)
    _known_names: frozenset | None = field(default=None, repr=False)
    _removal_lines: dict | None = field(default=None, repr=False)
    _lines_by_file: dict | None = field(default=None, repr=False)
    _requests_by_time: tuple | None = field(default=None, repr=False)
    _environment_index: tuple | None = field(default=None, repr=False)

    def context_between(self, stream: str, lo: float | None, hi: float | None, kinds: frozenset[str]) -> list[Event]:
        """``stream``'s context lines (those that name no process) of these ``kinds`` timed within
        ``[lo, hi]``, plus its untimed ones; all of them when no bound is known. Indexed by time: a file
        can hold thousands of workers' deaths, and each asks for the few lines around its own end."""
        if self._context_by_time is None:
            self._context_by_time = {}
        key = (stream, kinds)
        if key not in self._context_by_time:
            evs = [e for e in self.stream_context.get(stream, ()) if e.kind in kinds]
            timed = sorted((e for e in evs if known_ts(e) is not None), key=known_ts)
            self._context_by_time[key] = ([known_ts(e) for e in timed], timed, [e for e in evs if known_ts(e) is None])
        times, timed, untimed = self._context_by_time[key]
        if lo is None or hi is None:
            return timed + untimed
        return timed[bisect_left(times, lo):bisect_right(times, hi)] + untimed

    def cluster_lines(self, *kinds: str) -> list[Event]:
        """The cluster-wide lines of these kinds, in the order read. Found once per set of kinds: every
        incarnation asks for the few closes and requests among a long-running scheduler's many cluster lines."""
        if self._cluster_by_kind is None:
            self._cluster_by_kind = {}
        found = self._cluster_by_kind.get(kinds)
        if found is None:
            found = self._cluster_by_kind[kinds] = [c for c in self.cluster if c.kind in kinds]
        return found

    def lines_before(self, e: Event, kinds: frozenset[str] | set[str], within: int = NEAR_REMOVAL) -> list[Event]:
        """Cluster lines of these kinds in ``e``'s file at most ``within`` lines before it, nearest first
        (the scheduler's ``Connection to ... has been closed`` just before its ``Remove worker``)."""
        if e.origin is None:
            return []
        if self._by_line is None:
            self._by_line = {}
            for c in self.cluster:
                if c.origin is not None:
                    self._by_line.setdefault((c.origin.file, c.origin.line), []).append(c)
        out = []
        for line in range(e.origin.line - 1, max(0, e.origin.line - within) - 1, -1):
            out.extend(c for c in self._by_line.get((e.origin.file, line), ()) if c.kind in kinds)
        return out

    def known_names(self) -> frozenset[str]:
        """The worker names the lines give (found once: each death asks)."""
        if self._known_names is None:
            self._known_names = frozenset(i.name for incs in self.workers.values() for i in incs if i.name)
        return self._known_names

    def removal_lines(self, file: str) -> list[int]:
        """The lines of ``file`` where the scheduler removed a worker, in order (indexed once)."""
        if self._removal_lines is None:
            by_file: dict[str, set[int]] = {}
            for incs in self.workers.values():
                for i in incs:
                    for e in i.slots.get("removed", ()):
                        if e.origin is not None:
                            by_file.setdefault(e.origin.file, set()).add(e.origin.line)
            self._removal_lines = {f: sorted(lines) for f, lines in by_file.items()}
        return self._removal_lines.get(file, [])

    def environment_of(self, pids: set[int]) -> list[Event]:
        """The environment lines that name one of ``pids``, in the order read (indexed once: a kernel log can hold
        an OOM kill for each of thousands of deaths, and a pass over it for each death grew as their square)."""
        by_pid = self._environment()[0]
        found = sorted(x for pid in pids for x in by_pid.get(pid, ()))
        return [e for _, e in found]

    def environment_near(self, ts: float, within: float) -> list[Event]:
        """The timed environment lines that name no pid, at most ``within`` seconds from ``ts``, in the order read."""
        _, times, timed = self._environment()
        found = sorted(timed[bisect_left(times, ts - within):bisect_right(times, ts + within)])
        return [e for _, e in found]

    def _environment(self) -> tuple[dict[int, list[tuple[int, Event]]], list[float], list[tuple[int, Event]]]:
        if self._environment_index is None:
            by_pid: dict[int, list[tuple[int, Event]]] = {}
            timed = []
            for i, e in enumerate(self.environment):
                pid = e.get("pid")
                if isinstance(pid, int):
                    by_pid.setdefault(pid, []).append((i, e))
                elif known_ts(e) is not None:
                    timed.append((known_ts(e), i, e))
            timed.sort(key=lambda x: (x[0], x[1]))
            self._environment_index = (by_pid, [t for t, _, _ in timed], [(i, e) for _, i, e in timed])
        return self._environment_index

    def requests_by_time(self) -> tuple[list[float], list[tuple[int, Event]], list[tuple[int, Event]]]:
        """The scheduler's retire and close requests with their places in the order read: the timed ones sorted
        by time (with their times, to bisect), and the untimed ones (indexed once)."""
        if self._requests_by_time is None:
            numbered = list(enumerate(self.cluster_lines("retire-request", "close-request")))
            timed = sorted(((i, e) for i, e in numbered if known_ts(e) is not None), key=lambda x: (known_ts(x[1]), x[0]))
            self._requests_by_time = ([known_ts(e) for _, e in timed], timed,
                                      [(i, e) for i, e in numbered if known_ts(e) is None])
        return self._requests_by_time

    def cluster_line_before(self, file: str, line: int, *kinds: str) -> Event | None:
        """The last cluster line of these kinds in ``file`` before ``line`` (indexed once per set of kinds: a
        scheduler's log can hold as many requests as removals)."""
        if self._lines_by_file is None:
            self._lines_by_file = {}
        index = self._lines_by_file.get(kinds)
        if index is None:
            by_file: dict[str, list[Event]] = {}
            for e in self.cluster_lines(*kinds):
                if e.origin is not None:
                    by_file.setdefault(e.origin.file, []).append(e)
            index = self._lines_by_file[kinds] = {}
            for f, evs in by_file.items():
                evs.sort(key=lambda e: e.origin.line)
                index[f] = ([e.origin.line for e in evs], evs)
        lines, evs = index.get(file, ((), ()))
        i = bisect_left(lines, line)
        return evs[i - 1] if i else None

    def incarnations(self) -> list[Incarnation]:
        out = [i for incs in self.workers.values() for i in incs]
        out.sort(key=lambda i: (float("inf") if (end := i.ended_at) is None else end, i.order, i.worker, i.number))
        return out

    def spans(self) -> list[IncarnationSpan]:
        """When each incarnation lived, by worker and number (for the report's timeline)."""
        out = []
        for name in sorted(self.workers):
            for inc in self.workers[name]:
                started = inc.started if inc.started is not None else inc.first_ts
                out.append(IncarnationSpan(worker=name, incarnation=inc.number, started=started,
                                           ended=inc.ended_at if inc.ended else None, address=inc.address))
        return out
