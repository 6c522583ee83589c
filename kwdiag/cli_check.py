"""``kwdiag check LOG...``: gate a CI job on worker deaths.

A thin shell: read the logs like ``kwdiag explain`` (``kwdiag.pipeline.analyze``, input problems via
``kwdiag.cli_io``), judge the deaths (``kwdiag.check``), write the formats asked for, exit
0 (nothing fails the policy), 1 (findings) or 2 (usage error or unreadable input). Heavy imports
happen inside the command so ``kwdiag --help`` stays fast. Documented in ``docs/check.md``.
"""

from __future__ import annotations

from typing import List, Optional

import typer

FORMATS = ("text", "json", "junit", "sarif", "github", "markdown")


def register(app: typer.Typer) -> None:
    """Register the check command(s). Over 60 lines on purpose: Typer reads each option from a parameter of the
    command function defined here, one option per parameter with its help; the bodies only parse options and
    call one function."""
    @app.command("check")
    def check(
        paths: List[str] = typer.Argument(..., help="Log files, run directories (read recursively), '-' for stdin; "
                                                     "the same inputs as `kwdiag explain`."),
        fail_on: Optional[List[str]] = typer.Option(
            None, "--fail-on", help="What fails: a severity (info, warning, error; default warning), any, none, or "
                                    "causes (sudden_exit, sudden_exit/sigkill, */segfault). Repeat or comma-separate."),
        allow: Optional[List[str]] = typer.Option(
            None, "--allow", help="Causes that are expected and never fail (default chose_to_exit)."),
        baseline: Optional[str] = typer.Option(None, "--baseline", help="Accept the findings in this baseline file: "
                                                                        "fail only on new death signatures."),
        write_baseline: Optional[str] = typer.Option(None, "--write-baseline", help="Write the findings that fail "
                                                     "now to this baseline file, and exit 0 (2 on unreadable input)."),
        fmt: str = typer.Option("text", "--format", "-f", help=", ".join(FORMATS) + "."),
        output: Optional[str] = typer.Option(None, "--output", "-o", help="Write the --format output to this file."),
        junit: Optional[str] = typer.Option(None, "--junit", help="Also write a JUnit XML report to this file."),
        sarif: Optional[str] = typer.Option(None, "--sarif", help="Also write a SARIF 2.1.0 report to this file."),
        rules_dirs: Optional[List[str]] = typer.Option(None, "--rules", help="A directory of your own rule files."),
        config: Optional[str] = typer.Option(None, "--config", help="Read [tool.kwdiag.check] from this file "
                                             "instead of the nearest kwdiag.toml / pyproject.toml."),
        no_config: bool = typer.Option(False, "--no-config", help="Ignore configuration files."),
    ) -> None:
        """Fail a CI job when workers died unexpectedly: exit 0 pass, 1 findings, 2 usage or unreadable input."""
        _check(paths=paths, fail_on=fail_on, allow=allow, baseline=baseline, write_baseline=write_baseline, fmt=fmt, output=output, junit=junit, sarif=sarif, rules_dirs=rules_dirs, config=config, no_config=no_config)


def _check(paths, fail_on, allow, baseline, write_baseline, fmt, output, junit, sarif, rules_dirs, config, no_config) -> None:
    """``kwdiag check``'s work once its options are read: settings, baseline, analysis, outputs, exit."""
    from kwdiag.errors import USAGE, KwdiagError

    if fmt not in FORMATS:
        raise KwdiagError(f"unknown --format {fmt!r} (use {', '.join(FORMATS)})", USAGE)
    if config and no_config:
        raise KwdiagError("--config and --no-config cannot be used together", USAGE)
    policy, known, baseline_path = _policy_and_baseline(fail_on, allow, baseline, write_baseline, config,
                                                         no_config)

    from kwdiag.engine import load_rules
    from kwdiag.pipeline import analyze
    from kwdiag.check import evaluate

    rules = load_rules(rules_dirs or ())
    report = analyze(paths, rules=rules)
    outcome = evaluate(report, policy, known, baseline_path)
    from kwdiag.cli_io import open_output, print_problems

    out = open_output(output)
    try:
        out.write(_render(fmt, outcome, rules))
    finally:
        if output:
            out.close()
    for path, kind in ((junit, "junit"), (sarif, "sarif")):
        if path:
            fh = open_output(path, f"--{kind}")
            with fh:
                fh.write(_render(kind, outcome, rules))
    if fmt == "github":
        from kwdiag.check.github import append_step_summary

        append_step_summary(outcome)
    has_errors = print_problems(report)
    if write_baseline:
        from kwdiag.check.baseline import write

        n = write(write_baseline, [f for f in outcome.findings if f.would_fail])
        import sys

        print(f"kwdiag: wrote {n} death signature(s) to {write_baseline}", file=sys.stderr)
        raise typer.Exit(USAGE if has_errors else 0)
    raise typer.Exit(outcome.exit_code)


def _policy_and_baseline(fail_on, allow, baseline, write_baseline, config, no_config):
    """The policy (flags over the settings file's ``[tool.kwdiag.check]``) and the baseline to compare with."""
    from pathlib import Path

    from kwdiag.check import policy as pol

    settings: dict = {}
    if config:
        settings = pol.config_values(*pol.read_config(config))
    elif not no_config:
        found = pol.find_config()
        if found:
            settings = pol.config_values(*found)
    policy = pol.Policy.parse(fail_on if fail_on else settings.get("fail-on"),
                              allow if allow else settings.get("allow"))
    baseline_path = baseline or settings.get("baseline")
    if write_baseline and baseline and Path(write_baseline).resolve() == Path(baseline).resolve():
        baseline_path = None  # rewriting the baseline in place: start from what fails now
    known = None
    if baseline_path and not (write_baseline and not baseline and not Path(baseline_path).exists()):
        from kwdiag.check.baseline import load

        known = load(baseline_path)
    else:
        baseline_path = None

    return policy, known, baseline_path


def _render(fmt: str, outcome, rules) -> str:
    if fmt == "json":
        from kwdiag.check.jsonout import render_json

        return render_json(outcome)
    if fmt == "junit":
        from kwdiag.check.junit import render_junit

        return render_junit(outcome)
    if fmt == "sarif":
        from kwdiag.check.sarif import render_sarif

        return render_sarif(outcome, rules)
    if fmt == "github":
        from kwdiag.check.github import render_github

        return render_github(outcome)
    if fmt == "markdown":
        from kwdiag.check.textout import render_markdown

        return render_markdown(outcome)
    from kwdiag.check.textout import render_text

    return render_text(outcome)
