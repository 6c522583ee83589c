"""Death fingerprints: one short id per *death signature*, the same on every rerun.

``Death.fingerprint`` (``kwdiag explain``) and ``kwdiag check``'s findings and baselines all use this one
recipe, so an id seen in a report is the id a baseline holds.

Covers: ``fingerprint(death)`` and the worker-name normalisation behind it. A signature is the
verdict (cause and detail) plus the worker's *role*: its name with everything a rerun changes taken
out — an address (``tcp://127.0.0.1:38291``, ``10.0.0.5:8786``) becomes ``<address>``, a random
suffix (a pod's ``-7f9c8d-xk2lp``) becomes ``*`` and every run of digits becomes ``#`` (so
``worker-0`` and ``worker-1`` share a role: which replica happened to run the bad task is noise).
Timestamps, pids, ports, incarnation numbers, file paths and the set of rules that happened to see
evidence are deliberately left out; the last varies between reruns of the same failure (a
faulthandler dump is flushed or not), so it would make baselines flaky.

Does not cover: baselines (``kwdiag.check.baseline``).
"""

from __future__ import annotations

import hashlib
import re

VERSION = "1"  # bump when the recipe changes: old baselines then match nothing, loudly (see baseline.py)

_ADDRESS = re.compile(
    r"(?:[a-z][a-z0-9+.-]*://)?"  # scheme
    r"(?:\[[0-9a-f:.]+\]|\d{1,3}(?:\.\d{1,3}){3}|[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?)"  # host
    r":\d{1,5}\b",  # port
    re.IGNORECASE,
)
_SCHEME_ONLY = re.compile(r"^[a-z][a-z0-9+.-]*://\S+$", re.IGNORECASE)
_RANDOM = re.compile(r"(?<![a-z0-9])(?=[a-z0-9]*\d)(?=[a-z0-9]*[a-z])[a-z0-9]{5,}(?![a-z0-9])", re.IGNORECASE)
_DIGITS = re.compile(r"\d+")


def worker_role(name: str) -> str:
    """``name`` without what changes between reruns (addresses, random suffixes, numbers)."""
    name = (name or "").strip()
    if _SCHEME_ONLY.match(name):
        return "<address>"
    name = _ADDRESS.sub("<address>", name)
    name = _RANDOM.sub("*", name)
    return _DIGITS.sub("#", name).lower()


def fingerprint(death) -> str:
    """16 hex digits naming ``death``'s signature: worker role, cause, detail (see the module doc)."""
    return signature_id(death.worker, death.cause, death.detail)


def signature_id(worker: str, cause: str, detail: str) -> str:
    key = "\x1f".join(("kwdiag-check", VERSION, worker_role(worker), cause, detail))
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]  # any name, even a lone surrogate
