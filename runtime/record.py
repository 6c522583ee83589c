"""How runtime processes say what happened: human text on stderr and JSONL events, together.

Covers: the stderr logging format (Dask's layout, so people and kwdiag's readers see one
shape), and ``Recorder``, whose ``event()`` writes one fact both as a text line and as a
``kwdiag.events`` JSONL line (flushed at once) in the process's log directory.
Does not cover: what the events mean, or where the log directory is chosen.
"""

from __future__ import annotations

import logging
import os
import sys
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
    """One process's voice: ``event()`` logs a line and records the same fact as JSONL."""

    def __init__(self, logger_name: str, *, source: str, log_dir: str | None, file_stem: str,
                 worker: str | None = None):
        self.logger = logging.getLogger(logger_name)
        self.source = source
        self.worker = worker
        self.writer: EventWriter | None = None
        self.lost = 0  # events that could not be written (disk full)
        if log_dir:
            self.writer = EventWriter(os.path.join(log_dir, f"{file_stem}.jsonl"), source=source, worker=worker)

    def event(self, kind: str, message: str, *, level: str = "info", worker: str | None = None,
              exc_info: bool = False, quiet: bool = False, **fields: Any) -> None:
        """Log ``message`` (at DEBUG when ``quiet``) and record the event at ``level``."""
        self.logger.log(logging.DEBUG if quiet else _LEVELS[level], "%s", message, exc_info=exc_info)
        if self.writer is not None:
            try:
                self.writer.emit(kind, level=level, message=message, worker=worker, **fields)
            except OSError as exc:  # a full disk mid-run: say so loudly on stderr, keep the process alive
                self.lost += 1
                if self.lost == 1 or self.lost % 1000 == 0:
                    self.logger.error("Could not record event %r in %s: %s (%d event(s) lost so far)", kind,
                                      self.writer.path, exc.strerror or exc, self.lost)

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
        if self.writer is not None:
            self.writer.close()
