"""Shared helpers for reporters: short human formats (times, confidences), evidence paths relative to the
inputs' folder, the one fix and the proving lines a grouped report shows. Escaping is ``kwdiag.escape``."""

from __future__ import annotations

import os
import time

from kwdiag.analysis.model import Death, Evidence, Hint
from kwdiag.analysis.stack import named_frame, user_frame
from kwdiag.escape import safe

EVIDENCE_PER_GROUP = 3
# What a report says of a KilledWorker's blame (``KilledWorkerBlame.fair``).
BLAME = {True: "blame looks fair", False: "blame looks unfair", None: "blame unclear (the logs cannot tell)"}


def when(ts: float | None, *, utc: bool = False) -> str:
    """``2026-11-21 09:53:19.534`` in local time (or UTC, suffixed so); ``-`` when unknown."""
    if ts is None:
        return "-"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", (time.gmtime if utc else time.localtime)(ts))
    return stamp + f".{int((ts % 1) * 1000):03d}" + (" UTC" if utc else "")


def death_line(d: Death) -> str:
    """One death in one line, as ``kwdiag run`` announces it: who, which incarnation, the verdict and what it
    means, what it was running and, for a crash, the frame of the task's own code it crashed in."""
    verb = "died" if d.failure else "left"
    running = f"; running {', '.join(safe(t, 60) for t in d.running[:3])}" if d.running else ""
    named = named_frame(d.stack)
    crashed = f"; crashed in {safe(str(named), 120)}" if named is not None else ""
    return (f"worker {safe(d.worker)} #{d.incarnation} {verb}: {d.cause}/{safe(d.detail)} — {safe(d.summary)}"
            f"{running}{crashed}")


def conf(c: float) -> str:
    return f"{c:.2f}"


def base_dir(files: tuple[str, ...]) -> str | None:
    """The folder every input lies in (so evidence paths can be shown relative to it), if any."""
    dirs = [os.path.dirname(os.path.abspath(f)) for f in files if f and f != "-" and not f.startswith("<")]
    if not dirs:
        return None
    try:
        return os.path.commonpath(dirs)
    except ValueError:  # different drives
        return None


def short(path: str, base: str | None) -> str:
    if base and path and not path.startswith("<"):
        full = os.path.abspath(path)
        if full.startswith(base + os.sep):
            return os.path.relpath(full, base)
    return path


def from_here(path: str) -> str:
    """``path`` relative to the current directory when it lies below it."""
    here = os.getcwd()
    return os.path.relpath(path, here) if path.startswith(here + os.sep) else path


def hint_for(hints: tuple[Hint, ...], runtimes: tuple[str, ...]) -> Hint | None:
    """The one fix to show: written for the runtime of the logs (Dask's for Dask logs), else the first."""
    for rt in (*runtimes, "kwdiag", "dask", "any"):
        for h in hints:
            if h.runtime == rt:
                return h
    return hints[0] if hints else None


def proof(d: Death) -> list[Evidence]:
    """The one to three lines that prove the cause: those of the rules that decided it, else the first."""
    deciding = [e for e in d.evidence if e.rule and e.rule in d.rules]
    return (deciding or list(d.evidence))[:EVIDENCE_PER_GROUP]


def who(deaths, limit: int = 6) -> str:
    """``w1 #1, w2 #3, 4 more``: the workers and incarnations of some deaths, the first ``limit`` named
    (raw text: each reporter escapes it for its output)."""
    names = [f"{d.worker} #{d.incarnation}" for d in deaths[:limit]]
    if len(deaths) > limit:
        names.append(f"{len(deaths) - limit} more")
    return ", ".join(names)


def crash_frames(stack, brief: bool = False) -> tuple[list, object]:
    """The crashing thread's frames a report shows, innermost first (``None`` where frames are left out), and
    the frame a fix names (``user_frame``: the job's own code, else a package's), which is always among them.
    ``brief``: up to that frame, the ones between skipped past four; else up to ten."""
    stack = list(stack)
    named = user_frame(stack)
    at = stack.index(named) if named is not None else 0   # the first such frame: what user_frame returned
    limit = 4 if brief else 10
    if brief and at < limit:
        shown, last = stack[:at + 1], at
    elif at < limit:
        shown, last = stack[:limit], min(limit, len(stack)) - 1
    else:
        shown, last = [*stack[:limit - 2], None, stack[at]], at
    return (shown + [None] if last < len(stack) - 1 else shown), named
