"""Deaths grouped the way a person reads them: one group per cause, detail and task. Pure.

Covers: ``group_deaths(deaths) -> list[DeathGroup]``: deaths with the same ``cause/detail`` that ran the
same task (by the task's name without Dask's hash or index: ``('hog-4f2a...', 3)`` is ``hog``) are one
group with one fix; failures first (most deaths first), then ``unknown``, then the workers that chose
to exit. Each group has a stable id (``g1``, ``g2``, ...) in that order, which the JSON report gives
every death and the terminal and Markdown reports use to refer to a group (KilledWorker blame).

Does not cover: rendering (``kwdiag.report``) or which hint a group shows (the reporter picks by runtime).
"""

from __future__ import annotations

import re
from typing import Iterable

from kwdiag.analysis.model import Death
from kwdiag.records import record

_TUPLE_KEY = re.compile(r"""^\(\s*['"]([^'"]+)['"]""")
_HASH_SUFFIX = re.compile(r"-[0-9a-f]{8,}$")


def task_family(key: str) -> str:
    """A task key without what varies from one task of a kind to the next: Dask's token and index."""
    m = _TUPLE_KEY.match(key)
    name = m.group(1) if m else key
    return _HASH_SUFFIX.sub("", name)


@record(frozen=True)
class DeathGroup:
    id: str
    cause: str
    detail: str
    task: str | None  # the task family the deaths ran, if the logs name one
    deaths: tuple[Death, ...]

    @property
    def failure(self) -> bool:
        return self.deaths[0].failure

    @property
    def label(self) -> str:
        return f"{self.cause}/{self.detail}"


def _rank(cause: str) -> int:
    return 2 if cause == "chose_to_exit" else 1 if cause == "unknown" else 0


def group_deaths(deaths: Iterable[Death]) -> list[DeathGroup]:
    groups: dict[tuple[str, str, str | None], list[Death]] = {}
    for d in deaths:
        # chosen exits are one group per detail whatever they ran: a shutdown is a shutdown
        task = task_family(d.running[0]) if d.running and d.cause != "chose_to_exit" else None
        groups.setdefault((d.cause, d.detail, task), []).append(d)
    order = sorted(groups.items(), key=lambda kv: (_rank(kv[0][0]), -len(kv[1]), kv[0][0], kv[0][1], kv[0][2] or ""))
    return [DeathGroup(id=f"g{n}", cause=c, detail=dt, task=t, deaths=tuple(ds))
            for n, ((c, dt, t), ds) in enumerate(order, 1)]


def group_ids(deaths: Iterable[Death]) -> dict[int, str]:
    """``id(death) -> group id`` for the JSON report."""
    return {id(d): g.id for g in group_deaths(deaths) for d in g.deaths}
