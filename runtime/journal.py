"""The scheduler's journal: what it must not forget, appended to its run directory and replayed after a restart.

Covers: the record format (4-byte length, 4-byte CRC-32, then a msgpack list ``[op, ...]``); appending
with one unbuffered ``write`` per record batch: per call, or, given a ``defer`` (the scheduler passes
``core.at_turn_end``), per event-loop turn, written before that turn's messages leave. Either way every
record is in the kernel before the scheduler tells anyone what it records, and a SIGKILL loses nothing
anyone was told;
reading a journal back, where a torn or corrupt tail is skipped and reported rather than fatal;
folding the records into a ``Replay`` (the tasks clients still want, which are done and where, errors,
failure counts and who was blamed, scattered data's owners, the workers and clients of the cluster);
compaction (a fresh journal written from a snapshot and renamed over the old one); a lock so that two
schedulers never share one run directory; and carrying on when the disk fills or the directory is
deleted: appends stop, the failure is reported once, and a full snapshot is written as soon as it can be.

Does not cover: what the scheduler does with a replay (``runtime.recovery``), its events
(``runtime.record``), or durability against the host losing power (records reach the kernel, not the
disk: no ``fsync`` per record, which would cost milliseconds per task).

Records (worker names, not addresses, name holders: an address dies with its incarnation)::

    hello   {cluster, pid, address, started, version}   first record of every file
    task    key, spec, deps, priority, restrictions, loose[, retries]   a task the scheduler was given
                                    (spec None: scattered; retries: submit(retries=), from its submission)
    want    client, [keys]          /  unwant  client, [keys]
    has     key, worker, nbytes     a worker holds the result   /  drop  key, worker
    err     key, error              /  forget  [keys]            /  flush  (client.restart())
    retry   key                     client.retry: the error is cleared, the task runs again
    retries key, left               a task error was retried (submit(retries=)): retries left
    blame   key, deaths, [workers]  the allowed-failures count and who died running it
    worker  name, address, up       a worker down takes every result it held with it
    client  id, up                  /  close  reason (a clean end: nothing to recover)
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import msgpack

FILE_NAME = "scheduler.kwjournal"   # a suffix `kwdiag explain` does not read as a log
LOCK_NAME = "scheduler.lock"
FRAME = struct.Struct("!II")        # payload length, CRC-32 of the payload
MAX_RECORD = 1 << 30
VERSION = 1


def encode(record: Iterable[Any]) -> bytes:
    payload = msgpack.packb(list(record), use_bin_type=True)
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


@dataclass
class TaskRecord:
    """One task as the journal last described it."""

    key: str
    spec: bytes | None
    deps: list[str]
    priority: int = 0
    restrictions: list[str] | None = None
    loose: bool = False
    retries: int = 0
    wanted_by: set[str] = field(default_factory=set)
    holders: dict[str, int] = field(default_factory=dict)   # worker name -> nbytes
    error: dict | None = None
    deaths: int = 0
    death_workers: list[str] = field(default_factory=list)


@dataclass
class Replay:
    """What a journal holds, folded: the state its scheduler had when it stopped writing."""

    path: str
    hello: dict = field(default_factory=dict)
    tasks: dict[str, TaskRecord] = field(default_factory=dict)   # in submission order
    workers: dict[str, str] = field(default_factory=dict)        # name -> address, alive at the end
    clients: set[str] = field(default_factory=set)
    closed: str | None = None   # the reason of a clean close: nothing to recover
    records: int = 0
    skipped_bytes: int = 0      # a torn or corrupt tail, not replayed
    problem: str | None = None  # why the tail was skipped

    def apply(self, rec: list) -> None:
        op = rec[0]
        if op == "hello":
            self.hello = dict(rec[1])
            self.closed = None
        elif op == "task":
            key, spec, deps, priority, restrictions, loose = rec[1:7]
            retries = int(rec[7] or 0) if len(rec) > 7 else 0   # (journals before retries have 7 fields)
            old = self.tasks.get(key)
            if old is None or old.spec is None:
                self.tasks[key] = TaskRecord(key, spec, list(deps or ()), int(priority or 0),
                                             list(restrictions) if restrictions else None, bool(loose),
                                             retries=retries, wanted_by=old.wanted_by if old else set(),
                                             holders=old.holders if old else {})
        elif op in ("want", "unwant"):
            for key in rec[2]:
                ts = self.tasks.get(key)
                if ts is not None:
                    (ts.wanted_by.add if op == "want" else ts.wanted_by.discard)(rec[1])
        elif op == "has":
            ts = self.tasks.get(rec[1])
            if ts is not None:
                ts.holders[rec[2]] = int(rec[3] or 0)
        elif op == "drop":
            ts = self.tasks.get(rec[1])
            if ts is not None:
                ts.holders.pop(rec[2], None)
        elif op == "err":
            ts = self.tasks.get(rec[1])
            if ts is not None:
                ts.error, ts.holders = rec[2], {}
        elif op == "forget":
            for key in rec[1]:
                self.tasks.pop(key, None)
        elif op == "retries":   # a task error was retried: this many retries are left
            ts = self.tasks.get(rec[1])
            if ts is not None:
                ts.retries = int(rec[2])
        elif op == "retry":   # client.retry: the error is gone and the task runs again
            ts = self.tasks.get(rec[1])
            if ts is not None:
                ts.error, ts.deaths, ts.death_workers = None, 0, []
        elif op == "blame":
            ts = self.tasks.get(rec[1])
            if ts is not None:
                ts.deaths, ts.death_workers = int(rec[2]), list(rec[3])
        elif op == "worker":
            if rec[3]:
                self.workers[rec[1]] = rec[2]
            else:  # its results went with it (one record instead of a drop per key)
                self.workers.pop(rec[1], None)
                for ts in self.tasks.values():
                    ts.holders.pop(rec[1], None)
        elif op == "client":
            (self.clients.add if rec[2] else self.clients.discard)(rec[1])
        elif op == "flush":
            self.tasks.clear()
        elif op == "close":
            self.closed = str(rec[1])


def read(path: str) -> Replay:
    """Fold the journal at ``path``; a torn or corrupt tail is skipped (``skipped_bytes``, ``problem``)."""
    replay = Replay(path)
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        if len(data) - pos < FRAME.size:
            replay.problem = "a torn record at the end (its header is incomplete)"
            break
        size, crc = FRAME.unpack_from(data, pos)
        body = data[pos + FRAME.size: pos + FRAME.size + size]
        if size > MAX_RECORD or len(body) < size:
            replay.problem = "a torn record at the end (shorter than its header says)"
            break
        if zlib.crc32(body) != crc:
            replay.problem = f"a corrupt record at byte {pos} (checksum mismatch)"
            break
        try:
            rec = msgpack.unpackb(body, raw=False, strict_map_key=False)
            if not isinstance(rec, list) or not rec:
                raise ValueError("not a record")
            replay.apply(rec)
        except Exception as exc:  # a record of a format we do not know: stop here rather than guess
            replay.problem = f"an unreadable record at byte {pos} ({type(exc).__name__})"
            break
        replay.records += 1
        pos += FRAME.size + size
    replay.skipped_bytes = len(data) - pos
    return replay


class JournalLocked(Exception):
    """Another live scheduler uses this run directory."""


class Journal:
    """The append side. ``on_error(reason)`` is told once each time appending starts to fail. With ``defer``,
    appends are kept until ``flush``, which is handed to ``defer`` at the first append after a flush (a
    scheduler at full speed appends a record per finished task: one ``write`` per loop turn instead)."""

    def __init__(self, directory: str, on_error: Callable[[str], None],
                 defer: Callable[[Callable[[], None]], None] | None = None):
        self.directory = directory
        self.defer = defer
        self._pending: list[bytes] = []
        self.path = os.path.join(directory, FILE_NAME)
        self.on_error = on_error
        self.fd: int | None = None
        self.broken: str | None = None     # why appends are off until the next successful snapshot
        self.broken_since: float | None = None
        self.appended = 0                  # records since the last snapshot
        self.snapshot_size = 0
        self._lock_fd: int | None = None

    # ---------------------------------------------------------------- ownership
    def lock(self) -> None:
        """Take the run directory's lock (released by the kernel when this process dies, however it dies)."""
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(os.path.join(self.directory, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise JournalLocked(f"run directory {self.directory} is in use by another scheduler "
                                    f"(pid {holder})") from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def existing(self) -> Replay | None:
        return read(self.path) if os.path.exists(self.path) else None

    def set_aside(self, why: str) -> str:
        """Move the current journal out of the way (kept for a person to look at); return its new path."""
        target = f"{self.path}.{why}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        os.replace(self.path, target)
        return target

    # ---------------------------------------------------------------- writing
    def snapshot(self, records: list[list]) -> bool:
        """Replace the journal with ``records`` (compaction, or a fresh start); True if it is now written."""
        self.flush()   # records appended before the snapshot was taken belong to the file it replaces
        blob = b"".join(encode(r) for r in records)
        tmp = f"{self.path}.tmp-{os.getpid()}"
        try:
            os.makedirs(self.directory, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(fd, blob)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            new = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            self._fail(exc)
            return False
        if self.fd is not None:
            os.close(self.fd)
        self.fd = new
        self.broken = self.broken_since = None
        self.appended = 0
        self.snapshot_size = len(records)
        return True

    def append(self, *records: list) -> None:
        if self.fd is None or self.broken:
            return
        if self.defer is None:
            self._write(b"".join(encode(r) for r in records), len(records))
            return
        if not self._pending:
            self.defer(self.flush)
        self._pending.extend(encode(r) for r in records)

    def flush(self) -> None:
        """Write the appends kept so far."""
        if self._pending:
            pending, self._pending = self._pending, []
            if self.fd is not None and not self.broken:
                self._write(b"".join(pending), len(pending))

    def _write(self, blob: bytes, count: int) -> None:
        try:
            _write_all(self.fd, blob)
        except OSError as exc:
            self._fail(exc)
            return
        self.appended += count

    def _fail(self, exc: OSError) -> None:
        if self.broken is None:
            self.broken = exc.strerror or str(exc)
            self.broken_since = time.monotonic()
            self.on_error(self.broken)

    # ---------------------------------------------------------------- upkeep
    def needs_snapshot(self, live_records: int) -> bool:
        """A snapshot is due: appends failed, the file was deleted under us, or it holds well over the
        ``live_records`` a snapshot of the current state would (so a long run's journal stays small)."""
        if self.fd is None:
            return False
        if self.broken:
            return True
        try:
            if os.fstat(self.fd).st_nlink == 0:  # its directory (or the file) was deleted mid-run
                self._fail(OSError(errno.ENOENT, "the journal was deleted (its run directory removed?)"))
                return True
        except OSError:
            return True
        return self.snapshot_size + self.appended > 4 * live_records + 20_000

    def close(self) -> None:
        self.flush()
        for fd in (self.fd, self._lock_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fd = self._lock_fd = None


def _write_all(fd: int, blob: bytes) -> None:
    view = memoryview(blob)
    while view:
        n = os.write(fd, view)
        view = view[n:]
