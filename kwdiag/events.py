"""The one record type every kwdiag stage shares: ``Event``, and its JSONL encoding.

Covers: the ``Event`` and ``Origin`` types, encoding an event as one JSON line (format
version ``FORMAT_VERSION``, specified in ``docs/events.md``), decoding one line back, and
``EventWriter``, an append-only writer that flushes every line so nothing recorded is lost
when the writing process dies.

Does not cover: reading whole files or other log formats (the readers do that), deciding
what an event means (timelines and rules do that), or logging prose (the runtime does).
Standard library only: the runtime and the analyzer both import it, and nothing else of
each other.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

FORMAT_VERSION = 1

# Who produced an event. Readers of foreign logs may add their own (e.g. "kernel", "k8s").
SOURCES = ("scheduler", "worker", "nanny", "client", "cluster", "runner", "kernel", "k8s", "slurm", "dask")

LEVELS = ("debug", "info", "warning", "error", "critical")


class EventDecodeError(ValueError):
    """A line that is not a kwdiag event (bad JSON, wrong shape, unknown major version)."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an event was read from: so a verdict can point at the line that proves it.

    ``line`` orders the events of one file. ``shown``, when set, is the line to point at instead: the lines of a
    printed Python value are read in the order they happened, which is not the order printed (Dask returns its
    logs newest first), and several may sit on one printed line (``kwdiag.readers.pyrepr``)."""

    file: str
    line: int
    shown: int | None = None

    @property
    def at(self) -> int:
        """The line of the file that holds the event's text."""
        return self.line if self.shown is None else self.shown

    def __str__(self) -> str:
        return f"{self.file}:{self.at}"


@dataclass(frozen=True, slots=True)
class Event:
    """One lifecycle fact.

    ``ts`` is seconds since the Unix epoch (UTC). ``kind`` is kebab-case (``worker-exit``).
    ``worker`` is the stable identity (name) of the worker the event is about, if any; the
    address of one incarnation goes in ``fields["address"]``. ``origin`` is set by readers,
    never written to JSONL.
    """

    ts: float
    source: str
    kind: str
    worker: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    level: str = "info"
    message: str = ""
    pid: int | None = None
    host: str | None = None
    origin: Origin | None = None

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)


def iso_time(ts: float) -> str:
    """``ts`` (epoch seconds) as ISO 8601 UTC with milliseconds: ``2026-11-21T09:53:19.534Z``."""
    secs = int(ts)
    ms = int(round((ts - secs) * 1000))
    if ms == 1000:
        secs, ms = secs + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{ms:03d}Z"


def _jsonable(value: Any) -> Any:
    """Make a field value JSON-safe without raising: events must never be lost to a type."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return str(value)


def to_json_line(event: Event) -> str:
    """Encode ``event`` as one line of JSON (no trailing newline)."""
    record = {
        "v": FORMAT_VERSION,
        "ts": round(event.ts, 6),
        "time": iso_time(event.ts),
        "source": event.source,
        "kind": event.kind,
        "worker": event.worker,
        "level": event.level,
        "message": event.message,
        "pid": event.pid,
        "host": event.host,
        "fields": _jsonable(dict(event.fields)),
    }
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def from_json_line(line: str | bytes, origin: Origin | None = None) -> Event:
    """Decode one JSONL line; raise ``EventDecodeError`` if it is not a kwdiag event."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise EventDecodeError(f"not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise EventDecodeError("not a JSON object")
    version = record.get("v")
    if not isinstance(version, int) or isinstance(version, bool):
        raise EventDecodeError("missing format version 'v'")
    if version != FORMAT_VERSION:
        # Minor additions stay within one version; a new major version is refused, not guessed.
        raise EventDecodeError(f"unsupported event format version {version} (this kwdiag reads {FORMAT_VERSION})")
    ts, source, kind = record.get("ts"), record.get("source"), record.get("kind")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts):
        raise EventDecodeError("'ts' must be a number")
    if not isinstance(source, str) or not isinstance(kind, str) or not kind:
        raise EventDecodeError("'source' and 'kind' must be strings")
    fields = record.get("fields")
    fields = {} if fields is None else fields
    if not isinstance(fields, dict):
        raise EventDecodeError("'fields' must be an object")
    # NaN and ±Infinity (which Python's JSON reads) are not readings of anything: a field that holds one
    # is treated as absent, so no later arithmetic (axes, roundings, ratios) meets them.
    fields = {k: v for k, v in fields.items() if not (isinstance(v, float) and not math.isfinite(v))}
    worker = record.get("worker")
    pid = record.get("pid")
    return Event(
        ts=float(ts),
        source=source,
        kind=kind,
        worker=worker if isinstance(worker, str) else (str(worker) if worker is not None else None),
        fields=fields,
        level=record.get("level") if record.get("level") in LEVELS else "info",
        message=record.get("message") if isinstance(record.get("message"), str) else "",
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        host=record.get("host") if isinstance(record.get("host"), str) else None,
        origin=origin,
    )


class EventWriter:
    """Append events to one JSONL file, one ``write`` + flush per line, safe across threads.

    Each process owns its file, so lines from different processes never interleave. A write
    that fails (disk full) raises ``OSError`` to the caller: silent loss is worse than a crash.
    """

    def __init__(self, path: str, *, source: str, worker: str | None = None):
        self.path = path
        self.source = source
        self.worker = worker
        self.pid = os.getpid()
        import socket  # here, not at the top: explain never records, and the import costs ~3 ms at start

        self.host = socket.gethostname()
        self._lock = threading.Lock()
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8", buffering=1)

    def emit(self, kind: str, *, level: str = "info", message: str = "", worker: str | None = None,
             ts: float | None = None, **fields: Any) -> Event:
        event = Event(
            ts=time.time() if ts is None else ts,
            source=self.source,
            kind=kind,
            worker=worker if worker is not None else self.worker,
            fields=fields,
            level=level,
            message=message,
            pid=self.pid,
            host=self.host,
        )
        self.write(event)
        return event

    def write(self, event: Event) -> None:
        line = to_json_line(event) + "\n"
        with self._lock:
            if self._file.closed:
                return
            self._file.write(line)
            self._file.flush()

    def unlinked(self) -> bool:
        """True when the file was deleted under this writer (its directory removed): lines go nowhere."""
        with self._lock:
            return not self._file.closed and os.fstat(self._file.fileno()).st_nlink == 0

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()
