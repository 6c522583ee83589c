"""A cluster simulated in one thread around ``SchedulerState``: workers and clients as plain objects.

The state machine under test is the real one; only its surroundings are simulated: each simulated worker
keeps the compute messages it was sent, fetches inputs from the other simulated workers as a real worker
does, and runs a task when the test (or a random driver) says so, by calling the task's Python function on
its inputs. Clients see the messages the scheduler sends them. Every stimulus's outbox is delivered at once
and its journal records kept, so a test can replay them into a new scheduler.

Does not cover: timing, sockets, or anything a real process does (``tests/test_runtime_*`` and the
property test on real processes do).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from kwdiag.runtime.journal import Replay
from kwdiag.runtime.scheduler_state import CLIENT, Outbox, SchedulerState

CLIENT_ID = "client-1"


class TaskFailed(Exception):
    """What a simulated task raises when its definition says it fails."""


@dataclass
class TaskDef:
    fn: Callable[..., Any]
    deps: list[str]
    fails: int = 0          # how many of its first runs raise TaskFailed


@dataclass
class SimWorker:
    address: str
    name: str
    nthreads: int = 2
    data: dict[str, Any] = field(default_factory=dict)
    queued: dict[str, dict] = field(default_factory=dict)   # key -> compute message, in arrival order
    executing: set[str] = field(default_factory=set)
    freed_while_executing: set[str] = field(default_factory=set)
    alive: bool = True


@dataclass
class SimClient:
    finished: dict[str, Any] = field(default_factory=dict)     # key -> who_has at the last "in memory"
    erred: dict[str, dict] = field(default_factory=dict)
    cancelled: set[str] = field(default_factory=set)
    lost: list[str] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)


class Sim:
    def __init__(self, n_workers: int = 2, allowed_failures: int = 3, nthreads: int = 2, validate_every: int = 1):
        self.state = SchedulerState(allowed_failures=allowed_failures)
        self.defs: dict[str, TaskDef] = {}
        self.runs: dict[str, int] = {}
        self.workers: dict[str, SimWorker] = {}
        self.clients: dict[str, SimClient] = {CLIENT_ID: SimClient()}
        self.journal: list[list] = []
        self.events: list[tuple[str, str, dict]] = []
        self.stimuli = 0
        self.validate_every = validate_every   # invariants checked after every n-th stimulus (0: never)
        self._names = itertools.count(1)
        self.deliver(self.state.add_client(CLIENT_ID))
        for _ in range(n_workers):
            self.add_worker(nthreads)

    # ---------------------------------------------------------------- plumbing
    def deliver(self, out: Outbox) -> Outbox:
        self.stimuli += 1
        self.journal.extend(out.journal)
        self.events.extend(out.events)
        for recipient, ident, msg in out.messages:
            if recipient == CLIENT:
                self._to_client(ident, msg)
            else:
                self._to_worker(ident, msg)
        if self.validate_every and self.stimuli % self.validate_every == 0:
            self.state.validate()
        return out

    def _to_client(self, client: str, msg: dict) -> None:
        c = self.clients.setdefault(client, SimClient())
        c.messages.append(msg)
        op = msg["op"]
        if op == "key-in-memory":
            c.finished[msg["key"]] = msg["who_has"]
            c.erred.pop(msg["key"], None)
        elif op == "task-erred":
            c.erred[msg["key"]] = msg["error"]
            c.finished.pop(msg["key"], None)
        elif op == "key-lost":
            c.lost.append(msg["key"])
            c.finished.pop(msg["key"], None)
        elif op == "cancelled":
            c.cancelled.update(msg["keys"])
        elif op == "retrying":
            for key in msg["keys"]:
                c.erred.pop(key, None)

    def _to_worker(self, address: str, msg: dict) -> None:
        w = self.workers.get(address)
        if w is None or not w.alive:
            return
        if msg["op"] == "compute":
            if msg["key"] not in w.executing:
                w.queued[msg["key"]] = msg
        elif msg["op"] == "free-keys":
            for key in msg["keys"]:
                w.data.pop(key, None)
                w.queued.pop(key, None)
                if key in w.executing:
                    w.freed_while_executing.add(key)

    # ---------------------------------------------------------------- the cluster
    def add_worker(self, nthreads: int = 2, held: dict | None = None, name: str | None = None) -> SimWorker:
        n = next(self._names)
        w = SimWorker(f"tcp://127.0.0.1:{10000 + n}", name or f"w{n}", nthreads)
        if held:
            w.data.update(held)
        self.workers[w.address] = w
        self.deliver(self.state.add_worker(w.address, w.name, nthreads=nthreads,
                                           held={k: 8 for k in w.data}))
        self.deliver(self.state.schedule())
        return w

    def kill(self, address: str, expected: bool = False) -> None:
        w = self.workers[address]
        w.alive = False
        self.deliver(self.state.remove_worker(address, how="connection-closed", expected=expected))

    def live_workers(self) -> list[SimWorker]:
        return [w for w in self.workers.values() if w.alive]

    # ---------------------------------------------------------------- clients' stimuli
    def submit(self, key: str, fn: Callable[..., Any], deps: list[str] = (), *, fails: int = 0, retries: int = 0,
               priority: int = 0, workers: list[str] | None = None, client: str = CLIENT_ID) -> str:
        self.defs.setdefault(key, TaskDef(fn, list(deps), fails))
        self.deliver(self.state.update_graph(client, [{"key": key, "spec": b"task", "deps": list(deps),
                                                        "retries": retries, "priority": priority,
                                                        "workers": workers}]))
        return key

    def release(self, *keys: str, client: str = CLIENT_ID) -> None:
        self.deliver(self.state.release_keys(client, list(keys)))

    def cancel(self, *keys: str, client: str = CLIENT_ID, force: bool = False) -> None:
        self.deliver(self.state.cancel(client, list(keys), force=force))

    def retry(self, *keys: str, client: str = CLIENT_ID) -> list[str]:
        out, reset = self.state.retry(client, list(keys))
        self.deliver(out)
        return reset

    # ---------------------------------------------------------------- workers' stimuli
    def runnable(self) -> list[tuple[SimWorker, str]]:
        """(worker, key) pairs a worker could start now: a free thread and every input local or fetchable."""
        out = []
        for w in self.live_workers():
            if len(w.executing) >= w.nthreads:
                continue
            for key, msg in w.queued.items():
                if self._fetchable(w, msg):
                    out.append((w, key))
        return out

    def _fetchable(self, w: SimWorker, msg: dict) -> bool:
        for dep, holders in msg["deps"].items():
            if dep in w.data:
                continue
            if dep in msg.get("after", ()) and (dep in w.queued or dep in w.executing):
                return False   # sent ahead: runs after its dependency finishes here
            if not any(h in self.workers and self.workers[h].alive and dep in self.workers[h].data for h in holders):
                return False
        return True

    def stuck(self) -> list[tuple[SimWorker, str]]:
        """Queued tasks whose inputs no holder has (a real worker reports them as missing)."""
        out = []
        for w in self.live_workers():
            for key, msg in w.queued.items():
                for dep, holders in msg["deps"].items():
                    if dep in w.data or dep in msg.get("after", ()) and (dep in w.queued or dep in w.executing):
                        continue
                    if not any(h in self.workers and self.workers[h].alive and dep in self.workers[h].data
                               for h in holders):
                        out.append((w, key))
                        break
        return out

    def report_missing(self, w: SimWorker, key: str) -> None:
        msg = w.queued.pop(key)
        missing = [d for d in msg["deps"] if d not in w.data]
        self.deliver(self.state.missing_deps(w.address, key, missing))

    def start(self, w: SimWorker, key: str) -> None:
        msg = w.queued.pop(key)
        fetched = []
        for dep, holders in msg["deps"].items():
            if dep not in w.data:
                holder = next(h for h in holders if h in self.workers and dep in self.workers[h].data)
                w.data[dep] = self.workers[holder].data[dep]
                fetched.append(dep)
        if fetched:
            self.deliver(self.state.add_keys(w.address, fetched))
        w.executing.add(key)
        self.deliver(self.state.task_started(w.address, key))

    def finish(self, w: SimWorker, key: str) -> None:
        w.executing.discard(key)
        if key in w.freed_while_executing:
            w.freed_while_executing.discard(key)
            return
        d = self.defs[key]
        self.runs[key] = self.runs.get(key, 0) + 1
        try:
            if self.runs[key] <= d.fails:
                raise TaskFailed(key)
            value = d.fn(*[w.data[dep] for dep in d.deps])
        except Exception as exc:
            self.deliver(self.state.task_erred(w.address, key, exception=None, exc_type=type(exc).__name__,
                                               message=str(exc)))
            return
        w.data[key] = value
        self.deliver(self.state.task_finished(w.address, key, nbytes=8, duration=0.001))

    def step(self, pick: Callable[[list], Any] = lambda options: options[0]) -> bool:
        """Start or finish one task (or report one stuck); False when nothing can happen."""
        executing = [(w, k) for w in self.live_workers() for k in sorted(w.executing)]
        runnable = self.runnable()
        stuck = self.stuck()
        options = [("finish", w, k) for w, k in executing] + [("start", w, k) for w, k in runnable] + \
                  [("missing", w, k) for w, k in stuck]
        if not options:
            return False
        what, w, key = pick(options)
        {"finish": self.finish, "start": self.start, "missing": self.report_missing}[what](w, key)
        return True

    def run(self, limit: int = 1_000_000, pick: Callable[[list], Any] = lambda options: options[0]) -> None:
        for _ in range(limit):
            if not self.step(pick):
                self.state.validate()
                return
        raise AssertionError(f"still running after {limit} steps")

    def value(self, key: str) -> Any:
        """The result, from the holders the client was told of, else (as a real client asks again when they
        do not have it) from those the scheduler knows now."""
        known = list(self.clients[CLIENT_ID].finished.get(key) or ())
        if key not in self.clients[CLIENT_ID].finished:
            raise KeyError(key)
        for address in known + self.state.who_has([key])[key]:
            w = self.workers.get(address)
            if w is not None and w.alive and key in w.data:
                return w.data[key]
        raise KeyError(key)

    # ---------------------------------------------------------------- a restarted scheduler
    def restart_scheduler(self) -> None:
        """A new scheduler replays the journal; every live worker registers again with what it holds."""
        replay = Replay("sim")
        for record in self.journal:
            replay.apply(record)
        self.state = SchedulerState(allowed_failures=self.state.allowed_failures)
        self.journal = []
        self.deliver(self.state.restore(replay.tasks.values()))
        for client in self.clients:
            self.deliver(self.state.add_client(client))
        for w in self.live_workers():
            self.deliver(self.state.add_worker(w.address, w.name, nthreads=w.nthreads,
                                               held={k: 8 for k in w.data}, executing=sorted(w.executing),
                                               queued=list(w.queued)))
        self.deliver(self.state.end_recovery())
