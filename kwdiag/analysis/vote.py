"""Weigh votes into one verdict. Pure.

Covers: ``Vote`` (a rule's ``[verdict]`` applied to one event) and ``decide(votes) -> Decision``:
votes for the same cause/detail combine as ``1 - Π(1 - weight)`` (one vote per rule); a detail absorbs
the votes for the details it ``refines`` (an OOM-killer line refines ``killed by signal 9``); the best
supported explanation wins; the strongest explanation it does not absorb lowers the confidence
(``support × (1 - 0.6 × rival)``) and is reported as disagreement. A vote for ``unknown`` (a fact that
only says the logs cannot tell) never competes with a vote for a real cause; but what an ``unknown`` vote
``refines`` among the signals that ended a process (``sudden_exit`` details) it explains: the nanny's kill
of a worker that did not finish a close (whose reason the lines do not give) explains the SIGKILL that
carries it out, so that signal is not read as an outside killer's (``_contenders``). A refinement names a detail,
a ``cause/detail``, or another rule (``rule:ID``: that rule's votes count for the refining vote's verdict).

Does not cover: which events vote (``kwdiag.analysis.classify``) or what rules say (``rules/``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, NamedTuple

from kwdiag.engine import Rule
from kwdiag.events import Event
from kwdiag.records import record


@record(frozen=True)
class Vote:
    rule: Rule
    cause: str
    detail: str
    weight: float
    refines: tuple[str, ...]
    event: Event

    @property
    def key(self) -> tuple[str, str]:
        return (self.cause, self.detail)


class Decision(NamedTuple):
    cause: str
    detail: str
    confidence: float
    kept: list[Vote]  # the votes for the winner and for the details it absorbed
    disagreement: list[str]  # other explanations the evidence also supported, strongest first


NO_DECISION = Decision("unknown", "no_evidence", 0.0, [], [])
STOP_CAUSES = ("chose_to_exit", "nanny_memory_restart")   # causes that say why a worker was asked to stop


def refines_key(refines: Iterable[str], cause: str, detail: str) -> bool:
    """Whether a rule that ``refines`` these explains the verdict ``cause/detail``: an entry is a detail (whatever
    the cause) or ``cause/detail`` (that verdict only: the exit hook's SIGTERM to a stray process is
    ``sudden_exit/sigterm``, a SIGTERM the process handled is ``chose_to_exit/sigterm``); a ``rule:ID`` entry is
    another rule's evidence, whatever its verdict (``_explained_rules``)."""
    return any(r == detail or r == f"{cause}/{detail}" for r in refines)


def combine(weights: Iterable[float]) -> float:
    p = 1.0
    for w in weights:
        p *= 1.0 - max(0.0, min(1.0, w))
    return 1.0 - p


def decide(votes: list[Vote]) -> Decision:
    """The verdict ``votes`` support best (see the module doc).

    What decides is each vote's rule, verdict (its alternatives too), weight and refinements, in order, never its
    event: deaths whose votes agree on those (a log of 100,000 alike deaths has a few such lists) are decided
    once, and each gets its own votes back as ``kept``."""
    key = tuple((v.rule.id, v.cause, v.detail, v.weight, v.refines, v.rule.verdict.alternatives if v.rule.verdict
                 else ()) for v in votes)
    found = _decided.get(key)
    if found is None:
        explained = _explained_rules(votes)   # one vote for each of ``votes``, in order: some with another verdict
        decision = _decide(explained)
        where = {id(v): i for i, v in enumerate(explained)}
        kept = tuple((where[id(v)], v.key) for v in decision.kept)
        if len(_decided) > 10_000:
            _decided.clear()
        found = _decided[key] = (decision.cause, decision.detail, decision.confidence, kept,
                                 tuple(decision.disagreement))
    cause, detail, confidence, kept, disagreement = found
    return Decision(cause, detail, confidence, [_as(votes[i], k) for i, k in kept], list(disagreement))


_decided: dict[tuple, tuple] = {}


def _as(v: Vote, key: tuple[str, str]) -> Vote:
    """``v``, or the same vote counted for the verdict ``key`` (``_explained_rules``)."""
    return v if v.key == key else Vote(v.rule, *key, v.weight, v.refines, v.event)


def _decide(votes: list[Vote]) -> Decision:
    contenders, absorbable, others = _contenders(votes)
    if not contenders:
        return NO_DECISION
    votes = contenders + absorbable + others
    by_key: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    refines: dict[tuple[str, str], set[str]] = defaultdict(set)
    for v in votes:
        by_key[v.key][v.rule.id] = max(by_key[v.key].get(v.rule.id, 0.0), v.weight)
        refines[v.key].update(v.refines)

    def own(k):
        return combine(by_key[k].values())

    def absorbed(k):
        return {j for j in by_key if j != k and refines_key(refines[k], *j)}

    def support(k):
        ws: dict[str, float] = dict(by_key[k])
        for j in absorbed(k):
            for rid, w in by_key[j].items():
                ws[rid] = max(ws.get(rid, 0.0), w)
        return combine(ws.values())

    keys = list(dict.fromkeys(v.key for v in contenders))   # first seen first: ties keep the votes' order
    ranked = sorted(keys, key=lambda k: (support(k), len(refines[k]), own(k)), reverse=True)
    win = ranked[0]
    absorbed_win = absorbed(win)
    only_absorbable = {v.key for v in absorbable} - {v.key for v in contenders + others}
    rivals = [k for k in by_key if k != win and k not in absorbed_win and not refines_key(refines[k], *win)
              and k not in only_absorbable]
    rival = max((own(k) for k in rivals), default=0.0)
    confidence = max(0.05, min(0.99, support(win) * (1.0 - 0.6 * rival)))
    if win[0] == "unknown":
        confidence = 0.0  # no cause is established: there is nothing to be confident about
    kept = [v for v in votes if v.key == win or v.key in absorbed_win]
    disagreement = [f"{c}/{d}" for c, d in sorted(rivals, key=own, reverse=True)]
    return Decision(win[0], win[1], confidence, kept, disagreement)


def _explained_rules(votes: list[Vote]) -> list[Vote]:
    """``votes`` with each vote of a rule that another vote's rule ``refines`` as ``rule:ID`` counted for that vote's
    verdict: the refining evidence says why the refined one happened (a SIGTERM the `dask worker` command handled is
    why it exited and its exit hook reaped the worker: ``shutdown`` of that hook alone, ``sigterm`` with the signal),
    which a detail cannot say when the refined rule's verdict is also other rules' (a cluster's close is ``shutdown``
    too, and explains a SIGTERM)."""
    by_rule = {r[5:]: v.key for v in votes for r in v.refines if r.startswith("rule:") and v.cause != "unknown"}
    if not by_rule:
        return votes
    return [Vote(v.rule, *by_rule[v.rule.id], v.weight, v.refines, v.event)
            if by_rule.get(v.rule.id, v.key) != v.key else v for v in votes]


def _contenders(votes: list[Vote]) -> tuple[list[Vote], list[Vote], list[Vote]]:
    """(the votes that may win, the votes a winner may only absorb, the votes that may only disagree).

    Votes for ``unknown`` do not compete with votes for a cause. An ``unknown`` vote that ``refines`` details
    (the nanny's kill of a worker that did not finish stopping: ``close_timeout``) explains the signals with
    those details (``sudden_exit``), which ended the process on its behalf; what may then replace the unknown
    is what says why the stop was asked for (a chosen reason or the nanny's memory policy: ``STOP_CAUSES``; one
    of the readings the rule names as its ``alternatives``; a vote that refines its detail) or that something
    else ended the process first (a signal the kill does not explain: a segfault, an OOM kill). A traceback or
    an exit status printed meanwhile says neither: it is disagreement, and the unknown stands."""
    explainers = [v for v in votes if v.cause == "unknown" and v.refines]
    if not explainers:
        known = [v for v in votes if v.cause != "unknown"]
        return (known or votes), [], []
    explained = {("sudden_exit", d.rpartition("/")[2]) for v in explainers for d in v.refines
                 if d.rpartition("/")[0] in ("", "sudden_exit")}
    readings = {a for v in explainers if v.rule.verdict is not None for a in v.rule.verdict.alternatives}
    stops = {v.detail for v in explainers}
    answers, others = [], []
    for v in votes:
        if v.cause == "unknown" or v.key in explained:
            continue
        says_why = v.cause in STOP_CAUSES or v.cause == "sudden_exit" \
            or f"{v.cause}/{v.detail}" in readings or any(refines_key(v.refines, "unknown", d) for d in stops)
        (answers if says_why else others).append(v)
    signals = [v for v in votes if v.key in explained]
    if answers:
        return answers, explainers + signals, others
    return explainers, signals, others
