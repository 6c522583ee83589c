"""Pass 2 of the timeline: join the views of one process from several files into one incarnation. Pure.

Covers: the scheduler's view (its ``Register worker`` / ``Remove worker`` / heartbeat lines name an
address: one process per registration, so a fixed port registered five times is five processes), and
joining views that are the same process: kwdiag's (name, incarnation number), the same pid, a Dask
text log's view of a process kwdiag's plugins also recorded (the same end told twice), the same
address over overlapping lifetimes (one-to-one, the biggest overlap first), and an exit line that named
no process with the one process whose end the scheduler saw at about the same time. Two views never
join when they disagree (different names, addresses, pids or incarnation numbers) or when both hold an
end line of the same kind (one process ends once).

Does not cover: attributing lines within a file (``kwdiag.timeline.streams``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import defaultdict
from typing import Iterable

from kwdiag.events import Event
from kwdiag.timeline.model import REPEATABLE, Incarnation, known_ts, slot_of, stream_of

OVERLAP_TOLERANCE = 2.0  # seconds: the scheduler registers a worker a moment after it starts
ANONYMOUS_JOIN = 5.0  # seconds between an unnamed exit line and the scheduler's removal of the same process
ANONYMOUS_LINES = 12  # ... or lines between them, when the lines carry no time
REMOVAL_SECONDS = 60.0  # at most between the "Remove worker X" and the "Removed worker X" of one removal
CORE_SLOTS = ("exit", "memory", "memory-kill", "restart", "unregister", "crash", "fatal", "startup")


# ---------------------------------------------------------------- the scheduler's view
def scheduler_view(events: Iterable[Event]) -> list[Incarnation]:
    """Processes as the scheduler saw them: from the lines that name a worker by address (or name)."""
    by_addr: dict[str, list[Incarnation]] = defaultdict(list)
    out: list[Incarnation] = []
    for e in events:
        addr = e.get("address")
        key = addr if isinstance(addr, str) and addr else (f"name:{e.worker}" if e.worker else None)
        if key is None:
            continue
        incs = by_addr[key]
        cur = incs[-1] if incs else None
        if cur is not None and _retells(cur, e):
            _take_retelling(cur, e)   # the scheduler's record and Dask's own line of the same fact: one process
            continue
        if cur is None or (e.kind == "worker-registered" and (cur.registered or cur.ended)) or not cur.can_take(e):
            cur = Incarnation(address=addr if isinstance(addr, str) else None, name=e.worker,
                              order=(10**9, e.origin.line if e.origin else 0), host=e.host)
            incs.append(cur)
            out.append(cur)
        cur.add(e)
        if e.worker and cur.name is None:
            cur.name = e.worker
        pid = e.get("pid")
        if e.kind in ("worker-registered", "worker-exit") and isinstance(pid, int) and cur.pid is None:
            cur.pid = pid
        inc = e.get("incarnation")
        if isinstance(inc, int) and cur.kw_incarnation is None:
            cur.kw_incarnation = inc
    return out


def _retells(cur: Incarnation, e: Event) -> bool:
    """``e`` and a line ``cur`` already has tell one fact: one first-hand and one a copy (a run directory with
    both the scheduler plugin's records and Dask's text log), same kind, within ``MIRROR_SECONDS``; or two
    lines of one removal (Dask's ``Remove worker`` and its ``Removing worker ... caused the cluster to lose``
    name the same stimulus; its ``Remove worker`` and, at its end, ``Removed worker``)."""
    stimulus = e.get("stimulus")
    if e.kind == "worker-removed" and isinstance(stimulus, str) and stimulus and any(
            x.get("stimulus") == stimulus for x in cur.slots.get("removed", ())):
        return True
    ts = known_ts(e)
    if e.kind == "worker-removed" and e.get("removal") == "finished":
        # ``remove_worker`` logs "Remove worker X" first and "Removed worker X" last: one removal (one call: moments
        # apart when both are timed; a removal of the same address much later is another process's)
        removals = cur.slots.get("removed", ())
        return bool(removals) and not any(x.get("removal") == "finished" for x in removals) and all(
            ts is None or known_ts(x) is None or 0 <= ts - known_ts(x) <= REMOVAL_SECONDS for x in removals)
    if ts is None:
        return False
    pool = cur.events if e.kind == "worker-registered" else cur.slots.get(slot_of(e) or "", ())
    if e.kind == "worker-registered" and cur.ended:
        return False
    return any(x.kind == e.kind and _copy(x) != _copy(e) and known_ts(x) is not None
               and abs(known_ts(x) - ts) <= MIRROR_SECONDS for x in pool)


def _take_retelling(cur: Incarnation, e: Event) -> None:
    """Keep both lines as evidence; the first-hand one holds the slot (it carries the facts)."""
    slot = slot_of(e)
    if slot is not None and not _copy(e) and slot in cur.slots:
        cur.slots[slot] = [e if (x.kind == e.kind and _copy(x)) else x for x in cur.slots[slot]]
    cur.events.append(e)
    pid = e.get("pid")
    if e.kind in ("worker-registered", "worker-exit") and isinstance(pid, int) and cur.pid is None:
        cur.pid = pid


# ---------------------------------------------------------------- joining views
class _Joiner:
    def __init__(self, procs: list[Incarnation]):
        self.procs = procs
        self.parent = list(range(len(procs)))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def join(self, i: int, j: int) -> bool:
        a, b = self.find(i), self.find(j)
        if a == b:
            return True
        pa, pb = self.procs[a], self.procs[b]
        if not compatible(pa, pb):
            return False
        absorb(pa, pb)
        self.parent[b] = a
        return True

    def roots(self) -> list[Incarnation]:
        return [self.procs[i] for i in range(len(self.procs)) if self.find(i) == i]


def compatible(a: Incarnation, b: Incarnation) -> bool:
    for x, y in ((a.name, b.name), (a.address, b.address), (a.pid, b.pid), (a.host, b.host)):
        if x is not None and y is not None and x != y:
            return False
    if a.kw_incarnation is not None and b.kw_incarnation is not None and a.kw_incarnation != b.kw_incarnation:
        return False
    common = set(a.slots) & set(b.slots)
    if "nanny-closing" in common and _two_nannies(a.slots["nanny-closing"], b.slots["nanny-closing"]):
        return False
    if _nanny_after_stop(a, b) or _nanny_after_stop(b, a):
        return False
    return all(s in REPEATABLE or _slot_retold(a.slots[s], b.slots[s]) for s in common)


def _two_nannies(xs, ys) -> bool:
    """Each nanny prints "Closing Nanny at N" once and then "Nanny asking worker to close" once per close: two
    addresses, two "asking" lines, or an "asking" before the other's "Closing" in one stream are two nannies."""
    nx = {x.get("nanny") for x in xs} - {None}
    ny = {y.get("nanny") for y in ys} - {None}
    if nx and ny and nx != ny:
        return True
    if any(x.get("nanny") is None for x in xs) and any(y.get("nanny") is None for y in ys):
        return True
    return _asks_before_closing(xs, ys) or _asks_before_closing(ys, xs)


def _asks_before_closing(xs, ys) -> bool:
    """An "asking" line of ``xs`` comes before a "Closing Nanny at" line of ``ys`` in the same stream."""
    asks = [x for x in xs if x.get("nanny") is None and x.origin is not None]
    closes = [y for y in ys if y.get("nanny") is not None and y.origin is not None]
    return any(stream_of(x) == stream_of(y) and x.origin.line < y.origin.line for x in asks for y in closes)


def _slot_retold(xs: list[Event], ys: list[Event]) -> bool:
    """Both processes end with a line of this slot, and the lines tell one fact: a first-hand record and a copy
    (Dask's own line) of the same kind within ``MIRROR_SECONDS`` — the same end, not two."""
    return all(any(x.kind == y.kind and _copy(x) != _copy(y) and known_ts(x) is not None and known_ts(y) is not None
                   and abs(known_ts(x) - known_ts(y)) <= MIRROR_SECONDS for y in ys) for x in xs)


def absorb(a: Incarnation, b: Incarnation) -> None:
    """``a`` takes ``b``'s events and identity (they are one process)."""
    for e in b.events:
        a.add(e)
    a.address = a.address or b.address
    a.pid = a.pid if a.pid is not None else b.pid
    a.name = a.name or b.name
    a.kw_incarnation = a.kw_incarnation if a.kw_incarnation is not None else b.kw_incarnation
    a.stream = a.stream or b.stream
    a.host = a.host or b.host
    a.registered = a.registered or b.registered
    a.order = min(a.order, b.order)
    if b.started is not None and (a.started is None or b.started < a.started):
        a.started = b.started


def join_views(procs: list[Incarnation]) -> list[Incarnation]:
    """One incarnation per process from the files' and the scheduler's views (see the module doc)."""
    j = _Joiner(procs)
    _join_by_key(j, lambda p: (p.name, p.kw_incarnation) if p.kw_incarnation is not None and p.name else None)
    _join_by_key(j, lambda p: (p.host, p.pid) if p.pid is not None else None)
    _join_pid_without_host(j)
    _join_mirrors(j)
    _join_by_address(j)
    _join_unnamed_exits(j)
    _join_exits_to_removals(j)
    _join_by_successor(j)
    return j.roots()


def _join_by_key(j: _Joiner, key) -> None:
    first: dict[object, int] = {}
    for i, p in enumerate(j.procs):
        k = key(p)
        if k is None:
            continue
        if k in first:
            j.join(first[k], i)
        else:
            first[k] = i


def _join_pid_without_host(j: _Joiner) -> None:
    """A pid told by a line that names no host (a text log) and by records of exactly one host: one process.
    With several hosts using that pid, nothing says which: they stay apart."""
    hosts: dict[int, set[str]] = defaultdict(set)
    for p in j.roots():
        if p.pid is not None and p.host is not None:
            hosts[p.pid].add(p.host)
    index = {id(p): i for i, p in enumerate(j.procs)}
    for p in j.roots():
        if p.pid is None or p.host is not None or len(hosts.get(p.pid, ())) != 1:
            continue
        host = next(iter(hosts[p.pid]))
        q = next((r for r in j.roots() if r.pid == p.pid and r.host == host), None)
        if q is not None and compatible(q, p):
            j.join(index[id(q)], index[id(p)])


MIRROR_SECONDS = 2.0  # between kwdiag's record of an end and Dask's own line for it


def _copy(e: Event) -> bool:
    """``e`` retells a fact another record may hold first-hand: a line of Dask's text log (a rule read it,
    so it carries ``ctx``) or a nanny's death report forwarded to the scheduler."""
    return "ctx" in e.fields or e.get("forwarded") is True


def _mirrors(copy: Incarnation, rec: Incarnation) -> bool:
    """Every end line ``copy`` shares a slot with ``rec`` for is a copy of a line of the same kind in ``rec``
    within ``MIRROR_SECONDS``: the same end told twice (``kwdiag run --dask`` keeps Dask's log beside the
    plugins' records, so "Worker process 31 was killed by signal 9" arrives both ways)."""
    common = [s for s in set(copy.slots) & set(rec.slots) if s not in REPEATABLE]
    for slot in common:
        for e in copy.slots[slot]:
            ts = known_ts(e)
            if not _copy(e) or not any(
                    r.kind == e.kind and not _copy(r)
                    and (ts is None or known_ts(r) is None or abs(known_ts(r) - ts) <= MIRROR_SECONDS)
                    for r in rec.slots[slot]):
                return False
    return True


def _join_mirrors(j: _Joiner) -> None:
    """A process told twice, first-hand by kwdiag's records and again by copies (see ``_mirrors``) of the same
    pid, or of the same address at the same time: one process, although both views hold its end. Copies carry
    no host (text) or the scheduler's, so the pid matches whatever host the record names."""
    roots = j.roots()
    index = {id(p): i for i, p in enumerate(j.procs)}
    firsthand = {id(p) for p in roots if any(not _copy(e) for e in p.events)}
    if not firsthand:
        return  # text logs alone (the usual input): nothing was recorded first-hand, nothing is told twice
    by_pid: dict[int, list[Incarnation]] = defaultdict(list)
    by_addr: dict[str, list[Incarnation]] = defaultdict(list)
    for p in roots:
        if p.pid is not None:
            by_pid[p.pid].append(p)
        elif p.address:
            by_addr[p.address].append(p)
    with_pid: dict[str, list[Incarnation]] = defaultdict(list)
    for p in roots:
        if p.address and p.pid is not None and p.address in by_addr:
            with_pid[p.address].append(p)
    groups = list(by_pid.values()) + [by_addr[a] + with_pid[a] for a in by_addr]
    for group in groups:
        for copy in group:
            if not all(_copy(e) for e in copy.events):
                continue  # only a view made of copies is joined here (two records are joined by key)
            for rec in group:
                ic, ir = index[id(copy)], index[id(rec)]
                if rec is copy or id(rec) not in firsthand or j.find(ic) != ic or j.find(ir) != ir:
                    continue
                if copy.pid is None and not _overlap(copy, rec):
                    continue
                if any(x is not None and y is not None and x != y for x, y in (
                        (copy.name, rec.name), (copy.address, rec.address), (copy.kw_incarnation, rec.kw_incarnation))):
                    continue
                if _mirrors(copy, rec):
                    absorb(rec, copy)
                    j.parent[ic] = ir
    _join_anonymous_copies(j, index)


def _tells_the_same(copy: Event, exit_record: Event) -> bool:
    """The copy's line fits the recorded exit: a restart line only after an exit the nanny restarted, a crash
    dump or a fatal traceback only with a status that is not a clean 0."""
    slot = slot_of(copy)
    if slot == "restart":
        return exit_record.get("will_restart") is not False
    if slot in ("crash", "fatal"):
        return exit_record.get("exitcode") != 0
    return True


def _join_anonymous_copies(j: _Joiner, index: dict[int, int]) -> None:
    """Copies that name no process at all (Dask's "Restarting worker" in a shared log, the nanny's "still
    alive after 4 seconds, killing") each go to a process whose first-hand exit record they retell: an exit
    that fits (``_tells_the_same``), within ``MIRROR_SECONDS``, not yet retold by another copy of the same
    kind. Views are taken in time order and each copy takes the nearest such exit, so when several exits
    happen within the same second, as many copies of one kind go to as many of them (which copy goes to which
    changes nothing: they say the same thing). When every end line of such a view finds its process, the view
    is those processes' lines; otherwise it stays on its own (nothing says which)."""
    firsthand = [p for p in j.roots() if any(not _copy(e) for e in p.slots.get("exit", ()))]
    if not firsthand:
        return
    exits = _Exits(firsthand)
    taken: set[tuple[int, str | None]] = set()   # (exit record, kind of copy) already retold
    views = [u for u in j.roots()
             if not (u.address or u.name or u.pid is not None or u.kw_incarnation is not None or not u.ended)
             and all(_copy(e) for e in u.end_events)]
    views.sort(key=lambda u: min((t for t in map(known_ts, u.end_events) if t is not None), default=math.inf))
    for u in views:
        found = [_retold(e, exits, taken) for e in u.end_events]
        if any(f is None for f in found):
            continue
        owners = [owner for owner, _ in found]
        ends = u.end_events
        moves = [(owners[ends.index(e)] if e in ends else owners[0], e) for e in u.events]
        if not all(owner.can_take(e) for owner, e in moves):
            continue
        for e, (_, record) in zip(ends, found):
            taken.add((id(record), slot_of(e)))
        for owner, e in moves:
            owner.add(e)
        j.parent[index[id(u)]] = index[id(owners[0])]


class _Exits:
    """First-hand exit records by time, so a copy finds the exits near it without a scan of all of them."""

    def __init__(self, firsthand: list[Incarnation]):
        found = [(known_ts(e), i, p, e) for i, p in enumerate(firsthand) for e in p.slots["exit"]
                 if not _copy(e) and known_ts(e) is not None]
        found.sort(key=lambda t: (t[0], t[1]))
        self.times = [t[0] for t in found]
        self.found = found

    def near(self, ts: float, within: float):
        lo, hi = bisect_left(self.times, ts - within), bisect_right(self.times, ts + within)
        return self.found[lo:hi]


def _retold(copy: Event, exits: _Exits, taken: set[tuple[int, str | None]]
            ) -> tuple[Incarnation, Event] | None:
    """The process (and its exit record) that ``copy`` retells: the nearest fitting exit within
    ``MIRROR_SECONDS`` that no copy of this kind has retold yet."""
    ts = known_ts(copy)
    if ts is None:
        return None
    slot = slot_of(copy)
    gaps = sorted((abs(t - ts), i, p, e) for t, i, p, e in exits.near(ts, MIRROR_SECONDS)
                  if (id(e), slot) not in taken and _tells_the_same(copy, e) and p.can_take(copy))
    if not gaps:
        return None
    return gaps[0][2], gaps[0][3]


def _overlap(a: Incarnation, b: Incarnation) -> bool:
    sa, sb = _span(a), _span(b)
    return sa is None or sb is None or (sa[0] <= sb[1] + OVERLAP_TOLERANCE and sb[0] <= sa[1] + OVERLAP_TOLERANCE)


def _span(p: Incarnation) -> tuple[float, float] | None:
    a, b = p.first_ts, p.last_ts
    if a is None or b is None:
        return None
    return (p.started if p.started is not None else a, b)


def _join_by_address(j: _Joiner) -> None:
    """Views of one address whose lifetimes overlap are one process: biggest overlap first, one-to-one."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i in range(len(j.procs)):
        r = j.find(i)
        if r == i and j.procs[i].address:
            groups[j.procs[i].address].append(i)
    for members in groups.values():
        if len(members) < 2:
            continue
        _fold_reregistrations(j, members)
        members = [i for i in members if j.find(i) == i]
        pairs = []
        untimed = [i for i in members if _span(j.procs[i]) is None]
        timed = sorted((i for i in members if _span(j.procs[i]) is not None), key=lambda i: _span(j.procs[i])[0])
        for x, i in enumerate(timed):
            si = _span(j.procs[i])
            for k in timed[x + 1:]:
                sk = _span(j.procs[k])
                if sk[0] > si[1] + OVERLAP_TOLERANCE:
                    break
                overlap = min(si[1], sk[1]) - max(si[0], sk[0])
                if j.procs[i].stream != j.procs[k].stream:
                    pairs.append((overlap, i, k))
        for _, i, k in sorted(pairs, key=lambda t: -t[0]):
            j.join(i, k)
        # Lines without times (a pasted fragment): one view per file is one process when each file
        # holds exactly one process of that address.
        by_stream: dict[str | None, list[int]] = defaultdict(list)
        for i in untimed:
            by_stream[j.procs[i].stream].append(i)
        singles = [v[0] for v in by_stream.values() if len(v) == 1]
        for i in singles[1:]:
            j.join(singles[0], i)
        # Without times, a file's processes of one address and the scheduler's follow the same order.
        lists = [sorted(v, key=lambda i: j.procs[i].order) for v in by_stream.values() if len(v) > 1]
        if len(lists) == 2 and len(lists[0]) == len(lists[1]):
            for a, b in zip(*lists):
                j.join(a, b)
        # One process of this address in each file, whatever the clocks say (hosts' clocks differ): one process.
        alone: dict[str | None, list[int]] = defaultdict(list)
        for i in members:
            if j.find(i) == i:
                alone[j.procs[i].stream].append(i)
        if len(alone) > 1 and all(len(v) == 1 for v in alone.values()):
            first, *rest = [v[0] for v in alone.values()]
            for i in rest:
                j.join(first, i)


def _fold_reregistrations(j: _Joiner, members: list[int]) -> None:
    """One worker process whose own file shows a single start for this address, but which the scheduler
    registered several times (it removed it and the worker connected again: a reconnect, a restart asked of
    a worker without a nanny): the scheduler's registrations are one process, and only the last removal
    can be its end. The earlier removals stay as lines of its life, not as ends."""
    local: dict[str, list[int]] = defaultdict(list)
    sched: list[int] = []
    for i in members:
        (local[j.procs[i].stream].append(i) if j.procs[i].stream is not None else sched.append(i))
    if len(sched) < 2 or len(local) != 1:
        return
    (only,) = local.values()
    if len(only) != 1 or not any(e.kind == "worker-start" for e in j.procs[only[0]].events):
        return
    sched.sort(key=lambda i: j.procs[i].order)
    keep = j.procs[sched[-1]]
    for i in sched[:-1]:
        p = j.procs[i]
        for e in p.slots.pop("removed", []):
            keep.events.append(e)  # a removal the worker outlived: context, not its end
        p.slots.pop("heartbeat", None)
        j.join(sched[-1], i)


def _join_unnamed_exits(j: _Joiner) -> None:
    """An end that named no process (a nanny's exit line in a shared file) and a process whose end the
    scheduler or its own lines name, in the same file and at about the same time (or, without times, a
    few lines apart), lacking that kind of line: one process. Never across files: a line of one worker's
    log says nothing of another's process."""
    roots = j.roots()
    unnamed = [p for p in roots if p.address is None and p.name is None and p.kw_incarnation is None and p.ended]
    if not unnamed:
        return
    index = {id(p): i for i, p in enumerate(j.procs)}
    by_file: dict[str, list[tuple[int, float | None, Incarnation]]] = defaultdict(list)
    for p in roots:
        if (p.address or p.name) and p.ended:
            for e in p.end_events:
                if e.origin is not None:
                    by_file[stream_of(e)].append((e.origin.line, known_ts(e), p))
    for u in unnamed:
        best, best_gap = None, None
        # the lines that made it a death (its exit, its memory kill, its restart), not what followed
        anchors = [e for s in CORE_SLOTS for e in u.slots.get(s, ()) if e.origin is not None] or [
            e for e in u.end_events if e.origin is not None]
        for e in anchors:
            ts = known_ts(e)
            for line, pts, p in by_file.get(stream_of(e), ()):
                if j.find(index[id(p)]) != index[id(p)] or not compatible(p, u) or _started_after(p, e) \
                        or _spoke_after_the_exit(p, u):
                    continue
                if ts is not None and pts is not None:
                    gap = abs(ts - pts)
                    if gap > ANONYMOUS_JOIN:
                        continue
                else:
                    gap = abs(line - e.origin.line)
                    if gap > ANONYMOUS_LINES:
                        continue
                    gap = gap * 1e-3  # lines without times: closeness in the file
                if best_gap is None or gap < best_gap:
                    best, best_gap = p, gap
        if best is not None:
            j.join(index[id(best)], index[id(u)])


REMOVAL_JOIN = 1.0  # seconds between a nanny's exit line that names only a pid and the scheduler's removal


def _join_exits_to_removals(j: _Joiner) -> None:
    """Across files, for logs that keep a process's exit and its removal apart (Dask's in-memory logs of a
    LocalCluster: the nannies' lines in one, the scheduler's in another): a death known only by its pid from
    a nanny's exit line, and a worker known only by the scheduler's removal of it (no exit of its own), at
    about the same moment, are one death. Taken in time order, each exit with the nearest removal no other
    exit took: when several workers die in the same second, as many exits go to as many removals (which goes
    to which is then only as sure as the order of the lines)."""
    roots = j.roots()
    exits = sorted(((known_ts(e), i, p) for i, p in enumerate(roots)
                    if p.pid is not None and p.address is None and p.name is None and "exit" in p.slots
                    and "removed" not in p.slots for e in p.slots["exit"][:1] if known_ts(e) is not None),
                   key=lambda t: (t[0], t[1]))
    if not exits:
        return
    removals = [(known_ts(e), p) for p in roots if (p.address or p.name) and "removed" in p.slots
                and "exit" not in p.slots for e in p.slots["removed"][:1] if known_ts(e) is not None]
    index = {id(p): i for i, p in enumerate(j.procs)}
    taken: set[int] = set()
    for ts, _, u in exits:
        near = sorted((abs(rts - ts), k, p) for k, (rts, p) in enumerate(removals)
                      if k not in taken and abs(rts - ts) <= REMOVAL_JOIN and compatible(p, u))
        if near:
            _, k, p = near[0]
            taken.add(k)
            j.join(index[id(p)], index[id(u)])


def _spoke_after_the_exit(p: Incarnation, u: Incarnation) -> bool:
    """``p`` wrote a line of its own (the worker process's, not its nanny's or the scheduler's) after the line that
    told ``u``'s process exited, in that file: a process prints nothing once it is gone (its lines reach the shared
    stream as it writes them), so ``p`` is another process."""
    for x in u.slots.get("exit", ()):
        if x.origin is None:
            continue
        for y in p.events:
            if y.source != "worker" or y.origin is None or stream_of(y) != stream_of(x):
                continue
            tx, ty = known_ts(x), known_ts(y)
            if (ty > tx) if tx is not None and ty is not None else y.origin.line > x.origin.line:
                return True
    return False


def _started_after(p: Incarnation, e: Event) -> bool:
    """``p``'s start line comes after ``e`` in ``e``'s file: ``p`` is a later process than the one ``e`` ended."""
    return any(s.kind in ("worker-start", "worker-spawn") and s.origin is not None and e.origin is not None
               and stream_of(s) == stream_of(e) and s.origin.line > e.origin.line for s in p.events)


def _descending_before(lists: list[list[int]], k: int):
    """The positions below ``k`` in any of the sorted ``lists``, highest first, each once (lazily: the
    caller usually stops at the first)."""
    cursors = [bisect_left(xs, k) - 1 for xs in lists]
    last = None
    while True:
        best = max((i for i in range(len(lists)) if cursors[i] >= 0), key=lambda i: lists[i][cursors[i]], default=None)
        if best is None:
            return
        pos = lists[best][cursors[best]]
        cursors[best] -= 1
        if pos != last:
            last = pos
            yield pos


def _join_by_successor(j: _Joiner) -> None:
    """An end that named no process, in a file several workers share, and the worker of that file whose
    name (or fixed address) the next start line takes up again: a name is alive once at a time, so the
    latest earlier holder of that name with no exit line of its own is the process that died."""
    roots = j.roots()
    index = {id(p): i for i, p in enumerate(j.procs)}
    by_stream: dict[str, list[Incarnation]] = defaultdict(list)
    for p in roots:
        if p.stream is not None:
            by_stream[p.stream].append(p)
    for procs in by_stream.values():
        procs.sort(key=lambda p: p.order)
        # indexes instead of scans (a file may hold thousands of processes): the next named process after
        # each position, and the positions of each name and address
        next_named: list[Incarnation | None] = [None] * len(procs)
        following = None
        for k in range(len(procs) - 1, -1, -1):
            next_named[k] = following
            if procs[k].name or procs[k].address:
                following = procs[k]
        at: dict[tuple[str, str], list[int]] = defaultdict(list)
        for k, p in enumerate(procs):
            if p.name:
                at[("name", p.name)].append(k)
            if p.address:
                at[("address", p.address)].append(k)
        for k, u in enumerate(procs):
            if not (u.ended and u.address is None and u.name is None and j.find(index[id(u)]) == index[id(u)]):
                continue
            succ = next_named[k]
            if succ is None:
                continue
            lists = [at.get(key, []) for key in (("name", succ.name), ("address", succ.address)) if key[1]]
            for pos in _descending_before(lists, k):
                p = procs[pos]
                if "exit" not in p.slots and j.find(index[id(p)]) == index[id(p)]:
                    if compatible(p, u):
                        j.join(index[id(p)], index[id(u)])
                    break


def _nanny_after_stop(a: Incarnation, b: Incarnation) -> bool:
    """``a``'s worker stopped because its nanny asked ("Reason: nanny-close"), and ``b``'s nanny lines come
    after that stop in the same file: Dask prints a nanny's close before its worker's stop, so not one process."""
    for x in a.slots.get("closing", ()):
        if not str(x.get("reason") or "").startswith("nanny-close") or x.origin is None:
            continue
        for y in b.slots.get("nanny-closing", ()):
            if y.origin is not None and stream_of(y) == stream_of(x) and y.origin.line > x.origin.line:
                return True
    return False
