"""``--format github``: GitHub Actions workflow commands, and the job summary.

Covers: one ``::error`` (severity error) or ``::warning`` annotation per death that fails the
policy and one ``::notice`` per death the baseline knows, each at its deciding evidence line
(``file=``, ``line=``, ``title=``), within GitHub's limit of 10 annotations of each type per step:
what does not fit is counted in one summary notice (notices keep a slot for it) and a plain line.
Properties and messages are escaped per GitHub's workflow-command rules (``%``, ``\\r``, ``\\n``;
in properties also ``:`` and ``,``), after terminal control sequences are removed, so log text can
neither end a command nor start another. ``append_step_summary`` appends the markdown report to the
file named by ``$GITHUB_STEP_SUMMARY``.

Does not cover: the GitHub API (check runs); annotations are the runner's job.
"""

from __future__ import annotations

import os
from pathlib import Path

from kwdiag.check import Outcome
from kwdiag.check.policy import BASELINED, FAIL
from kwdiag.escape import safe
from kwdiag.report.text import conf

LIMIT = 10  # annotations per type per step (GitHub)


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _relative(path: str, root: Path) -> str:
    p = Path(path)
    try:
        return (p if p.is_absolute() else root / p).resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError):
        return path


def command(kind: str, message: str, **props) -> str:
    inner = ",".join(f"{k}={escape_property(str(v))}" for k, v in props.items() if v not in (None, ""))
    return f"::{kind}{' ' + inner if inner else ''}::{escape_data(message)}"


def render_github(outcome: Outcome, root: str | os.PathLike | None = None) -> str:
    root_path = Path(root or os.environ.get("GITHUB_WORKSPACE") or os.getcwd())
    planned: dict[str, list] = {"error": [], "warning": [], "notice": []}
    for f in outcome.findings:
        if f.status == FAIL:
            planned["error" if f.death.severity == "error" else "warning"].append(f)
        elif f.status == BASELINED:
            planned["notice"].append(f)
    lines: list[str] = []
    left_out = 0
    for kind in ("error", "warning", "notice"):
        budget = LIMIT if kind != "notice" else LIMIT - 1  # a notice slot stays free for the summary
        for f in planned[kind][:budget]:
            d = f.death
            ev = next((e for e in d.evidence if e.rule == f.rule), d.evidence[0] if d.evidence else None)
            title = f"{'known: ' if f.status == BASELINED else ''}worker {safe(d.worker, 60)} died: {f.verdict}"
            body = [f"{safe(d.summary)} (confidence {conf(d.confidence)}, fingerprint {f.fingerprint})"
                    if d.summary else f"confidence {conf(d.confidence)}, fingerprint {f.fingerprint}"]
            body += [f"{safe(e.file, 200)}:{e.line}: {safe(e.text)}" for e in d.evidence[:4]]
            body += [f"fix ({h.runtime}): {safe(h.text, 800)}" for h in d.hints]
            lines.append(command(kind, "\n".join(body), file=_relative(ev.file, root_path) if ev else None,
                                 line=ev.line if ev else None, title=title))
        left_out += max(0, len(planned[kind]) - budget)
    errors_shown = sum(1 for line in lines if line.startswith("::error"))
    for p in outcome.report.input_errors:
        if errors_shown >= LIMIT:
            left_out += 1
            continue
        errors_shown += 1
        lines.append(command("error", safe(p.message, 500), file=_relative(p.path, root_path),
                             title="kwdiag check: input could not be read"))
    if left_out:
        more = f"{left_out} more finding(s) not annotated (GitHub shows at most {LIMIT} per type); see the job summary"
        lines.append(command("notice", more, title="kwdiag check"))
        lines.append(f"kwdiag check: {more}")
    lines.append(f"kwdiag check: {outcome.summary()}")
    return "\n".join(lines) + "\n"


def append_step_summary(outcome: Outcome, path: str | None = None) -> bool:
    """Append the markdown report to ``$GITHUB_STEP_SUMMARY`` (or ``path``); False if there is none."""
    from kwdiag.check.textout import render_markdown

    path = path or os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return False
    from kwdiag.errors import USAGE, KwdiagError

    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(render_markdown(outcome) + "\n")
    except OSError as exc:
        raise KwdiagError(f"cannot write GITHUB_STEP_SUMMARY {path}: {exc.strerror or exc}", USAGE) from None
    return True
