"""Package versions of a process, and the differences between two processes' versions.

Covers: collecting the versions kwdiag compares (Python, kwdiag, msgpack, cloudpickle,
psutil, plus packages named in config) and diffing two such maps into rows for a table.
Does not cover: deciding what a mismatch does (the scheduler and client do that).
"""

from __future__ import annotations

import platform
from importlib import metadata

CORE_PACKAGES = ("kwdiag", "msgpack", "cloudpickle", "psutil")


def collect(extra: list[str] | tuple[str, ...] = ()) -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in (*CORE_PACKAGES, *extra):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def differences(ours: dict, theirs: dict, packages: list[str] | None = None) -> list[dict]:
    """Rows ``{package, ours, theirs}`` for every compared package whose versions differ."""
    names = packages if packages is not None else sorted(set(ours) | set(theirs))
    rows = []
    for name in names:
        a, b = ours.get(name), theirs.get(name)
        if a != b:
            rows.append({"package": name, "ours": a, "theirs": b})
    return rows


def table(rows: list[dict], left: str, right: str) -> str:
    """A plain text table of difference rows, as printed in logs and exceptions."""
    header = ("Package", left, right)
    body = [(r["package"], str(r["ours"] or "(not installed)"), str(r["theirs"] or "(not installed)")) for r in rows]
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(3)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    fmt = "| " + " | ".join("{:<%d}" % w for w in widths) + " |"
    return "\n".join([line, fmt.format(*header), line, *(fmt.format(*r) for r in body), line])
