"""Shared helpers for tests that start real kwdiag processes on loopback.

Waiting is always on a condition with a generous deadline, never a fixed sleep.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import time

import pytest

from kwdiag.events import from_json_line
from kwdiag.runtime.spawn import child_env, entry_command, module_command

DEADLINE = 60.0

# Workers import task functions defined in test modules by reference, as they would a user's modules.
_TESTS = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_TESTS, os.environ.get("PYTHONPATH")]))


def wait_until(condition, timeout: float = DEADLINE, interval: float = 0.02, what: str = "condition"):
    """Poll ``condition()`` until it returns something truthy; return that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def read_events(log_dir: str, kind: str | None = None, source: str | None = None, **match):
    """Every kwdiag event recorded under ``log_dir``, in time order, optionally filtered."""
    events = []
    for path in glob.glob(os.path.join(log_dir, "*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip() and line.endswith("\n"):   # a line without its newline is still being written
                    events.append(from_json_line(line))
    events.sort(key=lambda e: e.ts)
    out = []
    for e in events:
        if kind and e.kind != kind:
            continue
        if source and e.source != source:
            continue
        if any(e.fields.get(k) != v and getattr(e, k, None) != v for k, v in match.items()):
            continue
        out.append(e)
    return out


def wait_for_event(log_dir: str, kind: str, timeout: float = DEADLINE, predicate=None, **match):
    def found():
        events = [e for e in read_events(log_dir, kind, **match) if predicate is None or predicate(e)]
        return events
    return wait_until(found, timeout, what=f"event {kind} {match}")


def worker_pid(cluster, name: str) -> int:
    for address, info in cluster.scheduler_info()["workers"].items():
        if info["name"] == name:
            return info["pid"]
    raise KeyError(name)


def worker_address(cluster, name: str) -> str:
    return wait_until(lambda: next((a for a, i in cluster.scheduler_info()["workers"].items() if i["name"] == name),
                                   None), what=f"worker {name} registered")


def spawn_entry(args: list[str], log_path: str, env: dict | None = None) -> subprocess.Popen:
    """Start ``python -m kwdiag.runtime.entry ARGS`` with its output in ``log_path``."""
    log = open(log_path, "ab")
    try:
        return subprocess.Popen(entry_command(*args), stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, env=child_env(env), start_new_session=True)
    finally:
        log.close()


def spawn_kwdiag(args: list[str], log_path: str, env: dict | None = None) -> subprocess.Popen:
    """Start the ``kwdiag`` command line (``kwdiag scheduler ...``, as a user types it) with its output in ``log_path``."""
    log = open(log_path, "ab")
    try:
        return subprocess.Popen(module_command("kwdiag", *args), stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, env=child_env(env), start_new_session=True)
    finally:
        log.close()


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


@pytest.fixture
def log_dir(tmp_path):
    path = tmp_path / "logs"
    path.mkdir()
    return str(path)


ANY = object()   # in an expected death: a field the test cannot know (a name Dask chose, a pid)


def death_multiset(deaths) -> "Counter":
    """The (worker, incarnation, cause, detail) of each death, as a multiset; ``deaths`` are analysis
    ``Death`` objects or the dicts of ``kwdiag explain --format json``."""
    from collections import Counter

    def fields(d):
        if isinstance(d, dict):
            return (d.get("worker"), d.get("incarnation"), d.get("cause"), d.get("detail"))
        return (d.worker, d.incarnation, d.cause, d.detail)
    return Counter(fields(d) for d in deaths)


def assert_deaths(deaths, expected) -> None:
    """The whole multiset of deaths equals ``expected`` (an iterable of (worker, incarnation, cause, detail),
    where ``ANY`` matches any value of that field): an extra death fails the test as surely as a missing one."""
    got = death_multiset(deaths)
    want = list(expected)
    unmatched = list(got.elements())
    missing = []
    for w in sorted(want, key=lambda t: sum(x is ANY for x in t)):   # exact ones first
        for g in unmatched:
            if all(x is ANY or x == y for x, y in zip(w, g)):
                unmatched.remove(g)
                break
        else:
            missing.append(w)
    assert not missing and not unmatched, (f"deaths differ: missing {missing}, extra {unmatched}; "
                                           f"all: {sorted(got.elements(), key=str)}")
