"""The scheduler: task state, placement, worker lifecycle, blame, and the lineage it keeps.

Covers: registering workers and clients; a task state machine (``waiting`` -> ``ready`` ->
``processing`` -> ``memory`` | ``erred``, and ``released``) over a graph whose edges are kept
so lost results can be recomputed; noticing departures (deregistration, a closed connection,
missed heartbeats past the time-to-live) and recording each removal as a ``worker-removed``
event with how and how fast it was noticed; counting each unexpected death against the tasks
that were *executing* on the worker (not merely queued there) and failing a task with
KilledWorker past ``allowed_failures``; scatter, replicate, retire, restart, run, versions.

Also: appending every fact it must not forget to its journal (``runtime.journal``) as the state
changes, and accepting the results and running tasks a (re-)registering worker reports; recovering
from a predecessor's journal is ``runtime.recovery``'s part.

Does not cover: unpickling anything (task payloads, results and exceptions pass through as
opaque bytes), running tasks (``runtime.worker``), or supervising processes (``runtime.nanny``).
"""

from __future__ import annotations

import asyncio
import errno
import heapq
import itertools
import logging
import os
import signal
import time
from typing import Any

from kwdiag.runtime import recovery
from kwdiag.runtime import versions as versions_mod
from kwdiag.runtime.comm import CommClosedError, Credentials, Listener, Security, connect
from kwdiag.runtime.core import Stream, background
from kwdiag.runtime.identity import StartupError, write_scheduler_file
from kwdiag.runtime.journal import Journal
from kwdiag.runtime.record import Recorder

logger = logging.getLogger("kwdiag.scheduler")

# Task states
WAITING, READY, PROCESSING, MEMORY, ERRED, RELEASED = "waiting", "ready", "processing", "memory", "erred", "released"
ACTIVE = (WAITING, READY, PROCESSING)


def key_prefix(key: str) -> str:
    """``inc-1f3a...`` -> ``inc``: tasks of one function share duration estimates, as in Dask."""
    return key.rsplit("-", 1)[0] if "-" in key else key


class TaskState:
    __slots__ = ("key", "run_spec", "deps", "dependents", "state", "who_has", "processing_on", "executing",
                 "suspicious", "death_workers", "error", "wanted_by", "restrictions", "waiting_on", "priority",
                 "nbytes", "scattered", "missing_retries", "loose", "expected")

    def __init__(self, key: str, run_spec: bytes | None, priority: tuple[int, int]):
        self.key = key
        self.run_spec = run_spec
        self.deps: set[TaskState] = set()
        self.dependents: set[TaskState] = set()
        self.state = RELEASED
        self.who_has: set[WorkerState] = set()
        self.processing_on: WorkerState | None = None
        self.executing = False
        self.suspicious = 0
        self.death_workers: list[str] = []
        self.error: dict | None = None
        self.wanted_by: set[str] = set()
        self.restrictions: set[str] | None = None
        self.waiting_on: set[TaskState] = set()
        self.priority = priority
        self.nbytes = 0
        self.scattered = run_spec is None
        self.missing_retries = 0
        self.loose = False  # restrictions are a preference only (allow_other_workers)
        self.expected: dict[str, int] | None = None  # replayed: worker name -> nbytes, until a holder is back

    def __repr__(self) -> str:
        return f"<Task {self.key!r} {self.state}>"


class WorkerState:
    __slots__ = ("address", "name", "nthreads", "memory_limit", "nanny", "pid", "incarnation", "stream",
                 "processing", "executing", "has_what", "last_seen", "status", "versions", "registered_at", "memory")

    def __init__(self, address: str, name: str, nthreads: int, stream: Stream):
        self.address = address
        self.name = name
        self.nthreads = nthreads
        self.stream = stream
        self.memory_limit: int | None = None
        self.nanny: str | None = None
        self.pid: int | None = None
        self.incarnation = 0
        self.processing: set[TaskState] = set()
        self.executing: set[TaskState] = set()
        self.has_what: set[TaskState] = set()
        self.last_seen = time.monotonic()
        self.status = "running"  # running | retiring | closed
        self.versions: dict = {}
        self.registered_at = time.time()
        self.memory: int | None = None  # resident bytes, from the last heartbeat

    def __repr__(self) -> str:
        return f"<Worker {self.address!r} name={self.name!r}>"


class Scheduler:
    def __init__(self, *, secret: bytes, config: dict, log_dir: str | None, host: str = "127.0.0.1", port: int = 0,
                 scheduler_file: str | None = None, security: Security | None = None):
        """The scheduler's state, empty until ``start()``. Over 60 lines on purpose: one attribute per line
        (with what it holds), the journal if asked for, and the table of message handlers; no I/O here."""
        self.secret = secret
        self.credentials = Credentials(secret, security)
        self.config = config
        self.host, self.port = host, port
        self.scheduler_file = scheduler_file
        self.allowed_failures = int(config["allowed_failures"])
        self.worker_ttl = float(config["worker_ttl"])
        self.rec = Recorder("kwdiag.scheduler", source="scheduler", log_dir=log_dir, file_stem="scheduler")
        self.tasks: dict[str, TaskState] = {}
        self.workers: dict[str, WorkerState] = {}
        self.clients: dict[str, Stream] = {}
        self.ready: list[tuple[int, int, TaskState]] = []
        self._seq = itertools.count()
        self._priority = itertools.count()
        self.versions = versions_mod.collect(config["versions_packages"])
        self.compared = ["python", *versions_mod.CORE_PACKAGES, *config["versions_packages"]]
        self.address = ""
        self._listener: Listener | None = None
        self._ttl_task: asyncio.Task | None = None
        self._closed = asyncio.Event()
        self._closing = False  # close() has begun: a connection dropping now is part of the close
        self.closing_cluster = False
        self.counters = {"submitted": 0, "finished": 0, "erred": 0}  # cumulative, for progress displays
        self.durations: dict[str, float] = {}  # key prefix -> moving average of its tasks' run time, seconds
        self._window_settings = (int(config["worker_window"]), float(config["worker_window_seconds"]),
                                 int(config["worker_window_max"]))  # read once: placement asks for each task
        self.log_dir = log_dir
        self.journal: Journal | None = None
        if log_dir and config["journal"]:
            self.journal = Journal(log_dir, self._journal_failed)
        self.recovery: recovery.Recovery | None = None   # set while recovering from a predecessor's journal
        self.started_at = time.time()          # reported (and compared with peers' clocks for headless time)
        self._started_mono = time.monotonic()   # measured from: a wall-clock jump must not distort durations
        self.first_finished_after: float | None = None   # seconds from start to the first task finished here
        self.absent_clients: dict[str, asyncio.TimerHandle] = {}  # disconnected, within their grace period
        self._upkeep_task: asyncio.Task | None = None
        self.handlers = {
            "register-worker": self.handle_register_worker,
            "register-client": self.handle_register_client,
            "close-client": self.handle_close_client,
            "heartbeat": self.handle_heartbeat,
            "started": self.handle_started,
            "finished": self.handle_finished,
            "erred": self.handle_erred,
            "missing-deps": self.handle_missing_deps,
            "add-keys": self.handle_add_keys,
            "unregister": self.handle_unregister,
            "retire-me": self.handle_retire_me,
            "update-graph": self.handle_update_graph,
            "release-keys": self.handle_release_keys,
            "scatter": self.handle_scatter,
            "replicate": self.handle_replicate,
            "who-has": self.handle_who_has,
            "run": self.handle_run,
            "scheduler-info": self.handle_scheduler_info,
            "retire-workers": self.handle_retire_workers,
            "restart": self.handle_restart,
            "get-versions": self.handle_get_versions,
            "get-task-spec": self.handle_get_task_spec,
            "close-cluster": self.handle_close_cluster,
        }

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> str:
        """Take the run directory, listen, replay a predecessor's journal, then announce the address.

        Raises ``StartupError`` for what a user can fix: a port in use, a run directory another
        scheduler holds, a scheduler file that cannot be written."""
        replay = recovery.take_run_directory(self) if self.journal else None
        self._listener = Listener(self.credentials, self._on_comm, self.rec.refused)
        try:
            self.address = await self._listener.start(self.host, self.port)
        except OSError as exc:
            raise StartupError(_listen_error(self.host, self.port, exc), 3) from None
        self.rec.event("process-start", f"Scheduler process {os.getpid()} starting", role="scheduler",
                       address=self.address, versions=self.versions,
                       config={"allowed_failures": self.allowed_failures, "worker_ttl": self.worker_ttl})
        self.rec.event("scheduler-start", f"  Scheduler at: {self.address:>25}", address=self.address,
                       allowed_failures=self.allowed_failures, worker_ttl=self.worker_ttl)
        if self.journal:
            recovery.begin(self, replay)   # replays the journal (if any) and writes a fresh one
        if self.scheduler_file:
            write_scheduler_file(self.scheduler_file, self.address, self.secret)
        self._ttl_task = background(self._check_ttl_forever())
        if self.journal:
            self._upkeep_task = background(self._journal_upkeep_forever())
        return self.address

    # ---------------------------------------------------------------- journal
    def _j(self, *records: list) -> None:
        """Append to the journal before anyone is told what the records say (one write for all of them)."""
        if self.journal is not None:
            self.journal.append(*records)

    def _journal_failed(self, reason: str) -> None:
        self.rec.event("journal-error", f"Could not write the journal {self.journal.path}: {reason}; the scheduler "
                       "goes on, and will write a complete journal as soon as it can (until then a restart would "
                       "lose the work since)", level="error", path=self.journal.path, reason=reason)

    async def _journal_upkeep_forever(self) -> None:
        """Compact a journal that grew well past its state; rewrite one that failed or was deleted."""
        while True:
            await asyncio.sleep(1.0)
            journal = self.journal
            live = 3 * len(self.tasks) + len(self.workers) + len(self.clients)  # ~ task, want, has per task
            if journal is None or not journal.needs_snapshot(live):
                continue
            broken_since = journal.broken_since
            if journal.snapshot(recovery.snapshot(self)) and broken_since is not None:
                self.rec.event("journal-restored", f"The journal {journal.path} is complete again after "
                               f"{time.monotonic() - broken_since:.1f}s", level="warning", path=journal.path,
                               after=round(time.monotonic() - broken_since, 3))

    async def finished(self) -> None:
        await self._closed.wait()

    async def close(self, reason: str = "scheduler-close") -> None:
        if self._closed.is_set():
            return
        self._closing = True
        self.rec.event("scheduler-close", f"Closing scheduler. Reason: {reason}", reason=reason)
        self._j(["close", reason])  # a clean end: the next scheduler on this run directory starts afresh
        for ws in list(self.workers.values()):
            ws.stream.send({"op": "close", "reason": "scheduler-close"})
            await ws.stream.drain(1.0)
            self._remove_worker(ws, how="scheduler-close", expected=True, quiet=True)
        for stream in list(self.clients.values()):
            await stream.drain(1.0)
            stream.close()
        if self._listener:
            self._listener.stop()
        for task in (self._ttl_task, self._upkeep_task):
            if task:
                task.cancel()
        if self.recovery is not None:
            self.recovery.cancel()
        if self.journal is not None:
            self.journal.close()
        self.rec.close()
        self._closed.set()

    async def _on_comm(self, comm) -> None:
        stream = Stream(comm, self.handlers, on_close=self._on_stream_closed, on_bad_frame=self.rec.bad_frame)
        await stream.run()

    def _on_stream_closed(self, stream: Stream) -> None:
        ws = stream.info.get("worker")
        if ws is not None and self.workers.get(ws.address) is ws:
            if self._closing:  # the worker heard the close (or its nanny did) before its turn in the loop above
                self._remove_worker(ws, how="scheduler-close", expected=True, quiet=True)
            else:
                self._remove_worker(ws, how="connection-closed", expected=False)
        client = stream.info.get("client")
        if client is not None and self.clients.get(client) is stream:
            del self.clients[client]
            if stream.info.get("client-closed") or self._closing:
                self._release_client(client)
            else:  # it may come back (a broken connection, a client that reconnects): keep its futures a while
                self._client_absent(client)

    def _client_absent(self, client: str) -> None:
        grace = float(self.config["client_grace"])
        logger.info("Client %s disconnected; keeping its tasks for %.0fs in case it comes back", client, grace)
        old = self.absent_clients.pop(client, None)
        if old is not None:
            old.cancel()
        self.absent_clients[client] = asyncio.get_running_loop().call_later(grace, self._client_gone, client)

    def _client_gone(self, client: str) -> None:
        self.absent_clients.pop(client, None)
        if client not in self.clients:
            logger.info("Client %s did not come back; releasing its tasks", client)
            self._release_client(client)

    def handle_close_client(self, stream: Stream, msg: dict) -> None:
        stream.info["client-closed"] = True  # released at once when the connection ends

    # ---------------------------------------------------------------- registration
    def handle_register_worker(self, stream: Stream, msg: dict) -> dict:
        address, name = msg["address"], str(msg.get("name") or msg["address"])
        peer_versions = msg.get("versions") or {}
        diffs = versions_mod.differences(self.versions, peer_versions, self.compared)
        required = [d for d in diffs if d["package"] in self.config["versions_required"]]
        warning = None
        if diffs:
            warning = "Mismatched versions found\n\n" + versions_mod.table(diffs, "Scheduler", f"Worker {name}")
            self.rec.event("versions-mismatch", f"Worker {name} at {address}: {warning}",
                           level="error" if required else "warning", worker=name, peer=f"worker {name}",
                           differences=[{"package": d["package"], "scheduler": d["ours"], "peer": d["theirs"]}
                                        for d in diffs], required=bool(required))
        if required:
            return {"status": "refused", "reason": "version mismatch in required packages", "table": warning}
        old = self.workers.get(address)
        if old is not None:
            self._remove_worker(old, how="connection-closed", expected=False)
        for other in list(self.workers.values()):
            if other.name == name and other.status != "closed":
                # A new incarnation registering under the same name: the old one is gone.
                self._remove_worker(other, how="connection-closed", expected=False)
        ws = WorkerState(address, name, int(msg.get("nthreads") or 1), stream)
        ws.memory_limit = msg.get("memory_limit")
        ws.memory = msg.get("memory")  # known from registration on, not only from the first heartbeat
        ws.nanny = msg.get("nanny")
        ws.pid = msg.get("pid")
        ws.incarnation = int(msg.get("incarnation") or 0)
        ws.versions = peer_versions
        stream.info["worker"] = ws
        self.workers[address] = ws
        self._j(["worker", name, address, True])
        held = msg.get("data") or {}
        self.rec.event("worker-registered", f"Register worker addr: {address} name: {name}"
                       + (f" (holding {len(held)} result(s))" if held else ""), worker=name,
                       address=address, name=name, nthreads=ws.nthreads, memory_limit=ws.memory_limit,
                       nanny=ws.nanny, pid=ws.pid, incarnation=ws.incarnation)
        self._adopt(ws, held, msg.get("executing") or [], msg.get("queued") or [])
        if self.recovery is not None:
            self.recovery.worker_back(name, msg.get("lost_at"))
        asyncio.get_running_loop().call_soon(self._schedule)
        return {"status": "ok", "warning": warning, "heartbeat_interval": self.config["heartbeat_interval"]}

    def _adopt(self, ws: WorkerState, held: dict, executing: list, queued: list) -> None:
        """Take what a worker that kept working without us reports: results it holds and tasks it runs.

        A result of a task that is wanted and not being computed elsewhere is kept (not recomputed);
        a task it runs or has queued stays with it. Anything else is freed on the worker."""
        free = []
        for key, nbytes in held.items():
            ts = self.tasks.get(key)
            if ts is not None and ts.state == MEMORY:
                self._add_holder(ts, ws)
            elif ts is not None and ts.state in (RELEASED, WAITING, READY):
                if self.recovery is not None:
                    self.recovery.result_back(ts)
                self._accept_result(ts, ws, int(nbytes or 0))
                if self.recovery is None or not self.recovery.open:  # (a recovery sorts out what is needed at its end)
                    self._release_if_unneeded(ts)
            else:
                free.append(key)
        running = set(executing)
        for key in [*executing, *queued]:
            ts = self.tasks.get(key)
            if ts is not None and ts.state in (RELEASED, WAITING, READY) and ts.run_spec is not None:
                ts.state = PROCESSING
                ts.processing_on = ws
                ts.waiting_on = set()
                ws.processing.add(ts)
                if key in running:
                    ts.executing = True
                    ws.executing.add(ts)
                if self.recovery is not None:
                    self.recovery.adopted += 1
            elif ts is None or ts.processing_on is not ws:
                free.append(key)
        if free:
            ws.stream.send({"op": "free-keys", "keys": free})

    def handle_register_client(self, stream: Stream, msg: dict) -> dict:
        client_id = msg["client"]
        stream.info["client"] = client_id
        # Known: it was connected, or within its grace period, or in the journal we recovered from; its futures
        # are still ours. An unknown client that reconnects lost them with a scheduler that had no journal.
        absent = self.absent_clients.pop(client_id, None)
        if absent is not None:
            absent.cancel()
        known = absent is not None or client_id in self.clients
        self.clients[client_id] = stream
        self._j(["client", client_id, True])
        if self.recovery is not None:
            self.recovery.peer_lost_at(msg.get("lost_at"))
        diffs = versions_mod.differences(self.versions, msg.get("versions") or {}, self.compared)
        warning = None
        if diffs:
            warning = "Mismatched versions found\n\n" + versions_mod.table(diffs, "Scheduler", "Client")
            self.rec.event("versions-mismatch", f"Client {client_id}: {warning}", level="warning", peer="client",
                           differences=[{"package": d["package"], "scheduler": d["ours"], "peer": d["theirs"]}
                                        for d in diffs], required=False)
        logger.info("Receive client connection: %s%s", client_id, " (again)" if known else "")
        return {"status": "ok", "warning": warning, "allowed_failures": self.allowed_failures, "known": known}

    def _worker_of(self, stream: Stream) -> WorkerState | None:
        ws = stream.info.get("worker")
        if ws is None or self.workers.get(ws.address) is not ws:
            return None
        ws.last_seen = time.monotonic()
        return ws

    def handle_heartbeat(self, stream: Stream, msg: dict) -> dict:
        ws = self._worker_of(stream)
        if ws is None:
            return {"status": "missing"}
        ws.memory = msg.get("memory")
        return {"status": "ok"}

    # ---------------------------------------------------------------- graph intake
    def handle_update_graph(self, stream: Stream, msg: dict) -> None:
        client = stream.info.get("client")
        created: set[TaskState] = set()   # a set: membership below is tested once per task
        records, wanted = [], []
        for spec in msg["tasks"]:
            key = spec["key"]
            ts = self.tasks.get(key)
            if ts is None:
                # Higher user priority first (as Dask's submit(priority=)), then submission order.
                ts = TaskState(key, spec.get("spec"), (-int(spec.get("priority") or 0), next(self._priority)))
                self.counters["submitted"] += 1
                ts.restrictions = set(spec["workers"]) if spec.get("workers") else None
                ts.loose = bool(spec.get("loose"))
                self.tasks[key] = ts
                created.add(ts)
                records.append(_task_record(ts, spec.get("deps")))
            elif ts.state == RELEASED and ts.run_spec is None and spec.get("spec") is not None:
                ts.run_spec, ts.scattered = spec["spec"], False
                records.append(_task_record(ts, spec.get("deps")))
            if client not in ts.wanted_by:
                ts.wanted_by.add(client)
                wanted.append(key)
            spec["_ts"] = ts
        if wanted:
            records.append(["want", client, wanted])
        self._j(*records)
        for spec in msg["tasks"]:
            ts = spec.pop("_ts")
            if ts not in created:
                continue
            for dep_key in spec.get("deps") or ():
                dts = self.tasks.get(dep_key)
                if dts is None:
                    self._set_erred(ts, {"type": "unknown-dependency", "key": dep_key,
                                         "message": f"dependency {dep_key!r} of {ts.key!r} is unknown or was released"})
                    break
                ts.deps.add(dts)
                dts.dependents.add(ts)
        recovering = self.recovery is not None and self.recovery.open
        for spec in msg["tasks"]:
            ts = self.tasks.get(spec["key"])
            if ts is None:
                continue
            # While a recovery waits for workers to report what they hold, nothing is recomputed yet.
            if ts.state == RELEASED and ts.error is None and not recovering:
                self._recompute(ts)
            self._report_to_client(ts, client)
        self._schedule()
        # New tasks that wait only for work on one worker go ahead to it (a chain submitted link by link).
        running_deps = {d for ts in created if ts.state == WAITING for d in ts.deps if d.state == PROCESSING}
        for dts in sorted(running_deps, key=lambda t: t.priority):
            if dts.state == PROCESSING:
                self._send_successors(dts, dts.processing_on)

    def _report_to_client(self, ts: TaskState, client: str | None) -> None:
        stream = self.clients.get(client) if client else None
        if stream is None:
            return
        if ts.state == MEMORY:
            stream.send({"op": "key-in-memory", "key": ts.key, "who_has": [w.address for w in ts.who_has]})
        elif ts.state == ERRED:
            stream.send({"op": "task-erred", "key": ts.key, "error": ts.error})

    def _recompute(self, ts: TaskState) -> None:
        """Bring ``ts`` back to life from its lineage: recompute released dependencies first."""
        if ts.state in ACTIVE or ts.state == MEMORY or ts.state == ERRED:
            return
        if ts.run_spec is None:
            self._set_erred(ts, self._lost_error(ts.key, None))
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
    def _window(self, ts: TaskState) -> int:
        """Tasks a worker may hold beyond its threads when ``ts`` is next: ``worker_window``, widened for
        tasks known to be short so that a worker's threads never wait on a scheduler round trip, but never
        more than about ``worker_window_seconds`` of estimated work (so placement stays balanced without
        work stealing), and at most ``worker_window_max``."""
        base, seconds, most = self._window_settings
        estimate = self.durations.get(key_prefix(ts.key))
        if estimate is None:
            return base
        return max(base, min(most, int(seconds / max(estimate, 1e-6))))

    def _capacity(self, ws: WorkerState, window: int) -> int:
        return ws.nthreads + window - len(ws.processing)

    def _learn_duration(self, key: str, seconds: float) -> None:
        prefix = key_prefix(key)
        old = self.durations.get(prefix)
        # Weighted towards the newest: a function whose tasks turn long narrows the window quickly.
        self.durations[prefix] = seconds if old is None else 0.5 * old + 0.5 * seconds

    def _schedule(self) -> None:
        if self.recovery is not None and self.recovery.open:
            return  # workers are still reporting what they hold: placing work now could redo theirs
        running = [ws for ws in self.workers.values() if ws.status == "running"]
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
            window = self._window(ts)
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
        ws.stream.send(msg)
        self._send_successors(ts, ws)

    def _send_successors(self, ts: TaskState, ws: WorkerState) -> None:
        """Send ahead, to the worker computing ``ts``, the tasks downstream of it that can only wait for work
        on that worker: each of their dependencies is held there or being computed there. The worker runs
        them as soon as their dependencies finish, without a round trip through the scheduler per task (a
        chain's link cost two network hops and a placement each). Bounded by the worker's window, like any
        task it holds; one waiting on a task computed elsewhere, or restricted, waits here as before. A task
        sent ahead is not *executing* until the worker says it started, so a death meanwhile blames only the
        task that was running."""
        if self.recovery is not None and self.recovery.open or ws.status != "running":
            return
        stack = [ts]
        while stack:
            for dep in sorted(stack.pop().dependents, key=lambda d: d.priority):
                if dep.state == PROCESSING and dep.processing_on is ws:
                    stack.append(dep)          # sent ahead already: look further down
                    continue
                if dep.state != WAITING or dep.run_spec is None or dep.restrictions:
                    continue
                if self._capacity(ws, self._window(dep)) <= 0:
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
    def _processing_task(self, stream: Stream, key: str) -> tuple[WorkerState | None, TaskState | None]:
        ws = self._worker_of(stream)
        ts = self.tasks.get(key)
        if ws is None or ts is None or ts.processing_on is not ws:
            return ws, None
        return ws, ts

    def handle_started(self, stream: Stream, msg: dict) -> None:
        ws, ts = self._processing_task(stream, msg["key"])
        if ts is not None:
            ts.executing = True
            ws.executing.add(ts)

    def _done_processing(self, ts: TaskState) -> None:
        ws = ts.processing_on
        if ws is not None:
            ws.processing.discard(ts)
            ws.executing.discard(ts)
        ts.processing_on = None
        ts.executing = False

    def handle_finished(self, stream: Stream, msg: dict) -> None:
        ws, ts = self._processing_task(stream, msg["key"])
        if ts is None:
            if ws is not None and msg["key"] not in {t.key for t in ws.has_what}:
                ws.stream.send({"op": "free-keys", "keys": [msg["key"]]})
            return
        self._done_processing(ts)
        self.counters["finished"] += 1
        if self.first_finished_after is None:
            self.first_finished_after = round(time.monotonic() - self._started_mono, 3)
        if msg.get("duration") is not None:
            self._learn_duration(ts.key, float(msg["duration"]))
        self._accept_result(ts, ws, int(msg.get("nbytes") or 0), msg.get("value"))
        for dts in ts.deps:
            self._release_if_unneeded(dts)
        self._release_if_unneeded(ts)
        if ts.state == MEMORY:
            self._send_successors(ts, ws)   # room freed on ws: more of what waits on its work can go ahead
        self._schedule()

    def _accept_result(self, ts: TaskState, ws: WorkerState, nbytes: int, value: bytes | None = None) -> None:
        """``ts``'s result is on ``ws``: tell the clients that want it, and wake the tasks that waited on it.
        A small result's pickle (``value``, from the worker) goes to those clients with the news; the scheduler
        keeps no copy."""
        ts.state = MEMORY
        ts.nbytes = nbytes
        ts.waiting_on = set()
        self._add_holder(ts, ws)
        for client in ts.wanted_by:
            stream_c = self.clients.get(client)
            if stream_c is not None:
                news = {"op": "key-in-memory", "key": ts.key, "who_has": [ws.address]}
                if isinstance(value, bytes):
                    news["value"] = value
                stream_c.send(news)
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

    def handle_erred(self, stream: Stream, msg: dict) -> None:
        ws, ts = self._processing_task(stream, msg["key"])
        if ts is None:
            return
        self._done_processing(ts)
        error = {"type": "exception", "key": ts.key, "exception": msg.get("exception"),
                 "exc_type": msg.get("exc_type"), "message": msg.get("message"), "traceback": msg.get("traceback")}
        self.rec.event("task-erred", f"Task {ts.key!r} erred on {ws.address}: {msg.get('exc_type')}: "
                       f"{msg.get('message')}", level="info", key=ts.key, exception=msg.get("exc_type"),
                       error=msg.get("message"), traceback=msg.get("traceback"), worker=ws.name)
        self._set_erred(ts, error)
        self._schedule()

    def _set_erred(self, ts: TaskState, error: dict) -> None:
        """Mark ``ts`` and everything downstream of it erred with the same error."""
        stack = [ts]
        while stack:
            t = stack.pop()
            if t.state == ERRED:
                continue
            if t.processing_on is not None:
                t.processing_on.stream.send({"op": "free-keys", "keys": [t.key]})
                self._done_processing(t)
            t.state = ERRED
            t.error = error
            self._j(["err", t.key, error])
            self.counters["erred"] += 1
            t.waiting_on = set()
            for client in t.wanted_by:
                stream = self.clients.get(client)
                if stream is not None:
                    stream.send({"op": "task-erred", "key": t.key, "error": error})
            stack.extend(d for d in t.dependents if d.state != MEMORY)

    def handle_missing_deps(self, stream: Stream, msg: dict) -> None:
        ws, ts = self._processing_task(stream, msg["key"])
        if ts is None:
            return
        self._done_processing(ts)
        ts.missing_retries += 1
        for key in msg.get("missing") or ():
            dts = self.tasks.get(key)
            if dts is None:
                continue
            if ts.missing_retries > 3:  # the holders keep failing to deliver: treat the copies as lost
                for holder in list(dts.who_has):
                    self._drop_holder(dts, holder)
            if dts.state == MEMORY and not dts.who_has:
                dts.state = RELEASED
        ts.state = RELEASED
        self._recompute(ts)
        self._schedule()

    def handle_add_keys(self, stream: Stream, msg: dict) -> None:
        ws = self._worker_of(stream)
        if ws is None:
            return
        for key in msg["keys"]:
            ts = self.tasks.get(key)
            if ts is not None and ts.state == MEMORY:
                self._add_holder(ts, ws)
            else:
                ws.stream.send({"op": "free-keys", "keys": [key]})

    # ---------------------------------------------------------------- release and forget
    def _needed(self, ts: TaskState) -> bool:
        return bool(ts.wanted_by) or any(d.state in ACTIVE for d in ts.dependents)

    def _release_if_unneeded(self, ts: TaskState) -> None:
        if self._needed(ts) or ts.state == PROCESSING:
            return
        if ts.state == MEMORY:
            for ws in list(ts.who_has):
                self._drop_holder(ts, ws)
                ws.stream.send({"op": "free-keys", "keys": [ts.key]})
            ts.state = RELEASED
        elif ts.state in (WAITING, READY):
            ts.state = RELEASED
        self._maybe_forget(ts)

    def _maybe_forget(self, ts: TaskState) -> None:
        stack = [ts]
        while stack:
            t = stack.pop()
            if t.wanted_by or t.dependents or t.state not in (RELEASED, ERRED) or self.tasks.get(t.key) is not t:
                continue
            del self.tasks[t.key]
            self._j(["forget", [t.key]])
            for dts in t.deps:
                dts.dependents.discard(t)
                if not dts.wanted_by and dts.state == MEMORY and not any(d.state in ACTIVE for d in dts.dependents):
                    self._release_if_unneeded(dts)
                stack.append(dts)

    def handle_release_keys(self, stream: Stream, msg: dict) -> None:
        client = stream.info.get("client")
        self._j(["unwant", client, [k for k in msg["keys"] if k in self.tasks]])
        for key in msg["keys"]:
            ts = self.tasks.get(key)
            if ts is None:
                continue
            ts.wanted_by.discard(client)
            if not ts.wanted_by:
                self._release_if_unneeded(ts)
                self._maybe_forget(ts)

    def _release_client(self, client: str) -> None:
        self._j(["unwant", client, [k for k, ts in self.tasks.items() if client in ts.wanted_by]],
                ["client", client, False])
        for ts in list(self.tasks.values()):
            if client in ts.wanted_by:
                ts.wanted_by.discard(client)
                if not ts.wanted_by:
                    self._release_if_unneeded(ts)
                    self._maybe_forget(ts)

    # ---------------------------------------------------------------- departures
    def _lost_error(self, key: str, worker: str | None) -> dict:
        return {"type": "scattered-lost", "key": key, "worker": worker,
                "message": f"scattered data {key!r} was lost with worker {worker}: it is not in the lineage and "
                           f"cannot be recomputed (use client.replicate to keep copies)"}

    def _remove_worker(self, ws: WorkerState, *, how: str, expected: bool, quiet: bool = False,
                       noticed_after: float | None = None) -> None:
        """Forget a worker and what it held: reroute its tasks, count a death against the tasks it was running
        (KilledWorker past allowed-failures), lose keys held only there, record one ``worker-removed`` event.
        Over 60 lines on purpose: one step of the event loop with no await, so no other handler sees the
        cluster half-updated; split, each piece would need the others' partial results passed along."""
        if self.workers.get(ws.address) is not ws:
            return
        del self.workers[ws.address]
        ws.status = "closed"
        self._j(["worker", ws.name, ws.address, False])   # replay drops everything it held
        if noticed_after is None:
            noticed_after = time.monotonic() - ws.last_seen
        blamed, rerouted, lost, lost_scattered, killed = [], [], [], [], []
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
                stream = self.clients.get(client)
                if stream is not None:
                    stream.send({"op": "key-lost", "key": ts.key})
        ws.has_what.clear()
        message = (f"Remove worker addr: {ws.address} name: {ws.name} (how={how}, noticed after "
                   f"{noticed_after:.3f}s; rerouted {len(rerouted)}, blamed {len(blamed)}, lost {len(lost)})")
        if not quiet or rerouted or lost:
            self.rec.event("worker-removed", message, level="info" if expected else "warning", worker=ws.name,
                           address=ws.address, name=ws.name, how=how, expected=expected,
                           noticed_after=round(noticed_after, 6), rerouted=rerouted, blamed=blamed, lost=lost,
                           lost_scattered=lost_scattered, incarnation=ws.incarnation)
        for ts in killed:
            error = {"type": "killed-worker", "key": ts.key, "last_worker": ws.address,
                     "allowed_failures": self.allowed_failures, "workers": list(ts.death_workers),
                     "log_dir": self.log_dir,
                     "message": f"Attempted to run task {ts.key!r} on {ts.suspicious} different workers, but all "
                                f"those workers died while running it. The last worker that attempted to run the "
                                f"task was {ws.address}."}
            self.rec.event("killed-worker", f"Task {ts.key!r} marked as failed because {ts.suspicious} workers died "
                           f"while trying to run it", level="error", key=ts.key, deaths=ts.suspicious,
                           allowed_failures=self.allowed_failures, workers=list(ts.death_workers),
                           last_worker=ws.address)
            self._set_erred(ts, error)
        for key in lost_scattered:
            ts = self.tasks.get(key)
            if ts is not None:
                self.rec.event("scattered-lost", f"Removing worker {ws.address!r} caused the cluster to lose "
                               f"scattered data, which can't be recovered: {key!r}", level="error", key=key,
                               worker=ws.name)
                self._set_erred(ts, self._lost_error(key, ws.address))
        # Everything that was waiting on, processing with, or wanting a key that is gone: back to its lineage.
        for key in (*rerouted, *lost):
            ts = self.tasks.get(key)
            if ts is not None and ts.state == RELEASED and self._needed(ts):
                self._recompute(ts)
        for ts in list(self.tasks.values()):
            if ts.state in (WAITING, READY):
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
        ws.stream.info.pop("worker", None)
        ws.stream.close()
        if not self.workers:
            logger.info("Lost all workers")
        self._schedule()

    def handle_unregister(self, stream: Stream, msg: dict) -> dict:
        ws = self._worker_of(stream)
        if ws is not None:
            self._remove_worker(ws, how="deregistered", expected=True)
        return {"status": "ok"}

    async def _check_ttl_forever(self) -> None:
        interval = min(float(self.config["heartbeat_interval"]), self.worker_ttl / 4)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for ws in list(self.workers.values()):
                silent = now - ws.last_seen
                if silent > self.worker_ttl:
                    self.rec.event("heartbeat-missed", f"Worker failed to heartbeat for {silent:.1f}s; "
                                   f"{'attempting restart' if ws.nanny else 'removing'}: {ws.address}",
                                   level="warning", worker=ws.name, address=ws.address, silent_for=round(silent, 3),
                                   worker_ttl=self.worker_ttl)
                    self._remove_worker(ws, how="heartbeat-timeout", expected=False, noticed_after=silent)
                    if ws.nanny:
                        background(self._nanny_request(ws.nanny, "kill", reason="heartbeat-timeout"))

    async def _nanny_request(self, nanny: str, op: str, timeout: float = 30.0, **fields: Any) -> Any:
        try:
            comm = await connect(nanny, self.credentials, timeout=self.config["connect_timeout"])
        except CommClosedError as exc:
            logger.warning("Could not reach nanny %s: %s", nanny, exc)
            return None
        stream = Stream(comm, {})
        reader = background(stream.run())
        try:
            return await stream.request(op, timeout=timeout, **fields)
        except Exception as exc:
            logger.warning("Nanny %s did not complete %r: %s", nanny, op, exc)
            return None
        finally:
            stream.close()
            reader.cancel()

    # ---------------------------------------------------------------- data placement
    async def _wait_for_workers(self, n: int = 1, timeout: float | None = None) -> list[WorkerState]:
        deadline = time.monotonic() + (timeout if timeout is not None else self.config["connect_timeout"])
        while True:
            running = [ws for ws in self.workers.values() if ws.status == "running"]
            if len(running) >= n or time.monotonic() > deadline:
                return running
            await asyncio.sleep(0.05)

    async def handle_scatter(self, stream: Stream, msg: dict) -> dict:
        client = stream.info.get("client")
        data: dict[str, bytes] = msg["data"]
        running = await self._wait_for_workers()
        if msg.get("workers"):
            wanted = set(msg["workers"])
            running = [ws for ws in running if ws.address in wanted or ws.name in wanted]
        if not running:
            raise RuntimeError("no workers to scatter to")
        placement: dict[WorkerState, dict[str, bytes]] = {}
        ordered = sorted(running, key=lambda w: len(w.has_what))
        for i, (key, blob) in enumerate(data.items()):
            targets = running if msg.get("broadcast") else [ordered[i % len(ordered)]]
            for ws in targets:
                placement.setdefault(ws, {})[key] = blob
        results = await asyncio.gather(*(ws.stream.request("put-data", data=part) for ws, part in placement.items()),
                                       return_exceptions=True)
        who_has: dict[str, list[str]] = {}
        for (ws, part), result in zip(placement.items(), results):
            if isinstance(result, Exception) or self.workers.get(ws.address) is not ws:
                continue
            for key in part:
                ts = self.tasks.get(key)
                if ts is None:
                    ts = self.tasks[key] = TaskState(key, None, (0, next(self._priority)))
                    self._j(_task_record(ts, ()))
                ts.state = MEMORY
                ts.scattered = ts.run_spec is None
                ts.nbytes = len(part[key])
                self._add_holder(ts, ws)
                if client not in ts.wanted_by:
                    self._j(["want", client, [key]])
                    ts.wanted_by.add(client)
                who_has.setdefault(key, []).append(ws.address)
        missing = [k for k in data if k not in who_has]
        if missing:
            raise RuntimeError(f"could not place scattered keys {missing} (their workers left)")
        return who_has

    async def _copy_keys(self, keys: list[TaskState], target: WorkerState) -> list[str]:
        wanted = {ts.key: [w.address for w in ts.who_has] for ts in keys if ts.who_has}
        if not wanted:
            return []
        got = await target.stream.request("fetch-keys", keys=wanted, timeout=60)
        for key in got:
            ts = self.tasks.get(key)
            if ts is not None and ts.state == MEMORY and self.workers.get(target.address) is target:
                self._add_holder(ts, target)
        return got

    async def handle_replicate(self, stream: Stream, msg: dict) -> dict:
        n = msg.get("n")
        running = [ws for ws in self.workers.values() if ws.status == "running"]
        n = len(running) if not n else min(int(n), len(running))
        plan: dict[WorkerState, list[TaskState]] = {}
        for key in msg["keys"]:
            ts = self.tasks.get(key)
            if ts is None or ts.state != MEMORY:
                raise KeyError(f"{key!r} is not in memory")
            others = sorted((w for w in running if w not in ts.who_has), key=lambda w: len(w.has_what))
            for ws in others[: max(0, n - len(ts.who_has))]:
                plan.setdefault(ws, []).append(ts)
        await asyncio.gather(*(self._copy_keys(tss, ws) for ws, tss in plan.items()), return_exceptions=True)
        return {key: [w.address for w in self.tasks[key].who_has] for key in msg["keys"] if key in self.tasks}

    def handle_who_has(self, stream: Stream, msg: dict) -> dict:
        keys = msg.get("keys")
        if keys is None:
            keys = [k for k, ts in self.tasks.items() if ts.state == MEMORY]
        return {k: [w.address for w in self.tasks[k].who_has] if k in self.tasks else [] for k in keys}

    # ---------------------------------------------------------------- cluster operations
    async def handle_run(self, stream: Stream, msg: dict) -> dict:
        targets = [ws for ws in self.workers.values()
                   if not msg.get("workers") or ws.address in msg["workers"] or ws.name in msg["workers"]]

        async def one(ws: WorkerState) -> dict:
            try:
                return await ws.stream.request("run", spec=msg["spec"], timeout=msg.get("timeout"))
            except Exception as exc:
                return {"status": "comm-error", "message": f"{type(exc).__name__}: {exc}"}

        results = await asyncio.gather(*(one(ws) for ws in targets))
        return {ws.address: r for ws, r in zip(targets, results)}

    def handle_scheduler_info(self, stream: Stream, msg: dict) -> dict:
        now = time.monotonic()
        counts: dict[str, int] = {}
        for ts in self.tasks.values():
            counts[ts.state] = counts.get(ts.state, 0) + 1
        return {
            "type": "Scheduler",
            "address": self.address,
            "allowed_failures": self.allowed_failures,
            "worker_ttl": self.worker_ttl,
            "tasks": counts,
            "counters": dict(self.counters),
            "started": self.started_at,
            "first_finished_after": self.first_finished_after,
            "recovery": self.recovery.summary() if self.recovery is not None else None,
            "workers": {ws.address: {"name": ws.name, "nthreads": ws.nthreads, "memory_limit": ws.memory_limit,
                                     "memory": ws.memory,
                                     "nanny": ws.nanny, "pid": ws.pid, "incarnation": ws.incarnation,
                                     "processing": len(ws.processing), "executing": sorted(t.key for t in ws.executing),
                                     "keys": len(ws.has_what), "last_seen": round(now - ws.last_seen, 3),
                                     "status": ws.status}
                        for ws in self.workers.values()},
        }

    def _match_workers(self, names: list[str]) -> list[WorkerState]:
        wanted = set(map(str, names))
        return [ws for ws in self.workers.values() if ws.address in wanted or ws.name in wanted]

    async def _retire(self, ws: WorkerState, reason: str) -> bool:
        """Move ``ws``'s unique data elsewhere, hand its tasks back, and tell it to close."""
        if ws.status != "running":
            return False
        ws.status = "retiring"
        others = [w for w in self.workers.values() if w.status == "running"]
        unique = [ts for ts in ws.has_what if ts.who_has == {ws} and self._needed(ts) or ts.scattered and ts.who_has == {ws}]
        if unique:
            if not others:
                logger.warning("Could not retire worker %r: unique data could not be moved to any other worker",
                               ws.address)
                ws.status = "running"
                return False
            target = min(others, key=lambda w: len(w.has_what))
            try:
                await self._copy_keys(unique, target)
            except Exception as exc:
                logger.warning("Could not move data off %s: %s", ws.address, exc)
        if self.workers.get(ws.address) is not ws:
            return False
        ws.stream.send({"op": "close", "reason": reason})
        await ws.stream.drain(2.0)
        self._remove_worker(ws, how="retired", expected=True)
        return True

    async def handle_retire_workers(self, stream: Stream, msg: dict) -> dict:
        targets = self._match_workers(msg.get("workers") or [])
        logger.info("Retire worker addresses %s", [ws.address for ws in targets])
        done = await asyncio.gather(*(self._retire(ws, "retired") for ws in targets))
        return {ws.address: {"name": ws.name} for ws, ok in zip(targets, done) if ok}

    async def handle_retire_me(self, stream: Stream, msg: dict) -> dict:
        ws = self._worker_of(stream)
        if ws is None:
            return {"status": "unknown"}
        reason = msg.get("reason") or "worker-close-gracefully"
        if self.closing_cluster or reason in ("cluster-close", "parent-died"):
            self._remove_worker(ws, how="scheduler-close", expected=True)  # no point moving data
            return {"status": "ok"}
        ok = await self._retire(ws, reason)
        if not ok and self.workers.get(ws.address) is ws:
            self._remove_worker(ws, how="deregistered", expected=True)
        return {"status": "ok"}

    async def handle_restart(self, stream: Stream, msg: dict) -> dict:
        timeout = float(msg.get("wait") or 60)
        olds = list(self.workers.values())
        n = len(olds)
        self.rec.event("restart", f"Restarting all workers and releasing all keys ({n} workers)", level="info",
                       workers=[ws.name for ws in olds])
        # Flush the task state first: every client future is cancelled, as Dask's restart does.
        for client, cstream in self.clients.items():
            keys = [k for k, ts in self.tasks.items() if client in ts.wanted_by]
            if keys:
                cstream.send({"op": "cancelled", "keys": keys, "reason": "restart"})
        self.tasks.clear()
        self._j(["flush"])
        self.ready.clear()
        no_nanny = [ws for ws in olds if not ws.nanny]
        if no_nanny:
            logger.warning("Workers %s do not use a nanny and will be terminated without restarting them",
                           [ws.address for ws in no_nanny])
        for ws in olds:
            ws.processing.clear()
            ws.executing.clear()
            ws.has_what.clear()
            self._remove_worker(ws, how="restart", expected=True)
        for ws in no_nanny:
            ws.stream.send({"op": "close", "reason": "restart"})
        await asyncio.gather(*(self._nanny_request(ws.nanny, "restart", reason="restart", timeout=timeout)
                               for ws in olds if ws.nanny))
        expected = n - len(no_nanny)
        running = await self._wait_for_workers(expected, timeout)
        if len(running) < expected:
            raise TimeoutError(f"only {len(running)} of {expected} workers came back within {timeout:g}s")
        return {"status": "ok", "workers": len(running)}

    def handle_get_versions(self, stream: Stream, msg: dict) -> dict:
        return {"scheduler": self.versions, "workers": {ws.address: ws.versions for ws in self.workers.values()},
                "compared": self.compared}

    def handle_get_task_spec(self, stream: Stream, msg: dict) -> dict:
        ts = self.tasks.get(msg["key"])
        if ts is None:
            raise KeyError(f"unknown task {msg['key']!r}")
        if ts.error and ts.error.get("key") in self.tasks:
            ts = self.tasks[ts.error["key"]]
        return {"key": ts.key, "spec": ts.run_spec, "state": ts.state,
                "deps": {d.key: [w.address for w in d.who_has] for d in ts.deps},
                "missing": [d.key for d in ts.deps if d.state != MEMORY]}

    async def handle_close_cluster(self, stream: Stream, msg: dict) -> dict:
        self.closing_cluster = True
        nannies = [ws.nanny for ws in self.workers.values() if ws.nanny]
        await asyncio.gather(*(self._nanny_request(n, "close", reason="cluster-close", timeout=10) for n in nannies))
        asyncio.get_running_loop().call_later(0.05, lambda: background(self.close("cluster-close")))
        return {"status": "ok"}


def _task_record(ts: TaskState, deps: Any) -> list:
    return ["task", ts.key, ts.run_spec, list(deps or ()), -ts.priority[0],
            sorted(ts.restrictions) if ts.restrictions else None, ts.loose]


def _listen_error(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is already in use (another scheduler?): stop it, or choose another port "
                "with --port (0: any free port)")
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


async def run_scheduler(*, secret: bytes, config: dict, log_dir: str | None, host: str, port: int,
                        scheduler_file: str | None, watch_parent: int | None = None,
                        security: Security | None = None) -> None:
    scheduler = Scheduler(secret=secret, config=config, log_dir=log_dir, host=host, port=port,
                          scheduler_file=scheduler_file, security=security)
    await scheduler.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda s=sig: background(
            scheduler.close(f"signal-{int(s)}")))
    if watch_parent:
        async def watch() -> None:
            while os.getppid() == watch_parent:
                await asyncio.sleep(0.5)
            await scheduler.close("parent-died")
        background(watch())
    await scheduler.finished()
