"""Facts the lines imply but no single line states, derived as events so that rules decide from them. Pure.

Covers, for one ended incarnation (each fact is an ``Event`` of kind ``fact-...`` whose origin is the
line it rests on, so the evidence a verdict shows is still a real line):

* ``fact-cluster-closed``: the whole cluster was being closed (the scheduler closing, or the worker's
  own closing lines giving a cluster-wide reason) and this worker ended in an orderly way (its own
  closing lines, an expected removal, its nanny's kill of a worker slow to close). Positive evidence
  only: when a worker ended never decides it, so a SIGKILL seconds before the close stays a SIGKILL.
* ``fact-close-requested``: the scheduler asked this worker to go (retire, close, restart), by address.
* ``fact-vanished``: the scheduler lost the connection and nothing says the worker left on purpose or
  crashed; ``own_log`` says whether the worker's own lines are in the input at all.
* ``fact-never-registered``: the process failed while starting (a start-up failure or fatal exception,
  and no sign that it ever registered).
* ``fact-died-of-exception``: a registered worker's process died of an exception of its own (a traceback
  through the ``dask worker`` command's or the nanny's entry, kwdiag's fatal record).
* ``fact-gave-up-waiting``: it waited for the scheduler, never registered, and closed in an orderly way
  without a signal telling it to (older Dask says nothing more when ``--death-timeout`` expires).
* ``fact-silent-exit``: the process ended itself with a non-zero status and its own lines, which are
  in the input, show no Python traceback: ``os._exit`` or a C-level ``exit``.
* ``fact-restarted``: the nanny restarted it after an exit it did not ask for, and nothing says why.
* ``fact-no-evidence``: nothing at all says why it ended.
* ``fact-counted-death`` (``counted_death``, not of an incarnation): the scheduler counted a death against a
  task that gave up (KilledWorker) and no line of the input shows that death.

Does not cover: what a fact means for the verdict (the ``rules/facts/`` files) or weighing votes.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from typing import Iterable

from kwdiag.events import Event
from kwdiag.kinds import CONNECTION, EXCEPTION
from kwdiag.reasons import CLUSTER_CLOSE, NANNY_WENT, OWN_REMOVALS, chosen
from kwdiag.timeline import Incarnation, Timeline, known_ts

# ---------------------------------------------------------------- the conditions
# Each fact rule (rules/facts/) states in its `why` the conditions below that it rests on, with these numbers;
# tests/test_facts.py checks that the words and the numbers agree and tries every edge.
CLOSE_BEFORE = 5.0  # an orderly end this long before the scheduler's close line is part of the close ...
CLOSE_AFTER = 120.0  # ... and this long after it
CLOSE_AFTER_LINES = 30  # ... or, without times, this many lines before it in the same file
REQUEST_BEFORE = 120.0  # a retire/close/restart request counts for an end this long after it
# Reasons a worker (or its nanny) gives for closing that mean the whole cluster is going away, given an
# orderly end (kwdiag.reasons says why the nanny's are only so then).
CLUSTER_REASONS = CLUSTER_CLOSE | NANNY_WENT
ORDERLY_SLOTS = {"closing", "nanny-closing", "closed", "end"}  # its own log tells of an end it went through
VIOLENT_SLOTS = {"memory", "crash", "fatal", "startup", "heartbeat"}  # an end that was not orderly


# The stages of a worker-fatal line that happen before a worker registers.
STARTUP_STAGES = frozenset({"preload", "worker_init"})


def _fact(kind: str, basis: Event, message: str | None = None, **fields) -> Event:
    """A fact resting on ``basis``: it shows as that line, read by the fact's rule."""
    return Event(ts=basis.ts, source="kwdiag", kind=kind, worker=basis.worker, fields=fields,
                 level="info", message=message if message is not None else basis.message, origin=basis.origin)


def exit_signal(inc: Incarnation) -> int | None:
    """The signal that ended the process, from its nanny's exit line (kwdiag: the exit record)."""
    for e in inc.slots.get("exit", []):
        sig = e.get("signal")
        if isinstance(sig, int) and sig > 0:
            return sig
        code = e.get("exitcode")
        if isinstance(code, int) and code < 0:
            return -code
    return None


def nanny_killed_it(inc: Incarnation) -> bool:
    """The signal that ended the process was its nanny's doing: it had asked the worker to close (or
    terminated it for memory, or the worker had reported its failed start: the nanny terminates a process
    that did not start, ``WorkerProcess.start``) just before; the signal carries out that decision, it is not
    its cause."""
    exits = [e.origin.line for e in inc.slots.get("exit", []) if e.origin is not None]
    if not exits:
        return False
    return any(e.origin is not None and e.origin.line < min(exits)
               for s in ("nanny-closing", "memory", "memory-kill", "escalate", "startup")
               for e in inc.slots.get(s, []))


def exit_status(inc: Incarnation) -> int | None:
    """The non-zero status a process ended itself with, from its nanny's exit line."""
    for e in inc.slots.get("exit", []):
        code = e.get("exitcode")
        if isinstance(code, int) and not isinstance(code, bool) and code > 0 and e.get("signal") in (None, 0):
            return code
    return None


def _said_goodbye(removal: Event, tl: Timeline) -> bool:
    """The scheduler read the worker's goodbye (``Received 'close-stream'``) just before removing it."""
    near = tl.lines_before(removal, CONNECTION)
    return bool(near) and near[0].kind == "comm-close-stream"


def _vanished_unannounced(removal: Event, tl: Timeline) -> bool:
    """The scheduler's own lines say the connection simply went: kwdiag's ``connection-closed`` record, or
    Dask's ``Connection to ... has been closed.`` just before the removal. Older Dask says neither."""
    if removal.get("how") == "connection-closed":
        return True
    near = tl.lines_before(removal, CONNECTION)
    return bool(near) and near[0].kind == "comm-closed"


def _orderly(inc: Incarnation, tl: Timeline) -> bool:
    """The incarnation's own end lines show a close it chose (or its nanny's kill after a slow close)."""
    slots = set(inc.slots)
    if slots & VIOLENT_SLOTS:
        return False
    sig = exit_signal(inc)
    if sig is not None and "escalate" not in slots and sig not in (15, 2):
        return False
    if exit_status(inc) is not None:
        return False
    if slots & {"closing", "nanny-closing", "closed"} or "escalate" in slots:
        return True
    if "end" in slots:
        # "End worker" is printed whenever the dask worker command exits, whatever ended it: orderly only
        # after a handled signal, and never after an exception of the worker's own.
        return any(e.kind == "signal-received" for e in inc.events) and not _has_exception(inc.events)
    if any(removal_expected(e) for e in inc.slots.get("removed", [])):
        return True
    if any(_said_goodbye(e, tl) for e in inc.slots.get("removed", [])):
        return True
    return any(e.get("caused_by") in ("shutdown", "signal", "restart", "retire") for e in inc.slots.get("exit", []))


EXPECTED_STIMULI = ("retire-workers", "worker-close-gracefully", "client-restart")
LEAVING_STATUSES = {"closing", "closing_gracefully", "closed", "Status.closing", "Status.closing_gracefully",
                    "Status.closed"}


def removal_expected(e: Event) -> bool:
    """The scheduler's removal of a worker it expected to leave: asked for (kwdiag's ``expected``, a
    retirement), or a worker already closing when its connection went (Dask's ``status: closing``)."""
    stimulus = e.get("stimulus")
    return (e.get("expected") is True or e.get("how") in ("retired", "scheduler-close", "restart")
            or e.get("status") in LEAVING_STATUSES
            or (isinstance(stimulus, str) and stimulus.startswith(EXPECTED_STIMULI)))


def removal_lost(e: Event) -> bool:
    """The scheduler's removal of a worker whose connection simply went (nothing says it was leaving)."""
    stimulus = e.get("stimulus")
    if removal_expected(e) or (isinstance(stimulus, str) and stimulus.startswith("check-worker-ttl")):
        return False
    return e.get("how") in (None, "connection-closed")


def _reasons(inc: Incarnation) -> set[str]:
    """The close reasons the worker's (or its nanny's) own end lines give, and a retirement the scheduler
    recorded."""
    out: set[str] = set()
    for e in inc.end_events:
        if e.kind in ("worker-closing", "worker-end", "nanny-closing", "worker-exit"):
            out |= _reasons_of(e)
        elif e.kind == "worker-removed" and e.get("how") in OWN_REMOVALS:
            out.add(e.get("how"))
    return out


def _cluster_close(inc: Incarnation, tl: Timeline) -> Event | None:
    """The line that shows the cluster closing around this worker's end, if any.

    The worker's own closing reason decides first: a cluster-wide one (``scheduler-close``) is the close
    itself; a reason of its own (``retired``, ``lifetime``, a signal the scheduler did not also get) means
    it left on its own even if the scheduler closed moments later. With no reason stated (older Dask, a
    bare ``Stopping worker``), an orderly end near the scheduler's close is part of it.
    """
    own = {r for r in _reasons(inc) if r not in CLUSTER_REASONS}
    if own & OWN_REMOVALS:
        return None   # the scheduler retired it: its nanny's "shutdown" is the retirement's, not the cluster's
    for e in inc.end_events:
        if _reasons_of(e) & CLUSTER_REASONS:
            return e
    end = inc.ended_at
    for e in tl.cluster_lines("scheduler-close"):
        if own and e.get("reason") not in own:
            continue  # it left for a reason of its own, not the scheduler's
        ts = known_ts(e)
        if end is None or ts is None:
            if _same_file_near(e, inc):
                return e
            continue
        if ts - CLOSE_BEFORE <= end <= ts + CLOSE_AFTER:
            return e
    return None


def chose_first(inc: Incarnation) -> bool:
    """The worker had begun a close of its own choosing (a handled signal, a stated reason) before its
    process failed (a fatal traceback, a non-zero exit status): the failure is its close going wrong (a
    Dask bug on the way out), not why it ended."""
    failing = [e.origin.line for e in inc.slots.get("fatal", []) + inc.slots.get("exit", []) if e.origin is not None]
    if not failing:
        return False
    first_failure = min(failing)
    for e in inc.events:
        if e.origin is None or e.origin.line >= first_failure:
            continue
        if e.kind == "signal-received" or (e.kind in ("worker-closing", "nanny-closing") and chosen(e.get("reason"))):
            return True
    return False


def _removed_by_the_close(inc: Incarnation, close: Event) -> bool:
    """Only the scheduler saw this worker end, and it removed it after it had begun to close: the close
    took the worker with it (the scheduler's own log has nothing else to say)."""
    if set(inc.slots) != {"removed"} or close.kind != "scheduler-close":
        return False
    r = inc.slots["removed"][0]
    rts, cts = known_ts(r), known_ts(close)
    if rts is not None and cts is not None:
        return rts >= cts
    return (r.origin is not None and close.origin is not None and r.origin.file == close.origin.file
            and r.origin.line > close.origin.line)


def _reasons_of(e: Event) -> set[str]:
    return {v for k in ("reason", "leaving_reason", "nanny_close_reason", "caused_by")
            if isinstance(v := e.get(k), str)}


def _end_lines_beside(e: Event, inc: Incarnation) -> list[int]:
    """The lines of ``inc``'s end evidence in ``e``'s file (none when ``e`` was not read from a file)."""
    if e.origin is None:
        return []
    return [x.origin.line for x in inc.end_events if x.origin is not None and x.origin.file == e.origin.file]


def _same_file_before(e: Event, inc: Incarnation) -> bool:
    """Without times, a line of the file the worker's end is in, at or before that end's first line."""
    ends = _end_lines_beside(e, inc)
    return bool(ends) and e.origin.line <= min(ends)


def _same_file_near(e: Event, inc: Incarnation) -> bool:
    """Without times, the scheduler's close line of the file the worker's end is in: before that end, or
    within ``CLOSE_AFTER_LINES`` after its last line (the lines' order in one stream stands in for
    ``CLOSE_BEFORE``: a LocalCluster's stderr prints its workers' stops, then "Scheduler closing...")."""
    ends = _end_lines_beside(e, inc)
    return bool(ends) and e.origin.line <= max(ends) + CLOSE_AFTER_LINES


def _close_request(inc: Incarnation, tl: Timeline) -> Event | None:
    """A scheduler request for this worker to go (retire, close, restart) shortly before its end: one that
    names its address or its name, or a restart of every worker."""
    # The scheduler's own record of a retirement (kwdiag's, the plugin's on Dask), when the worker gave no reason
    # of its own for leaving (kwdiag's scheduler also records a worker that left on a signal as retired).
    stated = {r for r in _reasons(inc) if r not in CLUSTER_REASONS and r not in OWN_REMOVALS}
    for e in inc.slots.get("removed", ()):
        if e.get("how") == "retired" and not stated:
            return e
    end = inc.ended_at
    requests = tl.cluster_lines("retire-request", "close-request")
    if end is None:   # untimed: every request, by the order of the lines
        return next((e for e in requests if _names(e, inc) and _same_file_before(e, inc)), None) \
            or _retired_in_turn(inc, tl)
    # Timed, the requests of the window before the end (found by bisection: a long-running adaptive cluster's
    # scheduler logs a request per scale-down, and a pass over all of them for each death grew as their square),
    # and the untimed ones; the first of those in the order read, as a pass over all of them would find it.
    times, timed, untimed = tl.requests_by_time()
    window = timed[bisect_left(times, end - REQUEST_BEFORE):bisect_right(times, end)]
    found = [(i, e) for i, e in window if _names(e, inc)]
    found += [(i, e) for i, e in untimed if _names(e, inc) and _same_file_before(e, inc)]
    return min(found, key=lambda x: x[0])[1] if found else _retired_in_turn(inc, tl)


def _retired_in_turn(inc: Incarnation, tl: Timeline) -> Event | None:
    """A scale-down by names the logs never tie to an address ("Retire worker names (19, 20, ...)", adaptive's
    "Retiring workers [19, 20, ...]", then the scheduler's removals naming addresses only). Dask's
    ``retire_workers`` logs the names and removes the workers it finds under them at once; adaptive then logs
    "Retiring workers" and has the cluster manager close them (``cluster.scale_down``, "close workers more
    forcefully"), which is what removes them when the scheduler knows them by other names (2.30.1's
    ``Adaptive.scale_down``). Either way the removals that follow the nearest such request in its file (within
    ``REQUEST_BEFORE`` when both are timed), as many as it names, are the scale-down's. Only for a worker whose
    name the lines never give, removed with no reason of its own, when no worker of the logs bears one of the
    names (then the names say whom it retired)."""
    removed = inc.slots.get("removed")
    if inc.name is not None or not removed or removed[0].origin is None or _reasons(inc):
        return None
    removal = removed[0]
    file, line = removal.origin.file, removal.origin.line
    request = tl.cluster_line_before(file, line, "retire-request", "close-request")
    if request is None:
        return None
    names = _retired_names(request)
    if not names or names & tl.known_names():
        return None
    ts, end = known_ts(request), known_ts(removal)
    if ts is not None and end is not None and not 0 <= end - ts <= REQUEST_BEFORE:
        return None
    removals = tl.removal_lines(file)
    between = bisect_left(removals, line) - bisect_right(removals, request.origin.line)
    return request if between < len(names) else None


_NAME_LIST = re.compile(r"Retir(?:e worker names|ing workers)\s*[\[(\{](?P<names>[^\])}]*)[\])}]")


def _retired_names(request: Event) -> set[str]:
    """The worker names a retirement request lists by name only (none when it names addresses)."""
    m = _NAME_LIST.search(request.message or "")
    if m is None or "://" in m.group("names") or "<" in m.group("names"):
        return set()
    return {n.strip().strip("'\"") for n in m.group("names").split(",") if n.strip().strip("'\"")}


def _names(request: Event, inc: Incarnation) -> bool:
    text = request.message or ""
    if request.get("request") == "restart" and request.get("addresses") is None:
        return True  # "Restarting all workers", "Restarting workers and releasing all keys"
    if inc.address and inc.address in text:
        return True
    # Dask's LocalCluster retires its workers by name: "Retire worker addresses (...) (0, 1, 2)"
    return bool(inc.name) and re.search(r"[\s(\[,'\"]" + re.escape(inc.name) + r"[\s)\],'\"]", text) is not None


def _has_exception(events: Iterable[Event]) -> bool:
    return any(e.kind in EXCEPTION for e in events)


def _own_lines(inc: Incarnation) -> bool:
    """Lines of the worker process itself (not only its nanny's or the scheduler's) are in the input — or its
    exit record says what the worker last wrote (``stderr_tail``, even empty: whoever recorded the exit read
    the worker's own output, which is gone with the process when the logs come from a live cluster's memory)."""
    return any(e.source == "worker" or (e.kind == "worker-exit" and isinstance(e.get("stderr_tail"), list))
               for e in inc.events)


def counted_death(killed: Event) -> Event:
    """A death the scheduler counted against a task (Dask's ``Task X marked as failed because N workers died
    while trying to run it``) that no line of the input shows: a fact, so that a rule gives its verdict."""
    return _fact("fact-counted-death", killed, task=killed.get("key"))


def derive_facts(inc: Incarnation, tl: Timeline, evidence: list[Event]) -> list[Event]:
    """The facts about ``inc``'s end (see the module doc); ``evidence`` is what the classifier gathered."""
    facts: list[Event] = []
    slots = set(inc.slots)
    first_end = min(inc.end_events, key=lambda e: (e.origin.line if e.origin else 0)) if inc.end_events else None
    orderly = _orderly(inc, tl)
    close = _cluster_close(inc, tl)
    closed_by_the_cluster = close is not None and (orderly or _removed_by_the_close(inc, close))
    if closed_by_the_cluster:
        facts.append(_fact("fact-cluster-closed", close, reason=close.get("reason")))
    request = _close_request(inc, tl)
    violent = bool(slots & VIOLENT_SLOTS) or exit_signal(inc) is not None or exit_status(inc) is not None
    if request is not None and (orderly or not violent):
        facts.append(_fact("fact-close-requested", request, request=request.get("request", "retire")))
    if "removed" in slots and not orderly and not violent and not slots & {"exit"}:
        removed = inc.slots["removed"][0]
        own = _own_lines(inc)
        said_something = bool(slots & ORDERLY_SLOTS)  # its own log tells of an end ("End worker" at least)
        if removal_lost(removed) and not said_something and (own or _vanished_unannounced(removed, tl)):
            facts.append(_fact("fact-vanished", removed, own_log=own))
    stage = next((e.get("stage") for e in inc.slots.get("fatal", ()) if e.get("stage")), None)
    # A traceback through the preload or the worker's construction is from before registration, even
    # when the lines that would show the worker unregistered are missing (a pasted traceback alone).
    unregistered = not inc.registered or stage in STARTUP_STAGES
    if unregistered and slots & {"startup", "fatal"}:
        basis = (inc.slots.get("startup") or inc.slots.get("fatal") or [first_end])[0]
        if basis is not None:
            facts.append(_fact("fact-never-registered", basis, stage=stage))
    if not unregistered and "fatal" in slots and exit_signal(inc) is None and not chose_first(inc):
        facts.append(_fact("fact-died-of-exception", inc.slots["fatal"][0]))
    # a signal it received ("Exiting on signal 15") or the cluster's close (a replacement the nanny was
    # starting when the cluster closed) is what ended the wait, not its --death-timeout
    if not inc.registered and orderly and any(e.kind == "worker-waiting" for e in inc.events) \
            and not closed_by_the_cluster and not any(e.kind == "signal-received" for e in inc.events):
        facts.append(_fact("fact-gave-up-waiting", first_end))
    status = exit_status(inc)
    if status is not None and _own_lines(inc) and not _has_exception(evidence) and not chose_first(inc):
        facts.append(_fact("fact-silent-exit", inc.slots["exit"][0], exitcode=status))
    # the nanny restarted it, and at most the scheduler's plain removal is beside it (which says it left, not why)
    restarted = slots & {"restart", "unregister"}
    if restarted and slots - {"removed"} <= {"restart", "unregister"} \
            and all(removal_lost(e) for e in inc.slots.get("removed", ())):
        facts.append(_fact("fact-restarted", inc.slots.get("restart", inc.slots.get("unregister"))[0]))
    if first_end is not None:
        facts.append(_fact("fact-no-evidence", first_end))
    return facts
