"""One-line memory sparklines for the terminal report: ``memory ▁▂▃▅▆▇█ peak 391 MiB of 400 MiB limit``.

Covers: resampling a ``MemoryTrace``'s samples to a fixed width (the maximum of each bucket, so a
spike is never averaged away), scaling them against the memory limit (a climb to the limit, or to
the nanny's terminate line, reaches the top block ``█``; values above it stay ``█``) or, with no
limit known, against the peak (byte sizes are ``kwdiag.units``'). The output is plain text made of the
eight block characters U+2581..U+2588 and ASCII: no colour, no terminal control sequences.

Does not cover: deciding whether to show a line (the terminal reporter shows one for every death
whose trace has nanny samples), or the HTML charts (``kwdiag.report.html``).
"""

from __future__ import annotations

from kwdiag.analysis.model import MemoryTrace
from kwdiag.units import format_bytes

BLOCKS = "▁▂▃▄▅▆▇█"
WIDTH = 40


def resample(values: list[float], width: int = WIDTH) -> list[float]:
    """At most ``width`` values: the maximum of each of ``width`` equal runs of ``values``."""
    if len(values) <= width:
        return list(values)
    out = []
    for i in range(width):
        a = i * len(values) // width
        b = max(a + 1, (i + 1) * len(values) // width)
        out.append(max(values[a:b]))
    return out


def blocks(values: list[float], top: float) -> str:
    """One block per value, ``top`` (and above) being ``█`` and 0 ``▁``."""
    if top <= 0:
        return ""
    out = []
    for v in values:
        level = int(max(0.0, v) / top * len(BLOCKS))
        out.append(BLOCKS[max(0, min(len(BLOCKS) - 1, level))])
    return "".join(out)


def sparkline(trace: MemoryTrace | None, width: int = WIDTH, *, brief: bool = False) -> str | None:
    """The sparkline text for ``trace``, or None when it has no samples; ``brief``: the blocks and the peak
    against the limit only (one 80-column line in a grouped report)."""
    if trace is None or not trace.samples:
        return None
    values = [v for _, v in trace.samples]
    peak = max(values + ([trace.peak] if trace.peak else []))
    top = trace.limit or peak
    line = "memory " + blocks(resample(values, width), top) + f" peak {format_bytes(peak)}"
    if trace.limit:
        line += f" of {format_bytes(trace.limit)} limit"
        if trace.terminate_at and not brief:
            line += f" (terminate at {format_bytes(trace.terminate_at)})"
    if brief:
        return line
    span = trace.samples[-1][0] - trace.samples[0][0]
    line += f", {len(values)} sample{'s' if len(values) != 1 else ''}"
    if span > 0:
        line += f" over {span:.1f}s"
    return line
