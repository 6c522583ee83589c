"""Input and output handling shared by the analysis commands (``explain``, ``check``).

Covers: opening an ``--output`` file (an unwritable path is a usage error, one line) and printing
a report's input problems to stderr in the one format the docs promise
(``kwdiag: error: PATH: message`` / ``kwdiag: warning: ...``). Reading logs is
``kwdiag.pipeline.analyze``; exit codes are ``kwdiag.errors``.
"""

from __future__ import annotations

import sys
from typing import TextIO


def open_output(path: str | None, option: str = "--output") -> TextIO:
    """``path`` opened for writing (UTF-8), or stdout when None; ``KwdiagError`` (usage) if it cannot be."""
    if not path:
        return sys.stdout
    from kwdiag.errors import USAGE, KwdiagError

    try:
        return open(path, "w", encoding="utf-8")
    except OSError as exc:
        raise KwdiagError(f"cannot write {path}: {exc.strerror or exc}", USAGE) from None


def print_problems(report, warnings: bool = True) -> bool:
    """Each input problem of ``report`` as one line on stderr (``warnings``: the warnings too); True if any is an
    error."""
    for p in report.problems:
        if p.level == "error" or warnings:
            print(f"kwdiag: {'error' if p.level == 'error' else 'warning'}: {p.path}: {p.message}", file=sys.stderr)
    return bool(report.input_errors)


class ReadingProgress:
    """A progress display on stderr while logs are read and explained, shown only on a terminal, and only once the
    work has taken ``after`` seconds: a quick explain prints nothing extra.

    While reading: a bar (bytes, MB/s, time left, workers some end line was read about). Once the reading is over,
    a spinner while the lines read are explained: with many deaths that takes as long as the reading again, and a
    bar left at 100 % would look hung."""

    def __init__(self, enabled: bool = True, after: float = 2.0):
        import threading
        import time

        self.enabled = enabled and sys.stderr.isatty()
        self.after = after
        self.started = time.monotonic()
        self._bar = None
        self._task = None
        self._spinner = None
        self._timer = None
        self._lock = threading.Lock()   # the spinner may be started from a timer's thread
        self._closed = False

    def update(self, progress) -> None:
        if not self.enabled:
            return
        if getattr(progress, "finished", False):
            self._explaining(progress)
            return
        import time

        if self._bar is None:
            if time.monotonic() - self.started < self.after:
                return
            from rich.console import Console
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                       TransferSpeedColumn)

            self._bar = Progress(TextColumn("reading logs"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                 TimeRemainingColumn(), TextColumn("{task.fields[ended]} worker(s) ended so far"),
                                 console=Console(stderr=True), transient=True)
            self._bar.start()
            self._task = self._bar.add_task("read", total=progress.total, ended=0)
        self._bar.update(self._task, completed=progress.done, ended=progress.workers_ended)

    def _explaining(self, progress) -> None:
        """The reading is over: the bar goes, and a spinner says what is being explained, at once if the bar was
        shown, else when ``after`` seconds have passed since the start (unless the report is out by then)."""
        import threading
        import time

        text = f"explaining {progress.events:,} lifecycle lines ({progress.workers_ended:,} worker(s) ended)"
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            self._show_spinner(text)
            return
        self._timer = threading.Timer(max(0.0, self.after - (time.monotonic() - self.started)),
                                      self._show_spinner, (text,))
        self._timer.daemon = True
        self._timer.start()

    def _show_spinner(self, text: str) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with self._lock:
            if self._closed:
                return
            self._spinner = Progress(SpinnerColumn(), TextColumn(text, markup=False), TimeElapsedColumn(),
                                     console=Console(stderr=True), transient=True)
            self._spinner.start()
            self._spinner.add_task("explain", total=None)
            self._spinner.refresh()

    def __enter__(self) -> "ReadingProgress":
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            for shown in (self._bar, self._spinner):
                if shown is not None:
                    shown.stop()
