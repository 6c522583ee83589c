"""Dask's functions over futures: ``as_completed``, ``wait``, ``fire_and_forget``, ``futures_of``.

Covers: iterating futures in the order they finish (with their results, in batches, with futures added
while iterating, with a deadline), waiting for all or the first of several futures, running tasks whose
futures are dropped, and finding the futures inside lists, dicts and persisted Dask collections. Each
works on futures of any number of clients; completion is learnt from the client's own key states, so no
call here sends anything to the scheduler except ``fire_and_forget``.

Does not cover: the futures themselves or the client (``runtime.client``), or an ``async`` API.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any, Iterable, Iterator, NamedTuple

from kwdiag.runtime.client import CANCELLED, ERROR, Future
from kwdiag.runtime.config import parse_timedelta
from kwdiag.runtime.exceptions import FutureCancelledError, FuturesCancelledError

ALL_COMPLETED, FIRST_COMPLETED = "ALL_COMPLETED", "FIRST_COMPLETED"


def futures_of(obj: Any) -> list[Future]:
    """Every ``Future`` inside ``obj`` (nested lists, tuples, sets, dicts, or a persisted Dask collection),
    each once, in the order found."""
    found: dict[int, Future] = {}
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, Future):
            found.setdefault(id(x), x)
        elif isinstance(x, (list, tuple, set, frozenset)):
            stack.extend(reversed(list(x)))
        elif isinstance(x, dict):
            stack.extend(reversed(list(x.values())))
        elif hasattr(x, "__dask_graph__") and callable(x.__dask_graph__):
            graph = x.__dask_graph__()
            if graph is not None:
                stack.extend(_graph_values(graph))
    return list(found.values())


def _graph_values(graph: Any) -> list[Any]:
    values = []
    for node in dict(graph).values():
        value = getattr(node, "value", node)   # a dask DataNode holds its value
        if isinstance(value, Future):
            values.append(value)
    return values


class DoneAndNotDoneFutures(NamedTuple):
    done: set
    not_done: set


def wait(fs: Any, timeout: float | None = None, return_when: str = ALL_COMPLETED) -> DoneAndNotDoneFutures:
    """Wait until all (or, with ``FIRST_COMPLETED``, any) of the futures in ``fs`` are done — finished, erred
    or cancelled; ``TimeoutError`` after ``timeout`` (seconds, or ``"300ms"``); ``FuturesCancelledError`` when
    some of the done ones were cancelled (as Dask's)."""
    timeout = parse_timedelta(timeout)
    futures = futures_of(fs)
    if return_when not in (ALL_COMPLETED, FIRST_COMPLETED):
        raise NotImplementedError(f"wait(return_when={return_when!r}): only ALL_COMPLETED and FIRST_COMPLETED")
    deadline = None if timeout is None else time.monotonic() + timeout
    if return_when == ALL_COMPLETED:
        for future in futures:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not future._state.event.wait(remaining):
                pending = sum(1 for f in futures if not f.done())
                raise TimeoutError(f"{pending}/{len(futures)} futures were not done after {timeout} s.")
    elif futures and not any(f.done() for f in futures):
        woken = threading.Event()
        for future in futures:
            future.client._when_done(future._state, woken.set)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not woken.wait(remaining):
            raise TimeoutError(f"none of {len(futures)} futures was done after {timeout} s.")
    done = {f for f in futures if f.done()}
    cancelled = [FutureCancelledError(f.key, f._state.reason) for f in done if f.cancelled()]
    if cancelled:
        raise FuturesCancelledError(cancelled)
    return DoneAndNotDoneFutures(done, set(futures) - done)


def fire_and_forget(obj: Any) -> None:
    """Run the tasks of the futures in ``obj`` at least once, even when no future of theirs is kept."""
    by_client: dict[Any, list[str]] = {}
    for future in futures_of(obj):
        by_client.setdefault(future.client, []).append(future.key)
    for client, keys in by_client.items():
        client._send({"op": "fire-and-forget", "keys": keys})


class as_completed:
    """The futures given, in the order they complete (finished, erred or cancelled), as Dask's ``as_completed``:
    ``with_results=True`` yields ``(future, result)`` (an erred one raises, or with ``raise_errors=False``
    yields its ``(type, exception, traceback)``); ``add``/``update`` take more futures while iterating;
    ``batches()``/``next_batch()`` take every future done so far at once; ``timeout`` counts from creation."""

    def __init__(self, futures: Iterable[Future] | None = None, loop: Any = None, with_results: bool = False,
                 raise_errors: bool = True, *, timeout: float | None = None):
        self.futures: collections.defaultdict[Future, int] = collections.defaultdict(int)
        self.queue: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.thread_condition = threading.Condition()
        self.with_results = with_results
        self.raise_errors = raise_errors
        timeout = parse_timedelta(timeout)
        self._deadline = None if timeout is None else time.monotonic() + timeout
        if futures:
            self.update(futures)

    def update(self, futures: Iterable[Future]) -> None:
        """Add futures; each is yielded once it is done (a future added twice, twice)."""
        with self.lock:
            for future in futures:
                if not isinstance(future, Future):
                    raise TypeError(f"Input must be a future, got {future}")
                self.futures[future] += 1
                future.client._when_done(future._state, lambda f=future: self._done(f))

    def add(self, future: Future) -> None:
        self.update((future,))

    def _done(self, future: Future) -> None:
        with self.lock:
            if future in self.futures:
                self.futures[future] -= 1
                if not self.futures[future]:
                    del self.futures[future]
                self.queue.put_nowait(future)
        with self.thread_condition:
            self.thread_condition.notify_all()

    def is_empty(self) -> bool:
        """True when nothing is computing or waiting to be yielded."""
        return not self.count()

    def has_ready(self) -> bool:
        return not self.queue.empty()

    def count(self) -> int:
        """Futures not yet yielded: computing, or done and waiting to be taken."""
        with self.lock:
            return sum(self.futures.values()) + self.queue.qsize()

    def __repr__(self) -> str:
        return f"<as_completed: waiting={len(self.futures)} done={self.queue.qsize()}>"

    def __iter__(self) -> Iterator[Any]:
        return self

    def _item(self, future: Future) -> Any:
        if not self.with_results:
            return future
        if future.status == ERROR:
            exc = future.exception()
            if self.raise_errors:
                raise exc
            return future, (type(exc), exc, exc.__traceback__)
        if future.status == CANCELLED:
            return future, FutureCancelledError(future.key, future._state.reason)
        return future, future.result()

    def __next__(self) -> Any:
        while self.queue.empty():
            if self._deadline is not None and time.monotonic() > self._deadline:
                raise TimeoutError("as_completed: timed out")
            if self.is_empty():
                raise StopIteration
            with self.thread_condition:
                self.thread_condition.wait(timeout=0.1)
        return self._item(self.queue.get_nowait())

    next = __next__

    def next_batch(self, block: bool = True) -> list[Any]:
        """The futures done so far (at least one when ``block``; StopIteration when none are left)."""
        batch = [next(self)] if block else []
        while not self.queue.empty():
            batch.append(self._item(self.queue.get_nowait()))
        return batch

    def batches(self) -> Iterator[list[Any]]:
        while True:
            try:
                yield self.next_batch(block=True)
            except StopIteration:
                return

    def clear(self) -> None:
        with self.lock:
            self.futures.clear()
            while not self.queue.empty():
                self.queue.get_nowait()
