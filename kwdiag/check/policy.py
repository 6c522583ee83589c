"""The gate's policy: which deaths fail a CI job, which are expected, read from options and config.

Covers: ``Policy`` (a severity threshold, cause selectors that fail, cause selectors that are
allowed), parsing the ``--fail-on`` / ``--allow`` vocabulary, the ``[tool.kwdiag.check]`` table of
the nearest ``kwdiag.toml`` or ``pyproject.toml`` (searched upward from the working directory, the
same files and order as the runtime's settings), and ``Policy.judge(death)``.

Vocabulary (comma-separated or repeated):

* a severity, ``info`` < ``warning`` < ``error``: deaths at or above it fail;
* ``any`` (= ``info``) or ``none`` (nothing fails by severity: report only);
* a cause (``sudden_exit``), a cause and detail (``sudden_exit/sigkill``) or any cause with a
  detail (``*/sigkill``).

``--fail-on`` defaults to ``warning``; ``--allow`` defaults to ``chose_to_exit``. An allowed death
never fails, except that a cause named explicitly in ``--fail-on`` overrides the *default*
allow-list (``--fail-on chose_to_exit`` does what it says).

Does not cover: baselines (``kwdiag.check.baseline``) or rendering.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from kwdiag.engine import CAUSES, SEVERITIES
from kwdiag.errors import USAGE, KwdiagError
import kwdiag.settings as settings

DEFAULT_FAIL_ON = ("warning",)
DEFAULT_ALLOW = ("chose_to_exit",)
CONFIG_KEYS = ("fail-on", "allow", "baseline")

# statuses of a judged death
FAIL = "fail"          # gates the job (exit 1)
BASELINED = "baselined"  # would fail, but its fingerprint is in the baseline
ALLOWED = "allowed"    # matches --allow
PASSED = "passed"      # below the threshold and not named by --fail-on


@dataclass(frozen=True)
class Selector:
    """``cause``, ``cause/detail`` or ``*/detail``."""

    cause: str  # "*" for any
    detail: str | None = None

    def matches(self, death) -> bool:
        return (self.cause in ("*", death.cause)) and (self.detail is None or self.detail == death.detail)

    def __str__(self) -> str:
        return self.cause if self.detail is None else f"{self.cause}/{self.detail}"


def parse_selector(text: str, option: str) -> Selector:
    cause, _, detail = text.partition("/")
    cause, detail = cause.strip(), detail.strip()
    if cause != "*" and cause not in CAUSES:
        raise KwdiagError(f"{option}: unknown cause {text!r} (use a severity {', '.join(SEVERITIES)}, any, none, "
                          f"or a cause: {', '.join(CAUSES)}, optionally /detail)", USAGE)
    if cause == "*" and not detail:
        raise KwdiagError(f"{option}: {text!r} needs a detail (*/sigkill)", USAGE)
    return Selector(cause, detail or None)


def split_items(values: Iterable[Any] | str | None) -> list[str]:
    """Repeated options and comma-separated lists, flattened; config values may be a string or a list."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    out = []
    for v in values:
        if not isinstance(v, str):
            raise KwdiagError(f"expected a string, got {v!r}", USAGE)
        out += [p.strip() for p in v.split(",") if p.strip()]
    return out


@dataclass(frozen=True)
class Policy:
    threshold: str | None = "warning"  # lowest failing severity; None: severity alone fails nothing
    fail_on: tuple[Selector, ...] = ()
    allow: tuple[Selector, ...] = field(default_factory=lambda: tuple(Selector(c) for c in DEFAULT_ALLOW))
    default_allow: bool = True  # allow came from the default, not from the user

    @classmethod
    def parse(cls, fail_on: Iterable[str] | str | None = None, allow: Iterable[str] | str | None = None) -> "Policy":
        """From option values (``None`` = default); raises ``KwdiagError`` (usage) on a bad item."""
        items = split_items(fail_on) if fail_on is not None else list(DEFAULT_FAIL_ON)
        threshold: str | None = None
        selectors: list[Selector] = []
        for item in items:
            low = item.lower()
            if low in SEVERITIES or low == "any":
                low = "info" if low == "any" else low
                if threshold is None or SEVERITIES.index(low) < SEVERITIES.index(threshold):
                    threshold = low
            elif low in ("none", "never"):
                pass
            else:
                selectors.append(parse_selector(item, "--fail-on"))
        if not items:
            raise KwdiagError("--fail-on: empty (use a severity, a cause, or none)", USAGE)
        allow_items = split_items(allow) if allow is not None else list(DEFAULT_ALLOW)
        allowed = tuple(parse_selector(a, "--allow") for a in allow_items)
        return cls(threshold=threshold, fail_on=tuple(selectors), allow=allowed, default_allow=allow is None)

    def judge(self, death) -> tuple[str, str]:
        """(``fail`` | ``allowed`` | ``passed``, why) for one death; the baseline is applied later."""
        named = next((s for s in self.fail_on if s.matches(death)), None)
        allowed = next((s for s in self.allow if s.matches(death)), None)
        if allowed is not None and not (named is not None and self.default_allow):
            return ALLOWED, f"allowed ({allowed})"
        if named is not None:
            return FAIL, f"fail-on {named}"
        sev = death.severity if death.severity in SEVERITIES else "error"
        if self.threshold is not None and SEVERITIES.index(sev) >= SEVERITIES.index(self.threshold):
            return FAIL, f"severity {sev} ≥ {self.threshold}"
        return PASSED, (f"severity {sev} < {self.threshold}" if self.threshold else "not named by --fail-on")

    def describe(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "fail_on": [str(s) for s in self.fail_on],
                "allow": [str(s) for s in self.allow]}


def find_config(start: str | os.PathLike | None = None) -> tuple[Path, dict] | None:
    """The nearest settings file's ``[tool.kwdiag.check]`` table (``kwdiag.settings``' search rule), or None.
    A file that does not parse is a usage error naming it, not a silent default."""
    try:
        found = settings.find(start)
        return (found.path, found.section("check")) if found is not None else None
    except settings.SettingsError as exc:
        raise KwdiagError(str(exc), USAGE) from None


def read_config(path: str | os.PathLike) -> tuple[Path, dict]:
    """``--config FILE``: that file's ``[tool.kwdiag.check]`` table."""
    try:
        found = settings.read(path)
        return found.path, found.section("check")
    except settings.SettingsError as exc:
        raise KwdiagError(str(exc), USAGE) from None


def config_values(path: Path, table: dict) -> dict[str, Any]:
    """The table's keys (``fail-on``/``fail_on``, ``allow``, ``baseline``), checked; paths made absolute."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        norm = key.replace("_", "-")
        if norm not in CONFIG_KEYS:
            settings.unknown({key: value}, CONFIG_KEYS, f"[tool.kwdiag.check] of {path}")
            continue
        if norm == "baseline":
            if not isinstance(value, str) or not value:
                raise KwdiagError(f"{path}: baseline must be a file path", USAGE)
            value = str((path.parent / value))
        else:
            try:
                value = split_items(value)
            except KwdiagError as exc:
                raise KwdiagError(f"{path}: {norm}: {exc.message}", USAGE) from None
        out[norm] = value
    return out
