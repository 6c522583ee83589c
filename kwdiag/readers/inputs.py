"""Which files to read: paths, directories (recursively), ``-`` for stdin.

Covers: expanding the command line into ``Input`` items and reporting paths that do not exist or
directories with nothing to read as ``InputProblem`` (level ``error``), the one type every reader uses
for what could not be read (or was read imperfectly).

Does not cover: opening or decoding files (``kwdiag.readers.scan``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from kwdiag.records import record


@dataclass(frozen=True, slots=True)
class InputProblem:
    """Something in the input that could not be read (``error``) or was read imperfectly (``warning``)."""

    path: str
    message: str
    level: str = "error"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "message": self.message, "level": self.level}


# In a directory, read files that look like logs; a file named on the command line is always read.
LOG_SUFFIXES = {".log", ".jsonl", ".txt", ".out", ".err", ".gz", ".stderr", ".stdout", ".dmesg", ".journal", ".ipynb", ""}


@record(frozen=True)
class Input:
    name: str  # what evidence lines are attributed to (the path as given, or "<stdin>"), always printable
    path: str | None  # None for stdin


def display_name(path: str) -> str:
    """``path`` fit for output: a file name that is not UTF-8 arrives with lone surrogates
    (``surrogateescape``), which no output can encode; they become U+FFFD."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _looks_like_log(p: Path) -> bool:
    suffixes = p.suffixes
    if not suffixes:
        return not p.name.startswith(".")
    if p.suffix == ".gz" and len(suffixes) >= 2:
        return suffixes[-2] in LOG_SUFFIXES or True
    return p.suffix in LOG_SUFFIXES or any(s in (".log", ".jsonl") for s in suffixes)


def _is_empty(p: Path) -> bool:
    try:
        return p.stat().st_size == 0
    except OSError:
        return False   # unreadable: reading it reports why


def expand_inputs(paths: Iterable[str]) -> tuple[list[Input], list[InputProblem]]:
    inputs: list[Input] = []
    problems: list[InputProblem] = []
    seen: set[str] = set()
    for raw in paths:
        if raw == "-":
            inputs.append(Input("<stdin>", None))
            continue
        p = Path(raw)
        if p.is_dir():
            found = []
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for f in sorted(files):
                    fp = Path(root) / f
                    if fp.is_file() and _looks_like_log(fp):
                        found.append(fp)
            # An empty file beside others says nothing (a batch job's unused .out): not read, not warned of. A folder
            # whose logs are all empty is read (each warned of: a quiet run's log may well be empty), and a file
            # named on the command line always is.
            found = [fp for fp in found if not _is_empty(fp)] or found
            if not found:
                problems.append(InputProblem(display_name(raw), "directory has no log files to read"))
            for fp in found:
                key = str(fp.resolve())
                if key not in seen:
                    seen.add(key)
                    inputs.append(Input(display_name(str(fp)), str(fp)))
        elif p.exists():
            key = str(p.resolve())
            if key not in seen:
                seen.add(key)
                inputs.append(Input(display_name(raw), raw))
        else:
            problems.append(InputProblem(display_name(raw), "no such file or directory"))
    return inputs, problems
