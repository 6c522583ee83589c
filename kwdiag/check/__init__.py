"""``kwdiag check``: turn an analysis ``Report`` into a CI result.

Covers: ``evaluate(report, policy, baseline) -> Outcome`` — each death judged by the policy
(``kwdiag.check.policy``) and the baseline (``kwdiag.check.baseline``) into a ``Finding`` with a
status (``fail``, ``baselined``, ``allowed``, ``passed``) and a fingerprint
(``kwdiag.analysis.fingerprint``) — and the exit code that follows. The formats live beside it:
``text`` and ``markdown`` (``kwdiag.check.textout``), ``json`` (``jsonout``), ``junit``, ``sarif``,
``github``.

Does not cover: reading logs (``kwdiag.pipeline.analyze``), nor the command line
(``kwdiag.cli_check``). Task errors are not deaths and never fail the gate; a ``KilledWorker`` is
shown with the deaths it counted, which are judged themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kwdiag.analysis.fingerprint import fingerprint
from kwdiag.check.policy import ALLOWED, BASELINED, FAIL, PASSED, Policy
from kwdiag.errors import FINDINGS, OK, USAGE

STATUSES = (FAIL, BASELINED, ALLOWED, PASSED)


@dataclass(frozen=True)
class Finding:
    """One death as the gate sees it."""

    death: object  # kwdiag.analysis.model.Death
    fingerprint: str
    status: str
    reason: str

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    @property
    def would_fail(self) -> bool:
        """Fails by policy, whether or not the baseline knows it (what ``--write-baseline`` records)."""
        return self.status in (FAIL, BASELINED)

    @property
    def verdict(self) -> str:
        return f"{self.death.cause}/{self.death.detail}"

    @property
    def rule(self) -> str | None:
        """The rule that decided the verdict (the most decisive first), if one did."""
        return self.death.rules[0] if self.death.rules else None


@dataclass(frozen=True)
class Outcome:
    report: object  # kwdiag.analysis.model.Report
    policy: Policy
    findings: tuple[Finding, ...]
    baseline: str | None = None
    counts: dict = field(default_factory=dict)

    @property
    def failed(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.failed)

    @property
    def input_errors(self):
        return self.report.input_errors

    @property
    def exit_code(self) -> int:
        """2 if any input could not be read, else 1 if any finding fails, else 0."""
        if self.report.input_errors:
            return USAGE
        return FINDINGS if self.failed else OK

    def summary(self) -> str:
        """One line: the result and the counts behind it."""
        c = self.counts
        if self.report.input_errors:
            head = f"ERROR: {len(self.report.input_errors)} input(s) could not be read"
        elif self.failed:
            head = f"FAILED: {c[FAIL]} worker death(s) at or above the policy"
        else:
            head = "PASSED: no worker death fails the policy"
        rest = [f"{c[k]} {k}" for k in (BASELINED, ALLOWED, PASSED) if c.get(k)]
        return head + (f" ({', '.join(rest)})" if rest else "") + f"; {len(self.findings)} death(s) in total"


def evaluate(report, policy: Policy | None = None, baseline: set[str] | None = None,
             baseline_path: str | None = None) -> Outcome:
    """Judge every death of ``report``; pure."""
    policy = policy or Policy.parse()
    known = baseline or set()
    findings = []
    for d in report.deaths:
        fp = fingerprint(d)
        status, why = policy.judge(d)
        if status == FAIL and fp in known:
            status, why = BASELINED, f"{why}; known (baseline)"
        findings.append(Finding(d, fp, status, why))
    counts = {s: sum(1 for f in findings if f.status == s) for s in STATUSES}
    return Outcome(report, policy, tuple(findings), baseline_path, counts)
