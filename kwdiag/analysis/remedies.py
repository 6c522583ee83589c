"""Fixes with numbers in them: the values a remediation text can use, and filling its template. Pure.

Covers: ``observations`` (what the logs show that a fix can quote: the memory limit, the peak, a
suggested new limit, the missing module, the signal, the exit status, the current allowed-failures),
``fill_template`` (``{name}`` placeholders; ``[[A||B]]`` is A when every value A names was observed,
else B, so a fix never reads "a limit of the current limit") and ``hints_for`` (one fix per runtime,
from the most decisive rule that has one).

Does not cover: which rules decided (``kwdiag.analysis.classify``), nor the fix texts themselves (each
rule file's ``[remediation]``).
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Iterable

from kwdiag.analysis.model import Hint
from kwdiag.engine import Rule
from kwdiag.events import Event
from kwdiag.units import format_bytes, parse_size

RUNTIME_ORDER = ("kwdiag", "dask", "coiled")

DEFAULTS = {
    "memory_limit": "the current limit",
    "peak": "the observed peak",
    "suggested_memory": "about twice the current limit",
    "terminate_fraction": "0.95",
    "module": "the missing module",
    "package": "the mismatched packages",
    "exception": "the exception",
    "signal": "the signal",
    "exitcode": "the exit status",
    "reason": "the reason",
    "pid": "the worker's pid",
}


def _nice_up(n: float) -> float:
    """Round a byte count up to a size people write: 512 MiB steps below 4 GiB, then whole GiB."""
    gib = 1024**3
    step = 512 * 1024**2 if n < 4 * gib else gib
    return math.ceil(n / step) * step


_QUOTED = ("module", "package", "exception", "signal", "signal_name", "exitcode", "reason", "taken")
_OBSERVED = frozenset({"memory_limit", "peak_rss", "rss", "process_memory", "terminate_fraction", "percent",
                       *_QUOTED})


def observations(events: Iterable[Event], allowed_failures: int | None) -> dict[str, Any]:
    """Values the remediation texts can use, computed from what the logs show."""
    obs: dict[str, Any] = {}
    limit = peak = frac = None
    for e in events:
        f = e.fields
        if f.keys().isdisjoint(_OBSERVED):   # most lines hold none (a test per key was most of a death's fix)
            continue
        v = parse_size(f.get("memory_limit"))
        if v:
            limit = v
        for key in ("peak_rss", "rss", "process_memory"):
            v = parse_size(f.get(key))
            if v:
                peak = max(peak or 0.0, v)
        tf = f.get("terminate_fraction")
        if isinstance(tf, (int, float)) and not isinstance(tf, bool):
            frac = float(tf)
        elif isinstance(f.get("percent"), int) and e.kind == "nanny-memory-terminate":
            frac = f.get("percent") / 100
        for key in _QUOTED:
            if f.get(key) is not None and key not in obs:
                obs[key] = f.get(key)
    if limit and frac and not peak:
        peak = limit * frac  # the nanny acted when memory crossed this
    if limit:
        obs["memory_limit"] = format_bytes(limit, compact=True)
    if peak:
        obs["peak"] = format_bytes(peak, compact=True)
    if frac:
        obs["terminate_fraction"] = f"{frac:g}"
    base = max(x for x in (limit, peak) if x) if (limit or peak) else None
    if base and math.isfinite(base * 2):  # an absurd reading (1e308 bytes) suggests nothing
        obs["suggested_memory"] = format_bytes(_nice_up(base * 2), compact=True)
    af = allowed_failures if allowed_failures is not None else 3
    obs["allowed_failures"] = af
    obs["suggested_allowed_failures"] = af + 2
    return obs


class _Fill(dict):
    def __missing__(self, key):
        return DEFAULTS.get(key, key)


_OPTIONAL = re.compile(r"\[\[(.*?)(?:\|\|(.*?))?\]\]", re.S)
_FIELD = re.compile(r"(?<!\{)\{(\w+)\}(?!\})")


def fill_template(text: str, obs: dict[str, Any]) -> str:
    """Fill ``{name}`` from ``obs``. ``[[A||B]]`` is A when every value A names was observed, else B
    (``[[A]]``: A or nothing), so a fix never reads 'a limit of the current limit'."""
    # Which parts ``[[A||B]]`` keeps depends only on which names were observed: chosen once per template and
    # names (a fix that quotes each death's pid differs in every death, and choosing was most of filling it).
    key = (text, tuple(map(obs.__contains__, _names(text))))
    chosen = _chosen.get(key)
    if chosen is None:
        if len(_chosen) > 10_000:
            _chosen.clear()
        chosen = _chosen[key] = _choose(text, obs)
    filled = _format(chosen, obs)
    # The same fix is one string: a log of 100,000 alike deaths holds a few texts, not one per death.
    if len(_texts) > 10_000:
        _texts.clear()
    return _texts.setdefault(filled, filled)


_chosen: dict[tuple, str] = {}
_texts: dict[str, str] = {}
_NAME = re.compile(r"\{(\w+)")   # {name}, {name:fmt}, {name!r}, {name[0]}: a name is read either way


@functools.lru_cache(maxsize=512)
def _names(text: str) -> tuple[str, ...]:
    """Every name a template can read (whether inside ``[[...]]`` or not)."""
    return tuple(sorted(set(_NAME.findall(text))))


def _fill(text: str, obs: dict[str, Any]) -> str:
    """``fill_template`` without its memo."""
    return _format(_choose(text, obs), obs)


def _choose(text: str, obs: dict[str, Any]) -> str:
    def choose(m: re.Match) -> str:
        a, b = m.group(1), m.group(2) or ""
        return a if all(k in obs for k in _FIELD.findall(a)) else b

    return _OPTIONAL.sub(choose, text)


def _format(text: str, obs: dict[str, Any]) -> str:
    try:
        return text.format_map(_Fill(obs))
    except (ValueError, IndexError):
        return text


def runtimes_in_order(runtimes: set[str]) -> list[str]:
    """The runtimes to write fixes for: those the logs came from, else Dask's and Coiled's."""
    return [r for r in RUNTIME_ORDER if r in runtimes] or ["dask", "coiled"]


def hints_for(rules_used: list[Rule], runtimes: set[str], obs: dict[str, Any]) -> tuple[Hint, ...]:
    """One fix per runtime: from the first rule (most decisive first) that has one for it."""
    out = []
    for rt in runtimes_in_order(runtimes):
        for rule in rules_used:
            text = rule.remediation.get(rt)
            if text:
                out.append(Hint(text=fill_template(text, obs), runtime=rt, rule=rule.id))
                break
    return tuple(out)
