"""The Dask-compatible client: ``Client``, ``Future`` and their blocking API.

Covers: connecting (a ``LocalCluster``, an address, a scheduler file, or — with no argument —
the cluster ``kwdiag run`` announced in the environment, else a new ``LocalCluster``);
submitting tasks whose arguments may hold futures (they become dependencies, found while
pickling); tracking each key's state from the scheduler's reports; fetching results straight
from the workers that hold them; raising a task's own exception, ``KilledWorker`` or
``ScatteredDataLost``; reference counting futures so the scheduler can release what nobody
holds; and reconnecting when the scheduler comes back (re-reading the scheduler file, so a scheduler
that returns on another port or host is found), keeping every future: a scheduler that recovered its
journal still knows them, and one that did not gets them submitted again.

Does not cover: scheduling (the scheduler decides), or an asynchronous API (all calls block;
the event loop runs in one background thread shared by every client of the process).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import hashlib
import io
import logging
import os
import pickle
import threading
import time
import uuid
import warnings
import weakref
from typing import Any, Iterable

import cloudpickle

from kwdiag.runtime import versions as versions_mod
from kwdiag.runtime import config as config_mod
from kwdiag.runtime.comm import CommClosedError, Credentials, Security, connect
from kwdiag.runtime.core import RemoteError, Stream, background
from kwdiag.runtime.loopthread import LoopThread
from kwdiag.runtime.exceptions import (FutureCancelledError, KilledWorker, ScatteredDataLost, VersionMismatchError,
                                       VersionMismatchWarning)
from kwdiag.runtime.record import Recorder

logger = logging.getLogger("kwdiag.client")

PENDING, FINISHED, ERROR, CANCELLED = "pending", "finished", "error", "cancelled"

_LIVE: "weakref.WeakSet[Client]" = weakref.WeakSet()


def _close_all_at_exit() -> None:
    # A script that ends without client.close() still says goodbye: the scheduler then releases its tasks at
    # once instead of keeping them for a client that might reconnect (``client_grace``).
    for client in list(_LIVE):
        try:
            client.close()
        except Exception:
            pass


atexit.register(_close_all_at_exit)


class _KeyState:
    __slots__ = ("status", "who_has", "error", "event", "refcount", "reason", "waiters", "value")

    def __init__(self) -> None:
        self.status = PENDING
        self.who_has: list[str] = []
        self.value: bytes | None = None  # a small result's pickle, sent with its "in memory" news
        self.error: dict | None = None
        self.reason = ""
        self.event = threading.Event()   # for callers' threads
        self.waiters: list[asyncio.Future] = []  # for coroutines on the client loop
        self.refcount = 0


class _SpecPickler(cloudpickle.CloudPickler):
    """Pickles ``(fn, args, kwargs)``, turning every Future inside into a dependency reference."""

    def __init__(self, file: io.BytesIO, deps: list[str]):
        super().__init__(file, protocol=5)
        self.deps = deps

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is Future:
            if obj.key not in self.deps:
                self.deps.append(obj.key)
            return ("kwdiag-future", obj.key)
        return None


class _PickledCallable:
    """A task's callable, pickled once: a map of n tasks pickles its function once instead of n times (cloudpickle
    of a function defined in ``__main__`` costs ~50 us, most of what map() spent per task). In a spec it is its
    pickle, which the worker loads as before."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes):
        self.blob = blob

    def __reduce__(self) -> tuple:
        return pickle.loads, (self.blob,)


def _pickle_callable(fn: Any) -> Any:
    """``fn`` pickled once for the specs of its tasks; ``fn`` itself when it holds futures (a closure over one),
    which must be pickled with each spec, where they become that task's dependencies."""
    buffer, deps = io.BytesIO(), []
    _SpecPickler(buffer, deps).dump(fn)
    return fn if deps else _PickledCallable(buffer.getvalue())


def _dumps_spec(fn: Any, args: tuple, kwargs: dict) -> tuple[bytes, list[str]]:
    buffer, deps = io.BytesIO(), []
    _SpecPickler(buffer, deps).dump((fn, args, kwargs))
    return buffer.getvalue(), deps


def _funcname(fn: Any) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "lambda" if name == "<lambda>" else name


def _build_exception(key: str, error: dict) -> BaseException:
    kind = error.get("type")
    if kind == "killed-worker":
        return KilledWorker(error["key"], error.get("last_worker"), error.get("allowed_failures", 3),
                            error.get("workers"), error.get("log_dir"))
    if kind == "scattered-lost":
        return ScatteredDataLost(error["key"], error.get("worker"), error.get("message"))
    if kind == "exception":
        try:
            exc = pickle.loads(error["exception"])
        except Exception:
            exc = RuntimeError(f"{error.get('exc_type')}: {error.get('message')}")
        if error.get("traceback") and hasattr(exc, "add_note"):
            exc.add_note(f"Remote traceback (task {error.get('key')!r}):\n{error['traceback'].rstrip()}")
        return exc
    return RuntimeError(error.get("message") or f"task {key!r} failed")


class Future:
    """A handle to one task's result on the cluster."""

    __slots__ = ("key", "client", "__weakref__")

    def __init__(self, key: str, client: "Client"):
        self.key = key
        self.client = client
        client._inc_ref(key)

    @property
    def status(self) -> str:
        st = self.client._states.get(self.key)
        return st.status if st else CANCELLED

    def done(self) -> bool:
        return self.status != PENDING

    def result(self, timeout: float | None = None) -> Any:
        return self.client.gather(self, timeout=timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        st = self.client._wait(self.key, timeout)
        if st.status == ERROR:
            return _build_exception(self.key, st.error or {})
        if st.status == CANCELLED:
            return FutureCancelledError(self.key, st.reason)
        return None

    def release(self) -> None:
        self.client._dec_ref(self.key)
        self.client = None  # type: ignore[assignment]

    def __del__(self) -> None:
        # Garbage collection can run this anywhere — even inside the client's own locked sections — so it
        # must not take a lock: it only queues the release for the client's event loop.
        client = getattr(self, "client", None)
        if client is not None:
            try:
                client._release_later(self.key)
            except Exception:
                pass

    def __reduce__(self):
        raise TypeError("a kwdiag Future can only be passed as a task argument of the client that owns it")

    def __repr__(self) -> str:
        return f"<Future: {self.status}, key: {self.key}>"


class Client:
    """Connect to a kwdiag cluster and run work on it (the Dask ``Client`` subset kwdiag supports)."""

    def __init__(self, address: Any = None, *, scheduler_file: str | None = None, secret: bytes | str | None = None,
                 timeout: float = 10.0, name: str | None = None, security: Security | None = None):
        """Connect to a scheduler (an address, a scheduler file, a LocalCluster, the environment, or a new
        LocalCluster as Dask does). Over 60 lines on purpose: those five ways in, in the order Dask resolves
        them, then the state every later call reads."""
        from kwdiag.runtime.cluster import LocalCluster  # only for Client() with no address: it starts one

        self.id = name or f"Client-{uuid.uuid4().hex[:12]}"
        self.cluster: LocalCluster | None = None
        self._owns_cluster = False
        log_dir = os.environ.get("KWDIAG_LOG_DIR") or None
        if isinstance(secret, str):
            secret = bytes.fromhex(secret)
        if address is None and scheduler_file is None:
            scheduler_file = os.environ.get("KWDIAG_SCHEDULER_FILE") or None
            if scheduler_file is None:
                address = os.environ.get("KWDIAG_SCHEDULER_ADDRESS") or None
                if address is None:
                    address = LocalCluster()
                    self._owns_cluster = True
        if isinstance(address, LocalCluster):
            self.cluster = address
            address, secret, log_dir = address.scheduler_address, address.secret, address.log_dir
            security = security or self.cluster.security
        elif scheduler_file is not None:
            from kwdiag.runtime.identity import read_scheduler_file

            address, file_secret = read_scheduler_file(scheduler_file)
            secret = secret or file_secret
        if secret is None and os.environ.get("KWDIAG_SECRET"):
            secret = bytes.fromhex(os.environ["KWDIAG_SECRET"])
        if not secret:
            raise ValueError("no shared secret for the scheduler: pass scheduler_file=, secret=, or set KWDIAG_SECRET")
        self.scheduler_address: str = address
        self.secret: bytes = secret
        self.credentials = Credentials(secret, security)
        from kwdiag.runtime.identity import Follower

        self._follower = Follower(address, secret, self.cluster.scheduler_file if self.cluster else scheduler_file)
        self._lost_at: float | None = None  # wall-clock time the scheduler connection broke
        self.timeout = timeout
        self.config = config_mod.load()
        self._loop = LoopThread.get()
        self._states: dict[str, _KeyState] = {}
        self._lock = threading.Lock()
        self._garbage: collections.deque[str] = collections.deque()  # keys whose futures were collected
        self._drain_pending = False  # a drain is already queued on the loop: one wake-up serves many releases
        # The task spec of every live future, so that work lost with a scheduler can be submitted again.
        self._specs: dict[str, dict] = {}
        self._released_away: list[str] = []  # futures released while the scheduler was away
        self._stream: Stream | None = None
        self._workers: dict[str, Stream] = {}
        self._closing = False
        self.status = "connecting"
        self.rec = Recorder("kwdiag.client", source="client", log_dir=log_dir, file_stem=f"client-{os.getpid()}")
        self._reported_killed: set[str] = set()
        self.versions = versions_mod.collect(self.config["versions_packages"])
        self.handlers = {"key-in-memory": self._on_in_memory, "task-erred": self._on_erred,
                         "key-lost": self._on_lost, "cancelled": self._on_cancelled}
        try:
            warning = self._loop.run(self._connect(first=True), timeout + 5).get("warning")
        except BaseException:
            if self._owns_cluster and self.cluster is not None:
                self.cluster.close()
            raise
        self.status = "running"
        _LIVE.add(self)
        self.rec.event("client-start", f"Client {self.id} connected to {self.scheduler_address}",
                       scheduler=self.scheduler_address)
        if warning:
            warnings.warn(VersionMismatchWarning(warning), stacklevel=2)

    # ---------------------------------------------------------------- connection
    async def _connect(self, first: bool) -> dict:
        """Connect and register; the reply says whether the scheduler still knows this client (``known``)."""
        if not first:
            self.scheduler_address = self._follower.current()  # it may have come back on another port or host
        comm = await connect(self.scheduler_address, self.credentials, timeout=self.timeout)
        stream = Stream(comm, self.handlers, on_close=self._on_scheduler_closed)
        background(stream.run())
        reply = await stream.request("register-client", client=self.id, versions=self.versions,
                                     lost_at=self._lost_at, timeout=self.timeout)
        self._stream = stream
        return reply

    def _on_scheduler_closed(self, stream: Stream) -> None:
        if self._closing or stream is not self._stream:
            return
        self._stream = None
        self.status = "reconnecting"
        self._lost_at = time.time()
        self.rec.event("scheduler-lost", f"Client report stream closed to scheduler {self.scheduler_address}; "
                       "reconnecting", level="warning", address=self.scheduler_address)
        # Every future is kept as it is: finished results stay on their workers (which keep them while the
        # scheduler is away), and what the scheduler must learn again is sent when it is back.
        background(self._reconnect())

    async def _reconnect(self) -> None:
        started = time.monotonic()
        deadline = started + float(self.config["reconnect_timeout"])
        delay = 0.1
        while not self._closing and time.monotonic() < deadline:
            try:
                reply = await self._connect(first=False)
            except (CommClosedError, OSError, asyncio.TimeoutError, RemoteError):
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
            self.status = "running"
            if not reply.get("known"):
                self._forget_results()
            released, self._released_away = self._released_away, []
            if released and reply.get("known") and self._stream is not None:
                self._stream.send({"op": "release-keys", "keys": released})
            resubmitted = self._resubmit()
            self._lost_at = None
            self.rec.event("reconnected", f"Reconnected to scheduler at {self.scheduler_address} after "
                           f"{time.monotonic() - started:.2f}s; it {'knew' if reply.get('known') else 'did not know'}"
                           f" this client; submitted {resubmitted} task(s) again", address=self.scheduler_address,
                           after=round(time.monotonic() - started, 3), resubmitted=resubmitted,
                           known=bool(reply.get("known")))
            return
        if not self._closing:
            with self._lock:
                for st in self._states.values():
                    if st.status == PENDING:
                        self._set(st, CANCELLED, reason="scheduler-connection-lost")
            self.status = "closed"
            self.rec.event("scheduler-lost", f"Failed to reconnect to scheduler after "
                           f"{time.monotonic() - started:.2f} seconds, closing client", level="error",
                           address=self.scheduler_address)

    def _forget_results(self) -> None:
        """The scheduler came back without our records (no journal): it recomputes what it can, and the
        workers drop what it does not know. Scattered data is not in any lineage: it is lost."""
        with self._lock:
            for key, st in self._states.items():
                if key in self._specs and st.status in (PENDING, FINISHED):
                    st.who_has = []
                    self._set(st, PENDING)
                elif st.status in (PENDING, FINISHED):
                    self._set(st, CANCELLED, reason="scheduler-connection-lost")

    def _resubmit(self) -> int:
        """Tell the scheduler every live future again (one message; it orders them by dependency): a scheduler
        that kept them answers at once, one that lost them computes them again. Scattered keys go without a
        spec: a scheduler that lost their holders fails them with ScatteredDataLost."""
        with self._lock:
            tasks = [self._specs.get(k) or {"key": k, "spec": None, "deps": []}
                     for k, st in self._states.items()
                     if st.status == PENDING and k in self._specs or st.status == FINISHED]
        if tasks and self._stream is not None:
            self._stream.send({"op": "update-graph", "tasks": tasks})
        return len(tasks)

    def _send(self, message: dict, keep_alive: Any = None) -> None:
        """Send ``message`` from the client's loop. ``keep_alive`` (a submission's arguments) stays referenced
        until the message is on its way: a future among them that the caller drops at once
        (``f = client.submit(inc, f)``) is then released only after the task that depends on it was sent, so
        the scheduler never hears of the release first and forgets the dependency."""
        def send() -> None:
            # While the scheduler is away, submissions wait in self._specs and are sent on reconnect.
            if self._stream is not None:
                self._stream.send(message)
        send.keep_alive = keep_alive  # type: ignore[attr-defined]  # dropped with the callback, after it ran
        self._loop.call(send)

    def _request(self, op: str, timeout: float | None = None, **fields: Any) -> Any:
        async def request() -> Any:
            stream = self._stream
            if stream is None:
                raise CommClosedError(f"not connected to the scheduler at {self.scheduler_address}")
            return await stream.request(op, **fields)
        return self._loop.run(request(), timeout)

    # ---------------------------------------------------------------- key states (loop thread)
    def _set(self, st: _KeyState, status: str, reason: str = "") -> None:
        """Change a key's state; runs on the client loop only."""
        st.status = status
        st.reason = reason
        if status == PENDING:
            st.value = None
            st.event.clear()
            return
        st.event.set()
        waiters, st.waiters = st.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _on_in_memory(self, stream: Stream, msg: dict) -> None:
        st = self._states.get(msg["key"])
        if st is not None:
            st.who_has = list(msg.get("who_has") or [])
            value = msg.get("value")
            st.value = value if isinstance(value, bytes) else None
            self._set(st, FINISHED)

    def _on_erred(self, stream: Stream, msg: dict) -> None:
        st = self._states.get(msg["key"])
        if st is None:
            return
        st.error = msg["error"]
        self._set(st, ERROR)
        error = msg["error"] or {}
        if error.get("type") == "killed-worker" and error.get("key") == msg["key"] \
                and msg["key"] not in self._reported_killed:
            self._reported_killed.add(msg["key"])
            # Recorded for the postmortem; not printed: the user gets the exception itself.
            self.rec.event("killed-worker", f"KilledWorker: task {msg['key']!r}, last worker "
                           f"{error.get('last_worker')}", level="error", quiet=True, key=msg["key"],
                           last_worker=error.get("last_worker"), workers=error.get("workers"))

    def _on_lost(self, stream: Stream, msg: dict) -> None:
        st = self._states.get(msg["key"])
        if st is not None and st.status == FINISHED:
            st.who_has = []
            self._set(st, PENDING)

    def _on_cancelled(self, stream: Stream, msg: dict) -> None:
        for key in msg["keys"]:
            st = self._states.get(key)
            if st is not None:
                self._set(st, CANCELLED, reason=msg.get("reason") or "cancelled")

    # ---------------------------------------------------------------- reference counting
    def _inc_ref(self, key: str) -> None:
        with self._lock:
            st = self._states.get(key)
            if st is None:
                st = self._states[key] = _KeyState()
            st.refcount += 1

    def _release_later(self, key: str) -> None:
        self._garbage.append(key)  # deque.append is atomic: safe from __del__ in any thread
        if self._drain_pending:  # queued and not yet started: that drain will take this key too
            return
        self._drain_pending = True
        try:
            self._loop.loop.call_soon_threadsafe(self._drain_garbage)
        except RuntimeError:  # the loop is gone (interpreter shutdown)
            pass

    def _drain_garbage(self) -> None:
        # Cleared before draining: a key appended after this line either is drained below or queues a new drain.
        self._drain_pending = False
        released = []
        while self._garbage:
            key = self._garbage.popleft()
            if self._forget(key):
                released.append(key)
        self._send_release(released)

    def _dec_ref(self, key: str) -> None:
        if self._forget(key):
            self._send_release([key])

    def _forget(self, key: str) -> bool:
        """Drop one reference to ``key``; True when it was the last, so the scheduler may release it."""
        with self._lock:
            st = self._states.get(key)
            if st is None:
                return False
            st.refcount -= 1
            if st.refcount > 0:
                return False
            del self._states[key]
            self._specs.pop(key, None)
            return True

    def _send_release(self, keys: list[str]) -> None:
        if not keys or self._closing:
            return

        def release() -> None:  # on the loop, where reconnection runs: no release slips between the two
            if self._stream is not None:
                self._stream.send({"op": "release-keys", "keys": keys})
            else:  # the scheduler is away: told when it is back (one that recovered still holds them for us)
                self._released_away.extend(keys)
        if threading.current_thread() is self._loop.thread:
            release()
        else:
            self._loop.call(release)

    # ---------------------------------------------------------------- submitting
    def submit(self, func: Any, *args: Any, key: str | None = None, workers: Any = None, pure: bool = True,
               allow_other_workers: bool = False, priority: int = 0, **kwargs: Any) -> Future:
        """Run ``func(*args, **kwargs)`` on the cluster; futures among the arguments become dependencies.

        ``workers=`` restricts where it runs (addresses or names); with ``allow_other_workers=True``
        that is only a preference, used while one of those workers is alive. Tasks with a higher
        ``priority`` run before others that are ready."""
        if not callable(func):
            raise TypeError("first argument to submit must be a callable")
        spec, deps = _dumps_spec(_pickle_callable(func), args, kwargs)
        if key is None:
            key = f"{_funcname(func)}-{hashlib.sha1(spec).hexdigest() if pure else uuid.uuid4().hex}"
        future = Future(key, self)
        task = {"key": key, "spec": spec, "deps": deps, "workers": _as_list(workers), "loose": allow_other_workers,
                "priority": priority}
        self._specs[key] = task
        self._send({"op": "update-graph", "tasks": [task]}, keep_alive=(func, args, kwargs))
        return future

    def map(self, func: Any, *iterables: Iterable, key: str | list[str] | None = None, workers: Any = None,
            pure: bool = True, allow_other_workers: bool = False, **kwargs: Any) -> list[Future]:
        """``submit`` for each element of the zipped iterables, sent to the scheduler in one message."""
        if not callable(func):
            raise TypeError("first argument to map must be a callable")
        items = list(zip(*iterables))
        if isinstance(key, (list, tuple)) and len(key) != len(items):
            raise ValueError("map: the list of keys must be as long as the iterables")
        prefix = key if isinstance(key, str) else _funcname(func)
        tasks, futures = [], []
        restrictions = _as_list(workers)
        pickled_func = _pickle_callable(func)
        for i, args in enumerate(items):
            spec, deps = _dumps_spec(pickled_func, args, kwargs)
            k = key[i] if isinstance(key, (list, tuple)) else \
                f"{prefix}-{hashlib.sha1(spec).hexdigest() if pure else uuid.uuid4().hex}"
            futures.append(Future(k, self))
            task = {"key": k, "spec": spec, "deps": deps, "workers": restrictions, "loose": allow_other_workers}
            self._specs[k] = task
            tasks.append(task)
        if tasks:
            self._send({"op": "update-graph", "tasks": tasks}, keep_alive=(func, items, kwargs))
        return futures

    # ---------------------------------------------------------------- results
    def _wait(self, key: str, timeout: float | None) -> _KeyState:
        st = self._states.get(key)
        if st is None:
            raise FutureCancelledError(key, "released")
        if not st.event.wait(timeout):
            raise TimeoutError(f"timed out after {timeout} s.")
        return st

    def gather(self, futures: Any, errors: str = "raise", timeout: float | None = None) -> Any:
        """Results of a future, or of a list/tuple/dict of futures (same shape back)."""
        flat: list[Future] = []
        _collect(futures, flat)
        keys = list(dict.fromkeys(f.key for f in flat))
        values = None
        if threading.current_thread() is not self._loop.thread:
            values = self._inline_results(keys, timeout)
        if values is None:
            values = self._loop.run(self._gather_keys(keys, errors, timeout), None)
        return _rebuild(futures, values)

    def _inline_results(self, keys: list[str], timeout: float | None) -> dict[str, Any] | None:
        """The results of ``keys`` when all of them came with their "in memory" news (small ones do), taken in
        the caller's thread: no trip through the client's loop, none to a worker. None when any key needs
        more (it erred, was cancelled, or its result is too large to travel that way): then the loop gathers."""
        deadline = None if timeout is None else time.monotonic() + timeout
        blobs = []
        for key in keys:
            st = self._states.get(key)
            if st is None:
                return None
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not st.event.wait(remaining):
                raise TimeoutError(f"timed out after {timeout} s.")
            blob = st.value
            if st.status != FINISHED or blob is None:
                return None
            blobs.append(blob)
        return {key: pickle.loads(blob) for key, blob in zip(keys, blobs)}

    async def _gather_keys(self, keys: list[str], errors: str, timeout: float | None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        results: dict[str, Any] = {}
        pending = list(keys)
        while pending:
            for key in pending:
                st = self._states.get(key)
                if st is None:
                    raise FutureCancelledError(key, "released")
                while st.status == PENDING:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError(f"timed out after {timeout} s.")
                    waiter = asyncio.get_running_loop().create_future()
                    st.waiters.append(waiter)
                    try:
                        await asyncio.wait_for(waiter, remaining)
                    except asyncio.TimeoutError:
                        raise TimeoutError(f"timed out after {timeout} s.") from None
            by_worker: dict[str, list[str]] = {}
            for key in list(pending):
                st = self._states[key]
                if st.status in (ERROR, CANCELLED):
                    if errors == "raise":
                        if st.status == CANCELLED:
                            raise FutureCancelledError(key, st.reason)
                        raise _build_exception(key, st.error or {})
                    pending.remove(key)
                elif st.value is not None:
                    results[key] = pickle.loads(st.value)
                    pending.remove(key)
                elif st.who_has:
                    by_worker.setdefault(st.who_has[0], []).append(key)
                else:
                    self._set(st, PENDING)
            for address, ks in by_worker.items():
                try:
                    stream = await self._worker(address)
                    reply = await stream.request("get-data", keys=ks, timeout=60)
                except (CommClosedError, RemoteError, asyncio.TimeoutError, OSError):
                    reply = {"data": {}, "missing": ks}
                for key, blob in reply["data"].items():
                    results[key] = pickle.loads(blob)
                    pending.remove(key)
                # Keys the worker "deferred" (a reply holds at most GET_DATA_BYTES) stay pending: asked again.
                for key, problem in (reply.get("unpicklable") or {}).items():
                    if errors == "raise":
                        raise TypeError(f"the result of {key!r} cannot be sent from its worker: {problem}")
                    pending.remove(key)
                if reply["missing"]:
                    await self._refresh_who_has(reply["missing"], address)
        return results

    async def _refresh_who_has(self, keys: list[str], failed: str) -> None:
        stream = self._stream
        if stream is None:
            await asyncio.sleep(0.05)
            return
        asked = {key: st.who_has for key in keys if (st := self._states.get(key)) is not None}
        who_has = await stream.request("who-has", keys=keys)
        for key in keys:
            st = self._states.get(key)
            if st is None or st.status != FINISHED or st.who_has is not asked.get(key):
                # Changed since we asked (news handled while the reply waited, e.g. the key computed again
                # elsewhere): the reply is older than what we know, and would undo it.
                continue
            holders = [a for a in who_has.get(key) or [] if a != failed]
            if holders:
                st.who_has = holders
            else:
                st.who_has = []
                self._set(st, PENDING)  # the scheduler will recompute it and tell us
        await asyncio.sleep(0.01)

    async def _worker(self, address: str) -> Stream:
        stream = self._workers.get(address)
        if stream is None or stream.closed:
            comm = await connect(address, self.credentials, timeout=self.timeout)
            stream = Stream(comm, {})
            background(stream.run())
            self._workers[address] = stream
        return stream

    # ---------------------------------------------------------------- data
    def scatter(self, data: Any, workers: Any = None, broadcast: bool = False) -> Any:
        """Place data on workers. It is *not* in the lineage: losing its last copy cannot be undone."""
        if isinstance(data, dict):
            items = list(data.items())
        elif isinstance(data, (list, tuple, set, frozenset)):
            items = []
            for value in data:
                blob = cloudpickle.dumps(value, protocol=5)
                items.append((f"{type(value).__name__}-{hashlib.sha1(blob).hexdigest()}", value))
        else:
            blob = cloudpickle.dumps(data, protocol=5)
            items = [(f"{type(data).__name__}-{hashlib.sha1(blob).hexdigest()}", data)]
        payload = {str(k): cloudpickle.dumps(v, protocol=5) for k, v in items}
        futures = {str(k): Future(str(k), self) for k, _ in items}

        async def place() -> None:
            if self._stream is None:
                raise CommClosedError(f"not connected to the scheduler at {self.scheduler_address}")
            who_has = await self._stream.request("scatter", data=payload, workers=_as_list(workers),
                                                 broadcast=broadcast)
            for key, holders in who_has.items():
                st = self._states.get(key)
                if st is not None:
                    st.who_has = holders
                    self._set(st, FINISHED)

        self._loop.run(place(), self.timeout + 30)
        if isinstance(data, dict):
            return {k: futures[str(k)] for k in data}
        if isinstance(data, (list, tuple, set, frozenset)):
            return type(data)(futures[str(k)] for k, _ in items) if isinstance(data, (list, tuple)) else \
                [futures[str(k)] for k, _ in items]
        return futures[str(items[0][0])]

    def replicate(self, futures: Any, n: int | None = None) -> dict:
        flat: list[Future] = []
        _collect(futures, flat)
        return self._request("replicate", keys=[f.key for f in flat], n=n, timeout=120)

    def who_has(self, futures: Any = None) -> dict[str, list[str]]:
        keys = None
        if futures is not None:
            flat: list[Future] = []
            _collect(futures, flat)
            keys = [f.key for f in flat]
        return self._request("who-has", keys=keys, timeout=self.timeout)

    # ---------------------------------------------------------------- cluster
    def run(self, function: Any, *args: Any, workers: Any = None, **kwargs: Any) -> dict[str, Any]:
        """Run ``function`` on every worker (or those named); ``{address: result}``."""
        spec = cloudpickle.dumps((function, args, kwargs), protocol=5)
        replies = self._request("run", spec=spec, workers=_as_list(workers), timeout=None)
        out = {}
        for address, reply in replies.items():
            if reply.get("status") == "ok":
                out[address] = pickle.loads(reply["result"])
            elif reply.get("status") == "error":
                raise _build_exception("run", {"type": "exception", **reply})
            else:
                raise CommClosedError(f"run on {address} failed: {reply.get('message')}")
        return out

    def scheduler_info(self) -> dict:
        return self._request("scheduler-info", timeout=self.timeout)

    def retire_workers(self, workers: Any = None, close_workers: bool = True) -> dict:
        names = _as_list(workers)
        if names is None:
            raise ValueError("retire_workers needs the addresses or names of the workers to retire")
        return self._request("retire-workers", workers=names, timeout=120)

    def restart(self, timeout: float = 60) -> "Client":
        """Kill every worker, flush the scheduler's task state, and wait for the workers to come back."""
        self._request("restart", timeout=timeout + 10, wait=timeout)
        return self

    def get_versions(self, check: bool = False, packages: list[str] | None = None) -> dict:
        info = self._request("get-versions", timeout=self.timeout)
        info["client"] = versions_mod.collect([*self.config["versions_packages"], *(packages or [])])
        if check:
            compared = info["compared"] + [p for p in packages or [] if p not in info["compared"]]
            rows: dict[str, dict[str, Any]] = {}
            peers = {"client": info["client"], **{f"worker {a}": v for a, v in info["workers"].items()}}
            for peer, peer_versions in peers.items():
                for diff in versions_mod.differences(info["scheduler"], peer_versions, compared):
                    rows.setdefault(diff["package"], {"scheduler": diff["ours"]})[peer] = diff["theirs"]
            if rows:
                lines = ["Mismatched versions found", ""]
                for package, row in sorted(rows.items()):
                    lines.append(f"  {package}: scheduler={row.pop('scheduler')}; "
                                 + "; ".join(f"{peer}={v}" for peer, v in row.items()))
                raise VersionMismatchError("\n".join(lines))
        return info

    def recreate_error_locally(self, future: Future) -> None:
        """Rerun the task that made ``future`` fail, here, so its exception is raised in this process."""
        st = self._wait(future.key, None)
        if st.status != ERROR:
            raise ValueError(f"{future.key!r} did not fail (status {st.status})")
        if (st.error or {}).get("type") != "exception":
            raise _build_exception(future.key, st.error or {})
        info = self._request("get-task-spec", key=future.key, timeout=self.timeout)
        if info["missing"]:
            raise ValueError(f"cannot recreate {info['key']!r} locally: its inputs {info['missing']} are no longer "
                             "in memory")

        async def fetch() -> dict:
            values: dict[str, Any] = {}
            for key, holders in info["deps"].items():
                for address in holders:
                    try:
                        reply = await (await self._worker(address)).request("get-data", keys=[key], timeout=60)
                    except (CommClosedError, RemoteError):
                        continue
                    if key in reply["data"]:
                        values[key] = pickle.loads(reply["data"][key])
                        break
            return values

        from kwdiag.runtime.worker import load_spec

        values = self._loop.run(fetch(), None)
        fn, args, kwargs = load_spec(info["spec"], values)
        fn(*args, **kwargs)
        raise RuntimeError(f"task {info['key']!r} did not raise when rerun locally (is it non-deterministic?)")

    # ---------------------------------------------------------------- closing
    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self.status = "closed"

        async def shutdown() -> None:
            if self._stream is not None:  # a goodbye: the scheduler releases our tasks now, not after a grace period
                self._stream.send({"op": "close-client"})
            for stream in [self._stream, *self._workers.values()]:
                if stream is not None:
                    await stream.drain(1.0)
                    stream.close()
        try:
            self._loop.run(shutdown(), 5)
        except Exception:
            pass
        self.rec.close()
        if self._owns_cluster and self.cluster is not None:
            self.cluster.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client: {self.scheduler_address!r} status={self.status}>"


def _as_list(workers: Any) -> list[str] | None:
    if workers is None:
        return None
    if isinstance(workers, str):
        return [workers]
    return [str(w) for w in workers]


def _collect(obj: Any, out: list[Future]) -> None:
    if isinstance(obj, Future):
        out.append(obj)
    elif isinstance(obj, (list, tuple, set)):
        for item in obj:
            _collect(item, out)
    elif isinstance(obj, dict):
        for item in obj.values():
            _collect(item, out)


def _rebuild(obj: Any, values: dict[str, Any]) -> Any:
    if isinstance(obj, Future):
        return values.get(obj.key)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_rebuild(item, values) for item in obj)
    if isinstance(obj, set):
        return [_rebuild(item, values) for item in obj]
    if isinstance(obj, dict):
        return {k: _rebuild(v, values) for k, v in obj.items()}
    return obj
