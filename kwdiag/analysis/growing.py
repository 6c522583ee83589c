"""One analysis that grows with a run: events go in as the cluster writes them; each death is classified when
its worker's lines change, never by analysing the whole run again. Pure (no files, no clock).

Covers: ``GrowingAnalysis.add(events)`` and ``.deaths()``, for ``kwdiag run``'s live announcements. The events of a
kwdiag (or kwdiag.dask) run name their worker, so a worker's deaths follow from its own lines (its worker's,
nanny's and the scheduler's about it) and the cluster-wide lines (the scheduler's close, a restart): a
worker is classified again only when a line about it arrives, with the cluster-wide lines so far. The cost
of a look is that of the workers that changed, so a run of many deaths stays linear, where one analysis of
everything per death was quadratic.

Does not cover: the final diagnosis (``kwdiag run`` ends with ``kwdiag explain``'s full analysis of the run
directory, which may revise what was announced as later lines arrive) or logs whose lines do not name their
worker (Dask's text logs: ``kwdiag.pipeline``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from kwdiag.analysis.blame import UNSEEN
from kwdiag.analysis.model import Death
from kwdiag.engine import RuleSet
from kwdiag.events import Event
from kwdiag.kinds import DEATH

_CLUSTER = ""  # the bucket of lines that name no worker


class GrowingAnalysis:
    """The deaths of a run so far, each classified from its worker's lines and the cluster-wide ones."""

    def __init__(self, rules: RuleSet):
        self.rules = rules
        self._lines: dict[str, list[Event]] = defaultdict(list)  # worker -> its lines, in arrival order
        self._changed: set[str] = set()
        self._deaths: dict[str, list[Death]] = {}
        self.analyses = 0  # how many workers were classified, over the run (a measure of the cost)

    def add(self, events: Iterable[Event]) -> None:
        for e in events:
            worker = e.worker or _CLUSTER
            self._lines[worker].append(e)
            # a line that names no worker changes the cluster's bucket only if it may be a death of its own
            if worker != _CLUSTER or e.kind in DEATH:
                self._changed.add(worker)

    def deaths(self) -> list[Death]:
        """Every death so far, in the order they happened (those of the workers that changed classified anew)."""
        from kwdiag.analysis import analyze_events

        cluster = self._lines.get(_CLUSTER, [])
        for worker in sorted(self._changed):
            events = cluster if worker == _CLUSTER else self._lines[worker] + cluster
            report = analyze_events(events, self.rules)
            self.analyses += 1
            # A bucket's deaths are its worker's, and those no bucket names (a pid-only exit among the cluster-wide
            # lines); these come from every bucket's analysis alike and are kept once, below.
            # A death only a KilledWorker's count shows is not one: the count covers every worker, and the deaths it
            # counts are in other buckets (`kwdiag demo` announced two such phantoms); the final analysis, which
            # sees all the lines, is the one to say whether a counted death has none.
            self._deaths[worker] = [d for d in report.deaths if (d.worker == worker or d.worker not in self._lines)
                                    and not d.worker.startswith(UNSEEN)]
        self._changed.clear()
        unique = {(d.worker, d.incarnation): d for ds in self._deaths.values() for d in ds}
        return sorted(unique.values(), key=lambda d: (d.at is None, d.at or 0.0, d.worker, d.incarnation))
