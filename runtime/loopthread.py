"""The client side's event loop: one asyncio loop in a daemon thread per process.

Covers: starting it on first use (again if its thread died), running a coroutine on it from any thread
with a timeout, and scheduling a plain call on it. Used by ``runtime.client`` (every client of the
process shares it) and ``runtime.cluster`` (its requests to the scheduler).

Does not cover: what runs on it (connections, the client's state), or servers' loops (each scheduler,
nanny and worker process runs its own).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class LoopThread:
    """One asyncio loop in a daemon thread, shared by the clients (and cluster handles) of
    this process: blocking callers hand it coroutines and wait on the result."""

    _instance: "LoopThread | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kwdiag-client-loop", daemon=True)
        self.thread.start()

    @classmethod
    def get(cls) -> "LoopThread":
        with cls._lock:
            if cls._instance is None or not cls._instance.thread.is_alive():
                cls._instance = cls()
            return cls._instance

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            if future.done():
                raise  # the coroutine's own TimeoutError
            future.cancel()
            raise TimeoutError(f"timed out after {timeout} s.") from None

    def call(self, fn: Any, *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)
