"""Workers the scheduler refused for a name another worker holds: each refusal is a process that ended. Pure.

Covers: the scheduler's ``worker-refused`` lines (``Worker tried to connect with a duplicate name: N``), one death
each, of a process of its own under the name it asked for: never the worker that holds the name (the scheduler's
other lines about ``N`` are that one's), and not when the refused worker's own log is in the input and already
tells that refusal (its ``name taken, N`` line, within ``REFUSAL_SECONDS`` when both are timed): that process then
stands for it, so the two views of one refusal are one death.

Does not cover: why the name was taken (the holder's own lines say whether it was alive or a dead worker not yet
removed), or the verdict (the rule ``dask-scheduler-duplicate-name``).
"""

from __future__ import annotations

from kwdiag.events import Event
from kwdiag.timeline.model import Incarnation, known_ts

REFUSAL_SECONDS = 60.0  # at most between the scheduler's refusal and the refused worker's own line of it


def refused_deaths(refusals: list[Event], procs: list[Incarnation]) -> list[Incarnation]:
    """A process per refusal that no process of ``procs`` already tells (see the module doc). A refused worker's
    own log tells its one refusal several times (the error line, then its traceback's): one process, one refusal,
    paired with the scheduler's refusal nearest in time."""
    told: list[tuple[str, float | None]] = []   # per process that tells a refusal: the name, its first time
    for p in procs:
        mine = [e for e in p.events if e.kind == "worker-startup-failed" and e.get("reason") == "name-taken"]
        if mine:
            times = [t for t in map(known_ts, mine) if t is not None]
            told.append((str(mine[0].get("taken")), min(times) if times else None))
    out: list[Incarnation] = []
    for e in sorted(refusals, key=lambda e: (e.origin.file, e.origin.line) if e.origin else ("", 0)):
        taken, ts = str(e.get("taken")), known_ts(e)
        candidates = [(abs(ts - when) if ts is not None and when is not None else REFUSAL_SECONDS, i)
                      for i, (name, when) in enumerate(told) if name == taken]
        gap, same = min(candidates, default=(None, None))
        if same is not None and gap <= REFUSAL_SECONDS:
            del told[same]   # the refused worker's own lines of this refusal: that process is this death
            continue
        p = Incarnation(name=taken, stream=None, host=e.host, order=(10**9 + 2, e.origin.line if e.origin else 0))
        p.add(e)
        out.append(p)
    return out
