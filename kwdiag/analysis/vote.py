"""Weigh votes into one verdict. Pure.

Covers: ``Vote`` (a rule's ``[verdict]`` applied to one event) and ``decide(votes) -> Decision``:
votes for the same cause/detail combine as ``1 - Π(1 - weight)`` (one vote per rule); a detail absorbs
the votes for the details it ``refines`` (an OOM-killer line refines ``killed by signal 9``); the best
supported explanation wins; the strongest explanation it does not absorb lowers the confidence
(``support × (1 - 0.6 × rival)``) and is reported as disagreement. A vote for ``unknown`` (a fact that
only says the logs cannot tell) never competes with a vote for a real cause; but what an ``unknown`` vote
``refines`` among the signals that ended a process (``sudden_exit`` details) it explains: the nanny's kill
of a worker that did not finish a close (whose reason the lines do not give) explains the SIGKILL that
carries it out, so that signal is not read as an outside killer's.

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


def combine(weights: Iterable[float]) -> float:
    p = 1.0
    for w in weights:
        p *= 1.0 - max(0.0, min(1.0, w))
    return 1.0 - p


def decide(votes: list[Vote]) -> Decision:
    """The verdict ``votes`` support best (see the module doc)."""
    # the signals an unknown vote explains (they ended the process on its behalf): not an outside killer's
    explainers = [v for v in votes if v.cause == "unknown" and v.refines]
    explained = {("sudden_exit", d) for v in explainers for d in v.refines}
    known = [v for v in votes if v.cause != "unknown" and v.key not in explained]
    if known:
        votes = known
    elif explainers:   # the unknown that explains the signals wins, and absorbs them (below)
        votes = explainers + [v for v in votes if v.key in explained]
    if not votes:
        return NO_DECISION
    by_key: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    refines: dict[tuple[str, str], set[str]] = defaultdict(set)
    for v in votes:
        by_key[v.key][v.rule.id] = max(by_key[v.key].get(v.rule.id, 0.0), v.weight)
        refines[v.key].update(v.refines)

    def own(k):
        return combine(by_key[k].values())

    def absorbed(k):
        return {j for j in by_key if j != k and j[1] in refines[k]}

    def support(k):
        ws: dict[str, float] = dict(by_key[k])
        for j in absorbed(k):
            for rid, w in by_key[j].items():
                ws[rid] = max(ws.get(rid, 0.0), w)
        return combine(ws.values())

    ranked = sorted(by_key, key=lambda k: (support(k), len(refines[k]), own(k)), reverse=True)
    win = ranked[0]
    absorbed_win = absorbed(win)
    rivals = [k for k in by_key if k != win and k not in absorbed_win and win[1] not in refines[k]]
    rival = max((own(k) for k in rivals), default=0.0)
    confidence = max(0.05, min(0.99, support(win) * (1.0 - 0.6 * rival)))
    if win[0] == "unknown":
        confidence = 0.0  # no cause is established: there is nothing to be confident about
    kept = [v for v in votes if v.key == win or v.key in absorbed_win]
    disagreement = [f"{c}/{d}" for c, d in sorted(rivals, key=own, reverse=True)]
    return Decision(win[0], win[1], confidence, kept, disagreement)
