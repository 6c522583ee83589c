"""Pass 1 of the timeline: within one file, which process each line is about. Pure.

Covers: walking one file's events in line order and giving each line that speaks for the process
whose log it is (a nanny's or worker's own line) to an ``Incarnation`` of that file. A line that names
its process (an address, a pid, kwdiag's incarnation number) goes to that process. A line that does
not goes to the file's one current process while the file holds one worker at a time (a ``dask
worker`` log: its nanny and its worker); once two workers were alive in it at once (LocalCluster's
single stderr, ``--nworkers 2``), such a line goes only where the sequence shows it belongs (the
nanny's "Restarting worker" follows its own exit line), opens an anonymous process when it is proof
of a death by itself (an exit line, a restart), or waits as an *orphan* for the death it explains (a
traceback printed just before the exit line that names the dead process).

A new ``Start worker at`` starts a new process; a second line for an end slot already filled (a second
"killed by signal 9") is a second process, so a worker restarted on a fixed port is counted once per
death, not once per address — unless it repeats the first within a second (same status, no other pid):
a duplicated line, one death. Dask before 2022.6 printed its memory kill ("Worker exceeded 95% memory budget.
Restarting", no pid) on every tick of the nanny's 100 ms monitor until the process was gone: such lines before
the nanny's restart are one death, unless more restarts follow than deaths were seen (two workers killed at
once). A nanny's "Failed while trying to start worker process" and a worker's address-less "Stopping worker"
are printed once per process: a second one in a shared stream is another process's (each of these signs is
a test in ``kwdiag.timeline.repeats``). A nanny's close names the nanny's address: it goes only to a worker of that
machine (when both are IP literals). An orphan that each process of a shared file prints once (the "Exiting on
signal 15" of several `dask worker` commands stopped together) goes one to each death; a reaping by pid alone goes
to the one started process still alive, when there is one.

Does not cover: lines about other processes (the scheduler's, the environment's: ``kwdiag.timeline.merge``
joins those and the files' processes into one set of incarnations).
"""

from __future__ import annotations

import ipaddress

from kwdiag.events import Event
from kwdiag.kinds import NOT_ABOUT_THE_WORKER
from kwdiag.timeline.model import SELF_STANDING, Incarnation, known_ts, slot_of
from kwdiag.timeline.repeats import (
    FOLLOW_LINES,
    FOLLOW_SECONDS,
    another_nannys_close,
    entry_frame_told,
    line_and_time,
    once_lines,
    printed_once_per_process,
    repeats_an_end,
    repeats_old_memory_kill,
)

# An orphan (a line that names no process, in a file shared by several) explains a death in the same
# file if it comes at most this many lines, and this many seconds, before the death's first end line.
ORPHAN_LINES = 400
ORPHAN_SECONDS = 30.0
# Orphans a process prints at most once: the signal its `dask worker` command received.
ONCE_PER_PROCESS = {"signal-received"}
# A traceback printed again by the code that started a failed process comes within this of its end.
REPEAT_SECONDS = 5.0
# Kinds that follow an exit in a nanny's sequence and belong to the death just seen.
# End lines a process writes (or its nanny writes) while it is still alive: after the nanny's exit line
# for a process, such a line is about the next process.
BEFORE_EXIT = {"memory", "memory-kill", "escalate", "closing", "crash"}
# End lines that can come before the process's start line: its nanny was asked to close while it started.
ASKED_BEFORE_START = {"nanny-closing", "closing"}
# Unnamed lines of a shared file that come before the exit they lead to: the nanny's close, its kill of
# a worker slow to close, the worker's own close.
AWAITS_AN_EXIT = {"nanny-closing", "escalate", "closing"}
FOLLOW_UP_SLOTS = {"restart", "unregister", "closed", "nanny-closing", "escalate", "end", "exit", "memory",
                   "fatal", "startup", "crash",  # these three: more lines of one failure (a traceback's frames)
                   "reaped"}  # the exit hook of a worker's parent reaps it after its nanny's close and kill


def _explicit(e: Event) -> tuple[str | None, int | None, int | None]:
    """(address, pid, kwdiag incarnation) that the line itself states. A kwdiag worker's own event was
    written by the worker process, so the writer's pid is the process's pid."""
    addr, pid, inc = e.get("address"), e.get("pid"), e.get("incarnation")
    if pid is None and e.source == "worker" and e.pid is not None:
        pid = e.pid
    return (addr if isinstance(addr, str) and addr else None,
            pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
            inc if isinstance(inc, int) and not isinstance(inc, bool) else None)


class StreamAttributor:
    """Attributes one file's own lines to processes. Feed events in line order, then ``finish()``."""

    def __init__(self, name: str, index: int):
        self.name = name
        self.index = index
        self.procs: list[Incarnation] = []
        self.current: Incarnation | None = None  # the process an unnamed line is about, while one at a time
        self.multi = False  # two processes were alive in this file at once
        self.nannies = 0
        self.started: dict[int, Incarnation] = {}  # the processes that started and may not have ended yet
        self.started_seen = 32  # how many were alive when the ended were last dropped
        self.orphans: list[Event] = []
        self.context: list[Event] = []  # lines that belong to no process (several share the file)
        self.awaiting_exit: list[Event] = []  # a nanny's lines before an exit it has not reported yet
        self.by_inc: dict[tuple[str | None, int], Incarnation] = {}
        self.by_inc_any: dict[int, Incarnation] = {}
        self.by_pid: dict[int, Incarnation] = {}
        self.by_address: dict[str, Incarnation] = {}
        self.by_name: dict[str, Incarnation] = {}
        # memory kills in the old wording (no pid) printed again while their process was still dying:
        # (process, line), kept aside until a restart shows a second death they may be (else context)
        self.repeats: list[tuple[Incarnation, Event]] = []

    # ------------------------------------------------------------------ processes
    def _new(self, e: Event, address: str | None = None, pid: int | None = None, inc: int | None = None,
             name: str | None = None) -> Incarnation:
        cur = self.current
        if name is None and not self.multi and cur is not None and "restart" in cur.slots:
            name = cur.name  # one nanny's file: the process it starts after "Restarting worker" has the same name
        p = Incarnation(address=address, pid=pid, kw_incarnation=inc, name=name, stream=self.name,
                        order=(self.index, e.origin.line if e.origin else 0), host=e.host)
        if (cur is not None and not cur.ended and _started(cur) and address is not None
                and cur.address not in (None, address)):
            self.multi = True  # a line about another live worker: several workers share this file
        self.procs.append(p)
        self.current = p
        self._index(p)
        return p

    def _find(self, address: str | None, pid: int | None, inc: int | None, name: str | None) -> Incarnation | None:
        """The latest process of this file with the identity a line states (kwdiag's incarnation number and
        name, else the pid, else the address, else the name). Indexed: a file may hold many thousands."""
        if inc is not None:
            p = self.by_inc.get((name, inc)) or (self.by_inc_any.get(inc) if name is None else None)
            if p is None and name is not None:
                p = self.by_inc.get((None, inc))
            if p is not None:
                return p
        if pid is not None and pid in self.by_pid:
            return self.by_pid[pid]
        if address is not None:
            p = self.by_address.get(address)
            return p if p is not None and (pid is None or p.pid in (None, pid)) else None
        if pid is not None:
            return None
        if name is not None:
            return self.by_name.get(name)
        return None

    def _index(self, p: Incarnation) -> None:
        if p.kw_incarnation is not None:
            self.by_inc[(p.name, p.kw_incarnation)] = p
            self.by_inc_any[p.kw_incarnation] = p
        if p.pid is not None:
            self.by_pid[p.pid] = p
        if p.address is not None:
            self.by_address[p.address] = p
        if p.name is not None:
            self.by_name[p.name] = p

    def _start(self, e: Event, address: str | None, pid: int | None, inc: int | None) -> Incarnation:
        name = e.worker
        cur = self.current
        # kwdiag: the nanny's spawn and the worker's start of one incarnation arrive from two files, but
        # within a file a start line continues a process only if that process has not started yet.
        found = self._find(address, pid, inc, name) if inc is not None else None
        if found is not None:
            return found
        if (cur is not None and cur.started is None and not _started(cur) and set(cur.slots) <= ASKED_BEFORE_START
                and (cur.address is None or cur.address == address)):
            return cur  # lines before its start line (a close asked for while it started) are this process's
        if e.get("one_at_a_time"):
            self.current = None  # the file's last process is over: its lines end where this one's begin
        elif cur is not None and not cur.ended and _started(cur) and not self.multi:
            # a second start while the first still lives: several workers share this file
            self.multi = True
        return self._new(e, address=address, pid=pid, inc=inc, name=name)

    # ------------------------------------------------------------------ lines
    def feed(self, e: Event) -> None:
        if e.kind in NOT_ABOUT_THE_WORKER:
            if e.kind == "nanny-start":
                self.nannies += 1
                self.multi = self.multi or self.nannies > 1  # several nannies: their workers share this file
            self.context.append(e)
            return
        address, pid, inc = _explicit(e)
        if e.kind in ("worker-start", "worker-spawn"):
            p = self._start(e, address, pid, inc)
            self._give(p, e, address, pid, inc)
            self._note_started(p)
            return
        if e.kind == "worker-name":
            target = self._latest_started()
            if target is not None and target.name in (None, e.worker):
                target.name = e.worker or target.name
                target.add(e)
                self._index(target)
            return
        named = address is not None or pid is not None or inc is not None or e.worker is not None
        p = self._find(address, pid, inc, e.worker) if named else None
        slot = slot_of(e)
        if p is None and not self.multi:
            p = self._not_the_current(e, address, named)
        if p is None and (address is not None or inc is not None or e.worker is not None):
            p = self._new(e, address=address, pid=pid, inc=inc, name=e.worker)  # named by the line itself
        if p is None and not self.multi:
            if self._restarted_before(slot, named):
                self.orphans.append(e)   # it waits for the death it explains, as in a file several processes share
                return
            p = self.current if self.current is not None else self._new(e)
        if p is None:
            p = self._unnamed_target(e, slot, pid)
            if p is None:
                if slot is None:
                    self.orphans.append(e)
                elif slot in AWAITS_AN_EXIT:
                    self.awaiting_exit.append(e)
                else:
                    self.context.append(e)
                return
        elif slot == "memory" and slot in p.slots and not named and repeats_old_memory_kill(p, e):
            self.repeats.append((p, e))  # the monitor's next tick while the process was still dying
            return
        elif slot is not None and slot in p.slots and repeats_an_end(p, e, pid):
            # The same end told twice (a duplicated or tee'd line, one copy with an unreadable pid): one death.
            if pid is not None and p.pid is None:
                p.pid = pid
                self._index(p)
            self.context.append(e)
            return
        elif not _fits(p, e):
            follow = self._dying_without(e, pid) if slot in FOLLOW_UP_SLOTS and not named else None
            if follow is None and not named:
                follow = self._second_death_of_repeats(e, slot)
            if follow is None and slot == "exit":
                follow = self._killed_awaiting_exit(e, pid)
            p = follow or self._new(e, address=address, pid=pid, inc=inc, name=e.worker)
        self._give(p, e, address, pid, inc)

    def _restarted_before(self, slot: str | None, named: bool) -> bool:
        """Whether a line that names no process and ends nothing (a traceback) comes after the current process's
        nanny restarted it: the process is gone, and the line is a later process's, whose own lines may not say
        where it starts (a LocalCluster's stderr at WARNING holds no start lines)."""
        return slot is None and not named and self.current is not None and "restart" in self.current.slots

    def _not_the_current(self, e: Event, address: str | None, named: bool) -> Incarnation | None:
        """In a file of one nanny's or one worker's lines, the process a line that the current process cannot
        have printed belongs to: a worker's stop goes to the nanny-only process whose close came first; another
        nanny's close (``another_nannys_close``) and a second line of those Dask prints once per process (a
        nanny's failed start, an address-less stop) open another process. None: no such reason."""
        if e.kind == "worker-closing" and address is not None:
            p = self._nanny_closed_unnamed(e)
            if p is not None:
                return p
        if self.current is None:
            return None
        if e.kind == "nanny-closing" and another_nannys_close(self.current, e):
            return self._new(e)
        once = None if named else printed_once_per_process(e)
        if once is not None and once in once_lines(self.current):
            return self._new(e)
        if not named and entry_frame_told(self.current, e):
            return self._ended_before_its_traceback(e)
        return None

    def _ended_before_its_traceback(self, e: Event) -> Incarnation | None:
        """The earliest process of this file that said "End worker" a little before ``e`` and holds no such frame:
        `dask worker` logs "End worker" in a ``finally`` and then dies of the exception that escaped its main, so
        several commands sharing a stream print their "End worker" lines, then their tracebacks (interleaved)."""
        for p in self.procs[-32:]:
            if p is self.current or "end" not in p.slots or p.slots.keys() & {"exit", "restart"} or entry_frame_told(p, e):
                continue
            if _soon_after(p.slots["end"][0], e):
                return p
        return None

    def _nanny_closed_unnamed(self, e: Event) -> Incarnation | None:
        """The earliest process of this file known only by its nanny's close ("Nanny asking worker to
        close") that has no worker line yet: Dask prints the nanny's two lines before its worker's stop."""
        for p in self.procs[-32:]:
            if (p.address is None and p.name is None and p.pid is None and set(p.slots) == {"nanny-closing"}
                    and any(x.get("nanny") is None for x in p.slots["nanny-closing"])):
                return p
        return None

    def _unnamed_target(self, e: Event, slot: str | None, pid: int | None) -> Incarnation | None:
        """Where a line that names no process goes in a file several processes share, if anywhere."""
        if slot is None:
            return None
        follow = self._dying_without(e, pid) if slot in FOLLOW_UP_SLOTS else None
        if follow is not None:
            return follow
        if slot == "memory" and pid is None:
            dying = next((p for p in reversed(self.procs[-32:]) if "memory" in p.slots), None)
            if dying is not None and repeats_old_memory_kill(dying, e):
                self.repeats.append((dying, e))
                return None
        follow = self._second_death_of_repeats(e, slot)
        if follow is not None:
            return follow
        if slot == "fatal" and self._repeats_a_fatal(e):
            return None
        if slot in SELF_STANDING:
            return (self._the_one_alive(pid) if slot == "reaped" else None) or self._new(e, pid=pid)
        return None

    def _note_started(self, p: Incarnation) -> None:
        self.started[id(p)] = p
        if len(self.started) > 2 * self.started_seen:   # drop the ended now and then: a long file stays small
            self._forget_ended()

    def _forget_ended(self) -> None:
        for key in [k for k, p in self.started.items() if p.ended]:
            del self.started[key]   # an ended process never lives again: each is dropped once (linear in the file)
        self.started_seen = max(32, len(self.started))

    def _the_one_alive(self, pid: int | None) -> Incarnation | None:
        """The only process of this file that started and has not ended, when there is exactly one: the worker child
        that a parent's exit hook reaps (by pid only) is one that was still running, so that process (its own end
        lines are missing from the paste). Not for other lines that name no process: a process that fails while
        starting prints no start line, so the one started process alive is not the only candidate."""
        self._forget_ended()
        if len(self.started) != 1:
            return None
        alive = next(iter(self.started.values()))
        return alive if pid is None or alive.pid in (None, pid) else None

    def _dying_without(self, e: Event, pid: int | None) -> Incarnation | None:
        """The latest process of this file that is ending (an end line came a moment ago) and has no line
        of ``e``'s kind yet: the nanny's "Restarting worker" goes to the exit it follows, even when the
        lines of two deaths interleave. A process its nanny is restarting is over: what follows is not its."""
        line = e.origin.line if e.origin else 0
        ts = known_ts(e)
        once = printed_once_per_process(e)
        for p in reversed(self.procs[-32:]):
            if not p.ended or "restart" in p.slots or not _fits(p, e) or (pid is not None and p.pid not in (None, pid)):
                continue
            if once is not None and once in once_lines(p):
                continue  # a line a process prints once, which this one printed: another process's failure
            if slot_of(e) == "reaped" and "exit" in p.slots:
                continue  # Dask reaps a child still alive at its parent's exit: one whose exit was reported is gone
            last = max(p.end_events, key=lambda x: x.origin.line if x.origin else 0)
            lline = last.origin.line if last.origin else 0
            lts = known_ts(last)
            if 0 <= line - lline <= FOLLOW_LINES and (ts is None or lts is None or ts - lts <= FOLLOW_SECONDS):
                return p
        return None

    def _killed_awaiting_exit(self, e: Event, pid: int | None) -> Incarnation | None:
        """The earliest process of this file whose nanny said it was killing it ("Worker process still alive after
        N seconds, killing": no pid) and has not reported its exit yet: the nanny logs the kill, then the exit of the
        process it killed, so several nannies of one process closing at once print their kills and then as many
        exits (which kill goes with which exit the lines cannot tell; each is one death either way)."""
        for p in self.procs[-64:]:
            if set(p.slots) != {"escalate"} or (pid is not None and p.pid not in (None, pid)):
                continue
            if _soon_after(p.slots["escalate"][-1], e):
                return p
        return None

    def _second_death_of_repeats(self, e: Event, slot: str | None) -> Incarnation | None:
        """A restart (or exit) line that no dying process can take, after a memory kill line taken for a
        repeat of an earlier one: that line was a second worker's kill (two killed at once), and this is
        its restart. A new process of the two lines."""
        if slot not in ("restart", "exit", "unregister"):
            return None
        line, ts = line_and_time(e)
        for i in range(len(self.repeats) - 1, -1, -1):
            q, m = self.repeats[i]
            mline, mts = line_and_time(m)
            if slot in q.slots and 0 <= line - mline <= FOLLOW_LINES \
                    and (ts is None or mts is None or 0 <= ts - mts <= FOLLOW_SECONDS):
                del self.repeats[i]
                n = self._new(m)
                n.add(m)
                return n
        return None

    def _repeats_a_fatal(self, e: Event) -> bool:
        """``e`` is a line of a traceback this file already gave to a process that ended moments ago,
        printed again by whoever started it (a LocalCluster re-raises a nanny's failed start to its caller,
        asyncio prints the task that held it): the same death told twice, not a second one."""
        ts = known_ts(e)
        if ts is None:
            return False
        for p in reversed(self.procs[-32:]):
            same = [x for x in p.slots.get("fatal", ()) if x.get("rule") == e.get("rule")]
            ends = [known_ts(x) for x in p.end_events if known_ts(x) is not None]
            if same and ends and 0 <= ts - max(ends) <= REPEAT_SECONDS:
                return True
        return False

    def _give(self, p: Incarnation, e: Event, address: str | None, pid: int | None, inc: int | None) -> None:
        p.add(e)
        if address is not None and p.address is None and e.kind != "nanny-start":
            p.address = address
        if pid is not None and p.pid is None and e.kind in ("worker-exit", "worker-spawn", "nanny-memory-terminate",
                                                             "worker-start", "worker-registered"):
            p.pid = pid
        if inc is not None and p.kw_incarnation is None:
            p.kw_incarnation = inc
        if e.worker and p.name is None:
            p.name = e.worker
        if p.host is None and e.host:
            p.host = e.host
        self._index(p)

    def _latest_started(self) -> Incarnation | None:
        for p in reversed(self.procs):
            if _started(p):
                return p
        return self.current

    # ------------------------------------------------------------------ the end
    def finish(self) -> None:
        """Give each orphan to the death it explains: the first process whose end follows it closely."""
        self._give_awaiting_exit()
        self.context.extend(e for _, e in self.repeats)
        self.repeats = []
        if not self.orphans:
            return
        anchors = sorted(((line_and_time(e), p) for p in self.procs for e in p.end_events), key=lambda t: t[0])
        j = 0
        for o in self.orphans:
            line, ts = line_and_time(o)
            while j < len(anchors) and anchors[j][0][0] < line:
                j += 1
            target = self._orphans_death(o, anchors, j)
            if target is not None:
                target.add(o)
            else:
                self.context.append(o)

    @staticmethod
    def _orphans_death(o: Event, anchors: list, j: int) -> Incarnation | None:
        """The first death whose end follows orphan ``o`` closely (from ``anchors[j]`` on); for a line a process
        prints once (``ONCE_PER_PROCESS``), the first that holds no such line yet: processes that share a file print
        one each ("Exiting on signal 15" of several `dask worker` commands stopped together) before their ends."""
        line, ts = line_and_time(o)
        for k in range(j, len(anchors)):   # by index: a slice would copy the rest of a long file's deaths each time
            (aline, ats), p = anchors[k]
            if aline - line > ORPHAN_LINES or not (ts is None or ats is None or 0 <= ats - ts <= ORPHAN_SECONDS):
                return None
            if o.kind not in ONCE_PER_PROCESS or not any(x.kind == o.kind for x in p.events):
                return p
        return None


    def _give_awaiting_exit(self) -> None:
        """Nannies that share a file print their close and "still alive ..., killing" lines without naming
        the process, then one exit line each: each such line goes to the first exit after it whose process
        has no line of its kind yet (in order, as the nannies printed them), else it stays context."""
        exits = sorted(((line_and_time(e), p) for p in self.procs for e in p.slots.get("exit", ())), key=lambda t: t[0])
        for e in self.awaiting_exit:
            line, ts = line_and_time(e)
            slot = slot_of(e)
            for (xline, xts), p in exits:
                if xline <= line or xline - line > ORPHAN_LINES or slot in p.slots:
                    continue
                if ts is not None and xts is not None and not 0 <= xts - ts <= ORPHAN_SECONDS:
                    continue
                p.add(e)
                break
            else:
                self.context.append(e)


def _soon_after(earlier: Event, e: Event) -> bool:
    """``e`` comes after ``earlier`` in their file, within ``ORPHAN_LINES`` lines and ``ORPHAN_SECONDS`` (when both
    carry a time): close enough to be the next line of the same process's story."""
    line, ts = line_and_time(e)
    eline, ets = line_and_time(earlier)
    return 0 < line - eline <= ORPHAN_LINES and (ts is None or ets is None or 0 <= ts - ets <= ORPHAN_SECONDS)


def _fits(p: Incarnation, e: Event) -> bool:
    """``e`` can be more evidence of ``p``: its slot is free, it is not a line a live process writes
    arriving after ``p``'s nanny already reported ``p`` dead (a kwdiag exit record's own stderr tail aside),
    and not a failed start after ``p``'s nanny said it was restarting it."""
    if not p.can_take(e):
        return False
    if e.kind == "nanny-closing" and e.get("nanny") is not None and (
            another_nannys_close(p, e) or not same_machine(p.address, e.get("nanny"))):
        return False  # each process has one nanny, on its own machine
    if slot_of(e) == "startup" and "restart" in p.slots:
        return False  # its nanny is restarting it: a start that fails now is the next process's
    if slot_of(e) == "start-timeout" and ("restart" in p.slots or "exit" in p.slots):
        return False  # a process that exited did not time out starting: the timed-out one is the next
    if slot_of(e) in ("exit", "restart") and "start-timeout" in p.slots:
        # distributed 1.21 ``WorkerProcess.start``: after "Failed to start worker process.  Restarting" the nanny
        # terminates that process and starts another, and ``_on_exit`` ignores the old one's exit ("Ignore exit
        # of old process instance"): no exit or restart line is ever that process's
        return False
    if slot_of(e) in ("memory", "memory-kill", "escalate") and "restart" in p.slots:
        # the nanny restarts it after its exit: a memory kill, or a kill of a worker slow to close (the cluster's
        # close), told after that is the next process's
        return False
    if (slot_of(e) in ("nanny-closing", "closing") or e.kind == "signal-received") and "restart" in p.slots \
            and _explicit(e) == (None, None, None):
        # ... and so is a close, or the signal that starts one, that names no process (a nanny restarts its worker
        # only while it is not closing; Dask's "Nanny asking worker to close" is only for a process starting or
        # running)
        return False
    return not (slot_of(e) in BEFORE_EXIT and "exit" in p.slots and e.get("via") != "stderr_tail")


def same_machine(address: str | None, other: str | None) -> bool:
    """False only when both addresses are IP literals of different hosts (a name and an IP may be one machine)."""
    hosts = [_ip_host(a) for a in (address, other)]
    return None in hosts or hosts[0] == hosts[1]


def _ip_host(address: str | None) -> str | None:
    if not address or "://" not in address:
        return None
    host = address.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    return host


def _started(p: Incarnation) -> bool:
    return any(e.kind in ("worker-start", "worker-spawn") for e in p.events)
