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
# The commands each module registers: a command line that names one registers only its module, because typer
# builds the parameters of every registered command at each start (~7 ms for all of them, of ~150 ms).
COMMAND_MODULES = {
    "cli_runtime": ("scheduler", "worker"),
    "cli_analysis": ("explain", "rules"),
    "cli_check": ("check",),
    "cli_run": ("run", "runs", "demo"),
}


def modules_for(args: list[str] | None) -> list[str]:
    """The command modules to register for ``args``: the one that owns the named command, or all of them
    (``--help``, no command, a mistyped one: typer then lists or suggests among every command)."""
    first = next((a for a in args or () if not a.startswith("-")), None)  # the root's options take no value
    owners = [m for m, commands in COMMAND_MODULES.items() if first in commands]
    return owners or list(COMMAND_MODULES)


def register(args: list[str] | None = None) -> typer.Typer:
    """Register the command groups ``args`` needs on ``app``. A group that cannot be imported is an error at
    start, not a command that silently disappears from ``--help``."""
    import importlib

    for name in modules_for(args):
        if name not in _REGISTERED:
            importlib.import_module(f"kwdiag.{name}").register(app)
            _REGISTERED.add(name)
    return app


_REGISTERED: set[str] = set()


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A setting nobody knows is one line, like every other word from kwdiag (not Python's warning layout)."""
    if category.__name__ == "UnknownSettingWarning":
        print(f"kwdiag: warning: {message}", file=sys.stderr)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


_default_showwarning = None


def _usage_errors_in_one_line() -> None:
    """A usage error (an unknown option, a missing or bad argument) is one line on stderr, as for every other
    error (README: exit code 2, one line), instead of click's usage block; ``kwdiag`` alone still shows the help."""
    from typer._click.exceptions import NoArgsIsHelpError, UsageError

    if getattr(UsageError.show, "_kwdiag", False):
        return
    shown_as_click_would = UsageError.show

    def show(self, file=None) -> None:
        if isinstance(self, NoArgsIsHelpError):
            return shown_as_click_would(self, file)
        command = self.ctx.command_path if self.ctx is not None else "kwdiag"
        print(f"kwdiag: error: {self.format_message()} (see `{command} --help`)", file=file or sys.stderr)

    show._kwdiag = True
    UsageError.show = show


def main(argv: list[str] | None = None) -> None:
    global _default_showwarning
    import warnings

    if _default_showwarning is None:
        _default_showwarning = warnings.showwarning
        warnings.showwarning = _show_warning
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    _usage_errors_in_one_line()
    try:
        register(args)(args=args, prog_name="kwdiag", standalone_mode=True)
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
