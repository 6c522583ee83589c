"""What a task can ask of the worker it runs on, as in Dask: ``get_worker``, ``get_client``, ``secede``,
``rejoin``, ``worker_client``.

Covers: the thread-local context a worker sets around each task (the worker and the task's key); the
worker's own client, created on first use in the worker process and shared by its tasks, so that tasks
can submit tasks; leaving the worker's thread pool while a task waits on other tasks (``secede``: the
worker may start another task on that thread's slot, and the scheduler stops counting it against the
worker's capacity) and coming back (``rejoin``: waits for a free slot).

Does not cover: running tasks or the worker's event loop (``runtime.worker``), or the client itself
(``runtime.client``). Outside a task, ``get_worker`` raises ``ValueError`` and ``get_client`` returns the
process's current client, as Dask's do.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

_task = threading.local()   # .worker, .key while a task runs in this thread
_worker_client_lock = threading.Lock()


def set_task(worker: Any, key: str | None) -> None:
    """Called by the worker in a task's thread, before (``key``) and after (None) the task."""
    _task.worker = worker if key is not None else None
    _task.key = key


def current_task() -> tuple[Any, str] | None:
    worker, key = getattr(_task, "worker", None), getattr(_task, "key", None)
    return (worker, key) if worker is not None and key is not None else None


def get_worker() -> Any:
    """The worker running the current task (its ``address``, ``name``, ``nthreads``, ``data``)."""
    task = current_task()
    if task is None:
        raise ValueError("No worker found: get_worker() works only inside a task running on a worker")
    return task[0]


def get_client(timeout: float | None = None, resolve_address: bool = True) -> Any:
    """In a task: the worker's client (tasks may submit tasks). Elsewhere: the current client."""
    task = current_task()
    if task is None:
        from kwdiag.runtime.client import Client

        return Client.current()
    worker = task[0]
    with _worker_client_lock:
        client = getattr(worker, "client", None)
        if client is None or client.status == "closed":
            from kwdiag.runtime.client import Client

            client = Client(worker.scheduler_address, secret=worker.secret, security=worker.security,
                            timeout=timeout or 10.0, name=f"Client-worker-{worker.name}", set_as_default=False)
            worker.client = client
        return client


def secede() -> None:
    """Leave the worker's thread pool: the task keeps running, and the worker may start another task on its
    slot. Use it before a task blocks on other tasks' results (``worker_client`` does it for you)."""
    task = current_task()
    if task is None:
        raise ValueError("secede() works only inside a task running on a worker")
    worker, key = task
    worker.secede(key)


def rejoin() -> None:
    """Come back into the worker's thread pool after ``secede``: waits until a slot is free."""
    task = current_task()
    if task is None:
        raise ValueError("rejoin() works only inside a task running on a worker")
    worker, key = task
    worker.rejoin(key)


@contextlib.contextmanager
def worker_client(timeout: float | None = None, separate_thread: bool = True) -> Iterator[Any]:
    """``with worker_client() as client:`` inside a task: the worker's client, with the task seceded from the
    thread pool for the block's duration (so waiting on the tasks it submits cannot starve the worker)."""
    client = get_client(timeout=timeout)
    if separate_thread:
        secede()
    try:
        yield client
    finally:
        if separate_thread:
            rejoin()
