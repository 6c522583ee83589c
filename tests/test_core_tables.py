"""Table tests of the pure pieces every verdict rests on: the vote, the engine's field conditions, sizes."""

from __future__ import annotations

import math

import pytest

from kwdiag.analysis.vote import Vote, combine, decide
from kwdiag.engine import Rule, _field_ok
from kwdiag.events import Event
from kwdiag.units import format_bytes, parse_size

EVENT = Event(ts=0.0, source="nanny", kind="worker-exit")


def vote(rule_id, cause, detail, weight, refines=()):
    rule = Rule(id=rule_id, path=f"{rule_id}.toml", area="t", title="", why="", severity="error", runtime="any")
    return Vote(rule=rule, cause=cause, detail=detail, weight=weight, refines=tuple(refines), event=EVENT)


def _kill_after_close() -> Vote:
    """The vote of the built-in rule for Dask's `Worker process still alive after N seconds, killing`."""
    from kwdiag.engine import load_rules

    rule = load_rules().by_id["dask-nanny-kill-after-close"]
    v = rule.verdict
    return Vote(rule=rule, cause=v.cause, detail=v.detail, weight=v.weight, refines=v.refines, event=EVENT)


KILL = _kill_after_close()


@pytest.mark.parametrize("votes, cause, detail, confidence, disagreement", [
    ([], "unknown", "no_evidence", 0.0, []),
    # one rule: its weight
    ([vote("a", "sudden_exit", "sigkill", 0.7)], "sudden_exit", "sigkill", 0.7, []),
    # two rules agreeing combine as 1 - (1-a)(1-b)
    ([vote("a", "sudden_exit", "sigkill", 0.5), vote("b", "sudden_exit", "sigkill", 0.5)],
     "sudden_exit", "sigkill", 0.75, []),
    # one rule voting twice counts once
    ([vote("a", "sudden_exit", "sigkill", 0.5), vote("a", "sudden_exit", "sigkill", 0.5)],
     "sudden_exit", "sigkill", 0.5, []),
    # a specific detail absorbs the generic one it refines (and its support)
    ([vote("oom", "sudden_exit", "oom_killer", 0.6, refines=["sigkill"]), vote("sig", "sudden_exit", "sigkill", 0.5)],
     "sudden_exit", "oom_killer", 0.8, []),
    # a rival lowers the confidence: support x (1 - 0.6 x rival), and is reported
    ([vote("a", "sudden_exit", "segfault", 0.8), vote("b", "unrecoverable_exception", "exception", 0.5)],
     "sudden_exit", "segfault", 0.8 * (1 - 0.6 * 0.5), ["unrecoverable_exception/exception"]),
    # "unknown" never competes with a real cause
    ([vote("u", "unknown", "no_evidence", 0.9), vote("a", "chose_to_exit", "shutdown", 0.3)],
     "chose_to_exit", "shutdown", 0.3, []),
    # unknown alone: no confidence to have
    ([vote("u", "unknown", "restarted", 0.9)], "unknown", "restarted", 0.0, []),
    # an unknown that refines signals explains them: the nanny's kill after a slow stop, and its SIGKILL
    ([KILL, vote("sig", "sudden_exit", "sigkill", 0.6)], "unknown", "close_timeout", 0.0, []),
    # ... a reason for the stop replaces it, absorbing both when it refines them (as a cluster close does)
    ([KILL, vote("sig", "sudden_exit", "sigkill", 0.6),
      vote("close", "chose_to_exit", "shutdown", 0.7, refines=["close_timeout", "sigkill"])],
     "chose_to_exit", "shutdown", 1 - 0.3 * 0.4 * 0.4, []),
    # ... a weak chosen reason too, but the signal it does not refine is no rival (it was the nanny's)
    ([KILL, vote("sig", "sudden_exit", "sigkill", 0.6), vote("end", "chose_to_exit", "ended", 0.3)],
     "chose_to_exit", "ended", 0.3, []),
    # ... one of the readings the rule names
    ([KILL, vote("sig", "sudden_exit", "sigkill", 0.6), vote("hb", "sudden_exit", "heartbeat_timeout", 0.7)],
     "sudden_exit", "heartbeat_timeout", 0.7, []),
    # ... but a traceback printed meanwhile does not say why the stop came: it disagrees, the unknown stands
    ([KILL, vote("sig", "sudden_exit", "sigkill", 0.6), vote("exc", "unrecoverable_exception", "exception", 0.6)],
     "unknown", "close_timeout", 0.0, ["unrecoverable_exception/exception"]),
    # a signal the kill does not explain is not the nanny's
    ([KILL, vote("seg", "sudden_exit", "segfault", 0.7)], "sudden_exit", "segfault", 0.7, []),
    # a refinement written cause/detail absorbs that verdict only: the exit hook's SIGTERM to a stray child ...
    ([vote("reap", "chose_to_exit", "shutdown", 0.6, refines=["sudden_exit/sigterm"]),
      vote("sig15", "sudden_exit", "sigterm", 0.3)], "chose_to_exit", "shutdown", 1 - 0.4 * 0.7, []),
    # ... not a SIGTERM the process handled (its dask worker command was sent one), which says why the hook ran: a
    # refinement of that rule (rule:ID) counts its vote for the SIGTERM ...
    ([vote("reap", "chose_to_exit", "shutdown", 0.6, refines=["sudden_exit/sigterm"]),
      vote("handled", "chose_to_exit", "sigterm", 0.5, refines=["rule:reap"])],
     "chose_to_exit", "sigterm", 1 - 0.4 * 0.5, []),
    ([vote("reap", "chose_to_exit", "shutdown", 0.6, refines=["sudden_exit/sigterm"]),
      vote("handled", "chose_to_exit", "sigterm", 0.5)],
     "chose_to_exit", "shutdown", 0.6 * (1 - 0.6 * 0.5), ["chose_to_exit/sigterm"]),
    # ... and only that rule's: the whole cluster's close (shutdown too) explains the SIGTERM, not the reverse
    ([vote("reap", "chose_to_exit", "shutdown", 0.6, refines=["sudden_exit/sigterm"]),
      vote("handled", "chose_to_exit", "sigterm", 0.5, refines=["rule:reap"]),
      vote("close", "chose_to_exit", "shutdown", 0.8, refines=["sigterm"])],
     "chose_to_exit", "shutdown", 1 - 0.2 * 0.5 * 0.4, []),
])
def test_decide(votes, cause, detail, confidence, disagreement):
    d = decide(votes)
    assert (d.cause, d.detail) == (cause, detail)
    assert math.isclose(d.confidence, confidence, abs_tol=1e-9)
    assert d.disagreement == disagreement


def test_combine_clamps_weights():
    assert combine([]) == 0.0 and combine([2.0]) == 1.0 and combine([-1.0, 0.5]) == 0.5


@pytest.mark.parametrize("value, want, ok", [
    (None, "~", True), ("", "~", True), ("x", "~", False),
    ("x", "*", True), (None, "*", False), (0, "*", True),
    (137, ">128", True), (128, ">128", False), (True, ">0", False), ("200", ">128", False),
    (3, "<5", True), (5, "<5", False), (1, "<x", False),
    ("SIGKILL", ["SIGTERM", "SIGKILL"], True), ("SIGINT", ["SIGTERM", "SIGKILL"], False),
    ("nanny-close-gracefully", "re:^nanny-close", True), ("x-nanny-close", "re:^nanny-close", False),
    (5, "re:5", False),
    ("memory", "memory", True), (9, 9, True), (9, "9", False),
])
def test_field_conditions(value, want, ok):
    assert _field_ok(value, want) is ok


@pytest.mark.parametrize("text, size", [
    ("2 GiB", 2 * 1024**3), ("248.09 MiB", 248.09 * 1024**2), ("300MB", 300e6), ("1kb", 1e3),
    (512, 512.0), (float("inf"), None), (-1, None), (True, None), ("no size here", None), ("1.2.3 GB", None),
])
def test_parse_size(text, size):
    got = parse_size(text)
    assert got == size if size is None else math.isclose(got, size)


@pytest.mark.parametrize("n, compact, text", [
    (None, False, "?"), (12, False, "12 B"), (900 * 1024, False, "900 KiB"), (1.5 * 1024**3, False, "1.5 GiB"),
    (412 * 1024**2, False, "412 MiB"), (2 * 1024**3, True, "2GiB"),
])
def test_format_bytes(n, compact, text):
    assert format_bytes(n, compact=compact) == text
