"""The scheduler plugin: the cluster's view of every worker's arrival and departure, and of KilledWorker.

Covers: registering the nanny and worker plugins with the scheduler, so that Dask installs them on every
nanny and worker (loading this one plugin records the whole cluster); ``scheduler-start`` and
``scheduler-close``; ``worker-registered`` for each worker (and for those
already there when the plugin is registered late); ``worker-removed`` with how the scheduler noticed
(its stimulus: a closed connection, the worker-ttl check, a retirement, a restart, the nanny
unregistering it), whether Dask expected it, the tasks it sent back (``rerouted``) and counted the
death against (``blamed``), lost results, and the tasks that were actually *executing* (read from
the worker plugin's file when the scheduler can see it); ``killed-worker`` with the task, its
suspicious count, the workers that died running it and the last one; ``task-erred``; Dask's own
events where the version has them (``closing-worker`` → ``worker-closing``, ``worker-ttl-timed-out``
→ ``heartbeat-missed``, ``worker-restart-memory`` → ``nanny-memory-terminate``, 2024.x and later for
the last two); the nannies' forwarded deaths (a ``worker-exit`` copy, written only when the nanny's own
file is not in this run directory); and ``cluster_info``, the live counts ``kwdiag run --dask`` shows.

Does not cover: exit codes or memory samples (the nanny plugin), what a worker process wrote before
dying (the worker plugin). Hooks are called on the scheduler's event loop: each does a few dict
operations and at most one line of I/O.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter, defaultdict
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from kwdiag.dask._common import (Recorder, key_text, last_executing, missing, process_crash_dump, process_log_tail, run_dir, sorted_keys,
                                 stem, versions)

# The stimulus that made Dask remove a worker says how it noticed (prefix of "<prefix>-<timestamp>").
HOW = (("handle-worker-cleanup", "connection-closed"), ("check-worker-ttl", "heartbeat-timeout"),
       ("retire-workers", "retired"), ("worker-close-gracefully", "retired"), ("client-restart", "restart"),
       ("nanny-close", "deregistered"))
# Dask's close reasons in kwdiag's vocabulary (docs/events.md, worker-closing); others are kept as they are.
REASONS = {"worker-lifetime-reached": "lifetime", "worker-close-gracefully": "retired",
           "scheduler-close-worker": "retired", "worker-heartbeat-missing": "heartbeat-missing",
           "scheduler-close": "scheduler-close", "nanny-close": "nanny-close", "nanny-close-gracefully": "nanny-close",
           "signal-15": "signal-15", "signal-2": "signal-2"}
REASON_PREFIXES = (("client-restart-", "restart"), ("check-worker-ttl-", "heartbeat-missing"))
_EXCEPTION_TYPE = re.compile(r"^([A-Za-z_][\w.]*)\(")


def how_noticed(stimulus_id: str | None) -> str:
    for prefix, how in HOW:
        if (stimulus_id or "").startswith(prefix):
            return how
    return re.sub(r"-[\d.]+$", "", stimulus_id or "unknown")


def closing_reason(reason: str) -> str:
    if reason in REASONS:
        return REASONS[reason]
    for prefix, mapped in REASON_PREFIXES:
        if reason.startswith(prefix):
            return mapped
    if reason.startswith("nanny-plugin-") and reason.endswith("-restart"):
        return "restart"
    return reason


class SchedulerRecorder(SchedulerPlugin):
    """Record a Dask scheduler's view of worker deaths and KilledWorker.

    ``run_dir`` is where to write (default: ``$KWDIAG_RUN_DIR``, the Dask config key
    ``kwdiag.run-dir``, or ``./kwdiag-dask``), resolved in the scheduler process.
    """

    name = "kwdiag-scheduler"
    idempotent = True

    def __init__(self, run_dir: str | None = None, distribute: bool = True):
        self.run_dir = run_dir
        self.distribute = distribute
        self.scheduler: Any = None
        self.rec: Recorder | None = None
        self.workers: dict[str, Any] = {}            # address -> WorkerState, until its removal is recorded
        self.names: dict[str, str] = {}              # address -> worker name, kept after the removal
        self.removing: dict[str, dict] = {}          # address -> Dask's remove-worker event
        self.closing: dict[str, str] = {}            # address -> the reason the worker said it is closing
        self.deaths_of: dict[str, list[str]] = defaultdict(list)  # task -> workers that died running it
        self.registrations: Counter = Counter()      # worker name -> times registered
        self.counters: Counter = Counter()           # finished, erred
        self.closing_reason: str | None = None       # set once the scheduler-close event is written

    # ------------------------------------------------------------------ lifecycle
    async def start(self, scheduler: Any = None, **kwargs: Any) -> None:
        if self.rec is not None:
            return  # started twice (preload and registration): one record
        self.scheduler = scheduler
        self.directory = run_dir(self.run_dir)
        self.rec = Recorder(self.directory, "scheduler", source="scheduler", cluster=scheduler.address)
        ttl = getattr(scheduler, "worker_ttl", None)
        self.rec.event("scheduler-start", f"  Scheduler at: {scheduler.address:>25}", address=scheduler.address,
                       allowed_failures=scheduler.allowed_failures, worker_ttl=ttl, pid=os.getpid(),
                       versions=versions())
        for address in list(scheduler.workers):  # registered late, on a running cluster
            self.add_worker(scheduler, address, existing=True)
        if self.distribute:
            await self._distribute(scheduler)

    async def _distribute(self, scheduler: Any) -> None:
        """Register the nanny and worker plugins with this scheduler: Dask installs them on every nanny and
        worker there is and every one that joins later, so loading this plugin on the scheduler alone
        (one preload, one environment variable) records the whole cluster."""
        from distributed.protocol.pickle import dumps

        from kwdiag.dask.nanny import NannyRecorder
        from kwdiag.dask.worker import WorkerRecorder

        await scheduler.register_nanny_plugin(comm=None, plugin=dumps(NannyRecorder(self.run_dir)),
                                              name=NannyRecorder.name, idempotent=True)
        await scheduler.register_worker_plugin(comm=None, plugin=dumps(WorkerRecorder(self.run_dir)),
                                               name=WorkerRecorder.name, idempotent=True)

    async def before_close(self, **kwargs: Any) -> None:
        self.cluster_closing(None)

    def cluster_closing(self, reason: str | None = "cluster-close") -> None:
        """The cluster is being shut down (``reason`` None: Dask does not tell plugins why): from now on a
        removed worker leaves with the cluster. ``kwdiag run --dask`` calls this before it closes its cluster,
        so that retirements and closed connections during the shutdown are recorded as what they are."""
        if self.rec is None or self.closing_reason is not None:
            return
        self.closing_reason = reason or "unknown"
        self.rec.event("scheduler-close", f"Closing scheduler. Reason: {reason}", reason=reason,
                       **missing(reason=reason))

    def restart(self, scheduler: Any = None, **kwargs: Any) -> None:
        names = sorted(str(ws.name) for ws in self.workers.values())
        self.rec.event("restart", f"Restarting all workers and releasing all keys ({len(names)} workers)",
                       workers=names)

    def _name(self, address: str | None) -> str | None:
        # A worker's last words (its closing event) may arrive after its removal: the name outlives it.
        return self.names.get(address, address) if address else None

    # ------------------------------------------------------------------ workers
    def add_worker(self, scheduler: Any = None, worker: str | None = None, *, existing: bool = False,
                   **kwargs: Any) -> None:
        ws = self.scheduler.workers.get(worker)
        if ws is None or self.rec is None:
            return
        self.workers[worker] = ws
        name = self.names[worker] = str(ws.name)
        self.registrations[name] += 1
        self.rec.event("worker-registered", f"Register worker addr: {worker} name: {name}", worker=name,
                       address=worker, name=name, nthreads=ws.nthreads, memory_limit=ws.memory_limit,
                       nanny=ws.nanny or None, pid=ws.pid, **({"existing": True} if existing else {}))

    def remove_worker(self, scheduler: Any = None, worker: str | None = None, *, stimulus_id: str | None = None,
                      **kwargs: Any) -> None:
        ws = self.workers.pop(worker, None)
        facts = self.removing.pop(worker, {})
        if ws is None or self.rec is None:
            return
        fields = self._removal_fields(ws, facts, stimulus_id or facts.get("stimulus_id"))
        for key in fields["blamed"]:
            self.deaths_of[key].append(str(ws.name))
        text = (f"Remove worker addr: {worker} name: {ws.name} (how: {fields['how']}, "
                f"{'expected' if fields['expected'] else 'unexpected'}"
                + (f", blamed {len(fields['blamed'])} task(s)" if fields["blamed"] else "") + ")")
        self.rec.event("worker-removed", text, level="info" if fields["expected"] else "warning",
                       worker=str(ws.name), **fields)
        for key in fields["lost_scattered"] or ():
            self.rec.event("scattered-lost", f"Removing worker {worker!r} caused the cluster to lose scattered "
                           f"data, which can't be recovered: {key}", level="error", worker=str(ws.name),
                           key=key, address=worker)
        self.closing.pop(worker, None)

    def _removal_fields(self, ws: Any, facts: dict, stimulus_id: str | None) -> dict[str, Any]:
        processing = sorted_keys(facts.get("processing-tasks") or ())
        expected = facts.get("expected")
        if expected is None and "suspicious" in facts:  # Dask 2023.x: no "expected"; see what it counted
            blamed = [k for k in processing if self._suspicious(k) > facts["suspicious"].get(k, 0)]
            expected = not blamed if processing else None
        else:
            blamed = [] if expected else processing
        killed = {k for k in blamed if self._killed(k)}
        how = how_noticed(stimulus_id)
        if how == "connection-closed" and ws.address in self.closing:
            how = "deregistered"  # it said it was closing, then its connection ended
        if self.closing_reason is not None or "clos" in str(getattr(self.scheduler, "status", "")):
            how, expected = "scheduler-close", True
        lost = facts.get("lost-computed-tasks")
        lost_scattered = facts.get("lost-scattered-tasks")
        worker_file = os.path.join(self.directory, f"worker-{stem(ws.name)}")
        running = last_executing(worker_file + ".jsonl", ws.pid)
        fields: dict[str, Any] = dict(
            address=ws.address, name=str(ws.name), how=how, expected=expected, stimulus_id=stimulus_id,
            noticed_after=round(max(0.0, time.time() - ws.last_seen), 3), rerouted=[k for k in processing
                                                                                    if k not in killed],
            blamed=blamed, lost=sorted_keys(lost) if lost is not None else None,
            lost_scattered=sorted_keys(lost_scattered) if lost_scattered is not None else None,
            running_tasks=running or [], nanny=ws.nanny or None, pid=ws.pid)
        if not ws.nanny:  # nobody else will record this process's last words (its faulthandler dump)
            fields["stderr_tail"] = process_log_tail(worker_file + ".log", ws.pid) or []
            dump = process_crash_dump(worker_file + ".log", ws.pid)
            if dump:
                fields["crash_dump"] = dump
        fields.update(missing(expected=expected, lost=lost, lost_scattered=lost_scattered, running_tasks=running))
        return fields

    def _suspicious(self, key: str) -> int:
        ts = self._task(key)
        return getattr(ts, "suspicious", 0) if ts is not None else 0

    def _killed(self, key: str) -> bool:
        ts = self._task(key)
        return ts is not None and ts.state == "erred" and ts.suspicious > self.scheduler.allowed_failures

    def _task(self, key: str) -> Any:
        tasks = self.scheduler.tasks
        if key in tasks:
            return tasks[key]
        return next((ts for k, ts in tasks.items() if key_text(k) == key), None) if len(tasks) < 100_000 else None

    # ------------------------------------------------------------------ Dask's own events
    def log_event(self, topic: str, msg: Any, **kwargs: Any) -> None:
        if self.rec is None:
            return
        if topic == "kwdiag-worker-exit" and isinstance(msg, dict):
            self._forwarded_exit(msg)
        elif topic == "worker-restart-memory" and isinstance(msg, dict):
            self._memory_restart(msg)
        elif not isinstance(msg, dict) or topic == "all":
            return
        elif msg.get("action") == "remove-worker":
            self._removing(topic, msg)
        elif msg.get("action") == "closing-worker":
            self._closing(topic, str(msg.get("reason")))
        elif msg.get("action") == "worker-ttl-timed-out":
            for address in msg.get("workers") or ():
                self._heartbeat_missed(address, msg.get("ttl"))

    def _removing(self, address: str, msg: dict) -> None:
        facts = dict(msg)
        ws = self.scheduler.workers.get(address)
        if "expected" not in msg and ws is not None:
            # Dask 2023.x logs this before it counts the death against the tasks: remember the counts.
            facts["suspicious"] = {key_text(ts.key): ts.suspicious for ts in ws.processing}
        self.removing[address] = facts

    def _closing(self, address: str, reason: str) -> None:
        self.closing[address] = reason
        self.rec.event("worker-closing", f"Worker {address} is closing. Reason: {reason}", worker=self._name(address),
                       address=address, reason=closing_reason(reason), dask_reason=reason)

    def _heartbeat_missed(self, address: str, ttl: Any) -> None:
        ws = self.workers.get(address)
        silent = round(time.time() - ws.last_seen, 3) if ws is not None else None
        self.rec.event("heartbeat-missed", f"Worker failed to heartbeat for {silent}s: {address}", level="warning",
                       worker=self._name(address), address=address, silent=silent, ttl=ttl)

    def _memory_restart(self, msg: dict) -> None:
        address = msg.get("worker")
        ws = self.workers.get(address)
        self.rec.event("nanny-memory-terminate", f"Worker {address} (pid={msg.get('pid')}) exceeded its memory "
                       "budget; its nanny is restarting it", level="warning", worker=self._name(address),
                       address=address, pid=msg.get("pid"), rss=msg.get("rss"),
                       memory_limit=getattr(ws, "memory_limit", None), terminate_fraction=None, via="dask-event",
                       missing=["terminate_fraction"])

    def _forwarded_exit(self, msg: dict) -> None:
        path = msg.get("file")
        if isinstance(path, str) and os.path.exists(path) and (
                os.path.realpath(os.path.dirname(path)) == os.path.realpath(self.directory)):
            return  # the nanny's own record is in this run directory already
        fields = {k: v for k, v in msg.items() if k not in ("worker", "ts")}
        self.rec.event("worker-exit", f"Nanny {msg.get('nanny')} reports: worker process {msg.get('pid')} ended "
                       f"(exit code {msg.get('exitcode')})", level="warning", worker=msg.get("worker"),
                       forwarded=True, **fields)

    # ------------------------------------------------------------------ tasks
    def transition(self, key: Any, start: str, finish: str, *args: Any, stimulus_id: str | None = None,
                   **kwargs: Any) -> None:
        # Called for every transition of every task: the common cases return after one comparison.
        if finish == "memory":
            if start == "processing":
                self.counters["finished"] += 1
            return
        if finish != "erred" or start != "processing" or self.rec is None:
            return
        self.counters["erred"] += 1
        if "exception_text" in kwargs:
            self._task_erred(key, kwargs)
        elif kwargs.get("cause") == key:
            self._killed_worker(key, kwargs.get("worker"))

    def _task_erred(self, key: Any, kwargs: dict) -> None:
        text = str(kwargs.get("exception_text") or "")
        match = _EXCEPTION_TYPE.match(text)
        worker = kwargs.get("worker")
        self.rec.event("task-erred", f"Task {key_text(key)!r} erred on {worker}: {text[:300]}", worker=self._name(worker),
                       key=key_text(key), exception=match.group(1) if match else text[:100], error=text[:1000],
                       traceback=str(kwargs.get("traceback_text") or "")[-4000:] or None, address=worker)

    def _killed_worker(self, key: Any, address: str | None) -> None:
        ts = self.scheduler.tasks.get(key)
        if ts is None or ts.suspicious <= self.scheduler.allowed_failures:
            return
        last = self._name(address)
        workers = self.deaths_of.get(key_text(key), []) + [last]
        self.rec.event("killed-worker", f"Task {key_text(key)!r} marked as failed because {ts.suspicious} workers "
                       "died while trying to run it", level="error", key=key_text(key), deaths=ts.suspicious,
                       allowed_failures=self.scheduler.allowed_failures, workers=workers, last_worker=last,
                       last_address=address)


def cluster_info(dask_scheduler: Any = None) -> dict[str, Any]:
    """What ``kwdiag run --dask`` shows: task counts and a line per worker (``client.run_on_scheduler``)."""
    plugin = next((p for p in dask_scheduler.plugins.values() if isinstance(p, SchedulerRecorder)), None)
    counters = dict(plugin.counters) if plugin is not None else {}
    states: Counter = Counter()
    for group in dask_scheduler.task_groups.values():
        states.update({s: n for s, n in group.states.items() if n})
    active = sum(states.get(s, 0) for s in ("waiting", "queued", "no-worker", "processing"))
    counters["submitted"] = counters.get("finished", 0) + counters.get("erred", 0) + active
    workers = {}
    for address, ws in dask_scheduler.workers.items():
        counts = ws.metrics.get("task_counts") or {}
        executing = counts.get("executing", min(len(ws.processing), ws.nthreads))
        workers[address] = {"name": str(ws.name), "memory": getattr(ws.memory, "process", None),
                            "memory_limit": ws.memory_limit or None, "executing": [None] * int(executing),
                            "processing": len(ws.processing),
                            "incarnation": plugin.registrations.get(str(ws.name), 1) if plugin else 1}
    return {"counters": counters, "tasks": dict(states), "workers": workers}
