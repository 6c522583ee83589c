"""``--format sarif`` / ``--sarif FILE``: SARIF 2.1.0 for code-scanning pages (GitHub, GitLab, Azure).

Covers: one run of tool ``kwdiag`` whose ``rules`` are the kwdiag rules that decided the reported
verdicts (id, title, why, fix per runtime as help text, first web reference as ``helpUri``, severity
as the default level) — with a rule ``kwdiag-<cause>-<detail>`` for verdicts no single rule makes
(a verdict with no deciding rule, which the built-in rules never give) — and one result per death that fails the policy, is in the baseline
(``baselineState: unchanged`` plus an external suppression) or is below the threshold (level
``note``). Allowed deaths (a worker that chose to exit) are left out. Each result is located at its
evidence lines (log file and line; paths relative to the working directory under ``%SRCROOT%``,
others as ``file://`` URIs) and carries the check fingerprint in ``partialFingerprints``. Inputs that
could not be read are tool execution notifications.

Does not cover: SARIF features without a meaning for logs (regions beyond a line, fixes, graphs).
The output is validated against the official 2.1.0 schema in the tests.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from kwdiag.check import Outcome
from kwdiag.check.policy import ALLOWED, BASELINED, FAIL
from kwdiag.escape import safe, to_json
from kwdiag.report.text import conf

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
FP_KEY = "kwdiagDeathSignature/v1"
LEVEL = {"error": "error", "warning": "warning", "info": "note"}
MAX_LOCATIONS = 10


def uri_for(path: str, root: Path) -> tuple[str, str | None]:
    """(uri, uriBaseId) for a log path: relative to ``root`` when inside it, else an absolute file URI."""
    p = Path(path)
    try:
        absolute = p if p.is_absolute() else (root / p)
        rel = absolute.resolve().relative_to(root.resolve())
        return quote(rel.as_posix()), "%SRCROOT%"
    except (ValueError, OSError):
        return (p.resolve().as_uri() if p.is_absolute() else quote(p.as_posix())), None


def _location(path: str, line: int, root: Path, text: str | None = None) -> dict:
    uri, base = uri_for(path, root)
    art = {"uri": uri}
    if base:
        art["uriBaseId"] = base
    phys: dict = {"artifactLocation": art}
    if line and line >= 1:
        phys["region"] = {"startLine": int(line)}
    loc: dict = {"physicalLocation": phys}
    if text:
        loc["message"] = {"text": safe(text)}
    return loc


def _synthetic_id(death) -> str:
    return f"kwdiag-{death.cause}-{death.detail}".replace("_", "-")


def _rule_descriptor(rule_id: str, rule, death) -> dict:
    from kwdiag.analysis.remedies import fill_template

    if rule is not None:
        title, why, severity = rule.title, rule.why, rule.severity
        fixes = [(rt, fill_template(t, {})) for rt, t in rule.remediation.items() if t]
        refs = list(rule.references)
    else:
        title = death.summary or f"{death.cause}/{death.detail}"
        why = f"kwdiag classified a worker death as {death.cause}/{death.detail} from what the logs lack or imply."
        severity = death.severity
        fixes = [(h.runtime, h.text) for h in death.hints]
        refs = []
    web = [r for r in refs if r.startswith(("https://", "http://"))]
    help_text = why + "\n\n" + "\n".join(f"Fix ({rt}): {t}" for rt, t in fixes)
    help_md = why + "\n\n" + "\n".join(f"* **Fix ({rt})**: {t}" for rt, t in fixes)
    if refs:
        help_text += "\n\nReferences: " + ", ".join(refs)
        help_md += "\n\nReferences: " + ", ".join(f"<{r}>" if r in web else f"`{r}`" for r in refs)
    desc = {
        "id": rule_id,
        "name": "".join(part.capitalize() for part in rule_id.replace("_", "-").split("-")),
        "shortDescription": {"text": title},
        "fullDescription": {"text": why},
        "help": {"text": help_text.strip(), "markdown": help_md.strip()},
        "defaultConfiguration": {"level": LEVEL.get(severity, "error")},
        "properties": {"tags": ["kwdiag", "worker-death", death.cause]},
    }
    if web:
        desc["helpUri"] = web[0]
    return desc


def _result(f, rule_id: str, rule_index: int, root_path: Path, with_baseline: bool) -> dict:
    """One finding as a SARIF result: message, level, the deciding line first among its locations."""
    d = f.death
    level = LEVEL.get(d.severity, "error") if f.status in (FAIL, BASELINED) else "note"
    fix = f" Fix: {d.hints[0].text}" if d.hints else ""
    text = (f"Worker {safe(d.worker, 80)} #{d.incarnation} died: {f.verdict} (confidence {conf(d.confidence)})"
            f"{': ' + safe(d.summary) if d.summary else ''}.{fix}")
    evidence = sorted(d.evidence, key=lambda e: e.rule != f.rule)  # the deciding rule's line first
    locs = [_location(e.file, e.line, root_path, e.text) for e in evidence[:MAX_LOCATIONS]]
    result = {
        "ruleId": rule_id,
        "ruleIndex": rule_index,
        "level": level,
        "message": {"text": text},
        "partialFingerprints": {FP_KEY: f.fingerprint},
        "properties": {"status": f.status, "reason": f.reason, "worker": d.worker,
                       "incarnation": d.incarnation, "cause": d.cause, "detail": d.detail,
                       "confidence": round(d.confidence, 2)},
    }
    if locs:
        result["locations"] = locs[:1]
        if len(locs) > 1:
            result["relatedLocations"] = [{**loc, "id": i} for i, loc in enumerate(locs[1:], 1)]
    if with_baseline:
        result["baselineState"] = "unchanged" if f.status == BASELINED else "new"
    if f.status == BASELINED:
        result["suppressions"] = [{"kind": "external", "justification": "known finding in the kwdiag check baseline"}]
    return result


def to_dict(outcome: Outcome, rules=None, root: str | os.PathLike | None = None) -> dict:
    from kwdiag import __version__

    root_path = Path(root or os.getcwd())
    by_id = getattr(rules, "by_id", {}) or {}
    descriptors: list[dict] = []
    index: dict[str, int] = {}
    results = []
    for f in outcome.findings:
        if f.status == ALLOWED:
            continue
        d = f.death
        rule = by_id.get(f.rule) if f.rule else None
        rule_id = rule.id if rule is not None else _synthetic_id(d)
        if rule_id not in index:
            index[rule_id] = len(descriptors)
            descriptors.append(_rule_descriptor(rule_id, rule, d))
        results.append(_result(f, rule_id, index[rule_id], root_path, bool(outcome.baseline)))
    notes = []
    for p in outcome.report.problems:
        uri, base = uri_for(p.path, root_path)
        art = {"uri": uri, **({"uriBaseId": base} if base else {})}
        notes.append({"level": "error" if p.level == "error" else "warning", "message": {"text": safe(p.message, 500)},
                      "locations": [{"physicalLocation": {"artifactLocation": art}}]})
    invocation = {"executionSuccessful": not outcome.report.input_errors, "exitCode": outcome.exit_code}
    if notes:
        invocation["toolExecutionNotifications"] = notes
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "kwdiag", "version": __version__, "semanticVersion": __version__,
                                "rules": descriptors}},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": root_path.resolve().as_uri() + "/"}},
            "invocations": [invocation],
            "results": results,
            "columnKind": "unicodeCodePoints",
        }],
    }


def render_sarif(outcome: Outcome, rules=None, root=None) -> str:
    return to_json(to_dict(outcome, rules, root)) + "\n"
