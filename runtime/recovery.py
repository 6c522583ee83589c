"""Recovery: a scheduler started on the run directory of one that died takes up its work.

Covers: taking the run directory (its lock, and the journal left there, set aside when it belongs to
another cluster or cannot be read); rebuilding the tasks of a ``journal.Replay`` (specs, dependencies,
who wants what, errors, failure counts and who was blamed, which results were done and on which
workers); the recovery window, in which nothing is placed while the workers of the old scheduler come
back and report what they hold (their results are reused, their running tasks stay where they run);
closing the window (what no returning worker holds is recomputed from its lineage, scattered data
nobody brought back is lost for good, clients that have not come back keep a grace period); the
``journal-replayed`` and ``scheduler-recovered`` events; and ``snapshot``, the scheduler's state as
journal records (the compacted journal).

Does not cover: the record format and the file (``runtime.journal``), accepting what one worker
reports (``Scheduler._adopt``), or the task state machine (``runtime.scheduler``).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

from kwdiag.runtime.identity import StartupError, cluster_id
from kwdiag.runtime.journal import VERSION, JournalLocked, Replay

if TYPE_CHECKING:  # the scheduler imports this module; its types are only named here
    from kwdiag.runtime.scheduler import Scheduler, TaskState

MAX_KEYS_LISTED = 50  # keys named in an event; the counts are always complete


def take_run_directory(s: "Scheduler") -> tuple[Replay | None, str | None, float | None]:
    """Lock the run directory and read the journal left in it: ``(replay, problem, last_write)``."""
    try:
        s.journal.lock()
    except JournalLocked as exc:
        raise StartupError(f"{exc}: give each scheduler its own --log-dir", 3) from None
    except OSError as exc:
        raise StartupError(f"cannot use run directory {s.journal.directory}: {exc.strerror or exc}", 3) from None
    try:
        last_write = os.stat(s.journal.path).st_mtime if os.path.exists(s.journal.path) else None
        return s.journal.existing(), None, last_write
    except OSError as exc:
        return None, exc.strerror or str(exc), None


def hello(s: "Scheduler") -> list:
    return ["hello", {"cluster": cluster_id(s.secret), "pid": os.getpid(), "address": s.address,
                      "started": round(s.started_at, 3), "version": VERSION}]


def begin(s: "Scheduler", taken: tuple[Replay | None, str | None, float | None]) -> None:
    """Replay the journal a predecessor left, if it belongs to this cluster and did not end cleanly; then
    start a fresh (compacted) journal."""
    replay, problem, last_write = taken
    if problem is not None:
        _set_aside(s, "unreadable", f"it cannot be read ({problem})")
        replay = None
    if replay is not None and replay.records and replay.closed is None:
        if replay.hello.get("cluster") != cluster_id(s.secret):
            _set_aside(s, "other-cluster", "it belongs to another cluster (another shared secret)")
        else:
            restore(s, replay)
            s.recovery = Recovery(s, replay, last_write)
    s.journal.snapshot(snapshot(s))
    if s.recovery is not None:
        s.recovery.start()


def _set_aside(s: "Scheduler", why: str, reason: str) -> None:
    try:
        moved = s.journal.set_aside(why)
    except OSError as exc:
        moved = f"(could not be moved: {exc.strerror or exc})"
    s.rec.event("journal-set-aside", f"Not replaying the journal in {s.journal.directory}: {reason}; kept as "
                f"{moved}", level="warning", path=s.journal.path, moved_to=moved, reason=reason)


def restore(s: "Scheduler", replay: Replay) -> None:
    """Rebuild the scheduler's tasks from ``replay``: all released, finished ones awaiting their holders."""
    from kwdiag.runtime.scheduler import ERRED, TaskState

    for rec in replay.tasks.values():
        ts = TaskState(rec.key, rec.spec, (-rec.priority, next(s._priority)))
        ts.restrictions = set(rec.restrictions) if rec.restrictions else None
        ts.loose = rec.loose
        ts.wanted_by = set(rec.wanted_by)
        ts.suspicious, ts.death_workers = rec.deaths, list(rec.death_workers)
        if rec.error is not None:
            ts.state, ts.error = ERRED, rec.error
        elif rec.holders:
            ts.expected = dict(rec.holders)
            ts.nbytes = max(rec.holders.values())
        s.tasks[rec.key] = ts
    orphans = []
    for rec in replay.tasks.values():
        ts = s.tasks[rec.key]
        for dep in rec.deps:
            dts = s.tasks.get(dep)
            if dts is None:
                orphans.append((ts, dep))
                continue
            ts.deps.add(dts)
            dts.dependents.add(ts)
    for ts, dep in orphans:  # cannot happen with a whole journal; a damaged one must not hang a client
        s._set_erred(ts, {"type": "unknown-dependency", "key": dep,
                          "message": f"dependency {dep!r} of {ts.key!r} was not in the recovered journal"})
    s.counters.update(submitted=len(s.tasks), finished=sum(1 for t in s.tasks.values() if t.expected and not t.scattered),
                      erred=sum(1 for t in s.tasks.values() if t.state == ERRED))


class Recovery:
    """The recovery window and its figures (``summary()``, the ``scheduler-recovered`` event)."""

    def __init__(self, s: "Scheduler", replay: Replay, last_write: float | None):
        self.s = s
        self.previous = {"pid": replay.hello.get("pid"), "address": replay.hello.get("address"),
                         "started": replay.hello.get("started")}
        self.expected = dict(replay.workers)   # name -> address of the workers alive when the journal ended
        self.back: set[str] = set()
        self.lost_at: list[float] = []         # when peers noticed the old scheduler was gone (their clocks)
        self.last_write = last_write
        self.replayed = {"records": replay.records, "tasks": len(replay.tasks),
                         "finished": sum(1 for t in replay.tasks.values() if t.holders),
                         "erred": sum(1 for t in replay.tasks.values() if t.error is not None),
                         "scattered": sum(1 for t in replay.tasks.values() if t.spec is None),
                         "clients": len({c for t in replay.tasks.values() for c in t.wanted_by}),
                         "workers": len(replay.workers)}
        self.skipped = (replay.skipped_bytes, replay.problem)
        self.reused = self.finished_headless = self.adopted = self.recomputed = self.rerun = 0
        self.recomputed_keys: list[str] = []
        self.lost_scattered: list[str] = []
        self.open = True
        self.opened = time.monotonic()
        self.waited: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        s = self.s
        torn, why = self.skipped
        s.rec.event("journal-replayed", f"Replayed the journal of scheduler {self.previous['pid']} "
                    f"({self.replayed['records']} records: {self.replayed['tasks']} task(s), "
                    f"{self.replayed['finished']} finished, {self.replayed['erred']} erred)"
                    + (f"; skipped {torn} byte(s) at the end: {why}" if torn else "")
                    + f"; waiting up to {s.config['recovery_wait']:g}s for {len(self.expected)} worker(s) to come back",
                    level="warning" if torn else "info", path=s.journal.path, skipped_bytes=torn, problem=why,
                    previous_pid=self.previous["pid"], previous_address=self.previous["address"],
                    waiting_for=sorted(self.expected), **self.replayed)
        loop = asyncio.get_running_loop()
        for client in {c for t in s.tasks.values() for c in t.wanted_by}:
            s._client_absent(client)   # their futures are kept for the grace period; they resubmit on return
        self._timer = loop.call_later(float(s.config["recovery_wait"]), self.close, "timeout")
        if not self.expected:
            loop.call_soon(self.close, "no workers to wait for")

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    # ---------------------------------------------------------------- during the window
    def peer_lost_at(self, lost_at: Any) -> None:
        if isinstance(lost_at, (int, float)) and lost_at > 0:
            self.lost_at.append(float(lost_at))

    def worker_back(self, name: str, lost_at: Any) -> None:
        self.peer_lost_at(lost_at)
        self.back.add(name)
        if self.open and set(self.expected) <= self.back:
            asyncio.get_running_loop().call_soon(self.close, "all workers back")

    def result_back(self, ts: "TaskState") -> None:
        """A returning worker holds ``ts``'s result: done before the old scheduler died, or while it was away."""
        if ts.expected is not None:
            self.reused += 1
        else:
            self.finished_headless += 1
        ts.expected = None

    # ---------------------------------------------------------------- the end of the window
    def close(self, why: str) -> None:
        """Stop waiting: what no worker brought back is recomputed, then placement starts."""
        if not self.open:
            return
        self.open = False
        self.cancel()
        self.waited = time.monotonic() - self.opened
        s = self.s
        lost = self._drop_unconfirmed()
        order = sorted(s.tasks.values(), key=lambda t: t.priority)
        for ts in order:
            if s.tasks.get(ts.key) is ts and ts.wanted_by and ts.error is None and ts.state == "released":
                s._recompute(ts)
        for ts in order:
            if ts in lost and ts.state in ("waiting", "ready"):
                self.recomputed += 1
                if len(self.recomputed_keys) < MAX_KEYS_LISTED:
                    self.recomputed_keys.append(ts.key)
            elif ts.state in ("waiting", "ready"):
                self.rerun += 1
        for ts in order:  # results nobody needs any more (their dependents are done): free them
            if s.tasks.get(ts.key) is ts and ts.state in ("memory", "released") and not s._needed(ts):
                s._release_if_unneeded(ts)
        self._record(why)
        s._schedule()

    def _drop_unconfirmed(self) -> set:
        """Finished results whose holders did not come back: released (scattered data: lost for good)."""
        s = self.s
        lost = set()
        for ts in list(s.tasks.values()):
            if ts.expected is None:
                continue
            holders, ts.expected = sorted(ts.expected), None
            if ts.state != "released":
                continue
            if ts.scattered:
                self.lost_scattered.append(ts.key)
                s.rec.event("scattered-lost", f"Scattered data {ts.key!r} was held by {', '.join(holders)}, which "
                            "did not come back after the scheduler restarted; it can't be recovered", level="error",
                            key=ts.key, worker=holders[0] if holders else None)
                s._set_erred(ts, s._lost_error(ts.key, ", ".join(holders)))
            else:
                lost.add(ts)
                for client in ts.wanted_by:  # a client that kept the result as finished must wait for it again
                    stream = s.clients.get(client)
                    if stream is not None:
                        stream.send({"op": "key-lost", "key": ts.key})
        return lost

    def _record(self, why: str) -> None:
        s = self.s
        died_at = min(self.lost_at) if self.lost_at else self.last_write
        headless = max(0.0, s.started_at - died_at) if died_at else None
        missing = sorted(set(self.expected) - self.back)
        s.rec.event(
            "scheduler-recovered",
            f"Recovered from the death of scheduler {self.previous['pid']} ({self.previous['address']}), which "
            f"ended without closing: the cluster was headless for "
            f"{'?' if headless is None else f'{headless:.1f}'}s; {len(self.back)} of {len(self.expected)} "
            f"worker(s) back within {self.waited:.1f}s ({why}); {self.reused} finished result(s) reused, "
            f"{self.recomputed} recomputed, {self.rerun} unfinished task(s) to run, {self.adopted} still running "
            f"or queued where they were, {self.finished_headless} finished while it was away",
            level="warning", previous_pid=self.previous["pid"], previous_address=self.previous["address"],
            previous_started=self.previous["started"], died_at=died_at,
            headless_for=None if headless is None else round(headless, 3), waited=round(self.waited, 3),
            why=why, workers_back=sorted(self.back), workers_missing=missing, replayed=self.replayed,
            reused=self.reused, recomputed=self.recomputed, recomputed_keys=self.recomputed_keys,
            rerun=self.rerun, adopted=self.adopted, finished_while_headless=self.finished_headless,
            lost_scattered=self.lost_scattered[:MAX_KEYS_LISTED])

    def summary(self) -> dict:
        return {"open": self.open, "previous_pid": self.previous["pid"], "waited": self.waited,
                "workers_back": len(self.back), "workers_expected": len(self.expected), "reused": self.reused,
                "recomputed": self.recomputed, "rerun": self.rerun, "adopted": self.adopted,
                "finished_while_headless": self.finished_headless, "replayed": dict(self.replayed)}


def snapshot(s: "Scheduler") -> list[list]:
    """The scheduler's state as journal records: what a successor needs, and nothing it can do without."""
    from kwdiag.runtime.scheduler import _task_record

    records = [hello(s)]
    for ws in s.workers.values():
        records.append(["worker", ws.name, ws.address, True])
    if s.recovery is not None and s.recovery.open:  # still expected: a second restart must wait for them too
        for name in set(s.recovery.expected) - s.recovery.back:
            records.append(["worker", name, s.recovery.expected[name], True])
    for client in {*s.clients, *s.absent_clients}:
        records.append(["client", client, True])
    tasks = sorted(s.tasks.values(), key=lambda t: t.priority)
    wants: dict[str, list[str]] = {}
    for ts in tasks:
        records.append(_task_record(ts, [d.key for d in ts.deps]))
        for client in ts.wanted_by:
            wants.setdefault(client, []).append(ts.key)
    records.extend(["want", client, keys] for client, keys in wants.items())
    for ts in tasks:
        for ws in ts.who_has:
            records.append(["has", ts.key, ws.name, ts.nbytes])
        for name, nbytes in (ts.expected or {}).items():
            records.append(["has", ts.key, name, nbytes])
        if ts.error is not None:
            records.append(["err", ts.key, ts.error])
        if ts.suspicious:
            records.append(["blame", ts.key, ts.suspicious, ts.death_workers])
    return records
