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
        paths: Optional[List[str]] = typer.Argument(None, help="Log files, directories (read recursively), '-' for "
                                                                "stdin; gzip is detected."),
        fmt: str = typer.Option("text", "--format", "-f", help="text, json or markdown."),
        rules_dirs: Optional[List[str]] = typer.Option(None, "--rules", help="A directory of your own rule "
                                                                             "files, used beside the built-ins."),
        output: Optional[str] = typer.Option(None, "--output", "-o", help="Write the report to this file."),
        html_path: Optional[str] = typer.Option(None, "--html", help="Also write a self-contained HTML page "
                                                                      "with a timeline and memory charts."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Text report: after the groups, every death "
                                                                    "with every evidence line and fix."),
        dask_scheduler: Optional[str] = typer.Option(None, "--dask-scheduler", help="Explain a live Dask cluster: "
                                                     "fetch its logs, events and kwdiag records from this "
                                                     "scheduler address (saved with --save)."),
        scheduler_file: Optional[str] = typer.Option(None, "--scheduler-file", help="The same, for the Dask "
                                                                                    "scheduler in this file."),
        save: Optional[str] = typer.Option(None, "--save", help="With --dask-scheduler: the folder to save what "
                                                                "was fetched into (default kwdiag-dask-TIME)."),
        tls_ca_file: Optional[str] = typer.Option(None, "--tls-ca-file", help="TLS: the cluster's CA."),
        tls_cert: Optional[str] = typer.Option(None, "--tls-cert", help="TLS: this client's certificate."),
        tls_key: Optional[str] = typer.Option(None, "--tls-key", help="TLS: this client's key."),
        note_for: Optional[str] = typer.Option(None, "--note-for", help="Print only the few lines kwdiag adds to "
                                                                        "the KilledWorker of this task."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display and no warnings about the "
                                                                "inputs (errors are still printed)."),
    ) -> None:
        """Explain every worker death in saved logs (kwdiag's and Dask's), or in a live Dask cluster: cause,
        evidence, fix."""
        if dask_scheduler or scheduler_file:
            paths = [*(paths or ()), _fetch_live(dask_scheduler, scheduler_file, save, tls_ca_file, tls_cert,
                                                 tls_key)]
        _explain(list(paths or ()), fmt, rules_dirs, output, html_path, verbose, note_for, quiet)

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


def _fetch_live(address: Optional[str], scheduler_file: Optional[str], save: Optional[str], tls_ca_file: Optional[str],
                tls_cert: Optional[str], tls_key: Optional[str]) -> str:
    """Fetch a live Dask cluster's logs, events and kwdiag records into a folder; its path."""
    from kwdiag.errors import USAGE, KwdiagError

    try:
        from kwdiag.dask.live import _new_folder, _settle, connect
        from kwdiag.dask.collect import collect
    except ImportError:
        raise KwdiagError("--dask-scheduler needs Dask: pip install 'kwdiag[dask]'", USAGE) from None
    client = connect(address, scheduler_file, tls_ca_file=tls_ca_file, tls_cert=tls_cert, tls_key=tls_key)
    try:
        folder = save or _new_folder()
        _settle(client)
        summary = collect(client, folder)
    finally:
        client.close()
    typer.echo(f"Fetched {len(summary['files'])} file(s) from the cluster into {folder}"
               + ("" if summary["kwdiag_plugins"] else " (no kwdiag plugins ran there: Dask's logs only)"), err=True)
    return folder


def _explain(paths: list[str], fmt: str, rules_dirs: Optional[List[str]], output: Optional[str],
             html_path: Optional[str], verbose: bool, note_for: Optional[str], quiet: bool = False) -> None:
    """``kwdiag explain``'s work once its options are read: analyze, then write the report (or only the note)."""
    from kwdiag.errors import USAGE, KwdiagError

    if fmt not in FORMATS:
        raise KwdiagError(f"unknown --format {fmt!r} (use {', '.join(FORMATS)})", USAGE)
    if not paths:
        raise KwdiagError("give log files or folders to explain, or --dask-scheduler ADDRESS", USAGE)
    from kwdiag.cli_io import ReadingProgress
    from kwdiag.pipeline import analyze

    with ReadingProgress(enabled=not quiet) as progress:
        report = analyze(paths, rules_dirs or (), on_progress=progress.update)
    if note_for is not None:
        from kwdiag.report.note import killed_worker_note

        note = killed_worker_note(report, note_for, where=" ".join(paths))
        if note is None:
            raise typer.Exit(1)
        typer.echo(note)
        return
    from kwdiag.cli_io import open_output, print_problems

    out = open_output(output)
    try:
        if fmt == "json":
            from kwdiag.report.jsonout import write_json

            write_json(report, out)
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
    if print_problems(report, warnings=not quiet):
        raise typer.Exit(USAGE)
