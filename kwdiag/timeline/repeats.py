"""Whether a line of one stream tells an end already told, or is another process's: for pass 1 of the timeline
(``kwdiag.timeline.streams``). Pure.

Covers: the signs Dask's print order gives: an end line repeated within a second with the same status (one
record printed by two handlers: one death); the nanny's memory kill of distributed before 2022.6, printed on each
100 ms tick of its monitor until the process was gone, and its escalation (2022.6 on) printed on each tick while
the pid lives (one death); lines Dask prints once per process (a second one is another process's); a nanny's close
that cannot be the same nanny's (each prints "Closing Nanny at" and "Nanny asking worker to close" once).

Does not cover: which process a line goes to (``streams``); this module only answers yes or no for one process.
"""

from __future__ import annotations

from kwdiag.events import Event
from kwdiag.timeline.model import Incarnation, known_ts, slot_of

# Follow-up lines of one death ("Unregistering worker", "Restarting worker") come within these.
FOLLOW_LINES = 40
FOLLOW_SECONDS = 10.0

# An end line that repeats one already given to a process (same kind, same status, no conflicting pid) within
# this many seconds is the same end told twice.
DUPLICATE_SECONDS = 1.0
_STATUS_FIELDS = ("signal", "exitcode", "signal_name", "reason")


def repeats_an_end(p: Incarnation, e: Event, pid: int | None) -> bool:
    """Only exit lines that state a status (a signal, an exit code): lines that state nothing ("Restarting
    worker") may be two workers' in a shared file."""
    if slot_of(e) == "memory" and e.get("pid") is not None:
        ts = known_ts(e)
        return any(x.kind == e.kind and x.get("pid") == e.get("pid") and (ts is None or known_ts(x) is None
                   or abs(ts - known_ts(x)) <= DUPLICATE_SECONDS) for x in p.slots.get("memory", ()))
    if slot_of(e) == "memory-kill" and e.get("pid") is not None:
        # "is slow to accept SIGTERM; sending SIGKILL" / "is slow to terminate; trying again" (Windows, where
        # the kill can fail): the nanny says it on every tick of its monitor while that pid lives
        ts = known_ts(e)
        return any(x.get("pid") == e.get("pid") and (ts is None or known_ts(x) is None
                   or abs(ts - known_ts(x)) <= KILL_REPEAT_SECONDS) for x in p.slots.get("memory-kill", ()))
    if slot_of(e) != "exit" or all(e.get(f) is None for f in _STATUS_FIELDS):
        return False
    ts = known_ts(e)
    for x in p.slots.get("exit", ()):
        if x.kind != e.kind or any(x.get(f) != e.get(f) for f in _STATUS_FIELDS):
            continue
        xpid = x.get("pid") if x.source != "worker" else None
        if pid is not None and xpid is not None and pid != xpid:
            continue
        xts = known_ts(x)
        if ts is None or xts is None or abs(ts - xts) > DUPLICATE_SECONDS:
            continue
        return True
    return False


# The nanny's memory monitor (distributed before 2022.6) ticks every 100 ms and printed its kill again on each
# tick until the process was gone; a process that takes longer than this to die is not one death.
MEMORY_REPEAT_SECONDS = 5.0
# Its escalation (2022.6 on) names the pid and is printed on each tick while that pid lives.
KILL_REPEAT_SECONDS = 60.0


def repeats_old_memory_kill(p: Incarnation, e: Event) -> bool:
    """``e`` is "Worker exceeded N% memory budget. Restarting" (no pid: distributed before 2022.6) printed again
    for ``p``, whose own such line came first and whose nanny has not yet seen it exit (no exit, restart or
    unregister line since): the monitor's next tick while ``p`` was still dying."""
    if e.get("pid") is not None or slot_of(e) != "memory":
        return False
    if p.slots.keys() & {"exit", "restart", "unregister"}:
        return False
    mine = [x for x in p.slots.get("memory", ()) if x.get("pid") is None and x.kind == e.kind]
    if not mine:
        return False
    line, ts = line_and_time(e)
    xline, xts = line_and_time(mine[-1])
    return 0 <= line - xline <= FOLLOW_LINES and (ts is None or xts is None or 0 <= ts - xts <= MEMORY_REPEAT_SECONDS)


# Lines Dask prints once per process, naming none: a nanny's report of its worker's failed start (2.x to
# 2022.5), the worker process's own report that its worker class raised (``Nanny._run``, which runs once a
# process), a worker's stop before it knew its address (Worker.close returns at once when called again), and
# multiprocessing's header over the traceback of a child process that raised.
_ONCE_PER_PROCESS = (("worker-startup-failed", "Failed while trying to start worker process"),
                     ("worker-startup-failed", "Failed to initialize Worker"),
                     ("worker-closing", "Stopping worker"),
                     ("worker-fatal", "Process Dask Worker process (from Nanny):"))


def printed_once_per_process(e: Event) -> str | None:
    text = e.message or ""
    for kind, words in _ONCE_PER_PROCESS:
        if e.kind == kind and (text.endswith(words) if words == "Stopping worker" else words in text):
            return words
    return None


def once_lines(p: Incarnation) -> set[str]:
    return {w for x in p.events if (w := printed_once_per_process(x)) is not None}


# The frames of the `dask worker` command's own entry points (its script's ``<module>``, ``go``, ``main``; the rule
# ``dask-worker-process-traceback``): the command does not recurse, so one traceback that ends it holds each at most once.
_ENTRY_FRAME_RULE = "dask-worker-process-traceback"


def entry_frame_told(p: Incarnation, e: Event) -> bool:
    """``e`` is a frame of the command's entry points that ``p`` already holds, word for word: a second traceback
    ending a `dask worker` command, so another process's (several commands' stderr in one stream)."""
    if e.get("rule") != _ENTRY_FRAME_RULE or not e.message:
        return False
    text = e.message.strip()
    return any(x.get("rule") == _ENTRY_FRAME_RULE and x.message.strip() == text for x in p.slots.get("fatal", ()))


def line_and_time(e: Event) -> tuple[int, float | None]:
    """Where ``e`` is in its file: its line number (0 when unknown) and its time (None when its line had none)."""
    return (e.origin.line if e.origin else 0, known_ts(e))


def another_nannys_close(p: Incarnation, e: Event) -> bool:
    """``e`` (a nanny's close) cannot be ``p``'s nanny's: each nanny prints "Closing Nanny at N" once and then
    "Nanny asking worker to close" once, and its worker's "Stopping worker ... Reason: nanny-close" after both."""
    mine = p.slots.get("nanny-closing", [])
    if e.get("nanny") is not None:  # "Closing Nanny at N"
        if any(x.get("nanny") not in (None, e.get("nanny")) for x in mine):
            return True
        if any(x.get("nanny") is None for x in mine):
            return True  # its nanny already asked the worker to close: this close is another nanny's
    elif any(x.get("nanny") is None for x in mine):
        return True  # a second "asking"
    return any(str(x.get("reason") or "").startswith("nanny-close") for x in p.slots.get("closing", []))
