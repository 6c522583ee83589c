"""What log lines come wrapped in when users save or paste them, taken off before the rules read a line.

Covers: markdown quote markers (``> ``) and code-block indentation, a terminal's echoed ``^C``, the
prefixes ``kubectl logs --prefix`` (``[pod/name/container] ``) and ``docker compose logs``
(``worker-1  | ``) add, syslog/journal prefixes (``Nov 21 10:56:57 host kernel: ``, ``host dask-worker[123]:
``) and timestamps in front of a Dask line from ``kubectl logs --timestamps`` or a log shipper, which are
then the line's time. ``unwrap(line) -> (line, ts)``; markdown fences and blank lines are skipped by
``is_noise``. Pure functions.

Does not cover: Dask's own line layout and timestamps (``kwdiag.readers.text.parse_prefix``), which the
unwrapped line keeps.
"""

from __future__ import annotations

import re
import time

_QUOTE = re.compile(r"^(?:\s*>)+ ?")
_CTRL_C = re.compile(r"^\^C")
_KUBECTL = re.compile(r"^\[(?:pod|deployment|job|statefulset|daemonset)/[^\]\s]+\]\s")
_COMPOSE = re.compile(r"^[A-Za-z0-9][\w.-]{0,62}\s*\|\s")
# "Nov 21 10:56:57 host kernel: msg" / "Nov 21 10:56:57 host dask-worker[123]: msg" (journalctl, syslog)
_SYSLOG = re.compile(r"^([A-Z][a-z]{2}) +(\d{1,2}) (\d\d:\d\d:\d\d) \S+ [\w./@-]+(?:\[\d+\])?: ")
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                       "Dec"), 1)}
# An ISO timestamp in front of a line that has a timestamp of its own (kubectl --timestamps, shippers).
_LEADING_ISO = re.compile(r"^(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s+(?=\S)")
_DASK_TS = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
_FENCE = re.compile(r"^\s*(?:```|~~~)")


def is_noise(line: str) -> bool:
    """A markdown fence or an empty line: nothing a rule could read."""
    return not line.strip() or bool(_FENCE.match(line))


def unwrap(line: str, year: int | None = None) -> tuple[str, float | None]:
    """``line`` without the wrappers of the module doc, and the time a syslog prefix gave it (or None).

    ``year``: syslog lines carry none; the current year is assumed unless given.
    """
    ts = None
    for _ in range(4):  # wrappers nest (a quoted kubectl line); a bounded number of passes
        before = line
        line = _QUOTE.sub("", line)
        line = _CTRL_C.sub("", line)
        m = _KUBECTL.match(line) or _COMPOSE.match(line)
        if m and not _DASK_TS.match(line):
            line = line[m.end():]
        m = _SYSLOG.match(line)
        if m:
            ts = _syslog_time(m.group(1), m.group(2), m.group(3), year)
            line = line[m.end():]
        m = _LEADING_ISO.match(line)
        if m and _DASK_TS.match(line[m.end():]):
            line = line[m.end():]  # the Dask line's own time is the one to read
        if line == before:
            break
    return line.strip(), ts


def _syslog_time(month: str, day: str, hms: str, year: int | None) -> float | None:
    try:
        y = year or time.localtime().tm_year
        return time.mktime(time.strptime(f"{y}-{_MONTHS[month]:02d}-{int(day):02d} {hms}", "%Y-%m-%d %H:%M:%S"))
    except (KeyError, ValueError):
        return None
