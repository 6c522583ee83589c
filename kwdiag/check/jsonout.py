"""``--format json`` of ``kwdiag check``: schema ``kwdiag.check/1``.

Top level: ``schema``, ``version``, ``result`` (``pass``/``fail``/``error``), ``exit_code``,
``summary``, ``policy``, ``baseline``, ``counts`` (per status), ``findings`` (each: ``fingerprint``,
``status``, ``reason``, ``rule`` and the death as ``kwdiag explain`` writes it, under ``death``),
``killed_workers``, ``problems``. Within version 1 fields may be added, never removed or changed.
"""

from __future__ import annotations


from kwdiag.check import Outcome
from kwdiag.escape import to_json

SCHEMA = "kwdiag.check/1"


def to_dict(outcome: Outcome) -> dict:
    code = outcome.exit_code
    return {
        "schema": SCHEMA,
        "version": 1,
        "result": {0: "pass", 1: "fail"}.get(code, "error"),
        "exit_code": code,
        "summary": outcome.summary(),
        "policy": outcome.policy.describe(),
        "baseline": outcome.baseline,
        "counts": dict(outcome.counts),
        "findings": [{"fingerprint": f.fingerprint, "status": f.status, "reason": f.reason, "rule": f.rule,
                      "death": f.death.to_dict()} for f in outcome.findings],
        "killed_workers": [k.to_dict() for k in outcome.report.killed_workers],
        "problems": [p.to_dict() for p in outcome.report.problems],
    }


def render_json(outcome: Outcome) -> str:
    return to_json(to_dict(outcome)) + "\n"
