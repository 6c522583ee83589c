"""The nanny plugin: how each worker process of a Dask nanny ended, recorded by the nanny itself.

Covers: ``nanny-start``; a ``worker-exit`` event for every worker process the nanny loses, with the
exit code or signal Dask's nanny read (``_hooks``: never by waiting on the child here), whether the
nanny caused it (terminated it for memory, restarted or killed it on request, closed it with the
cluster) and whether it will restart it, the memory samples of that process (taken by a daemon
thread, because the event loop that Dask's own monitor runs on stalls when memory runs out), the tasks
that were executing (the worker plugin's last ``tasks-executing`` line) and the worker's last log lines
(its faulthandler dump); ``nanny-memory-terminate`` the moment Dask's memory monitor decides to
terminate the worker; and a compact copy of each death sent to the scheduler as a Dask event
(topic ``kwdiag-worker-exit``), so the death reaches the scheduler's file when run directories are
not shared between hosts.

Does not cover: what the worker or the scheduler know (their plugins). Field names follow
``docs/events.md`` so kwdiag's rules read these events as they read the embedded nanny's.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import signal
import socket
import threading
import time
from typing import Any

from distributed.diagnostics.plugin import NannyPlugin

from kwdiag.dask import _hooks
from kwdiag.dask._common import (Recorder, last_executing, process_crash_dump, process_log_tail, run_dir,
                                 scheduler_address_of, signal_name, stem, versions)

SAMPLES_KEPT_SECONDS = 30.0
FORWARD_TAIL = (5, 15)  # the compact copy keeps the first and last lines of the log tail (a dump's header)
_MEMORY_LINE = re.compile(r"\(pid=(\d+)\) exceeded (\d+)% memory budget")


def _status(server: Any) -> str:
    status = getattr(server, "status", None)
    return getattr(status, "name", str(status))


def _current_pid(nanny: Any) -> int | None:
    try:
        return nanny.process.process.pid  # WorkerProcess -> AsyncProcess; None between incarnations
    except (AttributeError, ValueError):
        return None


def _rss(pid: int) -> int | None:
    import psutil

    try:
        rss = psutil.Process(pid).memory_info().rss  # what Dask's nanny compares with its limit
    except psutil.Error:
        return None
    return rss or None  # 0: a killed process not yet reaped (a zombie), not a reading of a live worker


class MemorySampler(threading.Thread):
    """Samples the current worker process's memory from a daemon thread; keeps the last 30 s per pid."""

    def __init__(self, nanny: Any, interval: float, on_nanny_closed):
        super().__init__(name=f"kwdiag-nanny-sampler-{nanny.name}", daemon=True)
        self.nanny = nanny
        self.interval = interval
        self.on_nanny_closed = on_nanny_closed
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._samples: collections.deque = collections.deque()  # (ts, pid, rss)
        self.first_seen: dict[int, float] = {}

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            pid = _current_pid(self.nanny)
            if pid is not None:
                self.sample(pid)
            if _status(self.nanny) == "closed" and pid is None:
                self.on_nanny_closed()
                return

    def sample(self, pid: int) -> int | None:
        rss = _rss(pid)
        if rss is None:
            return None
        now = time.time()
        with self._lock:
            self.first_seen.setdefault(pid, now)
            self._samples.append((now, pid, rss))
            while self._samples and now - self._samples[0][0] > SAMPLES_KEPT_SECONDS:
                self._samples.popleft()
        return rss

    def samples_of(self, pid: int | None) -> list[list[float]]:
        with self._lock:
            return [[round(t, 3), rss] for t, p, rss in self._samples if p == pid]


class _MemoryTerminateListener(logging.Handler):
    """Hears Dask's nanny memory monitor say it is terminating a worker (a WARNING of
    ``distributed.nanny.memory``), synchronously, before it sends SIGTERM."""

    def __init__(self, recorder: "NannyRecorder"):
        super().__init__(logging.WARNING)
        self.recorder = recorder

    def emit(self, record: logging.LogRecord) -> None:
        match = _MEMORY_LINE.search(record.getMessage())
        if match:
            self.recorder.memory_terminate(int(match.group(1)), int(match.group(2)))


class NannyRecorder(NannyPlugin):
    """Record every worker process a Dask nanny loses: exit code or signal, memory, executing tasks.

    ``run_dir`` is where to write (default: ``$KWDIAG_RUN_DIR``, the Dask config key
    ``kwdiag.run-dir``, or ``./kwdiag-dask``), resolved in the nanny process.
    """

    name = "kwdiag-nanny"
    idempotent = True
    restart = False  # registering the plugin must not restart running workers

    def __init__(self, run_dir: str | None = None):
        self.run_dir = run_dir
        self.nanny: Any = None
        self.rec: Recorder | None = None
        self.sampler: MemorySampler | None = None
        self.terminated_for_memory: set[int] = set()
        self._listener: _MemoryTerminateListener | None = None
        self._closed = False

    # ------------------------------------------------------------------ setup and teardown
    def setup(self, nanny: Any = None, **kwargs: Any) -> None:
        self.nanny = nanny
        self.directory = run_dir(self.run_dir)
        self.rec = Recorder(self.directory, f"nanny-{stem(self._file_name())}", source="nanny",
                            worker=self._worker_name(None), cluster=scheduler_address_of(nanny))
        previous = _hooks.observer(nanny)
        if isinstance(previous, NannyRecorder):
            # Loaded twice (a --preload-nanny and the scheduler's registration): the newest one records.
            previous.sampler.stopped.set()
            previous._stop_listening()
            self.terminated_for_memory = previous.terminated_for_memory
        else:
            self._record_start()
        self._listener = _MemoryTerminateListener(self)
        logging.getLogger("distributed.nanny.memory").addHandler(self._listener)
        interval = getattr(getattr(nanny, "memory_manager", None), "memory_monitor_interval", None) or 0.1
        self.sampler = MemorySampler(nanny, float(interval), self._nanny_closed)
        self.sampler.start()
        _hooks.observe(nanny, self)

    def _record_start(self) -> None:
        nanny = self.nanny
        manager = getattr(nanny, "memory_manager", None)
        fraction = getattr(manager, "memory_terminate_fraction", None)
        self.rec.event("nanny-start", f"        Start Nanny at: {nanny.address!r}", address=nanny.address,
                       memory_limit=getattr(manager, "memory_limit", None),
                       terminate_fraction=fraction if fraction is not False else None, pid=os.getpid(),
                       versions=versions())

    def teardown(self, nanny: Any = None, **kwargs: Any) -> None:
        # Dask removes nanny plugins at the start of its close, before it stops the worker: keep
        # listening for that last exit; the sampler ends the recording once the nanny has closed.
        if _status(self.nanny) in ("closing", "closed", "closing_gracefully"):
            return
        self.sampler.stopped.set()
        self._stop_listening()

    def _nanny_closed(self) -> None:
        self.rec.event("nanny-close", f"Nanny at {self.nanny.address!r} closed.", reason=None, missing=["reason"])
        self._stop_listening()

    def _stop_listening(self) -> None:
        if self._closed:
            return
        self._closed = True
        _hooks.forget(self.nanny, self)
        logging.getLogger("distributed.nanny.memory").removeHandler(self._listener)
        self.rec.close()

    # ------------------------------------------------------------------ names and files
    def _file_name(self) -> str:
        return str(self.nanny.name) if self.nanny.name is not None else self.nanny.address

    def _worker_name(self, address: str | None) -> str | None:
        # Without --name, Dask names each worker process by its own address.
        return str(self.nanny.name) if self.nanny.name is not None else address

    def _worker_file(self, address: str | None, suffix: str) -> str:
        return os.path.join(self.directory, f"worker-{stem(self._worker_name(address) or '')}{suffix}")

    # ------------------------------------------------------------------ memory
    def memory_terminate(self, pid: int, percent: int) -> None:
        """Dask's memory monitor is about to terminate worker process ``pid`` (in the event loop)."""
        if pid != _current_pid(self.nanny) or pid in self.terminated_for_memory:
            return  # another nanny's worker (a LocalCluster shares the logger), or the SIGKILL that follows
        self.terminated_for_memory.add(pid)
        rss = self.sampler.sample(pid)
        self._record_memory_terminate(pid, getattr(self.nanny.process, "worker_address", None), rss, percent / 100)

    def _record_memory_terminate(self, pid: int, address: str | None, rss: int | None,
                                 fraction: float | None) -> None:
        limit = getattr(getattr(self.nanny, "memory_manager", None), "memory_limit", None)
        self.rec.event("nanny-memory-terminate",
                       f"Worker {address} (pid={pid}) exceeded {round((fraction or 0) * 100)}% memory budget. "
                       "Restarting...", level="warning", worker=self._worker_name(address), pid=pid, rss=rss,
                       address=address, memory_limit=limit, terminate_fraction=fraction,
                       running_tasks=last_executing(self._worker_file(address, ".jsonl"), pid),
                       samples=self.sampler.samples_of(pid)[-50:])

    # ------------------------------------------------------------------ the exit
    def worker_exited(self, facts: _hooks.ExitFacts) -> None:
        """Dask's nanny reaped worker process ``facts.pid`` and has scheduled what it does next."""
        nanny_status = _status(self.nanny)
        nanny_was = self._nanny_was(facts, nanny_status)
        code = facts.exitcode
        signum = -code if isinstance(code, int) and code < 0 else None
        caused_by = nanny_was if self._outcome_fits(nanny_was, code, signum) else None
        if nanny_was == "memory" and facts.pid not in self.terminated_for_memory:
            self.terminated_for_memory.add(facts.pid)  # the listener did not hear it: record it now
            self._record_memory_terminate(facts.pid, facts.address, None,
                                          getattr(self.nanny.memory_manager, "memory_terminate_fraction", None))
        fields = self._exit_fields(facts, code, signum, caused_by, nanny_was, nanny_status)
        self.rec.event("worker-exit", self._exit_text(facts.pid, code, signum),
                       level="info" if code == 0 or caused_by in ("shutdown", "signal", "restart") else "warning",
                       worker=self._worker_name(facts.address), **fields)
        if nanny_status in ("running", "closing_gracefully"):  # a closing nanny's scheduler is going away too
            self._forward(facts, fields)

    def _nanny_was(self, facts: _hooks.ExitFacts, nanny_status: str) -> str | None:
        """What the nanny was doing to this worker when it ended, whether or not that ended it."""
        manager = getattr(self.nanny, "memory_manager", None)
        if facts.pid in self.terminated_for_memory or getattr(manager, "_last_terminated_pid", None) == facts.pid:
            return "memory"
        reason = facts.kill_reason or ""
        if facts.kill_reason is not None:
            if reason.startswith("check-worker-ttl"):
                return "heartbeat-timeout"
            if "restart" in reason:  # client-restart-<ts>, nanny-restart, nanny-plugin-<name>-restart
                return "restart"
            if reason.startswith("signal-"):
                return "signal"
        if nanny_status in ("closing", "closed"):
            return "shutdown"
        return "kill" if facts.kill_reason is not None else None

    @staticmethod
    def _outcome_fits(nanny_was: str | None, code: int | None, signum: int | None) -> bool:
        """An exit is the nanny's doing only if it is what the nanny did: for memory a SIGTERM (or the
        SIGKILL that follows a slow one); otherwise a clean exit after it asked, or its SIGKILL after
        the worker did not close in time. A segfault while the nanny was asking is not its doing."""
        if nanny_was is None:
            return False
        if nanny_was == "memory":
            return signum in (signal.SIGTERM, signal.SIGKILL)
        return code == 0 or signum == signal.SIGKILL

    def _exit_fields(self, facts: _hooks.ExitFacts, code: int | None, signum: int | None, caused_by: str | None,
                     nanny_was: str | None, nanny_status: str) -> dict[str, Any]:
        manager = getattr(self.nanny, "memory_manager", None)
        samples = self.sampler.samples_of(facts.pid)
        running = last_executing(self._worker_file(facts.address, ".jsonl"), facts.pid)
        tail = process_log_tail(self._worker_file(facts.address, ".log"), facts.pid)
        dump = process_crash_dump(self._worker_file(facts.address, ".log"), facts.pid)
        first = self.sampler.first_seen.get(facts.pid)
        fraction = getattr(manager, "memory_terminate_fraction", None)
        fields = dict(pid=facts.pid, exitcode=code, signal=signum, signal_name=signal_name(signum) if signum else None,
                      caused_by=caused_by, nanny_was=nanny_was, kill_reason=facts.kill_reason,
                      address=facts.address, memory_limit=getattr(manager, "memory_limit", None),
                      terminate_fraction=fraction if fraction is not False else None,
                      peak_rss=max((s[1] for s in samples), default=None), memory_samples=samples,
                      running_tasks=running or [], stderr_tail=tail or [], **({"crash_dump": dump} if dump else {}),
                      uptime=round(facts.at - first, 3) if first else None,
                      will_restart=nanny_status == "running", nanny_status=nanny_status)
        absent = [name for name, value in (("running_tasks", running), ("stderr_tail", tail),
                                           ("uptime", first)) if value is None]
        if code == 255:
            absent.append("signal")  # Dask's "killed by unknown signal": the status was read elsewhere
        if absent:
            fields["missing"] = absent
        return fields

    @staticmethod
    def _exit_text(pid: int | None, code: int | None, signum: int | None) -> str:
        if code == 255:
            return f"Worker process {pid} was killed by unknown signal"
        if signum:
            return f"Worker process {pid} was killed by signal {signum} ({signal_name(signum)})"
        return f"Worker process {pid} exited with status {code}"

    def _forward(self, facts: _hooks.ExitFacts, fields: dict[str, Any]) -> None:
        """Send the scheduler a compact copy (no memory series) through Dask's own event log."""
        tail = fields.get("stderr_tail") or []
        head, last = FORWARD_TAIL
        keep = ("pid", "exitcode", "signal", "signal_name", "caused_by", "nanny_was", "address", "memory_limit",
                "terminate_fraction", "peak_rss", "running_tasks", "will_restart", "missing")
        compact = {k: fields[k] for k in keep if k in fields}
        compact.update(worker=self._worker_name(facts.address), ts=facts.at, nanny=self.nanny.address,
                       run_dir=self.directory, host=socket.gethostname(), file=self.rec.path,
                       stderr_tail=tail if len(tail) <= head + last else tail[:head] + tail[-last:])
        try:
            self.nanny.log_event("kwdiag-worker-exit", compact)
        except Exception:  # the nanny closing, or a scheduler that is gone: the local record stands
            pass
