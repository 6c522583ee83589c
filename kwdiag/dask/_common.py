"""What the three Dask plugins share: where they write, how they write, and how they read each other's files.

Covers: choosing the run directory (an explicit path, ``$KWDIAG_RUN_DIR``, the Dask config key
``kwdiag.run-dir``, or ``./kwdiag-dask``: never the worker's local directory, which the nanny
deletes), file names per worker, a ``Recorder`` that writes kwdiag JSONL events and never raises into
Dask, the text lines of the worker's own log (faulthandler dumps, WARNING+ records), reading back
the last executing-task set and the log lines of one worker process (for the nanny and the
scheduler, on the same host or a shared file system), and the version facts every start event carries.

Does not cover: Dask's hooks themselves (``scheduler``, ``nanny``, ``worker`` modules). Imports no
Dask module, so it can be tested and reused without a cluster.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import sys
import time
from typing import Any, Iterable

from kwdiag import crashdump
from kwdiag.events import EventWriter, to_json_line

ENV_RUN_DIR = "KWDIAG_RUN_DIR"
CONFIG_RUN_DIR = "kwdiag.run-dir"  # DASK_KWDIAG__RUN_DIR in the environment
DEFAULT_RUN_DIR = "kwdiag-dask"
TEXT_FORMAT = "%(asctime)s - %(name)s - %(levelname)s - %(message)s"  # Dask's layout, as kwdiag's runtime
EXECUTING_KIND = "tasks-executing"
BANNER = "kwdiag: worker process pid={pid} started"  # marks where one incarnation's lines begin in the log
TAIL_BYTES = 1 << 20   # how far back from the end a reader looks for one process's last lines
TAIL_LINES = 100       # room for a faulthandler dump of a few threads, as the embedded nanny keeps

logger = logging.getLogger("kwdiag.dask")

# What this process recorded, also kept in memory ((scheduler address, file name) -> its last lines), so that a
# client can fetch it from a live cluster whose run directories it cannot read (``kwdiag.dask.collect``).
# Keyed by the cluster's scheduler: one process may hold the servers of several clusters in turn (LocalClusters).
KEPT_LINES = 20_000
KEPT: dict[tuple[str | None, str], "collections.deque[str]"] = {}


def scheduler_address_of(server: Any) -> str | None:
    """The address of the scheduler a Dask scheduler, nanny or worker belongs to."""
    for get in (lambda: server.scheduler_addr, lambda: server.scheduler.address, lambda: server.address):
        try:
            value = get()
        except Exception:
            continue
        if isinstance(value, str) and value:
            return value
    return None


def recorded_lines(dask_worker: Any = None, dask_scheduler: Any = None) -> dict[str, list[str]]:
    """This process's recorded lines of the cluster of the server it runs on, by file name (run by
    ``client.run``/``run_on_scheduler``)."""
    cluster = scheduler_address_of(dask_scheduler if dask_scheduler is not None else dask_worker)
    return {name: list(lines) for (where, name), lines in KEPT.items() if cluster is None or where == cluster}


def run_dir(explicit: str | None = None) -> str:
    """The directory this process records into: ``explicit`` > $KWDIAG_RUN_DIR > config > default."""
    if explicit:
        return os.path.abspath(explicit)
    from_env = os.environ.get(ENV_RUN_DIR)
    if from_env:
        return os.path.abspath(from_env)
    try:
        import dask.config

        configured = dask.config.get(CONFIG_RUN_DIR, default=None)
    except ImportError:  # only the tests of this module run without Dask
        configured = None
    return os.path.abspath(configured or DEFAULT_RUN_DIR)


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def stem(name: Any) -> str:
    """A worker's name as part of a file name (Dask names a worker without ``--name`` by its address)."""
    text = _UNSAFE.sub("_", str(name)).strip("_.")
    return text[:100] or "unnamed"


def key_text(key: Any) -> str:
    """A task key as text, the same on scheduler and worker (tuple keys as Python shows them)."""
    return key if isinstance(key, str) else str(key)


def versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in ("kwdiag", "dask", "distributed", "tornado", "msgpack", "cloudpickle"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


class Recorder:
    """One JSONL file of events. A failure to write is logged once and never raised: a full disk must
    not take Dask's scheduler, nanny or worker down with it."""

    def __init__(self, directory: str, file_stem: str, *, source: str, worker: str | None = None,
                 cluster: str | None = None):
        self.path = os.path.join(directory, f"{file_stem}.jsonl")
        self.kept = KEPT[(cluster, os.path.basename(self.path))] = collections.deque(maxlen=KEPT_LINES)
        self.lost = 0
        self.writer: EventWriter | None = None
        try:
            os.makedirs(directory, exist_ok=True)
            self.writer = EventWriter(self.path, source=source, worker=worker)
        except OSError as exc:
            logger.error("kwdiag cannot record into %s: %s", self.path, exc.strerror or exc)

    def event(self, kind: str, message: str, *, level: str = "info", worker: str | None = None,
              **fields: Any) -> None:
        if self.writer is None:
            return
        try:
            event = self.writer.emit(kind, level=level, message=message, worker=worker, **fields)
            self.kept.append(to_json_line(event))
        except (OSError, ValueError) as exc:  # ValueError: written after close by a late hook
            self.lost += 1
            if self.lost == 1:
                logger.error("kwdiag could not record %r in %s: %s", kind, self.path, exc)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class ExecutingLines:
    """The worker's hot path: one ``tasks-executing`` event line per change of its executing set, in the
    format of ``kwdiag.events`` (docs/events.md) but with the parts that never change encoded once, and
    written with one ``write`` to an O_APPEND descriptor (no buffer to lose when the process dies). A
    general ``Recorder.event`` costs ~15 µs; this ~4 µs, twice per task."""

    def __init__(self, path: str, worker: str):
        import socket

        self.path = path
        self.fd: int | None = None
        self.lost = 0
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            logger.error("kwdiag cannot record into %s: %s", path, exc.strerror or exc)
        self._middle = (f',"source":"worker","kind":"{EXECUTING_KIND}","worker":{json.dumps(worker)},'
                        '"level":"debug","message":')
        self._end = f',"pid":{os.getpid()},"host":{json.dumps(socket.gethostname())},"fields":{{"executing":'
        self._second = -1
        self._iso = ""

    def write(self, keys: list[str]) -> None:
        if self.fd is None:
            return
        now = time.time()
        second = int(now)
        if second != self._second:  # the date part changes once a second
            self._second, self._iso = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        message = f"Executing {len(keys)} task(s)" + (f": {', '.join(keys[:5])}" if keys else "")
        line = (f'{{"v":1,"ts":{now:.6f},"time":"{self._iso}.{min(999, int((now - second) * 1000)):03d}Z"'
                f'{self._middle}{json.dumps(message)}{self._end}{json.dumps(keys)}}}}}\n')
        try:
            os.write(self.fd, line.encode("utf-8"))
        except OSError as exc:
            self.lost += 1
            if self.lost == 1:
                logger.error("kwdiag could not record the executing tasks in %s: %s", self.path, exc)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _tail_lines(path: str) -> list[str]:
    """The last ``TAIL_BYTES`` of ``path`` as lines (the first, probably cut, dropped); [] if unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[1:] if size > TAIL_BYTES else lines


def last_executing(events_path: str, pid: int | None) -> list[str] | None:
    """The last executing-task set worker process ``pid`` wrote in ``events_path``; None when that file
    has no such line (no worker plugin, another host, or the process died before its first task)."""
    if pid is None:
        return None
    for line in reversed(_tail_lines(events_path)):
        if EXECUTING_KIND not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a half-written last line
        if record.get("kind") == EXECUTING_KIND and record.get("pid") == pid:
            executing = (record.get("fields") or {}).get("executing")
            return [str(k) for k in executing] if isinstance(executing, list) else None
    return None


def _process_section(log_path: str, pid: int | None) -> list[str] | None:
    """The lines worker process ``pid`` wrote in its log between its banner and the next one; None when the
    banner is not there."""
    if pid is None:
        return None
    lines = _tail_lines(log_path)
    marker = BANNER.format(pid=pid)
    start = next((i for i in range(len(lines) - 1, -1, -1) if marker in lines[i]), None)
    if start is None:
        return None
    prefix = BANNER.split("{", 1)[0]
    end = next((i for i in range(start + 1, len(lines)) if prefix in lines[i]), len(lines))
    return [line[:1000] for line in lines[start + 1:end]]


def process_log_tail(log_path: str, pid: int | None, limit: int = TAIL_LINES) -> list[str] | None:
    """The lines worker process ``pid`` wrote in its log between its banner and the next one (its
    faulthandler dump, warnings): at most ``limit``, keeping the first lines (a dump's header says what
    happened) and the last; None when the banner is not there."""
    section = _process_section(log_path, pid)
    if section is None:
        return None
    head = min(20, limit // 2)
    kept = section if len(section) <= limit else section[:head] + section[-(limit - head):]
    return crashdump.fit(kept, crashdump.TAIL_BYTES, keep_end=True)


def process_crash_dump(log_path: str, pid: int | None) -> list[str] | None:
    """Process ``pid``'s faulthandler dump whole, from its last ``Fatal Python error`` line to its last line (the
    tail keeps only its ends, and a worker of many threads prints the crashing one's frames anywhere in it);
    bounded as the embedded nanny bounds it. None when there is none."""
    section = _process_section(log_path, pid) or []
    start = next((i for i in range(len(section) - 1, -1, -1) if crashdump.is_fatal(section[i])), None)
    if start is None:
        return None
    out = [section[start]]
    for line in section[start + 1:start + crashdump.MAX_LINES]:
        if not crashdump.is_dump_line(line):
            break   # the first line that is not the dump's ends it
        out.append(line)
    return crashdump.fit(out, crashdump.DUMP_BYTES)


def text_line(logger_name: str, level: str, message: str, when: float | None = None) -> str:
    """One line in the text layout of Dask and kwdiag logs."""
    when = time.time() if when is None else when
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) + f",{int(when % 1 * 1000):03d}"
    return f"{stamp} - {logger_name} - {level} - {message}\n"


def missing(**present: Any) -> dict[str, Any]:
    """``{"missing": [names]}`` for the fields given as None (this Dask version or setup cannot know them),
    or {} when every one is known. Readers see a field marked missing, never a made-up value."""
    absent = sorted(name for name, value in present.items() if value is None)
    return {"missing": absent} if absent else {}


def sorted_keys(keys: Iterable[Any]) -> list[str]:
    return sorted(key_text(k) for k in keys)
