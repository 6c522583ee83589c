"""Where the nanny plugin listens inside Dask's nanny: the moment it learns that its worker process ended.

Covers: three wrappers, installed once per process on ``distributed.nanny.WorkerProcess`` — ``start``
notes which address each worker process reported (Dask keeps only the last completed start's), ``kill``
remembers why the nanny asked its worker to stop (the reason string: a client restart, the
worker-ttl check, a nanny close), and ``mark_stopped`` (called by Dask's own exit callback once the
nanny has reaped its child) reads the exit code, pid, address and that reason before Dask releases the
process object, and hands them to the observer registered for that nanny once Dask has scheduled its
reaction, so the observer also sees whether the nanny will restart the worker. Nothing
here waits for, signals or reaps a process: the exit code is the one Dask's nanny already read.

Does not cover: what is recorded (``kwdiag.dask.nanny``). The wrappers do nothing for a nanny
without an observer, so other nannies in the same process (a LocalCluster) are untouched.
"""

from __future__ import annotations

import functools
import time
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

_OBSERVERS: "weakref.WeakKeyDictionary[Any, ExitObserver]" = weakref.WeakKeyDictionary()
_INSTALLED = "_kwdiag_hooks_installed"


@dataclass
class ExitFacts:
    pid: int | None
    exitcode: int | None
    address: str | None
    kill_reason: str | None   # why the nanny asked the worker to stop, if it did
    at: float


class ExitObserver(Protocol):
    def worker_exited(self, facts: ExitFacts) -> None: ...


def observe(nanny: Any, observer: ExitObserver) -> None:
    install()
    _OBSERVERS[nanny] = observer


def observer(nanny: Any) -> ExitObserver | None:
    return _OBSERVERS.get(nanny)


def forget(nanny: Any, observer_: ExitObserver) -> None:
    """Stop observing ``nanny``, unless another observer has taken over since."""
    if _OBSERVERS.get(nanny) is observer_:
        del _OBSERVERS[nanny]


def _observer_for(worker_process: Any) -> ExitObserver | None:
    # Dask builds each WorkerProcess with on_exit=nanny._on_worker_exit_sync: its __self__ is the nanny.
    nanny = getattr(getattr(worker_process, "on_exit", None), "__self__", None)
    try:
        return _OBSERVERS.get(nanny) if nanny is not None else None
    except TypeError:  # not weak-referenceable: not a nanny
        return None


def install() -> None:
    """Wrap ``WorkerProcess.kill`` and ``WorkerProcess.mark_stopped`` once in this process."""
    from distributed.nanny import WorkerProcess

    if getattr(WorkerProcess, _INSTALLED, False):
        return
    original_kill = WorkerProcess.kill
    original_mark_stopped = WorkerProcess.mark_stopped
    original_start = WorkerProcess.start

    @functools.wraps(original_start)
    async def start(self, *args: Any, **kwargs: Any) -> Any:
        result = await original_start(self, *args, **kwargs)
        proc = getattr(self, "process", None)
        if proc is not None and getattr(self, "worker_address", None):
            self._kwdiag_started = (proc.pid, self.worker_address)   # this process's address, once it is known
        return result

    @functools.wraps(original_kill)
    async def kill(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_kwdiag_kill_reason", None) is None:
            self._kwdiag_kill_reason = kwargs.get("reason")
        return await original_kill(self, *args, **kwargs)

    @functools.wraps(original_mark_stopped)
    def mark_stopped(self, *args: Any, **kwargs: Any) -> Any:
        observer = _observer_for(self)
        facts = _facts(self) if observer is not None else None
        self._kwdiag_kill_reason = None  # consumed: the next incarnation starts without one
        result = original_mark_stopped(self, *args, **kwargs)
        if facts is not None:
            try:
                observer.worker_exited(facts)
            except Exception:  # a recording bug must never break Dask's restart logic, but must be seen
                import sys
                import traceback

                sys.stderr.write("kwdiag: could not record a worker exit:\n" + traceback.format_exc())
        return result

    WorkerProcess.kill = kill
    WorkerProcess.mark_stopped = mark_stopped
    WorkerProcess.start = start
    setattr(WorkerProcess, _INSTALLED, True)


def _facts(worker_process: Any) -> ExitFacts | None:
    """What the nanny knows of the ended process, read before Dask releases it; None if already released."""
    if "stopped" in str(getattr(worker_process, "status", "")):
        return None  # mark_stopped runs once per process; a second call changes nothing
    proc = getattr(worker_process, "process", None)
    if proc is None:
        return None
    try:
        pid, exitcode = proc.pid, proc.exitcode
    except (ValueError, AttributeError):
        pid = exitcode = None
    # Dask sets worker_address only once a process's start completes: a process that died before (a task
    # crashed it right after it registered) leaves its predecessor's address there. Only the address this very
    # process reported at its start is its own.
    started_pid, started_address = getattr(worker_process, "_kwdiag_started", (None, None))
    return ExitFacts(pid=pid, exitcode=exitcode, address=started_address if started_pid == pid else None,
                     kill_reason=getattr(worker_process, "_kwdiag_kill_reason", None), at=time.time())
