"""Exceptions the client raises, with Dask's names where Dask has one."""

from __future__ import annotations

from concurrent.futures import CancelledError

from kwdiag.runtime.comm import CommClosedError


class KilledWorker(Exception):
    """A task was running on ``allowed_failures + 1`` workers that all died: the task is blamed."""

    def __init__(self, task: str, last_worker: str, allowed_failures: int = 3, workers: list | None = None,
                 log_dir: str | None = None):
        super().__init__(task, last_worker, allowed_failures)
        self.task = task
        self.last_worker = last_worker
        self.allowed_failures = allowed_failures
        self.workers = list(workers or [])
        self.log_dir = log_dir  # where the cluster's logs are kept (the scheduler's log folder)

    def __reduce__(self):
        return (type(self), (self.task, self.last_worker, self.allowed_failures, self.workers, self.log_dir))

    def __str__(self) -> str:
        where = f"`kwdiag explain {self.log_dir}`" if self.log_dir else "`kwdiag explain LOG_DIR`"
        return (f"Attempted to run task {self.task!r} on {self.allowed_failures + 1} different workers, but all those "
                f"workers died while running it. The last worker that attempted to run the task was "
                f"{self.last_worker}. Inspecting worker logs is often a good next step to diagnose what went wrong: "
                f"{where} says why each one died.")


class ScatteredDataLost(KeyError):
    """Scattered data is not in the lineage: when its last copy is lost it cannot be recomputed."""

    def __init__(self, key: str, worker: str | None, message: str | None = None):
        super().__init__(key)
        self.key = key
        self.worker = worker
        self.message = message or f"scattered data {key!r} was lost with worker {worker}"

    def __reduce__(self):
        return (type(self), (self.key, self.worker, self.message))

    def __str__(self) -> str:
        return self.message


class FutureCancelledError(CancelledError):
    """The future was cancelled (``client.restart()``, or the scheduler connection was lost)."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key} cancelled for reason: {reason}.")
        self.key = key
        self.reason = reason


class FuturesCancelledError(CancelledError):
    """``wait()`` found cancelled futures among those it waited for (Dask's name): ``errors`` holds each one's
    ``FutureCancelledError``."""

    def __init__(self, errors: list[FutureCancelledError]):
        super().__init__(f"{len(errors)} Future{'s' if len(errors) != 1 else ''} cancelled")
        self.errors = list(errors)

    def __str__(self) -> str:
        reasons: dict[str, int] = {}
        for error in self.errors:
            reasons[error.reason] = reasons.get(error.reason, 0) + 1
        return (f"{len(self.errors)} Future{'s' if len(self.errors) != 1 else ''} cancelled: "
                + ", ".join(f"{n} {reason}" for reason, n in reasons.items()))


class VersionMismatchError(ValueError):
    """``get_versions(check=True)`` found processes whose package versions differ."""


class VersionMismatchWarning(UserWarning):
    """The scheduler reported a version mismatch with this client on connect."""


__all__ = ["KilledWorker", "ScatteredDataLost", "FutureCancelledError", "FuturesCancelledError", "VersionMismatchError",
           "VersionMismatchWarning", "CommClosedError", "CancelledError"]
