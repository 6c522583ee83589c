"""The one seam through which kwdiag starts a Python child process.

Covers: the command line of a child that runs a kwdiag module (``python -P -m MODULE ...``) or a
user's script, and the child's environment, whose ``PYTHONPATH`` carries the parent's ``sys.path``
(in the parent's order, the empty entry made absolute). Every process kwdiag spawns (scheduler,
nanny, worker, the job of ``kwdiag run``, the demo's extra workers, the test helpers) goes through
here, so a child imports the same ``kwdiag`` and the same user modules as its parent whatever the
current directory is.

Why ``-P``: ``python -m`` puts the current directory first on ``sys.path``. Started from a clone of
kwdiag after a non-editable install, ``./kwdiag`` (which has no ``runtime/``) would shadow the
installed package and every child would fail with "No module named 'kwdiag.runtime'".

Does not cover: how the child's output is captured, its signals or its lifetime (the callers).
Standard library only.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Sequence


def parent_path(path: Sequence[str] | None = None) -> list[str]:
    """The entries of ``path`` (default ``sys.path``) as a child's ``PYTHONPATH``: absolute (the empty
    entry, the current directory, made so), in order, without duplicates. The interpreter's own
    directories are kept, so that the installed ``kwdiag`` keeps its place before anything a caller
    appends (a job's folder that happens to hold a ``kwdiag/`` source folder must not shadow it)."""
    out: list[str] = []
    for entry in sys.path if path is None else path:
        if not isinstance(entry, str) or entry.startswith("__editable__"):
            continue  # a path-hook marker of an editable install: the child's own .pth adds it again
        absolute = os.path.abspath(entry or os.getcwd())
        if absolute not in out:
            out.append(absolute)
    return out


def _entries(value: str | None) -> list[str]:
    return [os.path.abspath(e) for e in (value or "").split(os.pathsep) if e]


def child_env(extra: Mapping[str, str] | None = None, *, base: Mapping[str, str] | None = None,
              append_path: Sequence[str] = ()) -> dict[str, str]:
    """``base`` (default ``os.environ``) plus ``extra``, with ``PYTHONPATH`` made of, in order: a
    ``PYTHONPATH`` given in ``extra`` (the caller's deliberate choice, e.g. a user's setting or a test
    that gives a child another environment), the parent's ``sys.path``, ``append_path`` (e.g. the
    folder of a job whose modules workers must import), and the inherited ``PYTHONPATH``."""
    env = dict(os.environ if base is None else base)
    inherited = env.get("PYTHONPATH")
    if extra:
        env.update(extra)
    path: list[str] = []
    for entry in [*_entries((extra or {}).get("PYTHONPATH")), *parent_path(), *map(os.path.abspath, append_path),
                  *_entries(inherited)]:
        if entry not in path:
            path.append(entry)
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


def module_command(module: str, *args: str) -> list[str]:
    """``python -P -m MODULE ARGS``: the current directory is not put on the child's path."""
    return [sys.executable, "-P", "-m", module, *args]


def entry_command(*args: str) -> list[str]:
    """The command of a kwdiag runtime process (``kwdiag.runtime.entry`` scheduler|nanny|worker|...)."""
    return module_command("kwdiag.runtime.entry", *args)


def script_command(script: str, *args: str) -> list[str]:
    """``python SCRIPT ARGS``, as a user would run it: the script's own directory comes first on its
    path (so its sibling modules import), then the parent's path from ``child_env``."""
    return [sys.executable, script, *args]
