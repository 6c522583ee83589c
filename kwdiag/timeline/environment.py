"""Deaths that only the environment reports: a pasted ``dmesg``, ``kubectl describe pod`` or SLURM job log. Pure.

Covers: when the cluster's own lines show no death at all, each incident the environment reports
becomes a death of its own: a kernel OOM kill or segfault of a Python or Dask process (one per pid, an
OOM kill's summary and its kill line together), a Kubernetes container status (the lines of one ``describe`` block
together), a SLURM or YARN kill. A kernel kill of any other program (a browser, a database) is not a
worker's death.

Also: ``join_to_their_own_files``, an environment line written into a worker's own output (slurmstepd writes into
the batch job's stderr, beside the worker's log) that names no process is about the one process of that file still
alive: the job's end, when its processes were killed before Dask could write a word.

Does not cover: other environment lines next to the cluster's own deaths: the classifier joins those to the
death they explain (by pid, or by time).
"""

from __future__ import annotations

import re

from kwdiag.events import Event
from kwdiag.timeline.model import Incarnation, stream_of

BLOCK_LINES = 40  # lines of one kubectl describe / job log that describe one container or job
_WORKER_COMM = re.compile(r"python|dask|worker|java", re.I)  # YARN containers run the JVM launcher


def environment_deaths(environment: list[Event]) -> list[Incarnation]:
    incidents: list[Incarnation] = []
    by_pid: dict[int, Incarnation] = {}
    last_block: dict[str, tuple[int, Incarnation]] = {}
    for e in sorted(environment, key=lambda e: (e.origin.file if e.origin else "", e.origin.line if e.origin else 0)):
        pid = e.get("pid")
        if e.source == "kernel":  # an OOM kill, a segfault: the kernel names the process by pid
            comm = e.get("comm")
            if isinstance(comm, str) and not _WORKER_COMM.search(comm):
                continue
            if isinstance(pid, int):
                p = by_pid.get(pid)
                if p is None:
                    p = by_pid[pid] = _incident(e, pid)
                    incidents.append(p)
                p.add(e)
                continue
        file = e.origin.file if e.origin else "?"
        line = e.origin.line if e.origin else 0
        prev = last_block.get(file)
        if prev is not None and 0 <= line - prev[0] <= BLOCK_LINES and e.kind == prev[1].events[-1].kind:
            p = prev[1]
        else:
            p = _incident(e, pid if isinstance(pid, int) else None)
            incidents.append(p)
        p.add(e)
        last_block[file] = (line, p)
    return incidents


def _incident(e: Event, pid: int | None) -> Incarnation:
    return Incarnation(pid=pid, stream=None, order=(10**9 + 1, e.origin.line if e.origin else 0), host=e.host)


def join_to_their_own_files(environment: list[Event], procs_by_stream: dict[str, list[Incarnation]]) -> list[Event]:
    """Give each environment line that names no process, in a file whose only process still alive started before it,
    to that process as its end (a SLURM job killed for memory, nanny and worker at once: its output file ends with
    slurmstepd's lines and nothing of Dask's). The lines left are returned, for the classifier to join by time."""
    left = []
    for e in environment:
        procs = procs_by_stream.get(stream_of(e), ()) if e.origin is not None and e.get("pid") is None else ()
        alive = [p for p in procs if not p.ended]
        if len(alive) == 1 and alive[0].events and alive[0].events[0].origin is not None \
                and alive[0].events[0].origin.line < e.origin.line:
            alive[0].add(e)
        else:
            left.append(e)
    return left
