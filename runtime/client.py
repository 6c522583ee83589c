"""The Dask-compatible client: ``Client``, ``Future`` and their blocking API.

Covers: connecting (a ``LocalCluster``, an address, a scheduler file, or — with no argument —
the cluster ``kwdiag run`` announced in the environment, else a new ``LocalCluster``); submitting tasks
whose arguments may hold futures (they become dependencies, found while pickling) with Dask's keywords
(``key``, ``pure``, ``retries``, ``priority``, ``workers``, ``allow_other_workers``); tracking each key's
state from the scheduler's reports; fetching results straight from the workers that hold them; raising a
task's own exception (with a traceback into the task), ``KilledWorker`` or ``ScatteredDataLost``;
cancel, retry, done-callbacks; reference counting futures so the scheduler can release what nobody
holds; Dask collections (``compute``, ``persist``, ``get``, and ``dask.compute`` with this client as
Dask's scheduler); and reconnecting when the scheduler comes back (re-reading the scheduler file, so a
scheduler that returns on another port or host is found), keeping every future: a scheduler that
recovered its journal still knows them, and one that did not gets them submitted again.

Does not cover: scheduling (the scheduler decides), ``as_completed``/``wait``/``fire_and_forget``
(``runtime.futures``), what a task may ask of its worker (``runtime.worker_context``), or an
asynchronous API (all calls block; the event loop runs in one background thread shared by every client
of the process). Dask's methods kwdiag does not have raise ``NotImplementedError`` saying why
(``NOT_SUPPORTED``), and so do keywords it does not support; no keyword of Dask's reaches a task's function.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import contextvars
import hashlib
import importlib.util
import io
import itertools
import logging
import os
import pickle
import threading
import time
import types
import uuid
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator

import cloudpickle

from kwdiag.runtime import config as config_mod
from kwdiag.runtime import versions as versions_mod
from kwdiag.runtime.comm import CommClosedError, Credentials, Security, connect
from kwdiag.runtime.core import RemoteError, Stream, background
from kwdiag.runtime.dask_graphs import KeyRef
from kwdiag.runtime.exceptions import (FutureCancelledError, KilledWorker, ScatteredDataLost, VersionMismatchError,
                                       VersionMismatchWarning)
from kwdiag.runtime.loopthread import LoopThread
from kwdiag.runtime.record import Recorder
from kwdiag.runtime.tracebacks import rebuild as rebuild_traceback

logger = logging.getLogger("kwdiag.client")

PENDING, FINISHED, ERROR, CANCELLED = "pending", "finished", "error", "cancelled"
CONFIRM_DELAY = 0.2   # seconds between a message and the ping that confirms the scheduler has it
# Releases of collected futures wait this long for company: the next submission takes them along in its frame
# (a loop of ``submit(...).result()`` then sends one frame per task, not two), as Dask's client batches every
# message for 10 ms. A key is never released early by this, only a little late.
RELEASE_BATCH_DELAY = 0.005
# Requests that change nothing on the cluster (or nothing more when repeated): asked again after a broken connection.
IDEMPOTENT = {"scheduler-info", "who-has", "has-what", "get-versions", "get-task-spec", "ping", "cancel", "retry"}

_LIVE: "weakref.WeakSet[Client]" = weakref.WeakSet()
_current_client: contextvars.ContextVar["Client | None"] = contextvars.ContextVar("kwdiag_client", default=None)
_default_client: "weakref.ref[Client] | None" = None
_callback_executor: ThreadPoolExecutor | None = None   # runs Future.add_done_callback callbacks, as Dask's one thread
_callback_lock = threading.Lock()

# Dask's Client methods kwdiag does not have, and why; each raises NotImplementedError saying so.
NOT_SUPPORTED = {
    "run_on_scheduler": "the scheduler never unpickles anything a client sends (it passes task payloads on as "
                        "opaque bytes); run the function on the workers with client.run",
    "upload_file": "workers import the same modules as the process that started them (the spawn seam passes "
                   "sys.path); install or place the file where the workers can import it",
    "register_plugin": "kwdiag's processes record their own lifecycle events; there are no plugin hooks",
    "register_worker_callbacks": "there are no plugin hooks; use client.run for one-off setup",
    "unregister_worker_plugin": "there are no plugin hooks",
    "unregister_scheduler_plugin": "there are no plugin hooks",
    "publish_dataset": "there is no named-dataset store; keep the futures in your program",
    "unpublish_dataset": "there is no named-dataset store",
    "get_dataset": "there is no named-dataset store",
    "list_datasets": "there is no named-dataset store",
    "get_task_stream": "there is no task-stream recorder; `kwdiag explain` on the run directory shows each "
                       "task's worker deaths, and the JSONL events each task error",
    "profile": "there is no statistical profiler",
    "get_executor": "there is no concurrent.futures.Executor adapter",
    "rebalance": "there is no active memory manager; replicate copies data",
    "get_scheduler_logs": "logs are files in the run directory: `kwdiag explain DIR`",
    "get_worker_logs": "logs are files in the run directory: `kwdiag explain DIR`",
    "get_events": "events are JSONL files in the run directory (docs/events.md)",
    "subscribe_topic": "there is no event topic bus",
    "unsubscribe_topic": "there is no event topic bus",
    "log_event": "there is no event topic bus",
    "set_metadata": "there is no scheduler metadata store",
    "get_metadata": "there is no scheduler metadata store",
    "dump_cluster_state": "the scheduler's journal in the run directory holds its state",
    "story": "the JSONL events in the run directory tell each task's and worker's story",
    "benchmark_hardware": "not implemented",
    "call_stack": "not implemented",
    "processing": "client.scheduler_info() lists each worker's executing tasks",
    "restart_workers": "client.restart() restarts every worker",
    "forward_logging": "worker logs go to their own stderr and the run directory",
    "unforward_logging": "worker logs go to their own stderr and the run directory",
    "start_ipython_workers": "not implemented",
    "start_ipython_scheduler": "not implemented",
    "write_scheduler_file": "clusters write their scheduler file themselves (--scheduler-file)",
    "amm": "there is no active memory manager",
    "get_task_metadata": "not implemented",
    "nbytes": "result sizes are in the scheduler's JSONL events; client.who_has says where results are",
    "normalize_collection": "Dask collections are submitted whole (client.compute, client.persist)",
    "dashboard_link": "there is no dashboard: `kwdiag run` shows a live view in the terminal",
    "start": "there is no asynchronous client to start; Client() connects when it is created",
    "sync": "there is no asynchronous client; every call blocks",
}


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
    """One key as this client knows it. Futures hold it; a cancel or a restart replaces it in the client, so a
    new submission of the same key starts afresh while old futures stay cancelled (as Dask's FutureState)."""

    __slots__ = ("status", "who_has", "error", "event", "reason", "waiters", "value", "listeners")

    def __init__(self) -> None:
        self.status = PENDING
        self.who_has: list[str] = []
        self.value: bytes | None = None  # a small result's pickle, sent with its "in memory" news
        self.error: dict | None = None
        self.reason = ""
        self.event = threading.Event()   # for callers' threads
        self.waiters: list[asyncio.Future] = []  # for coroutines on the client loop
        self.listeners: list[Callable[[], None]] = []   # called on the client loop once it is done


_DYNAMIC_CODE = "<dynamic-code>"
_cloudpickle_code_reduce = cloudpickle.CloudPickler.dispatch_table.get(types.CodeType)


def _code_reduce_keeping_file(code: types.CodeType) -> tuple:
    """cloudpickle's reduction of a code object, with the code's own file name where cloudpickle 3 writes
    ``<dynamic-code>`` (for payloads that do not depend on where a function was defined): a function from the
    job script then crashes, raises and shows in tracebacks and faulthandler dumps as ``job.py:12``, the file
    the user can open, not ``<dynamic-code>:12``."""
    reduced = _cloudpickle_code_reduce(code)
    if not (isinstance(reduced, tuple) and len(reduced) == 2 and isinstance(reduced[1], tuple)):
        return reduced   # another cloudpickle's shape: as it is
    ctor, args = reduced
    return ctor, tuple(code.co_filename if type(a) is str and a == _DYNAMIC_CODE else a for a in args)


class _SpecPickler(cloudpickle.CloudPickler):
    """Pickles ``(fn, args, kwargs)``, turning every Future inside (and every ``KeyRef`` of a Dask graph) into a
    dependency reference."""

    if _cloudpickle_code_reduce is not None:   # cloudpickle reduces code objects itself (3.x renames their file)
        dispatch_table = collections.ChainMap({types.CodeType: _code_reduce_keeping_file},
                                              cloudpickle.CloudPickler.dispatch_table)

    def __init__(self, file: io.BytesIO, deps: list[str]):
        super().__init__(file, protocol=5)
        self.deps = deps

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is Future or type(obj) is KeyRef:
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


# Argument types that can hold no future and that the standard pickler writes as cloudpickle does.
_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})


def _dumps_spec(fn: Any, args: tuple, kwargs: dict) -> tuple[bytes, list[str]]:
    if type(fn) is _PickledCallable and all(type(a) in _PLAIN for a in args) \
            and all(type(v) in _PLAIN for v in kwargs.values()):
        # map(f, range(n)) and the like: nothing to look into, and the C pickler takes ~3 us where making and
        # running a CloudPickler per task takes ~8
        return pickle.dumps((fn, args, kwargs), protocol=5), []
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
        tb = rebuild_traceback(error.get("frames") or ())
        if tb is not None:
            exc = exc.with_traceback(tb)
        # The worker's own text too: its source lines, and any chained exceptions (the frames above have no
        # source where the client lacks the task's files).
        if error.get("traceback") and hasattr(exc, "add_note"):
            exc.add_note(f"Remote traceback (task {error.get('key')!r}):\n{error['traceback'].rstrip()}")
        return exc
    return RuntimeError(error.get("message") or f"task {key!r} failed")


def _unsupported(name: str, value: Any, reason: str) -> None:
    raise NotImplementedError(f"{name}={value!r} is not supported by kwdiag's runtime: {reason}")


def _check_task_keywords(resources: Any, actor: Any, actors: Any) -> None:
    if resources:
        _unsupported("resources", resources, "workers declare no resources; use workers= to choose where a task runs")
    if actor or actors:
        _unsupported("actor" if actor else "actors", actor or actors, "there are no actors (stateful remote objects)")


def _run_callback(fn: Callable[[Any], Any], future: "Future") -> None:
    try:
        fn(future)
    except Exception:
        logger.exception("Error in the done-callback %r of %r", fn, future)


def _callbacks() -> ThreadPoolExecutor:
    global _callback_executor
    with _callback_lock:
        if _callback_executor is None:
            _callback_executor = ThreadPoolExecutor(1, thread_name_prefix="kwdiag-callback")
        return _callback_executor


class Future:
    """A handle to one task's result on the cluster."""

    __slots__ = ("key", "client", "_state", "_cleared", "__weakref__")

    def __init__(self, key: str, client: "Client"):
        self.key = key
        self.client = client
        self._cleared = False   # released: its reference is given back (once)
        self._state = client._inc_ref(key)

    @property
    def status(self) -> str:
        """``pending``, ``finished``, ``error`` or ``cancelled``."""
        return self._state.status

    def done(self) -> bool:
        return self._state.status != PENDING

    def cancelled(self) -> bool:
        return self._state.status == CANCELLED

    def result(self, timeout: float | None = None) -> Any:
        return self.client.gather(self, timeout=timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The exception the task raised; None if it finished or was cancelled (as Dask's)."""
        st = self.client._wait(self._state, timeout)
        if st.status == ERROR:
            exc = _build_exception(self.key, st.error or {})
            return self.client._explained(exc) if isinstance(exc, KilledWorker) else exc
        return None

    def traceback(self, timeout: float | None = None) -> Any:
        """The traceback of the task's exception: its frames are the task's, on the worker. None if it did not
        fail."""
        exc = self.exception(timeout)
        return exc.__traceback__ if exc is not None and self._state.status == ERROR else None

    def cancel(self, reason: str | None = None, msg: str | None = None, **kwargs: Any) -> None:
        self.client.cancel([self], reason=reason, msg=msg, **kwargs)

    def retry(self) -> None:
        self.client.retry([self])

    def add_done_callback(self, fn: Callable[["Future"], Any]) -> None:
        """Call ``fn(future)`` once it is done (finished, erred or cancelled), in a separate thread, as Dask."""
        self.client._when_done(self._state, lambda: _callbacks().submit(_run_callback, fn, self))

    def release(self) -> None:
        """Give this future's reference back now; when it was the last, the key is released (and, as in Dask,
        the future is cancelled)."""
        if not self._cleared:
            self._cleared = True
            self.client._dec_ref(self.key)

    def __del__(self) -> None:
        # Garbage collection can run this anywhere — even inside the client's own locked sections — so it
        # must not take a lock: it only queues the release for the client's event loop.
        if getattr(self, "_cleared", True):
            return
        self._cleared = True
        try:
            self.client._release_later(self.key)
        except Exception:
            pass

    def __dask_tokenize__(self) -> tuple:
        return ("kwdiag-future", self.key)

    def __reduce__(self):
        raise TypeError("a kwdiag Future can only be passed as a task argument of the client that owns it")

    def __repr__(self) -> str:
        return f"<Future: {self.status}, key: {self.key}>"

class Client:
    """Connect to a kwdiag cluster and run work on it, with Dask's Futures API (see docs/runtime.md's table)."""

    def __init__(self, address: Any = None, loop: Any = None, timeout: float = 10.0, set_as_default: bool = True,
                 scheduler_file: str | None = None, security: Security | None = None, asynchronous: bool = False,
                 name: str | None = None, heartbeat_interval: Any = None, serializers: Any = None,
                 deserializers: Any = None, direct_to_workers: Any = None, connection_limit: int = 512, *,
                 secret: bytes | str | None = None, **cluster_kwargs: Any):
        """Connect to a scheduler (an address, a scheduler file, a LocalCluster, the environment, or a new
        LocalCluster as Dask does, with ``cluster_kwargs`` such as ``n_workers``), then set up the state every
        later call reads."""
        if asynchronous:
            _unsupported("asynchronous", asynchronous, "every call blocks (the event loop runs in a thread)")
        if serializers or deserializers:
            _unsupported("serializers" if serializers else "deserializers", serializers or deserializers,
                         "task payloads are always cloudpickled")
        self.id = name or f"Client-{uuid.uuid4().hex[:12]}"
        self.cluster: Any = None
        self._owns_cluster = False
        address, secret, security, log_dir = self._resolve_scheduler(address, scheduler_file, secret, security,
                                                                     cluster_kwargs)
        self.scheduler_address: str = address
        self.secret: bytes = secret
        self.security = security
        self.credentials = Credentials(secret, security)
        from kwdiag.runtime.identity import Follower

        self._follower = Follower(address, secret, self.cluster.scheduler_file if self.cluster else scheduler_file)
        self._lost_at: float | None = None  # wall-clock time the scheduler connection broke
        self.timeout = timeout
        self.config = config_mod.load()
        self._loop = LoopThread.get()
        self._states: dict[str, _KeyState] = {}   # key -> its current state (futures hold theirs)
        self._refcount: dict[str, int] = {}        # key -> live futures of it
        self._lock = threading.Lock()
        # Keys whose futures were collected, each with its place in the order of what the program did (the same
        # counter numbers every message queued for the scheduler): their releases keep that order.
        self._garbage: collections.deque[tuple[int, str]] = collections.deque()
        self._order = itertools.count()
        self._unsent: collections.deque[int] = collections.deque()  # numbers of messages queued, not yet sent
        self._drain_pending = False  # a drain is already queued on the loop: one wake-up serves many releases
        # The task spec of every live future, so that work lost with a scheduler can be submitted again.
        self._specs: dict[str, dict] = {}
        # Submissions and releases the scheduler has not confirmed (see _post), sent again on reconnection.
        self._unconfirmed: list[dict] = []
        self._confirming = False
        self._stream: Stream | None = None
        self._workers: dict[str, Stream] = {}
        self._closing = False
        self._dask_config: Any = None   # the dask.config.set() that made this client Dask's scheduler
        self.status = "connecting"
        self.rec = Recorder("kwdiag.client", source="client", log_dir=log_dir, file_stem=f"client-{os.getpid()}")
        self._reported_killed: set[str] = set()
        self._notes: dict[str, str] = {}   # task -> kwdiag's note for its KilledWorker ("": none could be made)
        self.versions = versions_mod.collect(self.config["versions_packages"])
        self.handlers = {"key-in-memory": self._on_in_memory, "task-erred": self._on_erred,
                         "key-lost": self._on_lost, "cancelled": self._on_cancelled, "retrying": self._on_retrying}
        self._start(timeout, set_as_default)

    def _start(self, timeout: float, set_as_default: bool) -> None:
        """Connect (closing the cluster this client started if that fails) and become the default client."""
        try:
            warning = self._loop.run(self._connect(first=True), timeout + 5).get("warning")
        except BaseException:
            if self._owns_cluster and self.cluster is not None:
                self.cluster.close()
            raise
        self.status = "running"
        _LIVE.add(self)
        if set_as_default:
            self._set_as_default()
        self.rec.event("client-start", f"Client {self.id} connected to {self.scheduler_address}",
                       scheduler=self.scheduler_address)
        if warning:
            warnings.warn(VersionMismatchWarning(warning), stacklevel=3)  # at the user's Client(...) line

    def _resolve_scheduler(self, address: Any, scheduler_file: str | None, secret: bytes | str | None,
                           security: Security | None, cluster_kwargs: dict) -> tuple[str, bytes, Any, str | None]:
        """(address, secret, security, log dir) of the scheduler to connect to, in the order Dask resolves them:
        an address or a LocalCluster given, a scheduler file, the environment, else a new LocalCluster (which
        this client then owns and closes)."""
        from kwdiag.runtime.cluster import LocalCluster  # only for Client() with no address: it starts one

        log_dir = os.environ.get("KWDIAG_LOG_DIR") or None
        if isinstance(secret, str):
            secret = bytes.fromhex(secret)
        if address is None and scheduler_file is None:
            scheduler_file = os.environ.get("KWDIAG_SCHEDULER_FILE") or None
            if scheduler_file is None:
                address = os.environ.get("KWDIAG_SCHEDULER_ADDRESS") or None
                if address is None:
                    address = LocalCluster(**cluster_kwargs)
                    self._owns_cluster = True
        elif cluster_kwargs:
            raise TypeError(f"unexpected keyword arguments {sorted(cluster_kwargs)} (they are LocalCluster's, "
                            "for a Client that starts its own cluster)")
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
        return address, secret, security, log_dir

    # ---------------------------------------------------------------- the default client, and Dask's scheduler
    def _set_as_default(self) -> None:
        """This client is the process's default (``get_client()``, ``Client.current()``) and, when Dask is
        installed, Dask's scheduler (``dask.compute``, ``.compute()``), as a new ``distributed.Client`` is."""
        global _default_client
        _default_client = weakref.ref(self)
        if importlib.util.find_spec("dask") is not None:
            import dask.config

            self._dask_config = dask.config.set(scheduler=dask_get)

    @classmethod
    def current(cls, allow_global: bool = True) -> "Client":
        """The client of ``as_current()`` here, else the default client; ``ValueError`` when there is none."""
        client = _current_client.get()
        if client is None and allow_global and _default_client is not None:
            client = _default_client()
        if client is None or client.status == "closed":
            raise ValueError("No clients found: start one with Client(...)")
        return client

    @contextlib.contextmanager
    def as_current(self) -> Iterator["Client"]:
        """Within the block, this client is the current one: ``get_client()`` and ``dask.compute`` use it."""
        token = _current_client.set(self)
        config = None
        if importlib.util.find_spec("dask") is not None:
            import dask.config

            config = dask.config.set(scheduler=dask_get)
        try:
            yield self
        finally:
            if config is not None:
                config.__exit__(None, None, None)
            _current_client.reset(token)

    def __getattr__(self, name: str) -> Any:
        if name in NOT_SUPPORTED:
            raise NotImplementedError(f"Client.{name} is not supported by kwdiag's runtime: {NOT_SUPPORTED[name]}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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
            except Exception as exc:   # never let the reconnection die quietly: the client would wait for ever
                logger.warning("Reconnecting to %s failed: %s: %s; trying again", self.scheduler_address,
                               type(exc).__name__, exc)
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
            self.status = "running"
            if not reply.get("known"):
                self._forget_results()
            # What the scheduler may not have (sent after the last confirmation, or while it was away), in the
            # order it was sent: a submission made while away is followed by the releases it allowed.
            for message in list(self._unconfirmed):
                self._stream.send(message)
            self._confirm_soon()
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
        order = next(self._order)
        self._unsent.append(order)

        def send() -> None:
            self._unsent.popleft()   # this one (the loop runs them in the order they were queued)
            # Releases waiting for company go ahead of it in the same frame, but only those of futures dropped
            # before it was queued: one dropped since (``fire_and_forget(client.map(...))``'s list, while the loop
            # had not yet sent the map) was alive when the program asked for this, and is released after it.
            if self._garbage:
                self._drain_garbage(before=order)
            self._post(message)
            if self._stream is not None:
                self._stream.flush()   # now, not a loop turn later: a submission is what the user waits on
        send.keep_alive = keep_alive  # type: ignore[attr-defined]  # dropped with the callback, after it ran
        self._loop.call(send)

    # ---------------------------------------------------------------- messages the scheduler must not miss
    def _post(self, message: dict) -> None:
        """Send a message that changes what the scheduler knows (a submission, a release); on the loop. It is
        kept until a later ``ping`` is answered — the scheduler answers in order, after it has journalled
        what came before — so that a scheduler which died before it read it, or while the client was away,
        gets it again on reconnection, in the same order."""
        self._unconfirmed.append(message)
        if self._stream is not None:
            self._stream.send(message)
            self._confirm_soon()

    def _confirm_soon(self) -> None:
        if not self._confirming and self._unconfirmed:
            self._confirming = True
            background(self._confirm())

    async def _confirm(self) -> None:
        await asyncio.sleep(CONFIRM_DELAY)   # one ping confirms every message of that moment
        stream, sent = self._stream, len(self._unconfirmed)
        try:
            if stream is not None:
                await stream.request("ping", timeout=self.timeout)
                del self._unconfirmed[:sent]
        except RemoteError:   # a scheduler that does not know "ping" still answered: it read what came before
            del self._unconfirmed[:sent]
        except Exception:   # the scheduler went away: the messages stay, and are sent again to its successor
            pass
        finally:
            self._confirming = False
        if self._stream is not None:
            self._confirm_soon()

    def _request(self, op: str, timeout: float | None = None, **fields: Any) -> Any:
        """Ask the scheduler and wait for its answer. While the client is reconnecting (the scheduler died and
        is expected back), the request waits for the connection, as Dask's do, rather than failing at once; a
        question that changes nothing (``IDEMPOTENT``) asked just as the connection broke is asked again."""
        async def request() -> Any:
            for attempt in range(2):
                stream = await self._scheduler_stream()
                try:
                    return await stream.request(op, **fields)
                except CommClosedError:
                    if attempt or op not in IDEMPOTENT or self._closing:
                        raise
                    await asyncio.sleep(0.05)   # the broken connection is noticed, a reconnection begins
        return self._loop.run(request(), timeout)

    async def _scheduler_stream(self) -> Stream:
        """The connection to the scheduler, waiting for it while a reconnection is under way."""
        while self._stream is None and self.status == "reconnecting":
            await asyncio.sleep(0.05)
        if self._stream is None:
            raise CommClosedError(f"not connected to the scheduler at {self.scheduler_address}")
        if self._garbage:   # futures dropped before this request are released before it, in program order
            self._drain_garbage()   # (a cancel must not reach a dependent the client had already dropped)
        return self._stream

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
        listeners, st.listeners = st.listeners, []
        for listener in listeners:
            listener()

    def _when_done(self, st: _KeyState, listener: Callable[[], None]) -> None:
        """Call ``listener()`` on the client loop once ``st`` is done (now, if it is)."""
        def register() -> None:
            if st.status != PENDING:
                listener()
            else:
                st.listeners.append(listener)
        self._loop.call(register)

    def _on_in_memory(self, stream: Stream, msg: dict) -> None:
        st = self._states.get(msg["key"])
        if st is not None and st.status != CANCELLED:
            st.who_has = list(msg.get("who_has") or [])
            value = msg.get("value")
            st.value = value if isinstance(value, bytes) else None
            st.error = None
            self._set(st, FINISHED)

    def _on_erred(self, stream: Stream, msg: dict) -> None:
        st = self._states.get(msg["key"])
        if st is None or st.status == CANCELLED:
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
        reason = msg.get("reason") or "cancelled"
        for key in msg["keys"]:
            # After a restart every key is new again: a later submission of it starts afresh (as Dask clears
            # its futures on restart); other cancels leave the cancelled state to the futures that hold it.
            st = self._states.pop(key, None) if reason == "restart" else self._states.get(key)
            if st is not None:
                self._set(st, CANCELLED, reason=reason)

    def _on_retrying(self, stream: Stream, msg: dict) -> None:
        for key in msg["keys"]:
            st = self._states.get(key)
            if st is not None and st.status == ERROR:
                st.error = None
                self._set(st, PENDING)

    # ---------------------------------------------------------------- reference counting
    def _inc_ref(self, key: str) -> _KeyState:
        with self._lock:
            self._refcount[key] = self._refcount.get(key, 0) + 1
            st = self._states.get(key)
            if st is None:
                st = self._states[key] = _KeyState()
            return st

    def _release_later(self, key: str) -> None:
        self._garbage.append((next(self._order), key))  # deque.append is atomic: safe from __del__ in any thread
        if self._drain_pending:  # queued and not yet started: that drain will take this key too
            return
        self._drain_pending = True
        try:
            self._loop.loop.call_soon_threadsafe(self._loop.loop.call_later, RELEASE_BATCH_DELAY,
                                                 self._drain_garbage)
        except RuntimeError:  # the loop is gone (interpreter shutdown)
            pass

    def _drain_garbage(self, before: int | None = None) -> None:
        """Release the keys of collected futures that the program dropped before the oldest message still waiting
        for the loop (or before message number ``before``, which is being sent): a release never overtakes
        something the program asked for while that future was alive. What must wait is taken by the next
        message or the batching timer, which this re-arms."""
        timer = before is None
        if timer:
            # Cleared before draining: a key appended after this line either is drained below or queues a new drain.
            self._drain_pending = False
            before = self._unsent[0] if self._unsent else None
        released = []
        while self._garbage and (before is None or self._garbage[0][0] < before):
            _, key = self._garbage.popleft()
            if self._forget(key):
                released.append(key)
        self._send_release(released)
        if timer and self._garbage and not self._drain_pending:
            self._drain_pending = True
            self._loop.loop.call_later(RELEASE_BATCH_DELAY, self._drain_garbage)

    def _dec_ref(self, key: str) -> None:
        if self._forget(key):
            self._send_release([key])

    def _forget(self, key: str) -> bool:
        """Drop one reference to ``key``; True when it was the last, so the scheduler may release it. A future
        still held after that (one released explicitly) is then cancelled, as Dask's."""
        with self._lock:
            count = self._refcount.get(key)
            if count is None:
                return False
            if count > 1:
                self._refcount[key] = count - 1
                return False
            del self._refcount[key]
            st = self._states.pop(key, None)
            self._specs.pop(key, None)
        if st is not None:
            if threading.current_thread() is self._loop.thread:
                self._set(st, CANCELLED, reason="released")
            else:
                self._loop.call(self._set, st, CANCELLED, "released")
        return True

    def _send_release(self, keys: list[str]) -> None:
        if not keys or self._closing:
            return

        def release() -> None:  # on the loop, where reconnection runs: no release slips between the two
            self._post({"op": "release-keys", "keys": keys})
        if threading.current_thread() is self._loop.thread:
            release()
        else:
            self._loop.call(release)

    # ---------------------------------------------------------------- submitting
    def submit(self, func: Any, *args: Any, key: str | None = None, workers: Any = None, resources: Any = None,
               retries: int | None = None, priority: int = 0, fifo_timeout: Any = "100 ms",
               allow_other_workers: bool = False, actor: bool = False, actors: bool = False, pure: bool = True,
               **kwargs: Any) -> Future:
        """Run ``func(*args, **kwargs)`` on the cluster; futures among the arguments become dependencies.

        ``workers=`` restricts where it runs (addresses or names); with ``allow_other_workers=True`` that is
        only a preference. A higher ``priority`` runs first among ready tasks; ``retries`` reruns a task that
        raised. ``fifo_timeout`` is accepted and has no effect (ready tasks run by priority, then in submission
        order). A pure submission of a key this client already holds returns another future of it."""
        if not callable(func):
            raise TypeError("First input to submit must be a callable function")
        _check_task_keywords(resources, actor, actors)
        spec, deps = _dumps_spec(_pickle_callable(func), args, kwargs)
        if key is None:
            key = f"{_funcname(func)}-{hashlib.sha1(spec).hexdigest() if pure else uuid.uuid4().hex}"
        return self._submit_specs([{"key": key, "spec": spec, "deps": deps, "workers": _as_list(workers),
                                    "loose": allow_other_workers, "priority": priority, "retries": retries}],
                                  [key], keep_alive=(func, args, kwargs))[key]

    def map(self, func: Any, *iterables: Iterable, key: str | list[str] | None = None, workers: Any = None,
            retries: int | None = None, resources: Any = None, priority: int = 0, allow_other_workers: bool = False,
            fifo_timeout: Any = "100 ms", actor: bool = False, actors: bool = False, pure: bool = True,
            batch_size: int | None = None, **kwargs: Any) -> list[Future]:
        """``submit`` for each element of the zipped iterables, sent to the scheduler in one message
        (``batch_size`` is accepted and has no effect: one message is cheap)."""
        if not callable(func):
            raise TypeError("First input to map must be a callable function")
        _check_task_keywords(resources, actor, actors)
        items = list(zip(*iterables))
        if isinstance(key, (list, tuple)) and len(key) != len(items):
            raise ValueError("map: the list of keys must be as long as the iterables")
        prefix = key if isinstance(key, str) else _funcname(func)
        specs, keys = [], []
        restrictions = _as_list(workers)
        pickled_func = _pickle_callable(func)
        for i, args in enumerate(items):
            spec, deps = _dumps_spec(pickled_func, args, kwargs)
            k = key[i] if isinstance(key, (list, tuple)) else \
                f"{prefix}-{hashlib.sha1(spec).hexdigest() if pure else uuid.uuid4().hex}"
            keys.append(k)
            specs.append({"key": k, "spec": spec, "deps": deps, "workers": restrictions, "loose": allow_other_workers,
                          "priority": priority, "retries": retries})
        futures = self._submit_specs(specs, keys, keep_alive=(func, items, kwargs))
        return [futures[k] for k in keys]

    def _submit_specs(self, specs: list[dict], wanted: list[str], keep_alive: Any = None) -> dict[str, Future]:
        """Futures of ``wanted`` (keys among ``specs``), the specs sent in one message. A key this client already
        holds is not sent again: its futures share its state (as Dask's)."""
        with self._lock:
            held = {k for k in wanted if k in self._states}
        futures = {k: Future(k, self) for k in wanted}
        fresh = [spec for spec in specs if spec["key"] not in held]
        for spec in fresh:
            if spec["key"] in futures:
                self._specs[spec["key"]] = spec
        if fresh:
            self._send({"op": "update-graph", "tasks": fresh}, keep_alive=keep_alive)
        return futures


    # ---------------------------------------------------------------- results
    def _wait(self, st: _KeyState, timeout: Any) -> _KeyState:
        timeout = config_mod.parse_timedelta(timeout)
        if not st.event.wait(timeout):
            raise TimeoutError(f"timed out after {timeout} s.")
        return st

    def gather(self, futures: Any, errors: str = "raise", direct: Any = None, asynchronous: Any = None, *,
               timeout: float | None = None) -> Any:
        """Results of a future, or of a list/tuple/dict of futures (same shape back). ``errors="skip"`` leaves
        failed or cancelled futures out of a list (None in their place elsewhere), as Dask does."""
        if errors not in ("raise", "skip"):
            raise ValueError(f"errors must be 'raise' or 'skip', not {errors!r}")
        timeout = config_mod.parse_timedelta(timeout)
        if asynchronous:
            _unsupported("asynchronous", asynchronous, "every call blocks")
        flat: list[Future] = []
        _collect(futures, flat)
        states = {}
        for f in flat:
            if f.client is not self:
                raise ValueError("Cannot gather Futures created by another client")
            states.setdefault(f.key, f._state)
        values = None
        if threading.current_thread() is not self._loop.thread:
            values = self._inline_results(states, timeout)
        if values is None:
            try:
                values = self._loop.run(self._gather_keys(states, errors, timeout), None)
            except KilledWorker as exc:
                raise self._explained(exc) from None
        if errors == "skip" and isinstance(futures, list):
            futures = [f for f in futures if not isinstance(f, Future) or f.key in values]
        return _rebuild(futures, values)

    def _inline_results(self, states: dict[str, _KeyState], timeout: float | None) -> dict[str, Any] | None:
        """The results of ``keys`` when all of them came with their "in memory" news (small ones do), taken in
        the caller's thread: no trip through the client's loop, none to a worker. None when any key needs
        more (it erred, was cancelled, or its result is too large to travel that way): then the loop gathers."""
        deadline = None if timeout is None else time.monotonic() + timeout
        blobs = []
        for st in states.values():
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not st.event.wait(remaining):
                raise TimeoutError(f"timed out after {timeout} s.")
            blob = st.value
            if st.status != FINISHED or blob is None:
                return None
            blobs.append(blob)
        return {key: pickle.loads(blob) for key, blob in zip(states, blobs)}

    async def _gather_keys(self, states: dict[str, _KeyState], errors: str, timeout: float | None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        results: dict[str, Any] = {}
        pending = list(states)
        while pending:
            for key in pending:
                st = states[key]
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
                st = states[key]
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

    # ---------------------------------------------------------------- KilledWorker, explained
    def _explained(self, exc: KilledWorker) -> KilledWorker:
        """``exc`` with kwdiag's verdict on the deaths counted against its task as a note (PEP 678): the lines of
        ``kwdiag explain LOG_DIR --note-for TASK``, run as a separate process (the runtime imports no analysis)
        in the caller's thread, once per task. ``KWDIAG_KILLED_WORKER_NOTE=0`` turns it off."""
        if not exc.log_dir or os.environ.get("KWDIAG_KILLED_WORKER_NOTE", "1") == "0":
            return exc
        note = self._notes.get(exc.task)
        if note is None:
            note = self._notes[exc.task] = _killed_worker_note(exc.log_dir, exc.task)
        if note and note not in getattr(exc, "__notes__", ()):
            exc.add_note(note)
        return exc

    # ---------------------------------------------------------------- cancel, retry
    def cancel(self, futures: Any, asynchronous: Any = None, force: bool = False, reason: str | None = None,
               msg: str | None = None) -> None:
        """Cancel the futures' tasks (and the dependents this client holds of them): running ones are dropped
        by their workers, and ``result()`` raises ``CancelledError``. With ``force``, also for other clients."""
        flat: list[Future] = []
        _collect(futures, flat)
        keys = list(dict.fromkeys(f.key for f in flat))
        if not keys:
            return
        why = reason or "cancelled"

        async def cancel() -> None:
            await (await self._scheduler_stream()).request("cancel", keys=keys, force=force, reason=why)
            for key in keys:
                st = self._states.pop(key, None)
                if st is not None:
                    self._set(st, CANCELLED, reason=why)
            for future in flat:   # a future of a state replaced meanwhile is cancelled too
                if future._state.status == PENDING:
                    self._set(future._state, CANCELLED, reason=why)
        self._loop.run(cancel(), self.timeout + 30)

    def retry(self, futures: Any, asynchronous: Any = None) -> None:
        """Run again the tasks of erred futures (and the erred tasks they depend on)."""
        flat: list[Future] = []
        _collect(futures, flat)
        keys = list(dict.fromkeys(f.key for f in flat))

        async def retry() -> None:
            reset = await (await self._scheduler_stream()).request("retry", keys=keys)
            for key in reset:
                st = self._states.get(key)
                if st is not None and st.status == ERROR:
                    st.error = None
                    self._set(st, PENDING)
        if keys:
            self._loop.run(retry(), self.timeout + 30)

    # ---------------------------------------------------------------- data
    def scatter(self, data: Any, workers: Any = None, broadcast: bool = False, direct: Any = None,
                hash: bool = True, timeout: Any = None, asynchronous: Any = None) -> Any:
        """Place data on workers (on all of them with ``broadcast``). It is *not* in the lineage: losing its last
        copy cannot be undone. Keys are the data's hash (``hash=False``: random keys)."""
        if asynchronous:
            _unsupported("asynchronous", asynchronous, "every call blocks")

        def key_of(value: Any) -> str:
            token = hashlib.sha1(cloudpickle.dumps(value, protocol=5)).hexdigest() if hash else uuid.uuid4().hex
            return f"{type(value).__name__}-{token}"
        if isinstance(data, dict):
            items = list(data.items())
        elif isinstance(data, (list, tuple, set, frozenset)):
            items = [(key_of(value), value) for value in data]
        else:
            items = [(key_of(data), data)]
        payload = {str(k): cloudpickle.dumps(v, protocol=5) for k, v in items}
        futures = {str(k): Future(str(k), self) for k, _ in items}

        async def place() -> None:
            who_has = await (await self._scheduler_stream()).request("scatter", data=payload, workers=_as_list(workers),
                                                 broadcast=broadcast)
            for key, holders in who_has.items():
                st = self._states.get(key)
                if st is not None:
                    st.who_has = holders
                    st.error = None
                    self._set(st, FINISHED)

        self._loop.run(place(), float(timeout) if timeout else self.timeout + 30)
        if isinstance(data, dict):
            return {k: futures[str(k)] for k in data}
        if isinstance(data, (list, tuple, set, frozenset)):
            return type(data)(futures[str(k)] for k, _ in items) if isinstance(data, (list, tuple)) else \
                [futures[str(k)] for k, _ in items]
        return futures[str(items[0][0])]

    def replicate(self, futures: Any, n: int | None = None, workers: Any = None, branching_factor: int = 2,
                  asynchronous: Any = None) -> dict:
        if workers is not None:
            _unsupported("workers", workers, "copies go to the workers holding the fewest keys")
        flat: list[Future] = []
        _collect(futures, flat)
        return self._request("replicate", keys=[f.key for f in flat], n=n, timeout=120)

    def who_has(self, futures: Any = None, **kwargs: Any) -> dict[str, list[str]]:
        """``{key: [worker addresses]}`` for the futures given, or for every result in memory."""
        keys = None
        if futures is not None:
            flat: list[Future] = []
            _collect(futures, flat)
            keys = [f.key for f in flat]
        return self._request("who-has", keys=keys, timeout=self.timeout)

    def has_what(self, workers: Any = None, **kwargs: Any) -> dict[str, list[str]]:
        """``{worker address: [keys it holds]}``, for every worker or those named."""
        return self._request("has-what", workers=_as_list(workers), timeout=self.timeout)

    def nthreads(self, workers: Any = None, **kwargs: Any) -> dict[str, int]:
        info = self.scheduler_info()["workers"]
        wanted = set(_as_list(workers) or [])
        return {a: w["nthreads"] for a, w in info.items() if not wanted or a in wanted or w["name"] in wanted}

    ncores = nthreads

    def wait_for_workers(self, n_workers: int = 1, timeout: float | None = None) -> None:
        """Block until at least ``n_workers`` workers are running (``TimeoutError`` after ``timeout`` s)."""
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        while True:
            running = [w for w in self.scheduler_info()["workers"].values() if w["status"] == "running"]
            if len(running) >= n_workers:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"only {len(running)} of {n_workers} workers after {timeout} s.")
            time.sleep(0.05)

    # ---------------------------------------------------------------- cluster
    def run(self, function: Any, *args: Any, workers: Any = None, wait: bool = True, nanny: bool = False,
            on_error: str = "raise", **kwargs: Any) -> dict[str, Any] | None:
        """Run ``function`` on every worker (or those named), outside the task threads: ``{address: result}``.
        ``on_error``: ``raise`` the first error, ``return`` it in place of the result, or ``ignore`` it."""
        if nanny:
            _unsupported("nanny", nanny, "the nanny runs no user code; run it on the workers")
        if on_error not in ("raise", "return", "ignore"):
            raise ValueError(f"on_error must be 'raise', 'return' or 'ignore', not {on_error!r}")
        spec = cloudpickle.dumps((function, args, kwargs), protocol=5)
        if not wait:
            self._send({"op": "run", "spec": spec, "workers": _as_list(workers)})
            return None
        replies = self._request("run", spec=spec, workers=_as_list(workers), timeout=None)
        out = {}
        for address, reply in replies.items():
            if reply.get("status") == "ok":
                out[address] = pickle.loads(reply["result"])
                continue
            if reply.get("status") == "error":
                error = _build_exception("run", {"type": "exception", **reply})
            else:
                error = CommClosedError(f"run on {address} failed: {reply.get('message')}")
            if on_error == "raise":
                raise error
            if on_error == "return":
                out[address] = error
        return out

    def futures_of(self, futures: Any) -> list[Future]:
        from kwdiag.runtime.futures import futures_of

        return futures_of(futures)

    def scheduler_info(self, **kwargs: Any) -> dict:
        return self._request("scheduler-info", timeout=self.timeout)

    def retire_workers(self, workers: Any = None, close_workers: bool = True, **kwargs: Any) -> dict:
        names = _as_list(workers)
        if names is None:
            raise ValueError("retire_workers needs the addresses or names of the workers to retire")
        return self._request("retire-workers", workers=names, timeout=120)

    def restart(self, timeout: float = 60, wait_for_workers: bool = True) -> "Client":
        """Kill every worker, flush the scheduler's task state (every future is cancelled), and wait for the
        workers to come back (``wait_for_workers=False``: only for the restart to be under way)."""
        self._request("restart", timeout=float(timeout) + 10, wait=float(timeout) if wait_for_workers else 0.01)
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
        st = self._wait(future._state, None)
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

    # ---------------------------------------------------------------- Dask collections
    def compute(self, collections: Any, sync: bool = False, optimize_graph: bool = True, workers: Any = None,
                allow_other_workers: bool = False, resources: Any = None, retries: int = 0, priority: int = 0,
                fifo_timeout: Any = "60s", actors: Any = None, traverse: bool = True, **kwargs: Any) -> Any:
        """A future of each Dask collection's value (the values themselves with ``sync=True``); anything that
        is not a collection is passed through."""
        from kwdiag.runtime import dask_graphs

        _check_task_keywords(resources, False, actors)
        singleton = not isinstance(collections, (list, tuple, set, frozenset))
        items = [collections] if singleton else list(collections)
        variables = [x for x in items if hasattr(x, "__dask_graph__")]
        futures_by_key: dict[str, Future] = {}
        names: list[Any] = []
        if variables:
            graph, names = dask_graphs.collection_graph(variables, optimize_graph, finalize=True)
            futures_by_key = dask_graphs.submit_graph(self, graph, names, retries=retries, priority=priority,
                                                      workers=workers, allow_other_workers=allow_other_workers)
        results, i = [], 0
        for x in items:
            if hasattr(x, "__dask_graph__"):
                results.append(futures_by_key[dask_graphs.stringify(names[i])])
                i += 1
            else:
                results.append(x)
        if sync:
            results = self.gather(results)
        return results[0] if singleton else results

    def persist(self, collections: Any, optimize_graph: bool = True, workers: Any = None,
                allow_other_workers: bool | None = None, resources: Any = None, retries: int | None = None,
                priority: int = 0, fifo_timeout: Any = "60s", actors: Any = None, **kwargs: Any) -> Any:
        """Start computing the collections and return equivalent collections built on their futures."""
        from dask.core import flatten

        from kwdiag.runtime import dask_graphs

        _check_task_keywords(resources, False, actors)
        singleton = not isinstance(collections, (list, tuple, set, frozenset))
        items = [collections] if singleton else list(collections)
        graph, keys = dask_graphs.collection_graph(items, optimize_graph)
        flat = list(flatten(keys))
        futures = dask_graphs.submit_graph(self, graph, flat, retries=retries, priority=priority, workers=workers,
                                           allow_other_workers=bool(allow_other_workers))
        result = []
        for collection, ks in zip(items, keys):
            rebuild, args = collection.__dask_postpersist__()
            result.append(rebuild({k: futures[dask_graphs.stringify(k)] for k in flatten(ks)}, *args))
        return result[0] if singleton else result

    def get(self, dsk: Any, keys: Any, workers: Any = None, allow_other_workers: bool | None = None,
            resources: Any = None, sync: bool = True, asynchronous: Any = None, direct: Any = None,
            retries: int | None = None, priority: int = 0, fifo_timeout: Any = "60s", actors: Any = None,
            **kwargs: Any) -> Any:
        """Dask's scheduler interface: compute ``keys`` (nested lists) of the graph ``dsk``. ``dask.compute`` and
        ``.compute()`` call it when this client is Dask's scheduler."""
        from dask.core import flatten

        from kwdiag.runtime import dask_graphs

        _check_task_keywords(resources, False, actors)
        graph = dask_graphs.graph_of(dsk)
        wanted = list(dict.fromkeys(flatten([keys]) if isinstance(keys, list) else [keys]))
        futures = dask_graphs.submit_graph(self, graph, wanted, retries=retries, priority=priority, workers=workers,
                                           allow_other_workers=bool(allow_other_workers))
        packed = _pack_keys(keys, {k: futures[dask_graphs.stringify(k)] for k in wanted})
        return self.gather(packed) if sync else packed

    # ---------------------------------------------------------------- closing
    def close(self, timeout: Any = None) -> None:
        global _default_client
        if self._closing:
            return
        self._closing = True
        self.status = "closed"
        if self._dask_config is not None:
            with contextlib.suppress(Exception):
                self._dask_config.__exit__(None, None, None)
            self._dask_config = None
        if _default_client is not None and _default_client() is self:
            _default_client = None

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

    def shutdown(self) -> None:
        """Close the cluster (its scheduler and workers) and this client."""
        if self.cluster is not None:
            self.cluster.close()
        else:
            with contextlib.suppress(Exception):
                self._request("close-cluster", timeout=30)
        self.close()

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
    elif isinstance(obj, (list, tuple, set, frozenset)):
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
    if isinstance(obj, (set, frozenset)):
        return [_rebuild(item, values) for item in obj]
    if isinstance(obj, dict):
        return {k: _rebuild(v, values) for k, v in obj.items()}
    return obj


def _pack_keys(keys: Any, futures: dict[Any, Future]) -> Any:
    if isinstance(keys, list):
        return [_pack_keys(k, futures) for k in keys]
    return futures[keys]


NOTE_TIMEOUT = 30.0   # seconds `kwdiag explain --note-for` may take


def _killed_worker_note(log_dir: str, task: str) -> str:
    """kwdiag's verdict on the deaths counted against ``task`` ("" when it cannot be had)."""
    import subprocess

    from kwdiag.runtime.spawn import child_env, module_command

    for attempt in range(3):   # the last death's records may still be on their way to the files
        try:
            done = subprocess.run(module_command("kwdiag", "explain", log_dir, "--note-for", task),
                                  capture_output=True, text=True, timeout=NOTE_TIMEOUT, env=child_env(),
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
        time.sleep(0.5 * (attempt + 1))
    return ""


def dask_get(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """Dask's scheduler while a kwdiag client is the default or current one: the current client's ``get``. A
    function of this module rather than the client's bound method, because Dask copies its configuration into
    processes it starts (a Dask LocalCluster's workers), and a client cannot be pickled."""
    return Client.current().get(dsk, keys, **kwargs)


def default_client(c: Client | None = None) -> Client:
    """The default client (``c`` given: that one)."""
    return c if c is not None else Client.current()
