"""The scheduler process: a thin shell around ``runtime.scheduler_state``'s pure state machine.

Covers: connections (workers, clients, nannies) and the ``{op: handler}`` table that turns each message
into a stimulus of the ``SchedulerState``; applying what a stimulus returns (journal records appended
first, then events recorded, then messages sent); clocks and timers (heartbeats' time-to-live, a
disconnected client's grace period, the journal's upkeep); versions; and the operations that wait on
other processes: scatter, replicate, retire, restart, run, closing the cluster.

Does not cover: task or worker state and its transitions (``runtime.scheduler_state``), unpickling
anything (task payloads, results and exceptions pass through as opaque bytes), running tasks
(``runtime.worker``), supervising processes (``runtime.nanny``), or recovering from a predecessor's
journal (``runtime.recovery``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import time
from typing import Any

from kwdiag.runtime import recovery
from kwdiag.runtime import versions as versions_mod
from kwdiag.runtime.comm import CommClosedError, Credentials, Listener, Security, connect
from kwdiag.runtime.core import Stream, at_turn_end, background
from kwdiag.runtime.identity import StartupError, write_scheduler_file
from kwdiag.runtime.journal import Journal
from kwdiag.runtime.record import Recorder
from kwdiag.runtime.scheduler_state import (CLIENT, MEMORY, Outbox, SchedulerState, TaskState, WorkerState,
                                            WorkerStatus, key_prefix)

logger = logging.getLogger("kwdiag.scheduler")

__all__ = ["Scheduler", "run_scheduler", "TaskState", "WorkerState", "key_prefix"]


class Scheduler:
    def __init__(self, *, secret: bytes, config: dict, log_dir: str | None, host: str = "127.0.0.1", port: int = 0,
                 scheduler_file: str | None = None, security: Security | None = None):
        """The scheduler's shell, empty until ``start()``: the state machine, the connections, the timers, the
        journal if asked for, and the table of message handlers. Over 60 lines on purpose: one attribute per
        line (with what it holds) and one handler per line; no I/O here."""
        self.secret = secret
        self.credentials = Credentials(secret, security)
        self.config = config
        self.host, self.port = host, port
        self.scheduler_file = scheduler_file
        self.allowed_failures = int(config["allowed_failures"])
        self.worker_ttl = float(config["worker_ttl"])
        self.rec = Recorder("kwdiag.scheduler", source="scheduler", log_dir=log_dir, file_stem="scheduler")
        self.state = SchedulerState(allowed_failures=self.allowed_failures, log_dir=log_dir,
                                    window=(int(config["worker_window"]), float(config["worker_window_seconds"]),
                                            int(config["worker_window_max"])))
        self.streams: dict[str, Stream] = {}   # worker address -> its connection
        self.last_seen: dict[str, float] = {}  # worker address -> monotonic time of its last message
        self.clients: dict[str, Stream] = {}   # connected clients
        self.versions = versions_mod.collect(config["versions_packages"])
        self.compared = ["python", *versions_mod.CORE_PACKAGES, *config["versions_packages"]]
        self.address = ""
        self._listener: Listener | None = None
        self._ttl_task: asyncio.Task | None = None
        self._closed = asyncio.Event()
        self._closing = False  # close() has begun: a connection dropping now is part of the close
        self.closing_cluster = False
        self.log_dir = log_dir
        self.journal: Journal | None = None
        if log_dir and config["journal"]:
            self.journal = Journal(log_dir, self._journal_failed, defer=at_turn_end)
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
            "seceded": self.handle_seceded,
            "finished": self.handle_finished,
            "erred": self.handle_erred,
            "missing-deps": self.handle_missing_deps,
            "add-keys": self.handle_add_keys,
            "unregister": self.handle_unregister,
            "retire-me": self.handle_retire_me,
            "update-graph": self.handle_update_graph,
            "release-keys": self.handle_release_keys,
            "cancel": self.handle_cancel,
            "retry": self.handle_retry,
            "fire-and-forget": self.handle_fire_and_forget,
            "scatter": self.handle_scatter,
            "replicate": self.handle_replicate,
            "who-has": self.handle_who_has,
            "has-what": self.handle_has_what,
            "run": self.handle_run,
            "scheduler-info": self.handle_scheduler_info,
            "retire-workers": self.handle_retire_workers,
            "restart": self.handle_restart,
            "get-versions": self.handle_get_versions,
            "get-task-spec": self.handle_get_task_spec,
            "close-cluster": self.handle_close_cluster,
            "ping": self.handle_ping,
        }

    # ---------------------------------------------------------------- the state machine's edge
    @property
    def tasks(self) -> dict[str, TaskState]:
        return self.state.tasks

    @property
    def workers(self) -> dict[str, WorkerState]:
        return self.state.workers

    @property
    def counters(self) -> dict[str, int]:
        return self.state.counters

    def apply(self, out: Outbox) -> None:
        """Do what a stimulus asked: journal first (before anyone is told what the records say), then the
        events, then the messages, each connection's in order."""
        if out.journal and self.journal is not None:
            self.journal.append(*out.journal)
        for kind, message, fields in out.events:
            self.rec.event(kind, message, **fields)
        for recipient, ident, message in out.messages:
            stream = self.clients.get(ident) if recipient == CLIENT else self.streams.get(ident)
            if stream is not None:   # a client away (within its grace) or a worker gone: nothing to tell
                stream.send(message)

    def _remove_worker(self, address: str, *, how: str, expected: bool, quiet: bool = False,
                       noticed_after: float | None = None) -> None:
        """The worker at ``address`` is gone: the state machine reroutes, blames and recomputes; its connection
        is closed."""
        if address not in self.state.workers:
            return
        if noticed_after is None:
            noticed_after = time.monotonic() - self.last_seen.get(address, time.monotonic())
        self.apply(self.state.remove_worker(address, how=how, expected=expected, quiet=quiet,
                                            noticed_after=noticed_after))
        self.last_seen.pop(address, None)
        stream = self.streams.pop(address, None)
        if stream is not None:
            stream.info.pop("worker", None)
            stream.close()
        if not self.state.workers:
            logger.info("Lost all workers")

    def _schedule(self) -> None:
        self.apply(self.state.schedule())

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
    def _journal_failed(self, reason: str) -> None:
        self.rec.event("journal-error", f"Could not write the journal {self.journal.path}: {reason}; the scheduler "
                       "goes on, and will write a complete journal as soon as it can (until then a restart would "
                       "lose the work since)", level="error", path=self.journal.path, reason=reason)

    async def _journal_upkeep_forever(self) -> None:
        """Compact a journal that grew well past its state; rewrite one that failed or was deleted."""
        while True:
            await asyncio.sleep(1.0)
            journal = self.journal
            live = 3 * len(self.state.tasks) + len(self.state.workers) + len(self.clients)  # ~ task, want, has
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
        if self.journal is not None:
            self.journal.append(["close", reason])  # a clean end: the next scheduler here starts afresh
        for address in list(self.state.workers):
            stream = self.streams.get(address)
            if stream is not None:
                stream.send({"op": "close", "reason": "scheduler-close"})
                await stream.drain(1.0)
            self._remove_worker(address, how="scheduler-close", expected=True, quiet=True)
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
        address = stream.info.get("worker")
        if address is not None and self.streams.get(address) is stream:
            if self._closing:  # the worker heard the close (or its nanny did) before its turn in the loop above
                self._remove_worker(address, how="scheduler-close", expected=True, quiet=True)
            elif stream.info.get("told_to_close"):
                # a retired worker that closed its connection while the scheduler was still draining the close
                # it sent (a fast worker, a loaded machine): the end it was asked for, not a lost connection
                self._remove_worker(address, how=stream.info["told_to_close"], expected=True)
            else:
                self._remove_worker(address, how="connection-closed", expected=False)
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

    def _release_client(self, client: str) -> None:
        self.apply(self.state.remove_client(client))

    def handle_ping(self, stream: Stream, msg: dict) -> dict:
        """Answered in order: a client learns that everything it sent before was taken (and journalled)."""
        return {}

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
        # An older incarnation at this address or under this name is gone: its connection goes with it.
        for old in [a for a, ws in self.state.workers.items() if a == address or ws.name == name]:
            self._remove_worker(old, how="connection-closed", expected=False)
        self.streams[address] = stream
        self.last_seen[address] = time.monotonic()
        stream.info["worker"] = address
        self.apply(self.state.add_worker(
            address, name, nthreads=int(msg.get("nthreads") or 1), memory_limit=msg.get("memory_limit"),
            memory=msg.get("memory"), nanny=msg.get("nanny"), pid=msg.get("pid"),
            incarnation=int(msg.get("incarnation") or 0), versions=peer_versions, held=msg.get("data") or {},
            executing=msg.get("executing") or [], queued=msg.get("queued") or []))
        if self.recovery is not None:
            self.recovery.worker_back(name, msg.get("lost_at"))
        asyncio.get_running_loop().call_soon(self._schedule)   # after the worker has its reply
        return {"status": "ok", "warning": warning, "heartbeat_interval": self.config["heartbeat_interval"]}

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
        self.apply(self.state.add_client(client_id))
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

    def _worker_of(self, stream: Stream) -> str | None:
        """The address of the live worker on ``stream`` (it was just heard from), or None."""
        address = stream.info.get("worker")
        if address is None or self.streams.get(address) is not stream:
            return None
        self.last_seen[address] = time.monotonic()
        return address

    def handle_heartbeat(self, stream: Stream, msg: dict) -> dict:
        if stream.info.get("restarting"):
            return {"status": "ok"}   # a process its nanny is about to kill for a restart: not to register again
        address = self._worker_of(stream)
        if address is None or not self.state.heartbeat(address, msg.get("memory")):
            return {"status": "missing"}
        return {"status": "ok"}

    # ---------------------------------------------------------------- clients' stimuli
    def handle_update_graph(self, stream: Stream, msg: dict) -> None:
        self.apply(self.state.update_graph(stream.info.get("client"), msg["tasks"]))

    def handle_release_keys(self, stream: Stream, msg: dict) -> None:
        self.apply(self.state.release_keys(stream.info.get("client"), msg["keys"]))

    def handle_cancel(self, stream: Stream, msg: dict) -> dict:
        self.apply(self.state.cancel(stream.info.get("client"), msg["keys"], force=bool(msg.get("force")),
                                     reason=str(msg.get("reason") or "cancelled")))
        return {"status": "ok"}

    def handle_retry(self, stream: Stream, msg: dict) -> list[str]:
        out, keys = self.state.retry(stream.info.get("client"), msg["keys"])
        self.apply(out)
        return keys

    def handle_fire_and_forget(self, stream: Stream, msg: dict) -> None:
        self.apply(self.state.fire_and_forget(msg["keys"]))

    # ---------------------------------------------------------------- workers' stimuli
    def handle_seceded(self, stream: Stream, msg: dict) -> None:
        address = self._worker_of(stream)
        if address is not None:
            self.apply(self.state.task_seceded(address, msg["key"]))

    def handle_started(self, stream: Stream, msg: dict) -> None:
        address = self._worker_of(stream)
        if address is not None:
            self.apply(self.state.task_started(address, msg["key"]))

    def handle_finished(self, stream: Stream, msg: dict) -> None:
        address = self._worker_of(stream)
        if address is None:
            return
        before = self.state.counters["finished"]
        self.apply(self.state.task_finished(address, msg["key"], int(msg.get("nbytes") or 0), msg.get("duration"),
                                            msg.get("value")))
        if self.first_finished_after is None and self.state.counters["finished"] > before:
            self.first_finished_after = round(time.monotonic() - self._started_mono, 3)

    def handle_erred(self, stream: Stream, msg: dict) -> None:
        address = self._worker_of(stream)
        if address is not None:
            self.apply(self.state.task_erred(address, msg["key"], exception=msg.get("exception"),
                                             exc_type=msg.get("exc_type"), message=msg.get("message"),
                                             traceback=msg.get("traceback"), frames=msg.get("frames")))

    def handle_missing_deps(self, stream: Stream, msg: dict) -> None:
        address = self._worker_of(stream)
        if address is not None:
            self.apply(self.state.missing_deps(address, msg["key"], msg.get("missing") or ()))

    def handle_add_keys(self, stream: Stream, msg: dict) -> None:
        address = self._worker_of(stream)
        if address is not None:
            self.apply(self.state.add_keys(address, msg["keys"]))

    def handle_unregister(self, stream: Stream, msg: dict) -> dict:
        address = self._worker_of(stream)
        if address is not None:
            self._remove_worker(address, how="deregistered", expected=True)
        return {"status": "ok"}

    async def _check_ttl_forever(self) -> None:
        interval = min(float(self.config["heartbeat_interval"]), self.worker_ttl / 4)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for address, ws in list(self.state.workers.items()):
                silent = now - self.last_seen.get(address, now)
                if silent > self.worker_ttl:
                    self.rec.event("heartbeat-missed", f"Worker failed to heartbeat for {silent:.1f}s; "
                                   f"{'attempting restart' if ws.nanny else 'removing'}: {address}",
                                   level="warning", worker=ws.name, address=address, silent_for=round(silent, 3),
                                   worker_ttl=self.worker_ttl)
                    self._remove_worker(address, how="heartbeat-timeout", expected=False, noticed_after=silent)
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
            running = self.state.running_workers()
            if len(running) >= n or time.monotonic() > deadline:
                return running
            await asyncio.sleep(0.05)

    async def handle_scatter(self, stream: Stream, msg: dict) -> dict:
        client = stream.info.get("client")
        data: dict[str, bytes] = msg["data"]
        running = await self._wait_for_workers()
        if msg.get("workers"):
            running = self.state.match_workers(msg["workers"])
            running = [ws for ws in running if ws.status == WorkerStatus.RUNNING]
        if not running:
            raise RuntimeError("no workers to scatter to")
        placement: dict[str, dict[str, bytes]] = {}
        ordered = sorted(running, key=lambda w: len(w.has_what))
        for i, (key, blob) in enumerate(data.items()):
            targets = running if msg.get("broadcast") else [ordered[i % len(ordered)]]
            for ws in targets:
                placement.setdefault(ws.address, {})[key] = blob
        results = await asyncio.gather(*(self.streams[a].request("put-data", data=part)
                                         for a, part in placement.items()), return_exceptions=True)
        placed: dict[str, tuple[list[str], int]] = {}
        for (address, part), result in zip(placement.items(), results):
            if isinstance(result, Exception) or address not in self.state.workers:
                continue
            for key in part:
                placed.setdefault(key, ([], len(part[key])))[0].append(address)
        self.apply(self.state.scattered(client, placed))
        missing = [k for k in data if k not in placed]
        if missing:
            raise RuntimeError(f"could not place scattered keys {missing} (their workers left)")
        return {key: addresses for key, (addresses, _) in placed.items()}

    async def _copy_keys(self, keys: list[TaskState], target: WorkerState) -> list[str]:
        wanted = {ts.key: [w.address for w in ts.who_has] for ts in keys if ts.who_has}
        stream = self.streams.get(target.address)
        if not wanted or stream is None:
            return []
        got = await stream.request("fetch-keys", keys=wanted, timeout=60)
        for key in got:
            self.apply(self.state.add_replica(key, target.address))
        return got

    async def handle_replicate(self, stream: Stream, msg: dict) -> dict:
        n = msg.get("n")
        running = self.state.running_workers()
        n = len(running) if not n else min(int(n), len(running))
        plan: dict[WorkerState, list[TaskState]] = {}
        for key in msg["keys"]:
            ts = self.state.tasks.get(key)
            if ts is None or ts.state != MEMORY:
                raise KeyError(f"{key!r} is not in memory")
            others = sorted((w for w in running if w not in ts.who_has), key=lambda w: len(w.has_what))
            for ws in others[: max(0, n - len(ts.who_has))]:
                plan.setdefault(ws, []).append(ts)
        await asyncio.gather(*(self._copy_keys(tss, ws) for ws, tss in plan.items()), return_exceptions=True)
        return self.state.who_has([k for k in msg["keys"] if k in self.state.tasks])

    def handle_who_has(self, stream: Stream, msg: dict) -> dict:
        return self.state.who_has(msg.get("keys"))

    def handle_has_what(self, stream: Stream, msg: dict) -> dict:
        return self.state.has_what(msg.get("workers"))

    # ---------------------------------------------------------------- cluster operations
    async def handle_run(self, stream: Stream, msg: dict) -> dict:
        targets = [a for a, ws in self.state.workers.items()
                   if not msg.get("workers") or a in msg["workers"] or ws.name in msg["workers"]]

        async def one(address: str) -> dict:
            try:
                return await self.streams[address].request("run", spec=msg["spec"], timeout=msg.get("timeout"))
            except Exception as exc:
                return {"status": "comm-error", "message": f"{type(exc).__name__}: {exc}"}

        results = await asyncio.gather(*(one(a) for a in targets))
        return dict(zip(targets, results))

    def handle_scheduler_info(self, stream: Stream, msg: dict) -> dict:
        now = time.monotonic()
        return {
            "type": "Scheduler",
            "address": self.address,
            "allowed_failures": self.allowed_failures,
            "worker_ttl": self.worker_ttl,
            "tasks": self.state.task_counts(),
            "counters": dict(self.state.counters),
            "started": self.started_at,
            "first_finished_after": self.first_finished_after,
            "recovery": self.recovery.summary() if self.recovery is not None else None,
            "workers": {ws.address: {"name": ws.name, "nthreads": ws.nthreads, "memory_limit": ws.memory_limit,
                                     "memory": ws.memory,
                                     "nanny": ws.nanny, "pid": ws.pid, "incarnation": ws.incarnation,
                                     "processing": len(ws.processing), "executing": sorted(t.key for t in ws.executing),
                                     "keys": len(ws.has_what),
                                     "last_seen": round(now - self.last_seen.get(ws.address, now), 3),
                                     "status": ws.status.value}
                        for ws in self.state.workers.values()},
        }

    async def _retire(self, address: str, reason: str) -> bool:
        """Move the results only ``address`` holds elsewhere, hand its tasks back, and tell it to close."""
        ws = self.state.workers.get(address)
        unique = self.state.begin_retire(address)
        if ws is None or unique is None:
            return False
        others = [w for w in self.state.running_workers() if w is not ws]
        if unique:
            if not others:
                logger.warning("Could not retire worker %r: unique data could not be moved to any other worker",
                               address)
                self.state.cancel_retire(address)
                return False
            target = min(others, key=lambda w: len(w.has_what))
            try:
                await self._copy_keys(unique, target)
            except Exception as exc:
                logger.warning("Could not move data off %s: %s", address, exc)
        if self.state.workers.get(address) is not ws:
            return False
        stream = self.streams.get(address)
        if stream is not None:
            stream.info["told_to_close"] = "retired"
            stream.send({"op": "close", "reason": reason})
            await stream.drain(2.0)
        self._remove_worker(address, how="retired", expected=True)
        return True

    async def handle_retire_workers(self, stream: Stream, msg: dict) -> dict:
        targets = self.state.match_workers(msg.get("workers") or [])
        logger.info("Retire worker addresses %s", [ws.address for ws in targets])
        done = await asyncio.gather(*(self._retire(ws.address, "retired") for ws in targets))
        return {ws.address: {"name": ws.name} for ws, ok in zip(targets, done) if ok}

    async def handle_retire_me(self, stream: Stream, msg: dict) -> dict:
        address = self._worker_of(stream)
        if address is None:
            return {"status": "unknown"}
        reason = msg.get("reason") or "worker-close-gracefully"
        if self.closing_cluster or reason in ("cluster-close", "parent-died"):
            self._remove_worker(address, how="scheduler-close", expected=True)  # no point moving data
            return {"status": "ok"}
        ok = await self._retire(address, reason)
        if not ok and self.streams.get(address) is stream:
            self._remove_worker(address, how="deregistered", expected=True)
        return {"status": "ok"}

    async def handle_restart(self, stream: Stream, msg: dict) -> dict:
        timeout = float(msg.get("wait") or 60)
        olds = list(self.state.workers.values())
        n = len(olds)
        self.rec.event("restart", f"Restarting all workers and releasing all keys ({n} workers)", level="info",
                       workers=[ws.name for ws in olds])
        no_nanny = [ws for ws in olds if not ws.nanny]
        if no_nanny:
            logger.warning("Workers %s do not use a nanny and will be terminated without restarting them",
                           [ws.address for ws in no_nanny])
        # Flush the task state first: every client future is cancelled, as Dask's restart does.
        self.apply(self.state.restart())
        kept = []
        for ws in olds:
            self.last_seen.pop(ws.address, None)
            old = self.streams.pop(ws.address, None)
            if old is not None:
                old.info.pop("worker", None)
                if not ws.nanny:   # told to close before the connection ends (a closed stream sends nothing)
                    old.send({"op": "close", "reason": "restart"})
                    await old.drain(1.0)
                    old.close()
                else:
                    # Its nanny kills it next, and its end closes the connection. Closed here, the worker would
                    # reconnect and register again before the kill (~10 ms), and be counted dead twice.
                    old.info["restarting"] = ws.address
                    kept.append(old)
        await asyncio.gather(*(self._nanny_request(ws.nanny, "restart", reason="restart", timeout=timeout)
                               for ws in olds if ws.nanny))
        for old in kept:   # a nanny that could not restart its worker: the old process is on its own now
            old.close()
        expected = n - len(no_nanny)
        running = await self._wait_for_workers(expected, timeout)
        if len(running) < expected:
            raise TimeoutError(f"only {len(running)} of {expected} workers came back within {timeout:g}s")
        return {"status": "ok", "workers": len(running)}

    def handle_get_versions(self, stream: Stream, msg: dict) -> dict:
        return {"scheduler": self.versions, "workers": {ws.address: ws.versions for ws in self.state.workers.values()},
                "compared": self.compared}

    def handle_get_task_spec(self, stream: Stream, msg: dict) -> dict:
        return self.state.task_spec(msg["key"])

    async def handle_close_cluster(self, stream: Stream, msg: dict) -> dict:
        self.closing_cluster = True
        nannies = [ws.nanny for ws in self.state.workers.values() if ws.nanny]
        await asyncio.gather(*(self._nanny_request(n, "close", reason="cluster-close", timeout=10) for n in nannies))
        asyncio.get_running_loop().call_later(0.05, lambda: background(self.close("cluster-close")))
        return {"status": "ok"}


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
