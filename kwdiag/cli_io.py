"""Input and output handling shared by the analysis commands (``explain``, ``check``).

Covers: opening an ``--output`` file (an unwritable path is a usage error, one line) and printing
a report's input problems to stderr in the one format the docs promise
(``kwdiag: error: PATH: message`` / ``kwdiag: warning: ...``). Reading logs is
``kwdiag.pipeline.analyze``; exit codes are ``kwdiag.errors``.
"""

from __future__ import annotations

import sys
from typing import TextIO


def open_output(path: str | None, option: str = "--output") -> TextIO:
    """``path`` opened for writing (UTF-8), or stdout when None; ``KwdiagError`` (usage) if it cannot be."""
    if not path:
        return sys.stdout
    from kwdiag.errors import USAGE, KwdiagError

    try:
        return open(path, "w", encoding="utf-8")
    except OSError as exc:
        raise KwdiagError(f"cannot write {path}: {exc.strerror or exc}", USAGE) from None


def print_problems(report) -> bool:
    """Each input problem of ``report`` as one line on stderr; True if any is an error."""
    for p in report.problems:
        print(f"kwdiag: {'error' if p.level == 'error' else 'warning'}: {p.path}: {p.message}", file=sys.stderr)
    return bool(report.input_errors)
