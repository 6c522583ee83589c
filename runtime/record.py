"""How runtime processes say what happened: human text on stderr and JSONL events, together.

Covers: the stderr logging format (Dask's layout, so people and kwdiag's readers see one
shape), and ``Recorder``, whose ``event()`` writes one fact both as a text line and as a
``kwdiag.events`` JSONL line (flushed at once) in the process's log directory, and which keeps
going when that directory fills up or is deleted (recording what the file is missing).
Does not cover: what the events mean, or where the log directory is chosen.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from kwdiag.events import EventWriter

TEXT_FORMAT = "%(asctime)s - %(name)s - %(levelname)s - %(message)s"

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR, "critical": logging.CRITICAL}


def setup_logging(level: str | int = "info") -> None:
    """Send ``kwdiag.*`` loggers to stderr in the text format (idempotent)."""
    root = logging.getLogger("kwdiag")
    if any(getattr(h, "_kwdiag", False) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    handler._kwdiag = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(_LEVELS.get(level, level) if isinstance(level, str) else level)
    root.propagate = False


class Recorder:
    """One process's voice: ``event()`` logs a line and records the same fact as JSONL.

    Recording never stops the process. A write that fails (a full disk) loses that event from the file
    (stderr still has it) and is counted; a file deleted under the process (its run directory removed)
    is created again. Either way the next event that can be written is preceded by an ``events-lost``
    event saying what the file is missing, so ``kwdiag explain`` can say so too.
    """

    def __init__(self, logger_name: str, *, source: str, log_dir: str | None, file_stem: str,
                 worker: str | None = None):
        self.logger = logging.getLogger(logger_name)
        self.source = source
        self.worker = worker
        self.path = os.path.join(log_dir, f"{file_stem}.jsonl") if log_dir else None
        self.writer: EventWriter | None = None
        self.lost = 0      # events that could not be written (disk full, directory gone)
        self.written = 0   # events in the current file
        self.gap: dict | None = None  # what the file is missing since the last event it got
        if self.path:
            self.writer = EventWriter(self.path, source=source, worker=worker)

    def event(self, kind: str, message: str, *, level: str = "info", worker: str | None = None,
              exc_info: bool = False, quiet: bool = False, **fields: Any) -> None:
        """Log ``message`` (at DEBUG when ``quiet``) and record the event at ``level``."""
        self.logger.log(logging.DEBUG if quiet else _LEVELS[level], "%s", message, exc_info=exc_info)
        if self.path is None:
            return
        try:
            writer = self._writer()
            if self.gap is not None:
                self._write_gap(writer)
            writer.emit(kind, level=level, message=message, worker=worker, **fields)
            self.written += 1
        except OSError as exc:  # a full disk mid-run: say so loudly on stderr, keep the process alive
            self._lose(kind, exc)

    def _writer(self) -> EventWriter:
        writer = self.writer
        if writer is not None and writer.unlinked():
            # Deleted under us (the run directory removed?): what the file held is gone with it.
            self._note_gap("its file was deleted (the log directory removed?)", self.written)
            self._drop_writer()
            writer = None
        if writer is None:
            writer = self.writer = EventWriter(self.path, source=self.source, worker=self.worker)
            self.written = 0
        return writer

    def _note_gap(self, reason: str, count: int) -> None:
        now = time.time()
        gap = self.gap or {"first": now, "lost": 0, "reasons": []}
        gap["lost"] += count
        gap["last"] = now
        if reason not in gap["reasons"]:
            gap["reasons"].append(reason)
        self.gap = gap

    def _write_gap(self, writer: EventWriter) -> None:
        gap = self.gap
        file = os.path.basename(self.path)
        writer.emit("events-lost", level="error",
                    message=f"{gap['lost']} event(s) of {file} between {when(gap['first'])} and {when(gap['last'])} "
                            f"are missing: {'; '.join(gap['reasons'])}",
                    file=file, lost=gap["lost"], first=round(gap["first"], 6), last=round(gap["last"], 6),
                    reason="; ".join(gap["reasons"]))
        self.written += 1
        self.gap = None

    def _lose(self, kind: str, exc: OSError) -> None:
        self.lost += 1
        self._note_gap(exc.strerror or str(exc), 1)
        self._drop_writer()  # a clean handle next time: a failed write must not linger in a buffer
        _trim_partial_line(self.path)
        if self.lost == 1 or self.lost % 1000 == 0:
            self.logger.error("Could not record event %r in %s: %s (%d event(s) lost so far)", kind, self.path,
                              exc.strerror or exc, self.lost)

    def _drop_writer(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError:
                pass  # its buffer could not be flushed: those lines are counted as lost already
            self.writer = None

    # The two ways a connection can be turned away, recorded alike by every server (scheduler, worker, nanny).
    def refused(self, peer: str, reason: str) -> None:
        """A peer failed authentication (shared secret or TLS): nothing it sent was unpickled."""
        self.event("auth-refused", f"Refused connection from {peer}: {reason}", level="warning", peer=peer,
                   reason=reason)

    def bad_frame(self, stream: Any, reason: str) -> None:
        """An authenticated peer sent a frame that is not a kwdiag frame; that connection was closed."""
        self.event("bad-frame", f"Closing connection from {stream.peer}: {reason}", level="error",
                   peer=stream.peer, reason=reason)

    def close(self) -> None:
        if self.path is not None and self.gap is not None:  # one last try to say what the file is missing
            try:
                self._write_gap(self._writer())
            except OSError:
                pass
        self._drop_writer()
        self.path = None


def _trim_partial_line(path: str) -> None:
    """Cut the part of a line a failed write left at the end of ``path``, so the next line starts clean."""
    try:
        with open(path, "rb+") as f:
            end = f.seek(0, os.SEEK_END)
            start = max(0, end - (1 << 20))
            f.seek(start)
            tail = f.read()
            if tail and not tail.endswith(b"\n"):
                cut = tail.rfind(b"\n")
                f.truncate(start + cut + 1 if cut >= 0 else start)
    except OSError:
        pass  # nothing to trim, or the file is gone: the next event starts a new one


def when(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts % 1 * 1000):03d}"
