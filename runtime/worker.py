"""The worker: runs tasks in threads, holds their results, serves them to peers and clients.

Covers: registering with the scheduler (and re-registering after it comes back: the worker keeps its
results and its running tasks while the scheduler is away, reports them when it registers again, and
re-reads its scheduler file on every attempt, so a scheduler that returns elsewhere is found), heartbeats,
fetching a task's dependencies from peers, executing tasks in a thread pool of ``nthreads``
(telling the scheduler *before* a task starts, so a death mid-task is blamed correctly), keeping
results, a graceful close that hands work back (signals when run without a nanny, retirement,
``--lifetime``), and telling its nanny — over a pipe — what is running and why it is leaving.

Does not cover: supervising itself (its nanny restarts it and watches its memory), placement
decisions (the scheduler's), or anything about the network below messages (``runtime.comm``).
Unpickling happens here, but only of payloads that arrived over authenticated comms.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import cloudpickle

from kwdiag.runtime import versions as versions_mod
from kwdiag.runtime import worker_context
from kwdiag.runtime.comm import CommClosedError, Credentials, Listener, Security, connect
from kwdiag.runtime.core import EXIT_REFUSED, RemoteError, Stream, background, watch_control_pipe
from kwdiag.runtime.identity import Follower
from kwdiag.runtime.record import Recorder

logger = logging.getLogger("kwdiag.worker")


def dumps(obj: Any) -> bytes:
    try:
        return pickle.dumps(obj, protocol=5)
    except Exception:
        return cloudpickle.dumps(obj, protocol=5)


class _DepUnpickler(pickle.Unpickler):
    """Unpickles a task spec, replacing each future reference with its dependency's value."""

    def __init__(self, data: bytes, values: dict):
        super().__init__(io.BytesIO(data))
        self.values = values

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "kwdiag-future":
            return self.values[pid[1]]
        raise pickle.UnpicklingError(f"unsupported persistent id {pid!r}")


def load_spec(spec: bytes, values: dict) -> tuple:
    return _DepUnpickler(spec, values).load()


class Worker:
    def __init__(self, *, name: str, scheduler_address: str, secret: bytes, config: dict, nthreads: int = 1,
                 memory_limit: int | None = None, log_dir: str | None = None, host: str = "127.0.0.1",
                 nanny_address: str | None = None, incarnation: int = 1, lifetime: float | None = None,
                 status_fd: int | None = None, control_fd: int | None = None, security: Security | None = None,
                 scheduler_file: str | None = None):
        self.name = name
        self.credentials = Credentials(secret, security)
        self.security = security
        self.client: Any = None   # the worker's own client, made by the first task that asks (get_client)
        self.scheduler_address = scheduler_address
        self.follower = Follower(scheduler_address, secret, scheduler_file)
        self.lost_at: float | None = None  # wall-clock time the scheduler connection broke, told to its successor
        self.registered = False  # a scheduler has registered this process once (before that, no reconnecting)
        self.secret = secret
        self.config = config
        self.nthreads = nthreads
        self.memory_limit = memory_limit
        self.host = host
        self.nanny_address = nanny_address
        self.incarnation = incarnation
        self.lifetime = lifetime
        self.status_fd = status_fd
        self._nanny_pending: list[str] = []  # status lines kept for one write (``_tell_nanny``)
        self.control_fd = control_fd
        self.rec = Recorder("kwdiag.worker", source="worker", log_dir=log_dir, file_stem=f"worker-{name}", worker=name)
        self.data: dict[str, Any] = {}
        self.specs: dict[str, dict] = {}      # key -> compute message, for tasks not yet started
        self.ready: list[str] = []            # keys whose dependencies are local, in arrival order
        # Tasks the scheduler sent ahead ("after"): key -> the keys computed here that it still waits for,
        # and the other way round, dependency -> the keys waiting for it.
        self.waiting: dict[str, set[str]] = {}
        self.waited_for: dict[str, set[str]] = {}
        self.executing: set[str] = set()
        self.started_at: dict[str, float] = {}  # key -> monotonic start, for the duration the scheduler learns from
        self.cancelled: set[str] = set()
        # Concurrency is bounded by free_threads, not by the pool: a task that secedes keeps its pool thread
        # while another task takes its slot, so the pool may need a thread per seceded task beyond nthreads.
        self.pool = ThreadPoolExecutor(nthreads + MAX_SECEDED, thread_name_prefix="kwdiag-task")
        self.free_threads = nthreads
        self.seceded: set[str] = set()        # tasks out of the pool's count (secede), until they rejoin
        self.rejoining: list[tuple[str, threading.Event]] = []   # seceded tasks waiting for a slot
        self.address = ""
        self.scheduler: Stream | None = None
        self.peers: dict[str, Stream] = {}
        self.closing: str | None = None
        self.closing_requested: str | None = None
        self._listener: Listener | None = None
        self.versions = versions_mod.collect(config["versions_packages"])
        self.peer_handlers = {"get-data": self.handle_get_data}
        self.scheduler_handlers = {
            "compute": self.handle_compute,
            "free-keys": self.handle_free_keys,
            "close": self.handle_close,
            "fetch-keys": self.handle_fetch_keys,
            "put-data": self.handle_put_data,
            "run": self.handle_run,
            "get-data": self.handle_get_data,
        }

    # ---------------------------------------------------------------- start and registration
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()   # tasks' threads reach the worker through it (secede, rejoin)
        self._listener = Listener(self.credentials, self._on_peer, self.rec.refused)
        self.address = await self._listener.start(self.host, 0)
        self._tell_nanny(f"A {self.address}")
        self.rec.event("worker-start", f"      Start worker at: {self.address:>26}", address=self.address,
                       name=self.name, nthreads=self.nthreads, memory_limit=self.memory_limit,
                       incarnation=self.incarnation, nanny=self.nanny_address, pid=os.getpid(), versions=self.versions)
        if self.control_fd is not None:  # before connecting: a close may come while we are still starting
            background(watch_control_pipe(self.control_fd, self._on_control, self._nanny_gone))
        await self._connect_scheduler(first=True)
        background(self._heartbeat_forever())
        if self.lifetime:
            asyncio.get_running_loop().call_later(self.lifetime, lambda: background(self.close("lifetime")))

    async def _on_peer(self, comm) -> None:
        await Stream(comm, self.peer_handlers, on_bad_frame=self.rec.bad_frame).run()

    async def _dial(self, first: bool) -> Any:
        """Connect to the scheduler (wherever its file now says it is), retrying with back-off; None if the
        reconnection timed out and the worker is closing."""
        timeout = self.config["connect_timeout"] if first else self.config["reconnect_timeout"]
        deadline = time.monotonic() + timeout
        delay = 0.05
        warned_other = False
        while True:
            self.scheduler_address = self.follower.current()   # the scheduler may come back elsewhere
            if self.follower.other_cluster and not warned_other:
                warned_other = True
                logger.warning("Scheduler file %s now names another cluster; not following it (still trying %s)",
                               self.follower.scheduler_file, self.scheduler_address)
            try:
                return await connect(self.scheduler_address, self.credentials,
                                     timeout=max(0.5, min(5.0, deadline - time.monotonic())))
            except CommClosedError as exc:
                if time.monotonic() > deadline:
                    if first:
                        raise
                    self.rec.event("scheduler-lost", f"Failed to reconnect to scheduler after {timeout:.0f}s; closing",
                                   level="error", address=self.scheduler_address)
                    await self.close("scheduler-lost", hand_back=False)
                    return None
                logger.info("Waiting to connect to: %26s (%s)", self.scheduler_address, exc)
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)

    async def _connect_scheduler(self, first: bool, deadline: float | None = None) -> None:
        lost_at = time.monotonic()
        if first and deadline is None:
            deadline = lost_at + self.config["connect_timeout"]
        comm = await self._dial(first)
        if comm is None:
            return
        stream = Stream(comm, self.scheduler_handlers, on_close=self._on_scheduler_closed,
                        on_bad_frame=self.rec.bad_frame)
        reader = background(stream.run())
        # Bind before registering: the scheduler may send work right after it registers us, before we
        # read its reply, and "started" must reach it for blame to be right. One stream keeps order.
        self.scheduler = stream
        # What we kept while the scheduler was away: a successor that replayed its journal reuses it.
        try:
            reply = await stream.request(
                "register-worker", address=self.address, name=self.name, nthreads=self.nthreads,
                memory_limit=self.memory_limit, memory=_resident_bytes(), nanny=self.nanny_address, pid=os.getpid(),
                incarnation=self.incarnation, versions=self.versions,
                data={k: _sizeof(v) for k, v in self.data.items()}, executing=sorted(self.executing),
                queued=[k for k in self.specs if k not in self.executing], lost_at=self.lost_at)
        except CommClosedError as exc:
            if first:
                # The scheduler went away while registering us (it died; a successor may be starting): try again
                # for as long as a first connection may take, as a worker that could not connect yet does.
                self.scheduler = None
                reader.cancel()
                if time.monotonic() > deadline:
                    raise
                logger.info("Waiting to connect to: %26s (%s, while registering)", self.scheduler_address, exc)
                await asyncio.sleep(0.1)
                await self._connect_scheduler(first=True, deadline=deadline)
                return
            return  # it went away again while we registered: its closing stream starts the next attempt
        if reply.get("status") == "refused":
            self.rec.event("worker-fatal", f"Scheduler refused this worker: {reply.get('reason')}\n"
                           f"{reply.get('table') or ''}", level="error", exception="VersionMismatch",
                           error=reply.get("reason"), traceback=reply.get("table"))
            self._tell_nanny("C refused")
            self.scheduler = None
            stream.close()
            reader.cancel()
            self._exit(EXIT_REFUSED)
            return
        if reply.get("warning"):
            self.rec.event("versions-mismatch", reply["warning"], level="warning", peer="scheduler")
        self.registered = True
        if first:
            logger.info("        Registered to: %26s", self.scheduler_address)
        else:
            self.rec.event("reconnected", f"Reconnected to scheduler at {self.scheduler_address} after "
                           f"{time.monotonic() - lost_at:.2f}s, holding {len(self.data)} result(s) and running "
                           f"{len(self.executing)} task(s)", address=self.scheduler_address,
                           after=round(time.monotonic() - lost_at, 3), held=len(self.data),
                           executing=len(self.executing))
        self.lost_at = None

    def _on_scheduler_closed(self, stream: Stream) -> None:
        if self.scheduler is not stream or self.closing or self.closing_requested or not self.registered:
            return  # (before the first registration, _connect_scheduler itself tries again)
        self.scheduler = None
        self.lost_at = time.time()
        self.rec.event("scheduler-lost", f"Connection to scheduler {self.scheduler_address} has been closed; "
                       f"keeping {len(self.data)} result(s) and {len(self.executing)} running task(s) and "
                       "reconnecting", level="warning", address=self.scheduler_address, held=len(self.data),
                       executing=len(self.executing))
        # Keep working: a scheduler that comes back with its journal takes our results and running tasks
        # when we register again; one without a journal tells us to free what it does not know.
        background(self._connect_scheduler(first=False))

    async def _heartbeat_forever(self) -> None:
        interval = float(self.config["heartbeat_interval"])
        while not self.closing:
            await asyncio.sleep(interval)
            stream = self.scheduler
            if stream is None or stream.closed:
                continue
            try:
                reply = await stream.request("heartbeat", timeout=max(5.0, self.config["worker_ttl"]),
                                             executing=len(self.executing), memory=_resident_bytes())
            except (CommClosedError, asyncio.TimeoutError, RemoteError):
                continue
            if reply.get("status") == "missing" and not self.closing:
                logger.warning("Scheduler was unaware of this worker; registering again.")
                stream.close()

    # ---------------------------------------------------------------- nanny channel
    def _tell_nanny(self, line: str, *, later: bool = False) -> None:
        """One line to the nanny: ``S key`` started, ``F key`` finished, ``C reason`` closing, ``A addr``.
        ``later``: kept until the next ``_flush_nanny`` (a task's "finished" and the next one's "started" then
        cost one write); every line not kept goes out at once, after those kept before it."""
        if self.status_fd is None:
            return
        self._nanny_pending.append(line.replace("\n", " "))
        if not later:
            self._flush_nanny()

    def _flush_nanny(self) -> None:
        """Write the kept lines. Called before a task's code can run, so the nanny knows what was running
        whatever kills the process."""
        if not self._nanny_pending:
            return
        data = ("\n".join(self._nanny_pending) + "\n").encode("utf-8", "replace")
        self._nanny_pending.clear()
        try:
            os.write(self.status_fd, data)
        except OSError:
            pass

    def _report_running(self) -> None:
        self._tell_nanny("R " + "\t".join(sorted(self.executing)))

    def _nanny_gone(self) -> None:
        logger.error("Nanny process died; worker exiting")  # a worker must not outlive its supervisor
        self._exit(1)

    def _on_control(self, command: str, argument: str) -> None:
        if command == "close":
            reason = argument or "nanny-close"
            # When the whole cluster is closing there is nobody to hand work back to.
            background(self.close(reason, hand_back=reason not in ("cluster-close", "parent-died")))

    # ---------------------------------------------------------------- tasks
    def handle_compute(self, stream: Stream, msg: dict) -> None:
        key = msg["key"]
        if key in self.executing:
            # Running already — maybe freed while it ran and asked for again since: its result is wanted again,
            # and the scheduler must know it runs (a death now is blamed on it).
            self.cancelled.discard(key)
            if self.scheduler is not None:
                self.scheduler.send({"op": "started", "key": key})
            return
        if key in self.specs:
            return
        self.specs[key] = msg
        missing = [k for k in msg["deps"] if k not in self.data]
        after = msg.get("after")
        if missing and after and all(k in after and self._computing_here(k) for k in missing):
            self.waiting[key] = set(missing)   # runs when they finish here: no fetch, no scheduler round trip
            for k in missing:
                self.waited_for.setdefault(k, set()).add(key)
        elif missing:
            background(self._fetch_then_ready(key, missing))
        else:
            self.ready.append(key)
            self._run_ready()

    def _computing_here(self, key: str) -> bool:
        return key in self.executing or key in self.specs

    def _dependency_done(self, dep: str, ok: bool) -> None:
        """``dep`` finished here (``ok``: its result is in ``self.data``) or will not: wake what waited for it;
        a task whose dependency will not come is handed back to the scheduler as missing it, and so, in turn,
        is everything sent ahead to wait for that task here (a chain waiting link by link)."""
        failed = [(dep, ok)]
        while failed:
            done, success = failed.pop()
            for key in self.waited_for.pop(done, ()):
                pending = self.waiting.get(key)
                if pending is None:
                    continue
                if not success:
                    del self.waiting[key]
                    for other in pending:   # it no longer waits for its other inputs either
                        self.waited_for.get(other, set()).discard(key)
                    self.specs.pop(key, None)
                    if self.scheduler is not None:
                        self.scheduler.send({"op": "missing-deps", "key": key, "missing": [done]})
                    failed.append((key, False))
                    continue
                pending.discard(done)
                if not pending:
                    del self.waiting[key]
                    self.ready.append(key)

    async def _fetch_then_ready(self, key: str, missing: list[str]) -> None:
        msg = self.specs.get(key)
        if msg is None:
            return
        try:
            still_missing = await self._gather_from_peers({k: msg["deps"][k] for k in missing})
        except Exception as exc:  # whatever went wrong, the task must not sit here forever: hand it back
            logger.warning("Fetching the inputs of %r failed: %s: %s", key, type(exc).__name__, exc)
            still_missing = [k for k in missing if k not in self.data]
        if key not in self.specs:
            return
        if still_missing:
            del self.specs[key]
            if self.scheduler is not None:
                self.scheduler.send({"op": "missing-deps", "key": key, "missing": still_missing})
            self._dependency_done(key, ok=False)   # what was sent ahead to wait for it here cannot run either
            return
        self.ready.append(key)
        self._run_ready()

    async def _peer(self, address: str) -> Stream:
        stream = self.peers.get(address)
        if stream is None or stream.closed:
            comm = await connect(address, self.credentials, timeout=self.config["connect_timeout"])
            stream = Stream(comm, self.peer_handlers)
            background(stream.run())
            self.peers[address] = stream
        return stream

    async def _gather_from_peers(self, who_has: dict[str, list[str]]) -> list[str]:
        """Fetch keys into ``self.data``; return the keys no holder could deliver."""
        remaining = dict(who_has)
        tried: dict[str, set[str]] = {k: set() for k in remaining}
        while remaining:
            by_holder: dict[str, list[str]] = {}
            for key, holders in remaining.items():
                options = [h for h in holders if h not in tried[key] and h != self.address]
                if options:
                    by_holder.setdefault(options[0], []).append(key)
            if not by_holder:
                break
            for holder, keys in by_holder.items():
                for key in keys:
                    tried[key].add(holder)
                try:
                    stream = await self._peer(holder)
                    reply = await stream.request("get-data", keys=keys, timeout=60)
                except (CommClosedError, RemoteError, asyncio.TimeoutError):
                    continue
                for key, blob in reply["data"].items():
                    self.data[key] = pickle.loads(blob)
                    remaining.pop(key, None)
                for key in reply.get("deferred") or ():
                    tried[key].discard(holder)   # not refused: sent in a later reply
            if self.scheduler is not None:
                got = [k for k in who_has if k not in remaining and k in self.data]
                if got:
                    self.scheduler.send({"op": "add-keys", "keys": got})
        return [k for k in remaining if k not in self.data]

    def _run_ready(self) -> None:
        while self.free_threads > 0 and self.ready:
            key = self.ready.pop(0)
            msg = self.specs.pop(key, None)
            if msg is None or self.closing:
                continue
            try:
                values = {k: self.data[k] for k in msg["deps"]}
            except KeyError as exc:  # a dependency was freed meanwhile
                if self.scheduler is not None:
                    self.scheduler.send({"op": "missing-deps", "key": key, "missing": [exc.args[0]]})
                self._dependency_done(key, ok=False)
                continue
            self.free_threads -= 1
            self.executing.add(key)
            self.started_at[key] = time.monotonic()
            # Say "started" before the task can possibly kill us: to the nanny and, flushed, to the scheduler.
            self._tell_nanny(f"S {key}")   # with the "finished" lines kept before it, in one write
            if self.scheduler is not None:
                self.scheduler.send({"op": "started", "key": key})
                self.scheduler.flush()
            self.pool.submit(_run_in_thread, self._loop, self._task_done, msg["spec"], values, self, key)

    # ---------------------------------------------------------------- secede and rejoin (from task threads)
    def secede(self, key: str) -> None:
        """A task's thread leaves the pool's count (it will wait on other tasks): its slot is free now."""
        self._loop.call_soon_threadsafe(self._on_secede, key)

    def _on_secede(self, key: str) -> None:
        if key not in self.executing or key in self.seceded:
            return
        self.seceded.add(key)
        self.free_threads += 1
        if self.scheduler is not None:
            self.scheduler.send({"op": "seceded", "key": key})
        self._serve_rejoining()
        self._run_ready()

    def rejoin(self, key: str) -> None:
        """Block the calling task's thread until a slot is free for it again."""
        woken = threading.Event()
        self._loop.call_soon_threadsafe(self._on_rejoin, key, woken)
        woken.wait()

    def _on_rejoin(self, key: str, woken: threading.Event) -> None:
        if key not in self.seceded:
            woken.set()
            return
        self.rejoining.append((key, woken))
        self._serve_rejoining()

    def _serve_rejoining(self) -> None:
        while self.rejoining and self.free_threads > 0:
            key, woken = self.rejoining.pop(0)
            self.seceded.discard(key)
            self.free_threads -= 1
            woken.set()

    def _task_done(self, key: str, outcome: tuple[str, Any, bytes | None]) -> None:
        if key in self.seceded:   # its slot was handed on when it seceded
            self.seceded.discard(key)
        else:
            self.free_threads += 1
        self._serve_rejoining()
        self.executing.discard(key)
        duration = time.monotonic() - self.started_at.pop(key, time.monotonic())
        self._tell_nanny(f"F {key}", later=True)   # written with the next start, or below
        status, payload, packed = outcome
        if status == "exit":
            self._flush_nanny()
            self._fatal_exit(key, payload)
            return
        if key in self.cancelled:
            self.cancelled.discard(key)
            self._dependency_done(key, ok=False)
        elif status == "ok":
            self.data[key] = payload  # kept even while the scheduler is away: reported when we register again
            if self.scheduler is not None:
                finished = {"op": "finished", "key": key, "nbytes": _sizeof(payload), "duration": round(duration, 6)}
                if packed is not None:
                    finished["value"] = packed  # small: it travels on to the clients, sparing them a get-data
                self.scheduler.send(finished)
            self._dependency_done(key, ok=True)
        else:
            if self.scheduler is not None:  # an error while it is away: the task runs again, and fails again
                self.scheduler.send({"op": "erred", "key": key, **payload})
            # after the error, so that the scheduler marks them erred with it (their "missing" is then moot)
            self._dependency_done(key, ok=False)
        self._run_ready()
        self._flush_nanny()
        if self.scheduler is not None:
            self.scheduler.flush()   # the news leaves now, not a loop turn later

    def _fatal_exit(self, key: str, code: Any) -> None:
        status = code if isinstance(code, int) else (0 if code is None else 1)
        self.rec.event("worker-fatal", f"Task {key!r} raised SystemExit({code!r}); the worker process exits with "
                       f"status {status}", level="critical", exception="SystemExit", error=repr(code), key=key,
                       exitcode=status)
        self._exit(status)

    def handle_free_keys(self, stream: Stream, msg: dict) -> None:
        for key in msg["keys"]:
            self.data.pop(key, None)
            freed_spec = self.specs.pop(key, None)
            pending = self.waiting.pop(key, None)
            for dep in pending or ():
                self.waited_for.get(dep, set()).discard(key)
            if key in self.executing:
                self.cancelled.add(key)
            elif freed_spec is not None:
                self._dependency_done(key, ok=False)   # it will not run: what waited for it cannot either

    def handle_get_data(self, stream: Stream, msg: dict) -> dict:
        """The pickled values of ``keys``; a value that cannot be pickled is reported by key (``unpicklable``)
        so that whoever asked raises it, instead of waiting for a value that can never come."""
        out, missing, unpicklable, deferred = {}, [], {}, []
        size = 0
        for key in msg["keys"]:
            if size >= GET_DATA_BYTES:
                deferred.append(key)   # one reply stays small enough not to stall this loop (and heartbeats)
                continue
            if key not in self.data:
                missing.append(key)
                continue
            try:
                out[key] = blob = dumps(self.data[key])
                size += len(blob)
            except Exception as exc:
                unpicklable[key] = f"{type(exc).__name__}: {exc}"
        return {"data": out, "missing": missing, "unpicklable": unpicklable, "deferred": deferred}

    def handle_put_data(self, stream: Stream, msg: dict) -> dict:
        for key, blob in msg["data"].items():
            self.data[key] = pickle.loads(blob)
        return {"status": "ok", "keys": list(msg["data"])}

    async def handle_fetch_keys(self, stream: Stream, msg: dict) -> list[str]:
        await self._gather_from_peers(msg["keys"])
        return [k for k in msg["keys"] if k in self.data]

    async def handle_run(self, stream: Stream, msg: dict) -> dict:
        def call() -> dict:
            try:
                fn, args, kwargs = pickle.loads(msg["spec"])
                if _takes_keyword(fn, "dask_worker"):   # as Dask's client.run: the function may ask for its worker
                    kwargs = {**kwargs, "dask_worker": self}
                return {"status": "ok", "result": dumps(fn(*args, **kwargs))}
            except Exception as exc:
                return {"status": "error", **_error_payload(exc)}
        return await asyncio.get_running_loop().run_in_executor(None, call)

    # ---------------------------------------------------------------- closing
    def handle_close(self, stream: Stream, msg: dict) -> None:
        reason = msg.get("reason") or "scheduler-close"
        self._tell_nanny(f"C {reason}")  # before the stream closes: this is a chosen exit, not a lost scheduler
        self.closing_requested = reason
        background(self.close(reason, hand_back=False))

    async def close(self, reason: str, hand_back: bool = True) -> None:
        """Leave on purpose: tell the nanny not to restart us, hand work back, end."""
        if self.closing:
            return
        self.closing = reason
        self._tell_nanny(f"C {reason}")
        self.rec.event("worker-closing", f"Stopping worker at {self.address}. Reason: {reason}", reason=reason,
                       address=self.address, executing=sorted(self.executing))
        stream = self.scheduler
        if hand_back and stream is not None and not stream.closed:
            try:
                await stream.request("retire-me", reason=reason, timeout=self.config["close_timeout"])
            except Exception as exc:
                logger.warning("Could not hand work back to the scheduler: %s", exc)
        if stream is not None:
            await stream.drain(1.0)
            stream.close()
        self.rec.event("worker-end", "End worker", reason=reason, address=self.address)
        self._exit(0)

    def _exit(self, code: int) -> None:
        """Leave now. Task threads cannot be interrupted, so the interpreter is not asked to join them."""
        try:
            self.rec.close()
            sys.stderr.flush()
            sys.stdout.flush()
        finally:
            os._exit(code)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _takes_keyword(fn: Any, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _resident_bytes() -> int | None:
    """This process's resident memory, cheaply (Linux /proc; elsewhere unknown — the nanny measures anyway)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _sizeof(obj: Any) -> int:
    try:
        return sys.getsizeof(obj)
    except Exception:
        return 0


def _error_payload(exc: BaseException) -> dict:
    """A task's exception for the scheduler and clients: pickled, named, formatted, and its traceback's frames
    (file, line, function) so that a client can raise it with a traceback that points into the task."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        blob = cloudpickle.dumps(exc, protocol=5)
        pickle.loads(blob)
    except Exception:
        blob = cloudpickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"), protocol=5)
    frames = [[f.filename, f.lineno or 0, f.name] for f in traceback.extract_tb(exc.__traceback__)]
    return {"exception": blob, "exc_type": type(exc).__name__, "message": str(exc), "traceback": tb,
            "frames": frames[-MAX_FRAMES:]}


MAX_FRAMES = 50      # traceback frames sent with a task's error (the innermost)
MAX_SECEDED = 256    # tasks that may have seceded from one worker's pool at a time (each keeps a thread)

# A get-data reply holds at most about this many bytes; the rest of the keys asked for are "deferred" and asked
# for again. Pickling and framing a reply runs on the event loop: 800 results of 1 MiB in one reply stalled a
# worker past its heartbeat time-to-live, and the scheduler had it killed.
GET_DATA_BYTES = 64 << 20

# A result whose pickle is at most this long travels with the "finished" message, and the scheduler passes it
# on to the clients that want it: a client's result() then needs no trip to the worker (one network round trip
# of the ~five a small task costs). Larger results stay on the worker until asked for, as in Dask.
INLINE_RESULT_BYTES = 1024


class _Full(Exception):
    pass


class _CappedBuffer:
    """A file for a pickler that refuses to hold more than ``limit`` bytes: pickling a large result stops at the
    first frame past the limit (frames are at most 64 KiB), so trying costs little whatever the result's size."""

    def __init__(self, limit: int):
        self.parts: list[bytes] = []
        self.size = 0
        self.limit = limit

    def write(self, data: Any) -> int:
        self.size += len(data)
        if self.size > self.limit:
            raise _Full
        self.parts.append(bytes(data))
        return len(data)


def pack_small(obj: Any, limit: int = INLINE_RESULT_BYTES) -> bytes | None:
    """``obj`` pickled when that takes at most ``limit`` bytes, else None (also when it cannot be pickled:
    the get-data path then reports that as it always did)."""
    for pickler in (pickle.Pickler, cloudpickle.CloudPickler):
        buf = _CappedBuffer(limit)
        try:
            pickler(buf, protocol=5).dump(obj)
        except _Full:
            return None
        except Exception:
            continue  # e.g. a lambda: plain pickle cannot, cloudpickle can
        return b"".join(buf.parts)
    return None


def _run_in_thread(loop: asyncio.AbstractEventLoop, on_done: Callable[[str, tuple], None], spec: bytes,
                   values: dict, worker: Any, key: str) -> None:
    """A task thread's whole job: run the task, then hand its outcome to the event loop with one wake-up
    (``run_in_executor`` took three loop turns to get it there)."""
    outcome = _execute_and_pack(spec, values, worker, key)
    try:
        loop.call_soon_threadsafe(on_done, key, outcome)
    except RuntimeError:  # the loop is closed: the worker is exiting
        pass


def _execute_and_pack(spec: bytes, values: dict, worker: Any = None, key: str | None = None
                      ) -> tuple[str, Any, bytes | None]:
    """``_execute``, and a small result pickled here in the task's thread, off the event loop. While it runs,
    ``get_worker()`` and ``get_client()`` in the task know its worker and key."""
    worker_context.set_task(worker, key)
    try:
        status, payload = _execute(spec, values)
    finally:
        worker_context.set_task(None, None)
    return status, payload, pack_small(payload) if status == "ok" else None


def _execute(spec: bytes, values: dict) -> tuple[str, Any]:
    """Run one task in a pool thread; never raises."""
    try:
        fn, args, kwargs = load_spec(spec, values)
    except Exception as exc:  # e.g. ModuleNotFoundError: the task's code is not importable here
        return "error", _error_payload(exc)
    try:
        return "ok", fn(*args, **kwargs)
    except SystemExit as exc:
        return "exit", exc.code
    except Exception as exc:
        return "error", _error_payload(exc)


async def run_worker(*, name: str, scheduler_address: str, secret: bytes, config: dict, nthreads: int,
                     memory_limit: int | None, log_dir: str | None, host: str, nanny_address: str | None,
                     incarnation: int, lifetime: float | None, status_fd: int | None, control_fd: int | None,
                     preload: list[str] = (), control_stdin: bool = False, security: Security | None = None,
                     scheduler_file: str | None = None) -> None:
    import faulthandler
    import importlib

    # A segfault or abort then leaves its Python stacks on stderr, where the nanny keeps the tail.
    faulthandler.enable()
    worker = Worker(name=name, scheduler_address=scheduler_address, secret=secret, config=config, nthreads=nthreads,
                    memory_limit=memory_limit, log_dir=log_dir, host=host, nanny_address=nanny_address,
                    incarnation=incarnation, lifetime=lifetime, status_fd=status_fd, control_fd=control_fd,
                    security=security, scheduler_file=scheduler_file)
    try:
        for module in preload:
            logger.info("Import preload module: %s", module)
            importlib.import_module(module)
    except Exception as exc:
        extra = {"module": exc.name} if isinstance(exc, ModuleNotFoundError) and exc.name else {}
        worker.rec.event("worker-fatal", f"Failed to start worker: {type(exc).__name__}: {exc}\n"
                         + "".join(traceback.format_exception(exc)).rstrip(), level="critical",
                         exception=type(exc).__name__, error=str(exc),
                         traceback="".join(traceback.format_exception(exc)), **extra)
        worker._exit(1)
    loop = asyncio.get_running_loop()
    if status_fd is None:  # no nanny: signals are ours to handle, and mean "leave gracefully"
        def on_signal(sig: int) -> None:
            name_ = signal.Signals(sig).name
            logger.info("Received signal %s (%d)", name_, sig)
            if worker.closing:  # a second signal: leave at once
                worker._exit(128 + sig)
            background(worker.close(f"signal-{sig}"))
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
    else:  # under a nanny, Ctrl-C in a terminal reaches the nanny, which asks us to close
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if control_stdin:  # started by a LocalCluster: it closes us through stdin, and EOF means it is gone
        background(watch_control_pipe(0, worker._on_control,
                                      lambda: background(worker.close("parent-died"))))
    try:
        await worker.start()
    except CommClosedError as exc:
        worker.rec.event("worker-fatal", f"Unable to connect to scheduler: {exc}", level="error",
                         exception="CommClosedError", error=str(exc))
        worker._exit(1)
    await asyncio.Event().wait()  # serve until the worker leaves: every way out ends in Worker._exit (os._exit)
