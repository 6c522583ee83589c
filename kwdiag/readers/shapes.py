"""What log lines come wrapped in when users save or paste them, taken off before the rules read a line.

Covers: markdown quote markers (``> ``) and code-block indentation, a terminal's echoed ``^C``, the
prefixes ``kubectl logs --prefix`` (``[pod/name/container] ``) and ``docker compose logs``
(``worker-1  | ``) add, syslog/journal prefixes (``Nov 21 10:56:57 host kernel: ``, ``host dask-worker[123]:
``, and ``journalctl -o short-iso``'s ``2026-11-21T10:56:57+0000 host dask[123]: ``), timestamps in front of
a Dask line from ``kubectl logs --timestamps`` or a log shipper (the Dask line's own time is read), a collector's
RFC 3339 stamp in front of a line with none of its own (a traceback's: the stamp is its time), and the
``\\"`` of a line that was a JSON string's content (docker output inside a platform's JSON message).
``unwrap(line) -> (line, ts)``; ``unwrap_from(line) -> (line, ts, who)`` also says which process the wrapper
names (the compose service, the kubectl pod and container, the journal's identifier and pid): in a stream
that merges several processes that is the only sure sign of who said a line. Markdown fences and blank lines
are skipped by ``is_noise``. Pure functions.

Does not cover: Dask's own line layout and timestamps (``kwdiag.readers.text.parse_prefix``), which the
unwrapped line keeps.
"""

from __future__ import annotations

import calendar
import re
import time

_QUOTE = re.compile(r"^(?:\s*>)+ ?")
_CTRL_C = re.compile(r"^\^C")
_KUBECTL = re.compile(r"^\[((?:pod|deployment|job|statefulset|daemonset)/[^\]\s]+)\]\s")
_COMPOSE = re.compile(r"^([A-Za-z0-9][\w.-]{0,62})\s*\|\s")
# "Nov 21 10:56:57 host kernel: msg" / "Nov 21 10:56:57 host dask-worker[123]: msg" (journalctl, syslog)
_SYSLOG = re.compile(r"^([A-Z][a-z]{2}) +(\d{1,2}) (\d\d:\d\d:\d\d) (\S+ [\w./@-]+(?:\[\d+\])?): ")
# "2026-11-21T10:56:57+0000 host dask[123]: msg" (journalctl -o short-iso; short-iso-precise has microseconds)
_JOURNAL_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)(Z|[+-]\d\d:?\d\d) "
                          r"(\S+ [\w./@-]+(?:\[\d+\])?): ")
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                       "Dec"), 1)}
# An ISO timestamp in front of a line that has a timestamp of its own (kubectl --timestamps, shippers).
_LEADING_ISO = re.compile(r"^(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s+(?=\S)")
_DASK_TS = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
# A collector's RFC 3339 stamp (kubectl --timestamps, Docker, Loki: a "T" and a zone, which logging's asctime never
# has) in front of a line without a stamp of its own (a traceback's): the stamp is the line's time and goes, so that
# rules read the line as the process printed it. Not when a logging level follows (a custom format's own stamp).
_COLLECTOR_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)(Z|[+-]\d\d:?\d\d)\s+")
_LEVEL_WORD = re.compile(r"\b(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b")
_FENCE = re.compile(r"^\s*(?:```|~~~)")
# Dask's own layout as its default logging config writes it ("2026-11-21 10:56:57,123 - distributed..."): no
# wrapper can be around such a line (each starts otherwise, or needs a second stamp after its own), so it is
# returned as it is without trying them (most lines of a saved log are in this layout).
_PLAIN_DASK = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - ")


def is_noise(line: str) -> bool:
    """A markdown fence or an empty line: nothing a rule could read."""
    return not line.strip() or bool(_FENCE.match(line))


def unwrap(line: str, year: int | None = None) -> tuple[str, float | None]:
    """``line`` without the wrappers of the module doc, and the time a syslog prefix gave it (or None).

    ``year``: syslog lines carry none; the current year is assumed unless given.
    """
    line, ts, _ = unwrap_from(line, year)
    return line, ts


def unwrap_from(line: str, year: int | None = None) -> tuple[str, float | None, str | None]:
    """``unwrap``, and the process the outermost collector's prefix names (None when there is none)."""
    line = _unescaped(line)
    if _PLAIN_DASK.match(line):
        return line.strip().rstrip("`").rstrip(), None, None
    return _unwrapped(line, year)


def _unwrapped(line: str, year: int | None = None) -> tuple[str, float | None, str | None]:
    """``unwrap_from`` trying every wrapper (the answer for any line, Dask's plain layout too)."""
    line = _unescaped(line)
    ts = None
    who = None
    for _ in range(4):  # wrappers nest (a quoted kubectl line); a bounded number of passes
        before = line
        line = _QUOTE.sub("", line)
        line = _CTRL_C.sub("", line)
        m = _KUBECTL.match(line) or _COMPOSE.match(line)
        if m and not _DASK_TS.match(line):
            who = who or m.group(1)
            line = line[m.end():]
        m = _SYSLOG.match(line)
        if m:
            ts = _syslog_time(m.group(1), m.group(2), m.group(3), year)
            who = who or m.group(4)
            line = line[m.end():]
        m = _JOURNAL_ISO.match(line)
        if m:
            ts = _iso_time(m.group(1), m.group(2))
            who = who or m.group(3)
            line = line[m.end():]
        m = _LEADING_ISO.match(line)
        if m and _DASK_TS.match(line[m.end():]):
            line = line[m.end():]  # the Dask line's own time is the one to read
        else:
            m = _COLLECTOR_STAMP.match(line)
            if m and not _LEVEL_WORD.search(line, m.end(), m.end() + 40):
                ts = _iso_time(m.group(1), m.group(2))
                line = line[m.end():]
        if line == before:
            break
    return line.strip().strip("`").strip(), ts, who


def _unescaped(line: str) -> str:
    """A line that was a JSON string's content, pasted as stored (a platform's ``{"error": "..."}`` message
    holding a container's output): its quotes are ``\\"``, which hide a traceback frame's ``File "..."`` from
    the rules. Unescaped only when every quote of the line is escaped (one ``\\"`` in a line that has plain
    quotes too is the line's own text)."""
    if '\\"' not in line or '"' in line.replace('\\"', ""):
        return line
    return line.replace('\\"', '"')


def _iso_time(stamp: str, zone: str) -> float | None:
    try:
        whole, _, frac = stamp.partition(".")
        t = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + (float("0." + frac) if frac else 0.0)
    except ValueError:
        return None
    if zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        t -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return t


def _syslog_time(month: str, day: str, hms: str, year: int | None) -> float | None:
    try:
        y = year or time.localtime().tm_year
        return time.mktime(time.strptime(f"{y}-{_MONTHS[month]:02d}-{int(day):02d} {hms}", "%Y-%m-%d %H:%M:%S"))
    except (KeyError, ValueError):
        return None
