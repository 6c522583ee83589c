"""kwdiag's one error type and its exit codes, in one place.

Every failure a user can cause (a bad option, an unreadable log, a cluster that cannot
start) is raised as ``KwdiagError`` with the exit code it maps to; ``kwdiag.cli.main`` turns
it into one line on stderr. Anything else is a bug and exits ``INTERNAL``, with the
traceback shown only under ``--debug``.
"""

from __future__ import annotations

# Documented in README.md ("Exit codes"); stable across releases.
OK = 0
FINDINGS = 1  # `check`: findings at or above the threshold; `run --fail-on`: such deaths happened
USAGE = 2  # bad options, unreadable or missing input
RUNTIME = 3  # the cluster could not start or the scheduler could not be reached
INTERRUPTED = 130
INTERNAL = 70
TIMEOUT = 124  # `run --timeout`: the job was stopped, as timeout(1) says
SIGNALLED = 128  # `run`: a job killed by signal N exits SIGNALLED + N, as a shell reports it


def signalled(signum: int) -> int:
    """The exit code of a job that a signal killed (``128 + N``)."""
    return SIGNALLED + signum


class KwdiagError(Exception):
    """A failure with a message for the user and an exit code."""

    def __init__(self, message: str, exit_code: int = USAGE):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message
