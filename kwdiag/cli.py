"""The ``kwdiag`` command line: a thin shell over the library.

Covers: the Typer app, registering each command group, and turning ``KwdiagError`` and
unexpected exceptions into one line and an exit code (``kwdiag.errors``). Command bodies
import their heavy modules lazily so that ``kwdiag --help`` stays fast.
"""

from __future__ import annotations

import sys

import typer

from kwdiag import __version__
from kwdiag.errors import INTERNAL, INTERRUPTED, KwdiagError

app = typer.Typer(
    name="kwdiag",
    help="Why did my worker die? Run jobs on an embedded task runtime and diagnose every worker death "
    "(kwdiag's own logs and Dask's).",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kwdiag {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> None:
    """kwdiag: run, explain and gate on worker deaths."""


# Each command group lives in its own module with a ``register(app)``; heavy imports stay inside commands.
COMMAND_MODULES = ("cli_runtime", "cli_analysis", "cli_check", "cli_run")


def _register_all() -> None:
    """Every command group registers, or the CLI does not start: a group that cannot be imported is a bug
    to see, not a command that silently disappears from ``--help``."""
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(f"kwdiag.{name}").register(app)


_register_all()


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        app(args=args, prog_name="kwdiag", standalone_mode=True)
    except KwdiagError as exc:
        if debug:
            raise
        print(f"kwdiag: error: {exc.message}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("kwdiag: interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED)
    except Exception as exc:  # a bug: say so in one line, not a traceback
        if debug:
            raise
        print(f"kwdiag: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
              file=sys.stderr)
        sys.exit(INTERNAL)


if __name__ == "__main__":
    main()
