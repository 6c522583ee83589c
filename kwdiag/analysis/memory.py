"""Gather what the logs show of one incarnation's memory into a ``MemoryTrace``. Pure.

Covers: the nanny's samples (``memory_samples`` of ``worker-exit``, ``samples`` of
``nanny-memory-terminate``, merged by timestamp), single readings stated by log lines (kwdiag's
``rss``; Dask's ``Process memory: ...`` of ``memory-pressure``), the memory limit (the nanny's, the
worker's start banner) and the terminate fraction (kwdiag's ``terminate_fraction``, Dask's
``exceeded 95% memory budget``), and the peak of all of them.

Does not cover: deciding anything from memory (the rules do that) or drawing it (``kwdiag.report``).
"""

from __future__ import annotations

import math
from typing import Iterable

from kwdiag.analysis.model import MemoryTrace
from kwdiag.events import Event
from kwdiag.units import parse_size

MAX_SAMPLES = 2000  # a hostile or huge log must not make one death's trace unbounded


def _size(v) -> float | None:
    n = parse_size(v)
    return n if n is not None and math.isfinite(n) and n >= 0 else None


def _pairs(v) -> list[tuple[float, float]]:
    out = []
    if not isinstance(v, list):
        return out
    for item in v[-MAX_SAMPLES:]:
        if (isinstance(item, (list, tuple)) and len(item) == 2
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in item)
                and item[1] >= 0):
            out.append((float(item[0]), float(item[1])))
    return out


def _near(sorted_times: list[float], t: float, tol: float) -> bool:
    import bisect

    i = bisect.bisect_left(sorted_times, t)
    return any(abs(sorted_times[j] - t) <= tol for j in (i - 1, i) if 0 <= j < len(sorted_times))


_MEMORY_FIELDS = frozenset({"memory_samples", "samples", "memory_limit", "terminate_fraction", "percent", "rss",
                            "process_memory", "peak_rss"})


def memory_trace(events: Iterable[Event]) -> MemoryTrace | None:
    """The ``MemoryTrace`` of one incarnation's events, or None when they say nothing about memory."""
    samples: dict[float, float] = {}
    readings: dict[float, float] = {}
    limit = frac = peak = None
    for e in events:
        f = e.fields
        if f.keys().isdisjoint(_MEMORY_FIELDS):   # most lines say nothing of memory
            continue
        if e.kind == "worker-exit":
            for t, v in _pairs(f.get("memory_samples")):
                samples[t] = v
        elif e.kind == "nanny-memory-terminate":
            for t, v in _pairs(f.get("samples")):
                samples[t] = v
        v = _size(f.get("memory_limit"))
        if v:
            limit = v
        tf = f.get("terminate_fraction")
        if isinstance(tf, (int, float)) and not isinstance(tf, bool) and 0 < tf <= 10:
            frac = float(tf)
        elif e.kind == "nanny-memory-terminate" and isinstance(f.get("percent"), int) and 0 < f.get("percent") <= 1000:
            frac = f.get("percent") / 100
        for key in ("rss", "process_memory"):
            v = _size(f.get(key))
            if v is not None and not e.get("ts_unknown"):
                readings[e.ts] = v
        v = _size(f.get("peak_rss"))
        if v:
            peak = max(peak or 0.0, v)
    # a reading taken when the nanny sampled (within 0.2 s) is already in the samples
    times = sorted(samples)
    readings = {t: v for t, v in readings.items() if not _near(times, t, 0.2)}
    values = list(samples.values()) + list(readings.values())
    if values:
        peak = max([peak or 0.0, *values])
    if not samples and not readings and limit is None and peak is None:
        return None
    s = tuple(sorted(samples.items()))[-MAX_SAMPLES:]
    return MemoryTrace(samples=s, readings=tuple(sorted(readings.items())), limit=limit,
                       terminate_fraction=frac, peak=peak)
