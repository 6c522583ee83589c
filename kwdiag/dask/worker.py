"""The worker plugin: what only the worker process knows, written before it can be lost.

Covers: a ``worker-start`` event per worker process (address, name, threads, memory limit, nanny, pid);
the set of tasks actually *executing* in its threads, written as a ``tasks-executing`` event each time
it changes, so the last such line before a death names what was running (Dask's scheduler only knows
what it assigned); and the worker's own log ``worker-<name>.log`` beside the events, where Python's
faulthandler writes its dump on a segfault or abort and where every WARNING+ record of the process is
appended, so both survive the process.

Does not cover: the exit code or signal (only the nanny can know it), the memory trajectory (the
nanny samples it from outside), or removals (the scheduler). faulthandler can write to one file
only: while this plugin is set up, its dumps go to the worker's log instead of stderr.
"""

from __future__ import annotations

import faulthandler
import logging
import os
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from kwdiag.dask._common import (BANNER, ExecutingLines, Recorder, TEXT_FORMAT, key_text, run_dir,
                                 scheduler_address_of, stem, text_line, versions)

RUNNING = frozenset({"executing", "long-running"})
# A task cancelled or resumed while executing keeps running in its thread until it returns.
STILL_RUNNING = frozenset({"cancelled", "resumed"})


class _OnceHandler(logging.Handler):
    """Appends WARNING+ records to the worker's log; a record reaching it through two loggers (the
    ``distributed`` logger and the root) is written once."""

    def __init__(self, stream):
        super().__init__(logging.WARNING)
        self.stream = stream
        self.setFormatter(logging.Formatter(TEXT_FORMAT))
        self._last: int | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if id(record) == self._last:
            return
        self._last = id(record)
        try:
            self.stream.write(self.format(record) + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass


class WorkerRecorder(WorkerPlugin):
    """Record a Dask worker's start, its executing tasks, and its crash dumps and warnings.

    ``run_dir`` is where to write (default: ``$KWDIAG_RUN_DIR``, the Dask config key
    ``kwdiag.run-dir``, or ``./kwdiag-dask``), resolved in the worker process.
    """

    name = "kwdiag-worker"
    idempotent = True

    def __init__(self, run_dir: str | None = None):
        self.run_dir = run_dir
        self.rec: Recorder | None = None
        self.lines: ExecutingLines | None = None
        self.worker: Any = None
        self.executing: set[str] = set()
        self._log = None
        self._handler: _OnceHandler | None = None

    def setup(self, worker: Any = None, **kwargs: Any) -> None:
        self.worker = worker
        directory = run_dir(self.run_dir)
        name = str(worker.name)
        self.rec = Recorder(directory, f"worker-{stem(name)}", source="worker", worker=name,
                            cluster=scheduler_address_of(worker))
        self.lines = ExecutingLines(self.rec.path, name)
        self._open_log(os.path.join(directory, f"worker-{stem(name)}.log"), worker)
        # Registered on a running worker: what already runs is the first executing set.
        self.executing = {key_text(ts.key) for ts in getattr(worker.state, "executing", ())}
        if getattr(worker, "_kwdiag_recorded", False):
            return  # loaded twice (a preload and the scheduler's registration): the first one's start stands
        worker._kwdiag_recorded = True
        limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)  # None: no limit
        self.rec.event("worker-start", f"Worker process {os.getpid()} started at {worker.address} (name {name})",
                       address=worker.address, name=name, nthreads=getattr(worker.state, "nthreads", None),
                       memory_limit=limit, nanny=worker.nanny, pid=os.getpid(), versions=versions())
        if self.executing:
            self._write_executing()

    def _open_log(self, path: str, worker: Any) -> None:
        try:
            self._log = open(path, "a", encoding="utf-8", buffering=1)
        except OSError:
            return
        self._log.write(text_line("kwdiag.dask.worker", "INFO", BANNER.format(pid=os.getpid())
                                  + f" at {worker.address} (name {worker.name}); faulthandler dumps and "
                                  "WARNING+ records of this process follow"))
        faulthandler.enable(file=self._log, all_threads=True)
        self._handler = _OnceHandler(self._log)
        for logger_name in ("distributed", ""):
            logging.getLogger(logger_name).addHandler(self._handler)

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        # Called for every transition of every task on this worker: keep the common case cheap.
        if finish in RUNNING:
            text = key_text(key)
            if text in self.executing:
                return
            self.executing.add(text)
        elif start in RUNNING or start in STILL_RUNNING:
            text = key_text(key)
            if text not in self.executing or self._still_running(key):
                return
            self.executing.discard(text)
        else:
            return
        self._write_executing()

    def _still_running(self, key: Any) -> bool:
        # Dask reports the transition it was asked for ("released"), while a task whose thread is still
        # running is left "cancelled" until the thread returns: ask the state machine what it is now.
        ts = self.worker.state.tasks.get(key) if self.worker is not None else None
        return ts is not None and (ts.state in RUNNING or ts.state in STILL_RUNNING)

    def _write_executing(self) -> None:
        if self.lines is not None:
            self.lines.write(sorted(self.executing))

    def teardown(self, worker: Any = None, **kwargs: Any) -> None:
        # At a close, the process is about to end: keep faulthandler and the log handler until it does
        # (a crash while closing must still be written). Only an unregistered plugin undoes them.
        status = str(getattr(worker, "status", ""))
        if "clos" in status or self._log is None:
            return
        faulthandler.disable()
        for logger_name in ("distributed", ""):
            logging.getLogger(logger_name).removeHandler(self._handler)
        self._log.close()
        self._log = None
        if self.rec is not None:
            self.rec.close()
            self.lines.close()
