"""The one reader of kwdiag's settings files: ``kwdiag.toml`` and ``[tool.kwdiag]`` in ``pyproject.toml``.

Covers, for every command (``run``, ``check``, ``explain``) and the runtime's processes alike: one search rule
(from a folder up to the root, the first folder with a ``kwdiag.toml`` — any content — or a ``pyproject.toml``
that has ``[tool.kwdiag]``), one error for a file that does not parse (``SettingsError``, naming the file), and
one policy for keys nobody knows: a warning naming the key and the closest known one, never a silent default
and never a refusal (a key a newer kwdiag knows must not break an older one).

The layout: runtime settings at the top of the table (``allowed_failures = 1``), each command's in a sub-table
of its name (``[tool.kwdiag.check]``, or ``[check]`` in a ``kwdiag.toml``).

Does not cover: what a setting means or its type (``runtime.config``, ``check.policy``, ``run.options``).
Imports nothing of kwdiag: the runtime uses it too.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

SECTIONS = ("check", "run", "explain")   # sub-tables of commands
# `kwdiag run`'s own keys, which live at the top of the table beside the runtime's settings (docs/run.md).
RUN_KEYS = frozenset({"workers", "threads", "memory_limit", "nanny", "allowed_failures", "worker_ttl", "log_dir",
                      "runs_dir", "timeout", "fail_on", "dask"})


class SettingsError(ValueError):
    """A settings file that cannot be read or does not parse; the message names it."""


class UnknownSettingWarning(UserWarning):
    """A key no part of kwdiag knows (a typo, or a newer kwdiag's setting)."""


@dataclass(frozen=True)
class Settings:
    path: Path
    table: dict   # [tool.kwdiag], or the whole kwdiag.toml

    def section(self, name: str) -> dict:
        """A command's sub-table (``check``, ``run``, ``explain``); empty when absent."""
        value = self.table.get(name, {})
        if not isinstance(value, dict):
            raise SettingsError(f"{self.path}: [tool.kwdiag.{name}] must be a table")
        return value

    def runtime(self) -> dict:
        """The top-level keys: runtime settings."""
        return {k: v for k, v in self.table.items() if k not in SECTIONS}


def read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"cannot read config {path}: {exc}") from None
    except OSError as exc:
        raise SettingsError(f"cannot read config {path}: {exc.strerror or exc}") from None


def read(path: str | os.PathLike) -> Settings:
    """The settings of one file named on purpose (``--config``)."""
    path = Path(path)
    if not path.is_file():
        raise SettingsError(f"cannot read config {path}: no such file")
    data = read_toml(path)
    tool = data.get("tool", {}).get("kwdiag")
    return Settings(path, tool if isinstance(tool, dict) else ({} if path.name == "pyproject.toml" else data))


def find(start: str | os.PathLike | None = None) -> Settings | None:
    """The nearest settings file (the search rule above), or None."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        own = folder / "kwdiag.toml"
        if own.is_file():
            data = read_toml(own)
            tool = data.get("tool", {}).get("kwdiag")
            return Settings(own, tool if isinstance(tool, dict) else data)
        project = folder / "pyproject.toml"
        if project.is_file():
            tool = read_toml(project).get("tool", {}).get("kwdiag")
            if isinstance(tool, dict):
                return Settings(project, tool)
    return None


def unknown(table: dict, known: Iterable[str], where: str) -> list[str]:
    """A warning for each key of ``table`` not in ``known`` (``-`` and ``_`` alike), naming the closest known
    one; also issued as ``UnknownSettingWarning``."""
    names = {k.replace("-", "_"): k for k in known}
    out = []
    for key in table:
        norm = str(key).replace("-", "_")
        if norm in names:
            continue
        close = difflib.get_close_matches(norm, list(names), n=1)
        message = f"unknown setting {key!r} in {where}" + (f" (did you mean {names[close[0]]!r}?)" if close else "")
        out.append(message)
        warnings.warn(message, UnknownSettingWarning, stacklevel=3)
    return out
