"""The scheduler's core: task and worker state, and every transition between states, as a pure state machine.

Each public method is a *stimulus* (a client submitted a graph, a worker finished a task, a worker is gone,
...): it changes the state and returns an ``Outbox`` — the journal records to append, the events to record
and the messages to send to workers and clients, in that order. Nothing here touches a socket, a thread, a
clock or a file: ``runtime.scheduler`` is the shell that turns messages into stimuli and outboxes into
writes and sends, and the unit tests drive this class directly at tens of thousands of stimuli a second.

Task states (``TaskStatus``): ``released`` (known, not wanted in memory now), ``waiting`` (on dependencies
not yet in memory), ``ready`` (queued for a worker), ``processing`` (sent to a worker; ``executing`` once it
said it started), ``memory``, ``erred``, and ``forgotten`` (dropped from ``tasks``). A task is kept while a
client wants it **or any dependent that is not finished needs it** (Dask's rule), whatever the clients hold.

Covers: graph intake (dependencies, restrictions, priorities, retries), placement (a window of tasks per
worker beyond its threads, widened for short tasks; a chain's next links sent ahead to the worker
computing it), results, errors (with retries) and their propagation to dependents, release and forgetting,
cancel and retry, lost results recomputed from the lineage, blame and ``KilledWorker`` past
``allowed_failures`` (a death counts only against tasks *executing* on the worker), scattered data, restart
(a flush), and the recovery from a journal's replay (tasks restored, results adopted from returning workers,
what nobody brought back recomputed when the window ends).

Does not cover: connections, timers and heartbeats' clocks, nannies, versions, the journal's file, or the
recovery window's timing and its events (``runtime.scheduler`` and ``runtime.recovery``).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Iterable


class TaskStatus(StrEnum):
    RELEASED = "released"
    WAITING = "waiting"
    READY = "ready"
    PROCESSING = "processing"
    MEMORY = "memory"
    ERRED = "erred"
    FORGOTTEN = "forgotten"


class WorkerStatus(StrEnum):
    RUNNING = "running"
    RETIRING = "retiring"
    CLOSED = "closed"


RELEASED, WAITING, READY, PROCESSING = TaskStatus.RELEASED, TaskStatus.WAITING, TaskStatus.READY, TaskStatus.PROCESSING
MEMORY, ERRED, FORGOTTEN = TaskStatus.MEMORY, TaskStatus.ERRED, TaskStatus.FORGOTTEN
ACTIVE = frozenset((WAITING, READY, PROCESSING))
WORKER, CLIENT = "worker", "client"   # the two kinds of recipient of an outbox's messages
# The pseudo-client of ``fire_and_forget``: it wants a key until the key is in memory or erred, then lets go.
FIRE_AND_FORGET = "fire-and-forget"
MISSING_DEPS_RETRIES = 3   # deliveries a dependency's holders may fail before its copies count as lost


def key_prefix(key: str) -> str:
    """``inc-1f3a...`` -> ``inc``: tasks of one function share duration estimates, as in Dask. A Dask
    collection's key, ``('sum-part-9c1e...', 3)``, is named by its first element."""
    if key.startswith("('"):
        end = key.find("'", 2)
        key = key[2:end] if end > 0 else key
    return key.rsplit("-", 1)[0] if "-" in key else key


class TaskState:
    __slots__ = ("key", "run_spec", "deps", "dependents", "state", "who_has", "processing_on", "executing",
                 "suspicious", "death_workers", "error", "wanted_by", "restrictions", "waiting_on", "priority",
                 "nbytes", "scattered", "missing_retries", "loose", "expected", "retries")

    def __init__(self, key: str, run_spec: bytes | None, priority: tuple[int, int]):
        self.key = key
        self.run_spec = run_spec
        self.deps: set[TaskState] = set()
        self.dependents: set[TaskState] = set()
        self.state = RELEASED
        self.who_has: set[WorkerState] = set()
        self.processing_on: WorkerState | None = None
        self.executing = False
        self.suspicious = 0            # deaths of workers while it was executing there
        self.death_workers: list[str] = []
        self.error: dict | None = None
        self.wanted_by: set[str] = set()   # client ids
        self.restrictions: set[str] | None = None
        self.waiting_on: set[TaskState] = set()
        self.priority = priority
        self.nbytes = 0
        self.scattered = run_spec is None
        self.missing_retries = 0
        self.loose = False  # restrictions are a preference only (allow_other_workers)
        self.expected: dict[str, int] | None = None  # replayed: worker name -> nbytes, until a holder is back
        self.retries = 0    # task errors that may still be retried (submit(retries=))

    def __repr__(self) -> str:
        return f"<Task {self.key!r} {self.state}>"


class WorkerState:
    __slots__ = ("address", "name", "nthreads", "memory_limit", "nanny", "pid", "incarnation", "processing",
                 "executing", "has_what", "status", "versions", "memory", "long_running")

    def __init__(self, address: str, name: str, nthreads: int):
        self.address = address
        self.name = name
        self.nthreads = nthreads
        self.memory_limit: int | None = None
        self.nanny: str | None = None
        self.pid: int | None = None
        self.incarnation = 0
        self.processing: set[TaskState] = set()
        self.executing: set[TaskState] = set()
        self.has_what: set[TaskState] = set()
        self.status = WorkerStatus.RUNNING
        self.versions: dict = {}
        self.memory: int | None = None  # resident bytes, from registration and heartbeats
        self.long_running: set[TaskState] = set()  # seceded tasks (secede, worker_client): they hold no thread

    def __repr__(self) -> str:
        return f"<Worker {self.address!r} name={self.name!r}>"


@dataclass
class Outbox:
    """What a stimulus asks the shell to do, in this order: append ``journal``, record ``events``
    (``(kind, message, fields)``), send ``messages`` (``(WORKER | CLIENT, address or client id, message)``)."""

    journal: list[list] = field(default_factory=list)
    events: list[tuple[str, str, dict]] = field(default_factory=list)
    messages: list[tuple[str, str, dict]] = field(default_factory=list)

    def to_worker(self, address: str, message: dict) -> None:
        self.messages.append((WORKER, address, message))

    def to_client(self, client: str, message: dict) -> None:
        self.messages.append((CLIENT, client, message))

    def __bool__(self) -> bool:
        return bool(self.journal or self.events or self.messages)


@dataclass
class Tally:
    """What a recovery from a journal did, counted as it happens (``runtime.recovery`` reports it)."""

    reused: int = 0              # results done before the old scheduler died, brought back by their workers
    finished_headless: int = 0   # results finished while no scheduler was up
    adopted: int = 0             # tasks still running or queued where they were
    recomputed: int = 0
    rerun: int = 0
    recomputed_keys: list[str] = field(default_factory=list)
    lost_scattered: list[str] = field(default_factory=list)


MAX_KEYS_LISTED = 50  # keys named in an event or a tally; the counts are always complete


def task_record(ts: TaskState, deps: Iterable[str] | None) -> list:
    """The journal's ``task`` record of ``ts`` (with the retries it has left; each one used is a ``retries``
    record)."""
    return ["task", ts.key, ts.run_spec, list(deps or ()), -ts.priority[0],
            sorted(ts.restrictions) if ts.restrictions else None, ts.loose, ts.retries]


def lost_error(key: str, worker: str | None) -> dict:
    return {"type": "scattered-lost", "key": key, "worker": worker,
            "message": f"scattered data {key!r} was lost with worker {worker}: it is not in the lineage and "
                       f"cannot be recomputed (use client.replicate to keep copies)"}


class SchedulerState:
    """Tasks, workers and clients, and the transitions between their states (see the module's docstring)."""

    def __init__(self, *, allowed_failures: int = 3, window: tuple[int, float, int] = (4, 0.01, 64),
                 log_dir: str | None = None):
        self.allowed_failures = allowed_failures
        self.window_settings = window   # (worker_window, worker_window_seconds, worker_window_max)
        self.log_dir = log_dir          # named in KilledWorker errors: where to point `kwdiag explain`
        self.tasks: dict[str, TaskState] = {}
        self.workers: dict[str, WorkerState] = {}   # address -> state
        self.clients: set[str] = set()
        self.ready: list[tuple[tuple[int, int], int, TaskState]] = []
        self._seq = itertools.count()
        self._priority = itertools.count()
        self.counters = {"submitted": 0, "finished": 0, "erred": 0}  # cumulative, for progress displays
        self.durations: dict[str, float] = {}  # key prefix -> moving average of its tasks' run time, seconds
        self.recovering = False   # a journal was restored and its workers are still coming back: place nothing
        self.tally = Tally()
        self.out = Outbox()

    # ---------------------------------------------------------------- plumbing
    def _take(self) -> Outbox:
        out, self.out = self.out, Outbox()
        return out

    def _event(self, kind: str, message: str, **fields: Any) -> None:
        self.out.events.append((kind, message, fields))

    def _j(self, *records: list) -> None:
        self.out.journal.extend(records)

    def next_priority(self, user_priority: int = 0) -> tuple[int, int]:
        """Higher user priority first (as Dask's ``submit(priority=)``), then submission order."""
        return (-int(user_priority or 0), next(self._priority))

    def running_workers(self) -> list[WorkerState]:
        return [ws for ws in self.workers.values() if ws.status == WorkerStatus.RUNNING]

    def match_workers(self, names: Iterable[Any]) -> list[WorkerState]:
        wanted = set(map(str, names))
        return [ws for ws in self.workers.values() if ws.address in wanted or ws.name in wanted]

    # ---------------------------------------------------------------- clients
    def add_client(self, client: str) -> Outbox:
        self.clients.add(client)
        self._j(["client", client, True])
        return self._take()

    def remove_client(self, client: str) -> Outbox:
        """The client is gone for good: nothing it wanted is wanted by it any more."""
        self.clients.discard(client)
        keys = [k for k, ts in self.tasks.items() if client in ts.wanted_by]
        self._j(["unwant", client, keys], ["client", client, False])
        for key in keys:
            ts = self.tasks.get(key)
            if ts is not None:
                self._unwant(ts, client)
        return self._take()

    # ---------------------------------------------------------------- workers
    def add_worker(self, address: str, name: str, *, nthreads: int = 1, memory_limit: int | None = None,
                   memory: int | None = None, nanny: str | None = None, pid: int | None = None,
                   incarnation: int = 0, versions: dict | None = None, held: dict | None = None,
                   executing: Iterable[str] = (), queued: Iterable[str] = ()) -> Outbox:
        """A worker registered. An older one at its address or under its name is gone (a new incarnation).
        It may hold results and run tasks from before (the scheduler restarted, or it reconnected): kept where
        they are wanted. Places nothing: the shell calls ``schedule()`` once the worker has its reply."""
        old = self.workers.get(address)
        if old is not None:
            self._remove_worker(old, how="connection-closed", expected=False)
        for other in list(self.workers.values()):
            if other.name == name and other.status != WorkerStatus.CLOSED:
                self._remove_worker(other, how="connection-closed", expected=False)
        ws = WorkerState(address, name, int(nthreads or 1))
        ws.memory_limit, ws.memory, ws.nanny, ws.pid = memory_limit, memory, nanny, pid
        ws.incarnation = int(incarnation or 0)
        ws.versions = versions or {}
        self.workers[address] = ws
        self._j(["worker", name, address, True])
        held = held or {}
        self._event("worker-registered", f"Register worker addr: {address} name: {name}"
                    + (f" (holding {len(held)} result(s))" if held else ""), worker=name, address=address,
                    name=name, nthreads=ws.nthreads, memory_limit=ws.memory_limit, nanny=ws.nanny, pid=ws.pid,
                    incarnation=ws.incarnation)
        self._adopt(ws, held, list(executing), list(queued))
        return self._take()

    def _adopt(self, ws: WorkerState, held: dict, executing: list[str], queued: list[str]) -> None:
        """Take what a worker that kept working without us reports: results it holds and tasks it runs.
        A result of a task that is wanted and not being computed elsewhere is kept (not recomputed); a task it
        runs or has queued stays with it. Anything else is freed on the worker."""
        free = []
        for key, nbytes in held.items():
            ts = self.tasks.get(key)
            if ts is not None and ts.state == MEMORY:
                self._add_holder(ts, ws)
            elif ts is not None and ts.state in (RELEASED, WAITING, READY):
                if self.recovering:
                    if ts.expected is not None:
                        self.tally.reused += 1
                    else:
                        self.tally.finished_headless += 1
                ts.expected = None
                self._accept_result(ts, ws, int(nbytes or 0))
                if not self.recovering:  # (a recovery sorts out what is needed at its end)
                    self._release_if_unneeded(ts)
            else:
                free.append(key)
        running = set(executing)
        adoptable = self._adoptable(executing, queued)
        for key in [*executing, *queued]:
            ts = self.tasks.get(key)
            if key in adoptable:
                ts.state = PROCESSING
                ts.processing_on = ws
                ts.waiting_on = set()
                ws.processing.add(ts)
                if key in running:
                    ts.executing = True
                    ws.executing.add(ts)
                if self.recovering:
                    self.tally.adopted += 1
            elif ts is None or ts.processing_on is not ws:
                free.append(key)
        if free:
            self.out.to_worker(ws.address, {"op": "free-keys", "keys": free})

    def _adoptable(self, executing: list[str], queued: list[str]) -> set[str]:
        """The tasks a returning worker may keep: every one it runs, and each queued one whose inputs are all in
        memory or are tasks it keeps too (a queued task waiting there on an input nobody will compute would
        wait for ever; it is freed there and computed afresh)."""
        def known(key: str) -> bool:
            ts = self.tasks.get(key)
            return ts is not None and ts.state in (RELEASED, WAITING, READY) and ts.run_spec is not None
        keep = {k for k in executing if known(k)}
        candidates = [k for k in queued if known(k) and k not in keep]
        changed = True
        while changed:   # a fixpoint: a queued chain is kept when its first link is
            changed = False
            for key in candidates:
                if key not in keep and all(d.state == MEMORY or d.key in keep for d in self.tasks[key].deps):
                    keep.add(key)
                    changed = True
        return keep

    def heartbeat(self, address: str, memory: int | None) -> bool:
        """A worker's heartbeat; False when the worker is not (or no longer) known."""
        ws = self.workers.get(address)
        if ws is None:
            return False
        ws.memory = memory
        return True

    def remove_worker(self, address: str, *, how: str, expected: bool, quiet: bool = False,
                      noticed_after: float = 0.0) -> Outbox:
        """A worker is gone (``how``: deregistered, connection-closed, heartbeat-timeout, retired, restart,
        scheduler-close). ``expected`` departures blame nothing."""
        ws = self.workers.get(address)
        if ws is not None:
            self._remove_worker(ws, how=how, expected=expected, quiet=quiet, noticed_after=noticed_after)
        return self._take()

    def _remove_worker(self, ws: WorkerState, *, how: str, expected: bool, quiet: bool = False,
                       noticed_after: float = 0.0) -> None:
        """Forget a worker and what it held: reroute its tasks, blame the ones it was executing, lose the
        results only it held, record one ``worker-removed`` event; then recompute what is still needed."""
        if self.workers.get(ws.address) is not ws:
            return
        del self.workers[ws.address]
        ws.status = WorkerStatus.CLOSED
        self._j(["worker", ws.name, ws.address, False])   # replay drops everything it held
        blamed, rerouted, killed = self._blame_and_reroute(ws, expected)
        lost, lost_scattered = self._lose_results_held_by(ws)
        message = (f"Remove worker addr: {ws.address} name: {ws.name} (how={how}, noticed after "
                   f"{noticed_after:.3f}s; rerouted {len(rerouted)}, blamed {len(blamed)}, lost {len(lost)})")
        if not quiet or rerouted or lost:
            self._event("worker-removed", message, level="info" if expected else "warning", worker=ws.name,
                        address=ws.address, name=ws.name, how=how, expected=expected,
                        noticed_after=round(noticed_after, 6), rerouted=rerouted, blamed=blamed, lost=lost,
                        lost_scattered=lost_scattered, incarnation=ws.incarnation)
        for ts in killed:
            self._kill(ts, ws)
        for key in lost_scattered:
            ts = self.tasks.get(key)
            if ts is not None:
                self._event("scattered-lost", f"Removing worker {ws.address!r} caused the cluster to lose "
                            f"scattered data, which can't be recovered: {key!r}", level="error", key=key,
                            worker=ws.name)
                self._set_erred(ts, lost_error(key, ws.address))
        # Everything that was processing there, or needs a result that is gone: back to its lineage.
        for key in (*rerouted, *lost):
            ts = self.tasks.get(key)
            if ts is not None and ts.state == RELEASED:
                if self._needed(ts):
                    self._recompute(ts)
                else:
                    self._maybe_forget(ts)
        self._rewait_on_lost_dependencies()
        self._schedule()

    def _blame_and_reroute(self, ws: WorkerState, expected: bool) -> tuple[list[str], list[str], list[TaskState]]:
        """The tasks ``ws`` was processing go back to released; an unexpected death counts against each one
        that was *executing* there, and one past ``allowed_failures`` is to be killed."""
        blamed, rerouted, killed = [], [], []
        for ts in sorted(ws.processing, key=lambda t: t.priority):
            was_executing = ts in ws.executing
            self._done_processing(ts)
            if was_executing and not expected:
                ts.suspicious += 1
                ts.death_workers.append(ws.name)
                self._j(["blame", ts.key, ts.suspicious, ts.death_workers])
                blamed.append(ts.key)
                if ts.suspicious > self.allowed_failures:
                    killed.append(ts)
                    continue
            rerouted.append(ts.key)
            ts.state = RELEASED
        return blamed, rerouted, killed

    def _lose_results_held_by(self, ws: WorkerState) -> tuple[list[str], list[str]]:
        """Results whose only copy was on ``ws``: released (and their clients told), scattered ones listed apart."""
        lost, lost_scattered = [], []
        for ts in list(ws.has_what):
            ts.who_has.discard(ws)
            if ts.who_has or ts.state != MEMORY:
                continue
            ts.state = RELEASED
            if ts.scattered:
                lost_scattered.append(ts.key)
            elif self._needed(ts):
                lost.append(ts.key)
            for client in ts.wanted_by:
                self.out.to_client(client, {"op": "key-lost", "key": ts.key})
        ws.has_what.clear()
        return lost, lost_scattered

    def _kill(self, ts: TaskState, ws: WorkerState) -> None:
        error = {"type": "killed-worker", "key": ts.key, "last_worker": ws.address,
                 "allowed_failures": self.allowed_failures, "workers": list(ts.death_workers),
                 "log_dir": self.log_dir,
                 "message": f"Attempted to run task {ts.key!r} on {ts.suspicious} different workers, but all "
                            f"those workers died while running it. The last worker that attempted to run the "
                            f"task was {ws.address}."}
        self._event("killed-worker", f"Task {ts.key!r} marked as failed because {ts.suspicious} workers died "
                    f"while trying to run it", level="error", key=ts.key, deaths=ts.suspicious,
                    allowed_failures=self.allowed_failures, workers=list(ts.death_workers),
                    last_worker=ws.address)
        self._set_erred(ts, error)

    def _rewait_on_lost_dependencies(self) -> None:
        """Tasks queued or waiting whose dependencies are no longer all in memory wait for them again."""
        for ts in list(self.tasks.values()):
            if ts.state not in (WAITING, READY):
                continue
            missing = {d for d in ts.deps if d.state != MEMORY}
            if missing and ts.state == READY:
                ts.state = RELEASED
                self._recompute(ts)
            elif ts.state == WAITING:
                ts.waiting_on = missing
                for d in missing:
                    if d.state == RELEASED:
                        self._recompute(d)
                if not ts.waiting_on and ts.state == WAITING:
                    self._make_ready(ts)

    def begin_retire(self, address: str) -> list[TaskState] | None:
        """Mark a worker retiring; the results that must be moved off it first (None: it cannot retire)."""
        ws = self.workers.get(address)
        if ws is None or ws.status != WorkerStatus.RUNNING:
            return None
        ws.status = WorkerStatus.RETIRING
        return [ts for ts in ws.has_what if ts.who_has == {ws} and (self._needed(ts) or ts.scattered)]

    def cancel_retire(self, address: str) -> None:
        ws = self.workers.get(address)
        if ws is not None and ws.status == WorkerStatus.RETIRING:
            ws.status = WorkerStatus.RUNNING

    # ---------------------------------------------------------------- graph intake
    def update_graph(self, client: str | None, specs: list[dict]) -> Outbox:
        """A client submitted tasks: ``{key, spec, deps, workers, loose, priority, retries}`` each (spec None:
        a key the client knows as scattered). A key already known is shared (pure keys), and reported to the
        client at once when it is already done."""
        created: set[TaskState] = set()   # a set: membership below is tested once per task
        records, wanted, tasks = [], [], []
        for spec in specs:
            key = spec["key"]
            ts = self.tasks.get(key)
            if ts is None:
                ts = TaskState(key, spec.get("spec"), self.next_priority(spec.get("priority") or 0))
                self.counters["submitted"] += 1
                ts.restrictions = set(spec["workers"]) if spec.get("workers") else None
                ts.loose = bool(spec.get("loose"))
                ts.retries = int(spec.get("retries") or 0)
                self.tasks[key] = ts
                created.add(ts)
                records.append(task_record(ts, spec.get("deps")))
            elif ts.state == RELEASED and ts.run_spec is None and spec.get("spec") is not None:
                ts.run_spec, ts.scattered = spec["spec"], False
                records.append(task_record(ts, spec.get("deps")))
            if client is not None and client not in ts.wanted_by:
                ts.wanted_by.add(client)
                wanted.append(key)
            tasks.append(ts)
        if wanted:
            records.append(["want", client, wanted])
        self._j(*records)
        for spec, ts in zip(specs, tasks):
            if ts in created:
                self._link(ts, spec.get("deps") or ())
        for ts in tasks:
            if self.tasks.get(ts.key) is not ts:
                continue
            # While a recovery waits for workers to report what they hold, nothing is recomputed yet.
            if ts.state == RELEASED and ts.error is None and not self.recovering:
                self._recompute(ts)
            if ts not in created:   # (a new task's own transitions tell the client)
                self._report(ts, client)
        self._schedule()
        # New tasks that wait only for work on one worker go ahead to it (a chain submitted link by link).
        running_deps = {d for ts in created if ts.state == WAITING for d in ts.deps if d.state == PROCESSING}
        for dts in sorted(running_deps, key=lambda t: t.priority):
            if dts.state == PROCESSING:
                self._send_successors(dts, dts.processing_on)
        return self._take()

    def _link(self, ts: TaskState, dep_keys: Iterable[str]) -> None:
        for dep_key in dep_keys:
            dts = self.tasks.get(dep_key)
            if dts is None:
                self._set_erred(ts, {"type": "unknown-dependency", "key": dep_key,
                                     "message": f"dependency {dep_key!r} of {ts.key!r} is unknown or was released"})
                return
            ts.deps.add(dts)
            dts.dependents.add(ts)

    def _report(self, ts: TaskState, client: str | None) -> None:
        if client is None:
            return
        if ts.state == MEMORY:
            self.out.to_client(client, {"op": "key-in-memory", "key": ts.key,
                                        "who_has": [w.address for w in ts.who_has]})
        elif ts.state == ERRED:
            self.out.to_client(client, {"op": "task-erred", "key": ts.key, "error": ts.error})

    def _recompute(self, ts: TaskState) -> None:
        """Bring ``ts`` back to life from its lineage: recompute released dependencies first."""
        if ts.state in ACTIVE or ts.state in (MEMORY, ERRED, FORGOTTEN):
            return
        if ts.run_spec is None:
            self._set_erred(ts, lost_error(ts.key, None))
            return
        ts.state = WAITING
        ts.waiting_on = set()
        for dts in ts.deps:
            if dts.state == ERRED:
                self._set_erred(ts, dts.error)
                return
            if dts.state != MEMORY:
                ts.waiting_on.add(dts)
                self._recompute(dts)
                if dts.state == ERRED:
                    self._set_erred(ts, dts.error)
                    return
        if not ts.waiting_on:
            self._make_ready(ts)

    def _make_ready(self, ts: TaskState) -> None:
        ts.state = READY
        heapq.heappush(self.ready, (ts.priority, next(self._seq), ts))

    # ---------------------------------------------------------------- placement
    def window(self, ts: TaskState) -> int:
        """Tasks a worker may hold beyond its threads when ``ts`` is next: ``worker_window``, widened for
        tasks known to be short so that a worker's threads never wait on a scheduler round trip, but never
        more than about ``worker_window_seconds`` of estimated work (so placement stays balanced without
        work stealing), and at most ``worker_window_max``."""
        base, seconds, most = self.window_settings
        estimate = self.durations.get(key_prefix(ts.key))
        if estimate is None:
            return base
        return max(base, min(most, int(seconds / max(estimate, 1e-6))))

    def learn_duration(self, key: str, seconds: float) -> None:
        prefix = key_prefix(key)
        old = self.durations.get(prefix)
        # Weighted towards the newest: a function whose tasks turn long narrows the window quickly.
        self.durations[prefix] = seconds if old is None else 0.5 * old + 0.5 * seconds

    @staticmethod
    def _capacity(ws: WorkerState, window: int) -> int:
        return ws.nthreads + window - len(ws.processing) + len(ws.long_running)

    def schedule(self) -> Outbox:
        self._schedule()
        return self._take()

    def _schedule(self) -> None:
        if self.recovering:
            return  # workers are still reporting what they hold: placing work now could redo theirs
        running = self.running_workers()
        if not running or not self.ready:
            return
        skipped = []
        while self.ready:
            priority, seq, ts = self.ready[0]
            if ts.state != READY:
                heapq.heappop(self.ready)
                continue
            candidates = running
            if ts.restrictions:
                candidates = [ws for ws in running if ws.address in ts.restrictions or ws.name in ts.restrictions]
                if not candidates and ts.loose:
                    candidates = running
            window = self.window(ts)
            free = [ws for ws in candidates if self._capacity(ws, window) > 0]
            if not free:
                if ts.restrictions:  # others may still fit elsewhere
                    skipped.append(heapq.heappop(self.ready))
                    continue
                break
            heapq.heappop(self.ready)
            if len(free) == 1:
                ws = free[0]
            else:
                ws = max(free, key=lambda w: (sum(1 for d in ts.deps if w in d.who_has),
                                              self._capacity(w, window) / w.nthreads, -len(w.has_what)))
            self._send_compute(ts, ws)
        for item in skipped:
            heapq.heappush(self.ready, item)

    def _send_compute(self, ts: TaskState, ws: WorkerState, after: list[str] | None = None) -> None:
        ts.state = PROCESSING
        ts.processing_on = ws
        ts.executing = False
        ws.processing.add(ts)
        msg = {"op": "compute", "key": ts.key, "spec": ts.run_spec,
               "deps": {d.key: [w.address for w in d.who_has] or [ws.address] for d in ts.deps}}
        if after:
            msg["after"] = after
        self.out.to_worker(ws.address, msg)
        self._send_successors(ts, ws)

    def _send_successors(self, ts: TaskState, ws: WorkerState) -> None:
        """Send ahead, to the worker computing ``ts``, the tasks downstream of it that can only wait for work
        on that worker: each of their dependencies is held there or being computed there. The worker runs
        them as soon as their dependencies finish, without a round trip through the scheduler per task (a
        chain's link cost two network hops and a placement each). Bounded by the worker's window, like any
        task it holds; one waiting on a task computed elsewhere, or restricted, waits here as before. A task
        sent ahead is not *executing* until the worker says it started, so a death meanwhile blames only the
        task that was running."""
        if self.recovering or ws.status != WorkerStatus.RUNNING:
            return
        stack = [ts]
        while stack:
            for dep in sorted(stack.pop().dependents, key=lambda d: d.priority):
                if dep.state == PROCESSING and dep.processing_on is ws:
                    stack.append(dep)          # sent ahead already: look further down
                    continue
                if dep.state != WAITING or dep.run_spec is None or dep.restrictions:
                    continue
                if self._capacity(ws, self.window(dep)) <= 0:
                    return
                pending = []
                for d in dep.deps:
                    if d.state == PROCESSING and d.processing_on is ws:
                        pending.append(d.key)
                    elif not (d.state == MEMORY and ws in d.who_has):
                        break
                else:
                    self._send_compute(dep, ws, after=pending)

    # ---------------------------------------------------------------- worker reports
    def _processing_on(self, address: str, key: str) -> tuple[WorkerState | None, TaskState | None]:
        ws = self.workers.get(address)
        ts = self.tasks.get(key)
        if ws is None or ts is None or ts.processing_on is not ws:
            return ws, None
        return ws, ts

    def task_started(self, address: str, key: str) -> Outbox:
        ws, ts = self._processing_on(address, key)
        if ts is not None:
            ts.executing = True
            ws.executing.add(ts)
        return self._take()

    def task_seceded(self, address: str, key: str) -> Outbox:
        """The task left its worker's thread pool (``secede``: it waits on other tasks): its thread is free for
        another task, so it no longer counts against the worker's capacity."""
        ws, ts = self._processing_on(address, key)
        if ts is not None:
            ws.long_running.add(ts)
            self._schedule()
        return self._take()

    def _done_processing(self, ts: TaskState) -> None:
        ws = ts.processing_on
        if ws is not None:
            ws.processing.discard(ts)
            ws.executing.discard(ts)
            ws.long_running.discard(ts)
        ts.processing_on = None
        ts.executing = False

    def task_finished(self, address: str, key: str, nbytes: int = 0, duration: float | None = None,
                      value: bytes | None = None) -> Outbox:
        """A worker computed ``key``. ``value``: a small result's pickle, passed on to the clients that want it
        (the scheduler keeps no copy)."""
        ws, ts = self._processing_on(address, key)
        if ts is None:
            if ws is not None and key not in {t.key for t in ws.has_what}:
                self.out.to_worker(address, {"op": "free-keys", "keys": [key]})
            return self._take()
        self._done_processing(ts)
        self.counters["finished"] += 1
        if duration is not None:
            self.learn_duration(ts.key, float(duration))
        self._accept_result(ts, ws, int(nbytes or 0), value)
        for dts in ts.deps:
            self._release_if_unneeded(dts)
        self._fired_and_done(ts)
        self._release_if_unneeded(ts)
        if ts.state == MEMORY:
            self._send_successors(ts, ws)   # room freed on ws: more of what waits on its work can go ahead
        self._schedule()
        return self._take()

    def _accept_result(self, ts: TaskState, ws: WorkerState, nbytes: int, value: bytes | None = None) -> None:
        """``ts``'s result is on ``ws``: tell the clients that want it, and wake the tasks that waited on it."""
        ts.state = MEMORY
        ts.nbytes = nbytes
        ts.waiting_on = set()
        self._add_holder(ts, ws)
        for client in ts.wanted_by:
            if client == FIRE_AND_FORGET:
                continue
            news = {"op": "key-in-memory", "key": ts.key, "who_has": [ws.address]}
            if isinstance(value, bytes):
                news["value"] = value
            self.out.to_client(client, news)
        for dep in ts.dependents:
            if ts in dep.waiting_on:
                dep.waiting_on.discard(ts)
                if dep.state == WAITING and not dep.waiting_on:
                    self._make_ready(dep)

    def _add_holder(self, ts: TaskState, ws: WorkerState) -> None:
        if ws not in ts.who_has:
            self._j(["has", ts.key, ws.name, ts.nbytes])
            ts.who_has.add(ws)
            ws.has_what.add(ts)

    def _drop_holder(self, ts: TaskState, ws: WorkerState) -> None:
        if ws in ts.who_has:
            self._j(["drop", ts.key, ws.name])
            ts.who_has.discard(ws)
            ws.has_what.discard(ts)

    def task_erred(self, address: str, key: str, *, exception: bytes | None = None, exc_type: str | None = None,
                   message: str | None = None, traceback: str | None = None, frames: list | None = None) -> Outbox:
        """The task raised. With retries left it runs again (Dask's ``retries=``); otherwise it and everything
        downstream of it is erred with its exception."""
        ws, ts = self._processing_on(address, key)
        if ts is None:
            return self._take()
        self._done_processing(ts)
        self._event("task-erred", f"Task {ts.key!r} erred on {ws.address}: {exc_type}: {message}", level="info",
                    key=ts.key, exception=exc_type, error=message, traceback=traceback, worker=ws.name,
                    retries_left=ts.retries)
        if ts.retries > 0:
            ts.retries -= 1
            self._j(["retries", ts.key, ts.retries])
            ts.state = RELEASED
            self._recompute(ts)
        else:
            self._set_erred(ts, {"type": "exception", "key": ts.key, "exception": exception, "exc_type": exc_type,
                                 "message": message, "traceback": traceback, "frames": frames})
        self._schedule()
        return self._take()

    def _set_erred(self, ts: TaskState, error: dict) -> None:
        """Mark ``ts`` and everything downstream of it erred with the same error."""
        stack, erred = [ts], []
        while stack:
            t = stack.pop()
            if t.state in (ERRED, FORGOTTEN):
                continue
            if t.processing_on is not None:
                self.out.to_worker(t.processing_on.address, {"op": "free-keys", "keys": [t.key]})
                self._done_processing(t)
            t.state = ERRED
            t.error = error
            self._j(["err", t.key, error])
            self.counters["erred"] += 1
            t.waiting_on = set()
            for client in t.wanted_by:
                if client != FIRE_AND_FORGET:
                    self.out.to_client(client, {"op": "task-erred", "key": t.key, "error": error})
            stack.extend(d for d in t.dependents if d.state != MEMORY)
            erred.append(t)
            # An erred task needs no inputs: release the ones nothing else waits for.
            for dts in t.deps:
                self._release_if_unneeded(dts)
        for t in erred:
            self._fired_and_done(t)

    def missing_deps(self, address: str, key: str, missing: Iterable[str]) -> Outbox:
        """A worker could not get ``key``'s inputs from their holders: back to the lineage."""
        ws, ts = self._processing_on(address, key)
        if ts is None:
            return self._take()
        self._done_processing(ts)
        ts.missing_retries += 1
        for dep_key in missing:
            dts = self.tasks.get(dep_key)
            if dts is None:
                continue
            if ts.missing_retries > MISSING_DEPS_RETRIES:  # the holders keep failing: treat the copies as lost
                for holder in list(dts.who_has):
                    self._drop_holder(dts, holder)
            if dts.state == MEMORY and not dts.who_has:
                dts.state = RELEASED
        ts.state = RELEASED
        self._recompute(ts)
        self._schedule()
        return self._take()

    def add_keys(self, address: str, keys: Iterable[str]) -> Outbox:
        """A worker now holds copies of ``keys`` (fetched as inputs, or moved there)."""
        ws = self.workers.get(address)
        if ws is not None:
            for key in keys:
                ts = self.tasks.get(key)
                if ts is not None and ts.state == MEMORY:
                    self._add_holder(ts, ws)
                elif ts is not None and ts.processing_on is ws:
                    # Its copy was lost elsewhere and this worker was asked to compute it since: the copy is of no
                    # use to us now, but a free-keys would also drop the computation it has queued.
                    continue
                else:
                    self.out.to_worker(address, {"op": "free-keys", "keys": [key]})
        return self._take()

    # ---------------------------------------------------------------- release, forget, cancel, retry
    def needed(self, ts: TaskState) -> bool:
        """Wanted by a client, or by a dependent that is not finished."""
        return bool(ts.wanted_by) or any(d.state in ACTIVE for d in ts.dependents)

    _needed = needed

    def _release_if_unneeded(self, ts: TaskState) -> None:
        if self._needed(ts):
            return
        if ts.state == MEMORY:
            for ws in list(ts.who_has):
                self._drop_holder(ts, ws)
                self.out.to_worker(ws.address, {"op": "free-keys", "keys": [ts.key]})
            ts.state = RELEASED
        elif ts.state == PROCESSING:   # nobody wants it any more: the worker drops it (or its result)
            self.out.to_worker(ts.processing_on.address, {"op": "free-keys", "keys": [ts.key]})
            self._done_processing(ts)
            ts.state = RELEASED
            for dts in ts.deps:
                self._release_if_unneeded(dts)
        elif ts.state in (WAITING, READY):
            ts.state = RELEASED
            ts.waiting_on = set()
            for dts in ts.deps:
                self._release_if_unneeded(dts)
        self._maybe_forget(ts)

    def _maybe_forget(self, ts: TaskState) -> None:
        stack = [ts]
        while stack:
            t = stack.pop()
            if t.wanted_by or t.dependents or t.state not in (RELEASED, ERRED) or self.tasks.get(t.key) is not t:
                continue
            del self.tasks[t.key]
            t.state = FORGOTTEN
            self._j(["forget", [t.key]])
            for dts in t.deps:
                dts.dependents.discard(t)
                if not dts.wanted_by and dts.state in (MEMORY, PROCESSING, WAITING, READY) \
                        and not any(d.state in ACTIVE for d in dts.dependents):
                    self._release_if_unneeded(dts)
                stack.append(dts)

    def _unwant(self, ts: TaskState, client: str) -> None:
        ts.wanted_by.discard(client)
        if not ts.wanted_by:
            self._release_if_unneeded(ts)
            self._maybe_forget(ts)

    def release_keys(self, client: str | None, keys: Iterable[str]) -> Outbox:
        """The client dropped its futures of ``keys``; what nobody needs any more is released and forgotten."""
        keys = list(keys)
        self._j(["unwant", client, [k for k in keys if k in self.tasks]])
        for key in keys:
            ts = self.tasks.get(key)
            if ts is not None:
                self._unwant(ts, client)
        return self._take()

    def cancel(self, client: str | None, keys: Iterable[str], force: bool = False, reason: str = "cancelled") -> Outbox:
        """``client.cancel``, as Dask: a key only this client wants (or any, with ``force``) is cancelled with the
        dependents it wants, every client holding it is told, and the client's want of it ends."""
        for key in keys:
            self._cancel_key(key, client, force, reason)
        self._schedule()
        return self._take()

    def _cancel_key(self, key: str, client: str | None, force: bool, reason: str) -> None:
        ts = self.tasks.get(key)
        if ts is None or not ts.wanted_by:
            return
        if force or ts.wanted_by == {client}:
            for dts in sorted(ts.dependents, key=lambda t: t.priority):
                self._cancel_key(dts.key, client, force, reason)
        ts = self.tasks.get(key)   # (a dependent's release may have forgotten it)
        if ts is None:
            return
        for other in ts.wanted_by:
            self.out.to_client(other, {"op": "cancelled", "keys": [key], "reason": reason})
        for other in list(ts.wanted_by) if force else [c for c in ts.wanted_by if c == client]:
            self._j(["unwant", other, [key]])
            self._unwant(ts, other)

    def retry(self, client: str | None, keys: Iterable[str]) -> tuple[Outbox, list[str]]:
        """``client.retry``: the erred tasks behind ``keys`` (up to the first that erred on its own) run again,
        and their erred dependents wait for them. Returns the keys that are pending again."""
        stack, seen, roots = [k for k in keys if k in self.tasks], set(), []
        while stack:
            key = stack.pop()
            if key in seen:
                continue
            seen.add(key)
            ts = self.tasks[key]
            if ts.state != ERRED:
                continue
            erred_deps = [d.key for d in ts.deps if d.state == ERRED]
            if erred_deps:
                stack.extend(erred_deps)
            else:
                roots.append(ts)
        reset: list[TaskState] = []
        stack2 = list(roots)
        while stack2:   # the roots and everything downstream that erred with them
            ts = stack2.pop()
            if ts.state != ERRED:
                continue
            ts.state, ts.error, ts.suspicious, ts.death_workers = RELEASED, None, 0, []
            reset.append(ts)
            stack2.extend(d for d in ts.dependents if d.state == ERRED)
        for ts in reset:
            self._j(["retry", ts.key])
        clients: dict[str, list[str]] = {}
        for ts in reset:
            for c in ts.wanted_by:
                clients.setdefault(c, []).append(ts.key)
        for c, ks in clients.items():
            self.out.to_client(c, {"op": "retrying", "keys": ks})
        for ts in sorted(reset, key=lambda t: t.priority):
            if ts.state == RELEASED and self._needed(ts):
                self._recompute(ts)
        self._schedule()
        return self._take(), [ts.key for ts in reset]

    def fire_and_forget(self, keys: Iterable[str]) -> Outbox:
        """Run ``keys`` though no client may hold them any more (Dask's ``fire_and_forget``): the pseudo-client
        ``FIRE_AND_FORGET`` wants each until it is in memory or erred."""
        wanted = []
        for key in keys:
            ts = self.tasks.get(key)
            if ts is None or FIRE_AND_FORGET in ts.wanted_by:
                continue
            if ts.state in (MEMORY, ERRED):
                continue   # done already: nothing to run
            ts.wanted_by.add(FIRE_AND_FORGET)
            wanted.append(key)
        if wanted:
            self._j(["want", FIRE_AND_FORGET, wanted])
        return self._take()

    def _fired_and_done(self, ts: TaskState) -> None:
        if FIRE_AND_FORGET in ts.wanted_by:
            self._j(["unwant", FIRE_AND_FORGET, [ts.key]])
            self._unwant(ts, FIRE_AND_FORGET)

    # ---------------------------------------------------------------- data placed by clients
    def scattered(self, client: str | None, placed: dict[str, tuple[list[str], int]]) -> Outbox:
        """Data a client scattered is on these workers: ``{key: ([addresses], nbytes)}``."""
        for key, (addresses, nbytes) in placed.items():
            ts = self.tasks.get(key)
            if ts is None:
                ts = self.tasks[key] = TaskState(key, None, self.next_priority())
                self._j(task_record(ts, ()))
            ts.state = MEMORY
            ts.error = None
            ts.scattered = ts.run_spec is None
            ts.nbytes = nbytes
            for address in addresses:
                ws = self.workers.get(address)
                if ws is not None:
                    self._add_holder(ts, ws)
            if client is not None and client not in ts.wanted_by:
                self._j(["want", client, [key]])
                ts.wanted_by.add(client)
            for dep in ts.dependents:   # tasks submitted before the data arrived may run now
                if ts in dep.waiting_on:
                    dep.waiting_on.discard(ts)
                    if dep.state == WAITING and not dep.waiting_on:
                        self._make_ready(dep)
        self._schedule()
        return self._take()

    def add_replica(self, key: str, address: str) -> Outbox:
        ts, ws = self.tasks.get(key), self.workers.get(address)
        if ts is not None and ws is not None and ts.state == MEMORY:
            self._add_holder(ts, ws)
        return self._take()

    # ---------------------------------------------------------------- restart
    def restart(self) -> Outbox:
        """``client.restart()``: every client future is cancelled, every task forgotten, every worker removed
        as an expected departure (their nannies bring new ones)."""
        for client in self.clients:
            keys = [k for k, ts in self.tasks.items() if client in ts.wanted_by]
            if keys:
                self.out.to_client(client, {"op": "cancelled", "keys": keys, "reason": "restart"})
        for ts in self.tasks.values():
            ts.state = FORGOTTEN
        self.tasks.clear()
        self._j(["flush"])
        self.ready.clear()
        for ws in list(self.workers.values()):
            ws.processing.clear()
            ws.executing.clear()
            ws.has_what.clear()
            self._remove_worker(ws, how="restart", expected=True)
        return self._take()

    # ---------------------------------------------------------------- recovery from a journal
    def restore(self, records: Iterable[Any]) -> Outbox:
        """Rebuild the tasks of a journal's replay (``journal.TaskRecord``s): all released; finished ones
        expect their holders back; nothing is placed until ``end_recovery()``."""
        self.recovering = True
        records = list(records)
        for rec in records:
            ts = TaskState(rec.key, rec.spec, (-rec.priority, next(self._priority)))
            ts.restrictions = set(rec.restrictions) if rec.restrictions else None
            ts.loose = rec.loose
            ts.retries = int(getattr(rec, "retries", 0) or 0)
            ts.wanted_by = set(rec.wanted_by)
            ts.suspicious, ts.death_workers = rec.deaths, list(rec.death_workers)
            if rec.error is not None:
                ts.state, ts.error = ERRED, rec.error
            elif rec.holders:
                ts.expected = dict(rec.holders)
                ts.nbytes = max(rec.holders.values())
            self.tasks[rec.key] = ts
        orphans = []
        for rec in records:
            ts = self.tasks[rec.key]
            for dep in rec.deps:
                dts = self.tasks.get(dep)
                if dts is None:
                    orphans.append((ts, dep))
                    continue
                ts.deps.add(dts)
                dts.dependents.add(ts)
        for ts, dep in orphans:  # cannot happen with a whole journal; a damaged one must not hang a client
            self._set_erred(ts, {"type": "unknown-dependency", "key": dep,
                                 "message": f"dependency {dep!r} of {ts.key!r} was not in the recovered journal"})
        self.counters.update(submitted=len(self.tasks),
                             finished=sum(1 for t in self.tasks.values() if t.expected and not t.scattered),
                             erred=sum(1 for t in self.tasks.values() if t.state == ERRED))
        return self._take()

    def end_recovery(self) -> Outbox:
        """The recovery window closed: what no returning worker holds is recomputed (scattered data nobody
        brought back is lost for good), results nobody needs are freed, and placement starts."""
        if not self.recovering:
            return self._take()
        self.recovering = False
        lost = self._drop_unconfirmed()
        order = sorted(self.tasks.values(), key=lambda t: t.priority)
        for ts in order:
            if self.tasks.get(ts.key) is ts and ts.wanted_by and ts.error is None and ts.state == RELEASED:
                self._recompute(ts)
        for ts in order:
            if ts in lost and ts.state in (WAITING, READY):
                self.tally.recomputed += 1
                if len(self.tally.recomputed_keys) < MAX_KEYS_LISTED:
                    self.tally.recomputed_keys.append(ts.key)
            elif ts.state in (WAITING, READY):
                self.tally.rerun += 1
        for ts in order:  # results nobody needs any more (their dependents are done): free them
            if self.tasks.get(ts.key) is ts and ts.state in (MEMORY, RELEASED) and not self._needed(ts):
                self._release_if_unneeded(ts)
        self._schedule()
        return self._take()

    def _drop_unconfirmed(self) -> set[TaskState]:
        """Finished results whose holders did not come back: released (scattered data: lost for good)."""
        lost = set()
        for ts in list(self.tasks.values()):
            if ts.expected is None:
                continue
            holders, ts.expected = sorted(ts.expected), None
            if ts.state != RELEASED:
                continue
            if ts.scattered:
                self.tally.lost_scattered.append(ts.key)
                self._event("scattered-lost", f"Scattered data {ts.key!r} was held by {', '.join(holders)}, which "
                            "did not come back after the scheduler restarted; it can't be recovered", level="error",
                            key=ts.key, worker=holders[0] if holders else None)
                self._set_erred(ts, lost_error(ts.key, ", ".join(holders)))
            else:
                lost.add(ts)
                for client in ts.wanted_by:  # a client that kept the result as finished must wait for it again
                    self.out.to_client(client, {"op": "key-lost", "key": ts.key})
        return lost

    # ---------------------------------------------------------------- queries
    def who_has(self, keys: Iterable[str] | None = None) -> dict[str, list[str]]:
        if keys is None:
            keys = [k for k, ts in self.tasks.items() if ts.state == MEMORY]
        return {k: [w.address for w in self.tasks[k].who_has] if k in self.tasks else [] for k in keys}

    def has_what(self, workers: Iterable[str] | None = None) -> dict[str, list[str]]:
        chosen = self.workers.values() if workers is None else self.match_workers(workers)
        return {ws.address: sorted(ts.key for ts in ws.has_what) for ws in chosen}

    def task_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for ts in self.tasks.values():
            counts[ts.state.value] = counts.get(ts.state.value, 0) + 1
        return counts

    def task_spec(self, key: str) -> dict:
        """What ``recreate_error_locally`` needs: the spec of the task that erred first, and its inputs."""
        ts = self.tasks.get(key)
        if ts is None:
            raise KeyError(f"unknown task {key!r}")
        if ts.error and ts.error.get("key") in self.tasks:
            ts = self.tasks[ts.error["key"]]
        return {"key": ts.key, "spec": ts.run_spec, "state": ts.state.value,
                "processing_on": ts.processing_on.address if ts.processing_on is not None else None,
                "executing": ts.executing, "who_has": [w.address for w in ts.who_has],
                "dependents": {d.key: d.state.value for d in list(ts.dependents)[:5]},
                "deps": {d.key: [w.address for w in d.who_has] for d in ts.deps},
                "missing": [d.key for d in ts.deps if d.state != MEMORY]}

    def task_records(self) -> list[list]:
        """The tasks as journal records (a compacted journal's body, after its hello, workers and clients)."""
        records = []
        tasks = sorted(self.tasks.values(), key=lambda t: t.priority)
        wants: dict[str, list[str]] = {}
        for ts in tasks:
            records.append(task_record(ts, [d.key for d in ts.deps]))
            for client in ts.wanted_by:
                wants.setdefault(client, []).append(ts.key)
        records.extend(["want", client, keys] for client, keys in wants.items())
        for ts in tasks:
            for ws in ts.who_has:
                records.append(["has", ts.key, ws.name, ts.nbytes])
            for name, nbytes in (ts.expected or {}).items():
                records.append(["has", ts.key, name, nbytes])
            if ts.error is not None:
                records.append(["err", ts.key, ts.error])
            if ts.suspicious:
                records.append(["blame", ts.key, ts.suspicious, ts.death_workers])
        return records

    def validate(self) -> None:
        """Check the invariants that tie the structures together (tests call this after every stimulus)."""
        for key, ts in self.tasks.items():
            assert ts.key == key and ts.state != FORGOTTEN, ts
            for d in ts.deps:
                assert ts in d.dependents and self.tasks.get(d.key) is d, (ts, d)
            for d in ts.dependents:
                assert ts in d.deps, (ts, d)
            if ts.state == PROCESSING:
                assert ts.processing_on is not None and ts in ts.processing_on.processing, ts
                assert self.workers.get(ts.processing_on.address) is ts.processing_on, ts
            else:
                assert ts.processing_on is None and not ts.executing, ts
            if ts.state == MEMORY:
                assert ts.who_has, ts
            for ws in ts.who_has:
                assert ts in ws.has_what and self.workers.get(ws.address) is ws, (ts, ws)
            if ts.state == WAITING:
                assert ts.waiting_on and all(d.state != MEMORY for d in ts.waiting_on), ts
            if ts.state in ACTIVE:
                assert self.needed(ts) or self.recovering, ts
                assert all(d.state != ERRED for d in ts.deps), ts
            if ts.state == ERRED:
                assert ts.error is not None, ts
        for ws in self.workers.values():
            for ts in ws.processing:
                assert ts.processing_on is ws and self.tasks.get(ts.key) is ts, (ws, ts)
            assert ws.executing <= ws.processing, ws
            for ts in ws.has_what:
                assert ws in ts.who_has and self.tasks.get(ts.key) is ts, (ws, ts)
