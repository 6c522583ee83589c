"""Message layer over a ``Comm``: batched sends, request/reply, and one ``{op: handler}`` table.

Covers: ``Stream`` — a live connection on which either side may send fire-and-forget
messages (coalesced into one frame per event-loop turn, so a burst of 5,000 messages costs a
handful of frames and an idle send costs no added latency) or requests that are answered by
``{"op": "reply"}``; dispatch of incoming messages to the owning server's handler table; and
``RemoteError`` for a request whose handler raised.

Does not cover: sockets and authentication (``runtime.comm``), or what any op means (each
server's handler table).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import threading
from typing import Any, Callable

from kwdiag.runtime.comm import Comm, CommClosedError, ProtocolError

logger = logging.getLogger("kwdiag.comm")

Handler = Callable[["Stream", dict], Any]

# The worker's exit status when the scheduler refused it (EX_CONFIG): restarting it would not help.
EXIT_REFUSED = 78

_BACKGROUND: set[asyncio.Task] = set()


def background(coro: Any) -> asyncio.Task:
    """Run ``coro`` as a task that is kept alive until it finishes (asyncio holds tasks weakly)."""
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return task


async def watch_control_pipe(fd: int, on_command: Callable[[str, str], None], on_eof: Callable[[], None]) -> None:
    """Read ``command argument`` lines from a pipe (a nanny's, or a launcher's stdin); EOF means its owner is gone."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    pipe = open(fd, "rb", buffering=0, closefd=False)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        while True:
            line = await reader.readline()
            if not line:
                on_eof()
                return
            command, _, argument = line.decode("utf-8", "replace").strip().partition(" ")
            on_command(command, argument)
    finally:
        transport.close()


class _TurnEnd(threading.local):
    """Per thread (each runs its own loop): what this loop turn left to do once its callbacks have run.

    Messages queued in a turn leave at its end, one frame per stream, whatever queued them (a burst of frames
    from several peers read in one turn, a timer, a task's end): the kernel is entered once per peer and turn,
    not once per message. Callbacks given to ``at_turn_end`` run first, in order: the scheduler writes its
    journal there, so the records are on disk before anyone is told what they say. The end is one
    ``call_soon`` away: after the callbacks already due in this turn, before any I/O that becomes ready."""

    def __init__(self) -> None:
        self.scheduled: asyncio.AbstractEventLoop | None = None   # the loop the end is queued on
        self.before: list[Callable[[], None]] = []
        self.dirty: list["Stream"] = []

    def schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        # a thread's earlier loop may have stopped with its end still queued: queue it on this one
        if self.scheduled is not loop and not loop.is_closed():
            self.scheduled = loop
            loop.call_soon(self.run)

    def run(self) -> None:
        self.scheduled = None
        self.run_before()
        dirty, self.dirty = self.dirty, []
        for stream in dirty:
            try:   # one connection's failure must not leave the others' messages unsent
                stream.flush()
            except Exception:
                logger.exception("Sending to %s failed; closing that connection", stream.peer)
                stream._outbox.clear()
                stream.close()

    def run_before(self) -> None:
        """The ``at_turn_end`` callbacks due so far (also before any stream is flushed early, by hand)."""
        while self.before:
            before, self.before = self.before, []
            for callback in before:
                try:
                    callback()
                except Exception:   # (the journal reports its own write errors; this is a bug, not a full disk)
                    logger.exception("A callback at the end of a loop turn failed")


_TURN_END = _TurnEnd()


def at_turn_end(callback: Callable[[], None]) -> None:
    """Call ``callback`` at the end of this loop turn, before the turn's messages are sent."""
    _TURN_END.before.append(callback)
    _TURN_END.schedule(asyncio.get_running_loop())


class RemoteError(Exception):
    """A request's handler raised on the other side; the message says what."""


class Stream:
    """An authenticated connection with batching, requests and dispatch."""

    def __init__(self, comm: Comm, handlers: dict[str, Handler], *, on_close: Callable[["Stream"], None] | None = None,
                 on_bad_frame: Callable[["Stream", str], None] | None = None):
        self.comm = comm
        self.handlers = handlers
        self.on_close = on_close
        self.on_bad_frame = on_bad_frame
        self.peer = comm.peer
        self.info: dict[str, Any] = {}  # what the owning server knows this stream to be
        self._outbox: list[dict] = []
        self._flush_pending = False
        self._rids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._closed = False
        self._loop = asyncio.get_running_loop()
        self._last_write: Any = None

    @property
    def closed(self) -> bool:
        return self._closed or self.comm.closed

    # -- sending -----------------------------------------------------------------------------
    def send(self, message: dict) -> None:
        """Queue ``message``; all messages queued in one loop turn leave as one frame, at the turn's end."""
        if self.closed:
            return
        self._outbox.append(message)
        if not self._flush_pending:
            self._flush_pending = True
            _TURN_END.dirty.append(self)
            _TURN_END.schedule(self._loop)

    def flush(self) -> None:
        """Send what is queued now, as one frame (instead of at the end of this loop turn); what ``at_turn_end``
        was given so far runs first (the journal's records are written before any message leaves)."""
        self._flush_pending = False
        if not self._outbox:
            return
        if _TURN_END.before:
            _TURN_END.run_before()
        batch, self._outbox = self._outbox, []
        try:
            self._last_write = self.comm.write(batch)
        except CommClosedError:
            self.close()

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait until everything queued so far has been handed to the kernel."""
        self.flush()
        if self._last_write is not None and not self.closed:
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(self._last_write)), timeout)
            except Exception:
                pass

    async def request(self, op: str, timeout: float | None = None, **fields: Any) -> Any:
        """Send ``op`` and wait for its reply; RemoteError if the handler raised."""
        if self.closed:
            raise CommClosedError(f"connection to {self.peer} is closed")
        rid = next(self._rids)
        future = self._loop.create_future()
        self._pending[rid] = future
        self.send({"op": op, "rid": rid, **fields})
        try:
            return await asyncio.wait_for(future, timeout) if timeout else await future
        finally:
            self._pending.pop(rid, None)

    # -- receiving ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Read and dispatch until the connection ends; then fail pending requests and call on_close."""
        try:
            await self.comm.deliver(self._dispatch_frames)
        except ProtocolError as exc:
            if self.on_bad_frame is not None:
                self.on_bad_frame(self, str(exc))
        except CommClosedError:
            pass
        finally:
            self.close()

    def _dispatch_frames(self, frames: list[list[dict]]) -> None:
        for messages in frames:
            for message in messages:
                self._dispatch(message)

    def _dispatch(self, message: dict) -> None:
        op = message.get("op")
        rid = message.get("rid")
        if op == "reply":
            future = self._pending.get(rid)
            if future is not None and not future.done():
                if "error" in message:
                    future.set_exception(RemoteError(str(message["error"])))
                else:
                    future.set_result(message.get("result"))
            return
        handler = self.handlers.get(op) if isinstance(op, str) else None
        if handler is None:
            logger.warning("Unknown operation %r from %s", op, self.peer)
            if rid is not None:
                self.send({"op": "reply", "rid": rid, "error": f"unknown operation {op!r}"})
            return
        try:
            result = handler(self, message)
        except Exception as exc:
            self._handler_failed(op, rid, exc)
            return
        if inspect.isawaitable(result):
            background(self._finish(op, rid, result))
        elif rid is not None:
            self.send({"op": "reply", "rid": rid, "result": result})

    async def _finish(self, op: str, rid: Any, awaitable: Any) -> None:
        try:
            result = await awaitable
        except CommClosedError as exc:
            if rid is not None:
                self.send({"op": "reply", "rid": rid, "error": f"CommClosedError: {exc}"})
            return
        except Exception as exc:
            self._handler_failed(op, rid, exc)
            return
        if rid is not None:
            self.send({"op": "reply", "rid": rid, "result": result})

    def _handler_failed(self, op: str, rid: Any, exc: Exception) -> None:
        logger.error("Handler for %r from %s failed: %s: %s", op, self.peer, type(exc).__name__, exc,
                     exc_info=not isinstance(exc, (KeyError, TypeError, ValueError)))
        if rid is not None:
            self.send({"op": "reply", "rid": rid, "error": f"{type(exc).__name__}: {exc}"})

    def close(self) -> None:
        if self._closed:
            return
        _TURN_END.run_before()   # the journal's records of this turn, before the peer sees the connection end
        self.flush()
        self._closed = True
        self.comm.abort()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(CommClosedError(f"connection to {self.peer} closed"))
        self._pending.clear()
        if self.on_close is not None:
            callback, self.on_close = self.on_close, None
            callback(self)
