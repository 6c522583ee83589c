"""CLI commands of the analyzer: ``kwdiag explain`` and ``kwdiag rules list|show|check``.

Thin shells over ``kwdiag.analysis``; heavy imports (rich, the rule engine) happen inside the
command functions so ``kwdiag --help`` stays fast. Exit codes: ``docs/explain.md``.
"""

from __future__ import annotations

from typing import List, Optional

import typer

FORMATS = ("text", "json", "markdown")


def register(app: typer.Typer) -> None:
    """Register the explain and rules command(s). Over 60 lines on purpose: Typer reads each option from a
    parameter of the command function defined here, one option per parameter with its help; the bodies only
    parse options and call one function."""
    rules_app = typer.Typer(name="rules", help="List, document and lint the diagnosis rules.", no_args_is_help=True,
                            add_completion=False, rich_markup_mode=None)

    @app.command("explain")
    def explain(
        paths: List[str] = typer.Argument(..., help="Log files, directories (read recursively), '-' for stdin; "
                                                     "gzip is detected."),
        fmt: str = typer.Option("text", "--format", "-f", help="text, json or markdown."),
        rules_dirs: Optional[List[str]] = typer.Option(None, "--rules", help="A directory of your own rule "
                                                                             "files, used beside the built-ins."),
        output: Optional[str] = typer.Option(None, "--output", "-o", help="Write the report to this file."),
        html_path: Optional[str] = typer.Option(None, "--html", help="Also write a self-contained HTML page "
                                                                      "with a timeline and memory charts."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Text report: after the groups, every death "
                                                                    "with every evidence line and fix."),
    ) -> None:
        """Explain every worker death in saved logs (kwdiag's and Dask's): cause, evidence, fix."""
        from kwdiag.errors import USAGE, KwdiagError

        if fmt not in FORMATS:
            raise KwdiagError(f"unknown --format {fmt!r} (use {', '.join(FORMATS)})", USAGE)
        from kwdiag.pipeline import analyze

        report = analyze(paths, rules_dirs or ())
        from kwdiag.cli_io import open_output, print_problems

        out = open_output(output)
        try:
            if fmt == "json":
                from kwdiag.report.jsonout import render_json

                out.write(render_json(report))
            elif fmt == "markdown":
                from kwdiag.report.markdown import render_markdown

                out.write(render_markdown(report))
            else:
                from kwdiag.report.terminal import render_terminal

                render_terminal(report, out, verbose=verbose)
        finally:
            if output:
                out.close()
        if html_path:
            from kwdiag.report.html import render_html

            page = render_html(report)
            try:
                with open(html_path, "w", encoding="utf-8") as fh:
                    fh.write(page)
            except OSError as exc:
                raise KwdiagError(f"cannot write {html_path}: {exc.strerror or exc}", USAGE) from None
        if print_problems(report):
            raise typer.Exit(USAGE)

    @rules_app.command("list")
    def rules_list(rules_dirs: Optional[List[str]] = typer.Option(None, "--rules", help="Also your own rules.")) -> None:
        """List every rule: id, severity, verdict, title."""
        from kwdiag.engine import load_rules

        rs = load_rules(rules_dirs or ())
        for r in sorted(rs.rules, key=lambda r: (r.area, r.id)):
            v = f"{r.verdict.cause}/{r.verdict.detail}" if r.verdict else "-"
            typer.echo(f"{r.id:42} {r.severity:8} {v:44} {r.title}")

    @rules_app.command("show")
    def rules_show(rule_id: str = typer.Argument(..., help="A rule id (see `kwdiag rules list`)."),
                   rules_dirs: Optional[List[str]] = typer.Option(None, "--rules", help="Also your own rules.")) -> None:
        """Show one rule's documentation: what it matches, why it matters, what to do."""
        from kwdiag.engine import load_rules
        from kwdiag.errors import USAGE, KwdiagError

        rs = load_rules(rules_dirs or ())
        r = rs.by_id.get(rule_id)
        if r is None:
            raise KwdiagError(f"no rule {rule_id!r} (see `kwdiag rules list`)", USAGE)
        typer.echo(f"{r.id}: {r.title}")
        typer.echo(f"area: {r.area}   severity: {r.severity}   reads: {r.runtime} logs")
        if r.verdict:
            typer.echo(f"verdict: {r.verdict.cause}/{r.verdict.detail} (weight {r.verdict.weight:g}"
                       + (f", refines {', '.join(r.verdict.refines)}" if r.verdict.refines else "") + ")")
        typer.echo("")
        typer.echo(r.why)
        typer.echo("")
        if r.patterns:
            typer.echo("patterns:")
            for p in r.patterns:
                typer.echo(f"  {p}")
        if r.event_kind:
            typer.echo(f"matches events: kind={r.event_kind} " + " ".join(f"{k}={v!r}" for k, v in r.event_fields.items()))
        for rt, text in r.remediation.items():
            typer.echo(f"\nfix ({rt}): {text}")
        if r.references:
            typer.echo("\nreferences:")
            for ref in r.references:
                typer.echo(f"  {ref}")
        typer.echo("\nexamples that match:")
        for ex in r.examples_match:
            typer.echo(f"  {ex}")
        typer.echo("examples that must not match:")
        for ex in r.examples_no_match:
            typer.echo(f"  {ex}")

    @rules_app.command("check")
    def rules_check(rules_dirs: Optional[List[str]] = typer.Option(None, "--rules", help="Also lint these.")) -> None:
        """Lint the rules: duplicate ids, empty messages, missing or failing examples, bad patterns."""
        from kwdiag.engine import builtin_rules_dir, lint_rules, load_rule_files
        from kwdiag.errors import FINDINGS

        rules, errors = load_rule_files([builtin_rules_dir(), *(rules_dirs or [])])
        problems = lint_rules(rules, errors)
        for p in problems:
            typer.echo(p)
        typer.echo(f"{len(rules)} rules, {len(problems)} problem(s)")
        if problems:
            raise typer.Exit(FINDINGS)

    app.add_typer(rules_app)
