"""Grouping deaths for the reports: one group per cause, detail and task family; failures first."""

from __future__ import annotations

import pytest

from kwdiag.analysis import Death
from kwdiag.analysis.groups import group_deaths, task_family


@pytest.mark.parametrize("key, family", [
    ("('load-4f2a9c0d1e2b3c4d5e6f708192a3b4c5', 3)", "load"),     # Dask's tuple key: name-token, index
    ('("read_parquet-fused-0123456789abcdef", 0)', "read_parquet-fused"),
    ("inc-1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d", "inc"),                # a single key: name-token
    ("memory-hog", "memory-hog"),                                     # a name the user gave
    ("segfault", "segfault"),
    ("f-12", "f-12"),                                                 # too short to be a token
])
def test_task_family(key, family):
    assert task_family(key) == family


def _death(worker, n, cause, detail, running=()):
    return Death(worker=worker, incarnation=n, cause=cause, detail=detail, confidence=0.9, at=float(n),
                 running=tuple(running))


def test_groups_by_cause_detail_and_task_failures_first_then_unknown_then_chosen():
    deaths = [
        _death("a", 1, "chose_to_exit", "shutdown", ["('x-0123456789abcdef', 1)"]),
        _death("b", 1, "sudden_exit", "sigkill", ["('load-0123456789abcdef', 1)"]),
        _death("c", 1, "unknown", "restarted"),
        _death("d", 1, "sudden_exit", "sigkill", ["('load-fedcba9876543210', 2)"]),
        _death("e", 1, "sudden_exit", "sigkill", ["other"]),
        _death("f", 1, "chose_to_exit", "shutdown", ["('y-0123456789abcdef', 1)"]),
        _death("g", 1, "nanny_memory_restart", "memory_limit"),
    ]
    groups = group_deaths(deaths)
    assert [(g.id, g.label, g.task, [d.worker for d in g.deaths]) for g in groups] == [
        ("g1", "sudden_exit/sigkill", "load", ["b", "d"]),      # the most deaths first among failures
        ("g2", "nanny_memory_restart/memory_limit", None, ["g"]),
        ("g3", "sudden_exit/sigkill", "other", ["e"]),
        ("g4", "unknown/restarted", None, ["c"]),
        ("g5", "chose_to_exit/shutdown", None, ["a", "f"]),     # a shutdown is a shutdown, whatever it ran
    ]
    assert [g.failure for g in groups] == [True, True, True, True, False]   # an unknown end is not a choice
