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

Does not cover: the record format and the file (``runtime.journal``), or the task state machine
(``runtime.scheduler_state``: restoring the replayed tasks, adopting what returning workers report, and
what is recomputed when the window closes are its ``restore``, ``add_worker`` and ``end_recovery``).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

from kwdiag.runtime.identity import StartupError, cluster_id
from kwdiag.runtime.journal import VERSION, JournalLocked, Replay
from kwdiag.runtime.scheduler_state import MAX_KEYS_LISTED  # keys named in an event; the counts are complete

if TYPE_CHECKING:  # the scheduler imports this module; its type is only named here
    from kwdiag.runtime.scheduler import Scheduler


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
    s.apply(s.state.restore(replay.tasks.values()))


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
        self.tally = s.state.tally   # what the state machine counts as workers come back and the window ends
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
        for client in {c for t in s.state.tasks.values() for c in t.wanted_by}:
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

    # ---------------------------------------------------------------- the end of the window
    def close(self, why: str) -> None:
        """Stop waiting: what no worker brought back is recomputed, then placement starts."""
        if not self.open:
            return
        self.open = False
        self.cancel()
        self.waited = time.monotonic() - self.opened
        self.s.apply(self.s.state.end_recovery())
        self._record(why)

    def _record(self, why: str) -> None:
        s, tally = self.s, self.tally
        died_at = min(self.lost_at) if self.lost_at else self.last_write
        headless = max(0.0, s.started_at - died_at) if died_at else None
        missing = sorted(set(self.expected) - self.back)
        s.rec.event(
            "scheduler-recovered",
            f"Recovered from the death of scheduler {self.previous['pid']} ({self.previous['address']}), which "
            f"ended without closing: the cluster was headless for "
            f"{'?' if headless is None else f'{headless:.1f}'}s; {len(self.back)} of {len(self.expected)} "
            f"worker(s) back within {self.waited:.1f}s ({why}); {tally.reused} finished result(s) reused, "
            f"{tally.recomputed} recomputed, {tally.rerun} unfinished task(s) to run, {tally.adopted} still running "
            f"or queued where they were, {tally.finished_headless} finished while it was away",
            level="warning", previous_pid=self.previous["pid"], previous_address=self.previous["address"],
            previous_started=self.previous["started"], died_at=died_at,
            headless_for=None if headless is None else round(headless, 3), waited=round(self.waited, 3),
            why=why, workers_back=sorted(self.back), workers_missing=missing, replayed=self.replayed,
            reused=tally.reused, recomputed=tally.recomputed, recomputed_keys=tally.recomputed_keys,
            rerun=tally.rerun, adopted=tally.adopted, finished_while_headless=tally.finished_headless,
            lost_scattered=tally.lost_scattered[:MAX_KEYS_LISTED])

    def summary(self) -> dict:
        return {"open": self.open, "previous_pid": self.previous["pid"], "waited": self.waited,
                "workers_back": len(self.back), "workers_expected": len(self.expected), "reused": self.tally.reused,
                "recomputed": self.tally.recomputed, "rerun": self.tally.rerun, "adopted": self.tally.adopted,
                "finished_while_headless": self.tally.finished_headless, "replayed": dict(self.replayed)}


def snapshot(s: "Scheduler") -> list[list]:
    """The scheduler's state as journal records: what a successor needs, and nothing it can do without."""
    records = [hello(s)]
    for ws in s.state.workers.values():
        records.append(["worker", ws.name, ws.address, True])
    if s.recovery is not None and s.recovery.open:  # still expected: a second restart must wait for them too
        for name in set(s.recovery.expected) - s.recovery.back:
            records.append(["worker", name, s.recovery.expected[name], True])
    for client in {*s.clients, *s.absent_clients}:
        records.append(["client", client, True])
    return records + s.state.task_records()
