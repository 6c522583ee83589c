"""Baselines: the death signatures a project already knows about, so CI fails only on new ones.

Covers: reading (``load``) and writing (``write``) a baseline file — JSON, schema
``kwdiag.check.baseline/1``, one entry per fingerprint (``kwdiag.analysis.fingerprint``) with what it
stands for (role, cause, detail, a sample summary) so a reviewer can read the diff — and nothing
else: matching is a set lookup in ``kwdiag.check.evaluate``. A baseline counts signatures, not
occurrences: a known signature seen more often than before is still known.

Entries written by another fingerprint version are reported as a usage error rather than silently
matching nothing.
"""

from __future__ import annotations

import json
import os
from typing import Iterable

from kwdiag.analysis.fingerprint import VERSION, worker_role
from kwdiag.errors import USAGE, KwdiagError

SCHEMA = "kwdiag.check.baseline/1"


def load(path: str) -> set[str]:
    """The fingerprints in the baseline at ``path``; ``KwdiagError`` (usage) if it is missing or malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise KwdiagError(f"cannot read baseline {path}: no such file (write one with --write-baseline)",
                          USAGE) from None
    except OSError as exc:
        raise KwdiagError(f"cannot read baseline {path}: {exc.strerror or exc}", USAGE) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise KwdiagError(f"cannot read baseline {path}: not JSON ({exc})", USAGE) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("findings"), dict):
        raise KwdiagError(f"cannot read baseline {path}: not a {SCHEMA} file", USAGE)
    if str(data.get("fingerprint_version")) != VERSION:
        raise KwdiagError(f"baseline {path} was written with fingerprint version {data.get('fingerprint_version')!r}, "
                          f"this kwdiag uses {VERSION}: rewrite it with --write-baseline", USAGE)
    return {fp for fp in data["findings"] if isinstance(fp, str)}


def document(findings: Iterable) -> dict:
    """The baseline document for ``findings`` (``kwdiag.check.Finding``s that would fail)."""
    entries: dict[str, dict] = {}
    for f in findings:
        d = f.death
        e = entries.setdefault(f.fingerprint, {"worker_role": worker_role(d.worker), "cause": d.cause,
                                               "detail": d.detail, "summary": d.summary, "seen": 0})
        e["seen"] += 1
    return {"schema": SCHEMA, "fingerprint_version": VERSION,
            "findings": dict(sorted(entries.items(), key=lambda kv: (kv[1]["cause"], kv[1]["detail"], kv[0])))}


def write(path: str, findings: Iterable) -> int:
    """Write the baseline for ``findings`` atomically; returns how many signatures it holds."""
    doc = document(findings)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, ensure_ascii=False)
            f.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise KwdiagError(f"cannot write baseline {path}: {exc.strerror or exc}", USAGE) from None
    return len(doc["findings"])
