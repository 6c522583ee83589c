"""What ``kwdiag run`` shows while the job runs: a live view on a terminal, plain lines otherwise.

Covers: ``LiveView`` (rich: task progress, a worker table with memory against its limit, tasks and
restarts, and a line printed above it the moment a worker dies) and ``PlainView`` (timestamped
lines, no control codes — for CI logs and pipes), both on stderr so the job's stdout stays its own;
passing the job's output through; ``NO_COLOR``. Does not cover: where the state comes from
(``runner``) or the final report (``kwdiag.report``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kwdiag.units import format_bytes
from kwdiag.escape import safe

PLAIN_PROGRESS_EVERY = 5.0  # seconds between progress lines when nothing else happens


@dataclass
class ClusterState:
    """A snapshot of the cluster for display."""

    elapsed: float = 0.0
    submitted: int = 0
    finished: int = 0
    erred: int = 0
    running: int = 0
    waiting: int = 0
    workers: list[dict[str, Any]] = field(default_factory=list)  # name, memory, memory_limit, executing, restarts
    deaths: int = 0

    @classmethod
    def from_info(cls, info: dict, elapsed: float, deaths: int, restarts: dict[str, int]) -> "ClusterState":
        counters = info.get("counters") or {}
        tasks = info.get("tasks") or {}
        workers = []
        running = 0
        for address, w in sorted(info.get("workers", {}).items(), key=lambda kv: str(kv[1].get("name"))):
            executing = len(w.get("executing") or [])
            running += executing
            workers.append({"name": str(w.get("name")), "memory": w.get("memory"), "memory_limit": w.get("memory_limit"),
                            "executing": executing, "processing": w.get("processing", 0),
                            "restarts": restarts.get(str(w.get("name")), 0)})
        waiting = tasks.get("waiting", 0) + tasks.get("ready", 0) + max(0, tasks.get("processing", 0) - running)
        return cls(elapsed=elapsed, submitted=counters.get("submitted", 0), finished=counters.get("finished", 0),
                   erred=counters.get("erred", 0), running=running, waiting=waiting, workers=workers, deaths=deaths)

    def progress_line(self) -> str:
        return (f"tasks done {self.finished}, erred {self.erred}, running {self.running}, waiting {self.waiting}; "
                f"workers {len(self.workers)}, deaths {self.deaths}")


def _stamp() -> str:
    return time.strftime("%H:%M:%S")


class PlainView:
    """Timestamped lines on stderr; job output passed through byte for byte."""

    def __init__(self, job: str, run_dir: str, err=None):
        self.err = err or sys.stderr
        self.job = job
        self.run_dir = run_dir
        self._last_line = ""
        self._last_at = 0.0
        self._lock = threading.Lock()

    def start(self) -> None:
        self.say(f"running {self.job}; run directory {self.run_dir}")

    def say(self, text: str) -> None:
        with self._lock:
            self.err.write(f"{_stamp()} kwdiag: {safe(text, 2000)}\n")
            self.err.flush()

    def update(self, state: ClusterState) -> None:
        line = state.progress_line()
        now = time.monotonic()
        if line != self._last_line and now - self._last_at >= PLAIN_PROGRESS_EVERY:
            self._last_line, self._last_at = line, now
            self.say(line)

    def death(self, text: str) -> None:
        self.say(text)

    def job_output(self, data: bytes, stream: str) -> None:
        out = sys.stdout if stream == "stdout" else sys.stderr
        with self._lock:
            out.buffer.write(data)
            out.flush()

    def stop(self, state: ClusterState | None) -> None:
        if state is not None:
            self.say(state.progress_line())


class LiveView:
    """A rich live display on stderr (a terminal)."""

    def __init__(self, job: str, run_dir: str, console=None):
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console(stderr=True, no_color=bool(os.environ.get("NO_COLOR")),
                                          highlight=False, markup=False, emoji=False)
        self.job = job
        self.run_dir = run_dir
        self.state = ClusterState()
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True,
                         redirect_stdout=False, redirect_stderr=False)
        self._partial = {"stdout": "", "stderr": ""}
        self._lock = threading.Lock()

    def start(self) -> None:
        from rich.text import Text

        self.console.print(Text(f"kwdiag run {self.job} — run directory {self.run_dir}", style="bold"))
        self.live.start()

    def _render(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        s = self.state
        done = s.finished + s.erred
        total = max(s.submitted, done + s.running + s.waiting, 1)
        width = 30
        filled = int(width * done / total)
        bar = Text("█" * filled + "░" * (width - filled), style="green")
        head = Text.assemble((f"{s.elapsed:6.1f}s  ", "dim"), bar,
                             f"  done {s.finished}  erred {s.erred}  running {s.running}  waiting {s.waiting}  "
                             f"deaths {s.deaths}")
        table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
        for column in ("worker", "memory", "", "tasks", "restarts"):
            table.add_column(column)
        shown, hidden = _rows_that_fit(s.workers, self.console.size.height)
        for w in shown:
            limit, memory = w.get("memory_limit"), w.get("memory")
            gauge = ""
            style = "green"
            if limit and memory:
                frac = min(1.0, memory / limit)
                gauge = "▮" * int(10 * frac) + "▯" * (10 - int(10 * frac))
                style = "red" if frac > 0.8 else "yellow" if frac > 0.6 else "green"
            used = f"{format_bytes(memory)} / {format_bytes(limit)}" if limit else format_bytes(memory)
            table.add_row(Text(safe(w["name"], 40)), Text(used), Text(gauge, style=style),
                          str(w.get("executing", 0)), str(w.get("restarts", 0)))
        if hidden:
            table.add_row(Text(f"+{len(hidden)} more", style="dim"), Text(_memory_range(hidden), style="dim"), "",
                          str(sum(w.get("executing", 0) for w in hidden)), str(sum(w.get("restarts", 0) for w in hidden)))
        return Group(head, table)

    def update(self, state: ClusterState) -> None:
        self.state = state
        self.live.update(self._render())

    def death(self, text: str) -> None:
        from rich.text import Text

        style = "bold red" if " died" in text else "yellow"
        self.live.console.print(Text(f"{_stamp()} {safe(text, 2000)}", style=style))

    def say(self, text: str) -> None:
        from rich.text import Text

        self.live.console.print(Text(f"{_stamp()} kwdiag: {safe(text, 2000)}", style="dim"))

    def job_output(self, data: bytes, stream: str) -> None:
        out = sys.stdout if stream == "stdout" else sys.stderr
        if not out.isatty():  # redirected to a file or a pipe: byte for byte
            out.buffer.write(data)
            out.flush()
            return
        # On the terminal the live display owns the screen: whole lines go above it, never re-wrapped.
        with self._lock:
            text = self._partial[stream] + data.decode("utf-8", "replace")
            *lines, self._partial[stream] = text.split("\n")
        for line in lines:
            self._print_job_line(line)

    def _print_job_line(self, line: str) -> None:
        from rich.text import Text

        self.live.console.print(Text.from_ansi(line), soft_wrap=True)

    def stop(self, state: ClusterState | None) -> None:
        if state is not None:
            self.state = state
        for stream in ("stdout", "stderr"):
            if self._partial[stream]:
                self._print_job_line(self._partial[stream])
                self._partial[stream] = ""
        self.live.stop()
        self.console.print(self._render())


# Lines the live view keeps for itself besides the worker rows: the progress line, the table's header, the
# "+N more" row, and room for the lines printed above it (deaths, job output) not to scroll it away.
VIEW_MARGIN = 6


def _memory_fraction(w: dict[str, Any]) -> float:
    limit, memory = w.get("memory_limit"), w.get("memory")
    return memory / limit if limit and memory else -1.0


def _rows_that_fit(workers: list[dict[str, Any]], height: int) -> tuple[list, list]:
    """The workers to show one per row (the view stays one screen high): all when they fit, else those
    nearest their memory limit first (they are the ones about to die), the rest summed up in one row."""
    room = max(3, height - VIEW_MARGIN)
    if len(workers) <= room:
        return workers, []
    ranked = sorted(workers, key=lambda w: (-_memory_fraction(w), -w.get("restarts", 0), w["name"]))
    shown = {id(w) for w in ranked[: room - 1]}
    return [w for w in workers if id(w) in shown], [w for w in workers if id(w) not in shown]


def _memory_range(workers: list[dict[str, Any]]) -> str:
    values = [w["memory"] for w in workers if w.get("memory")]
    if not values:
        return ""
    low, high = min(values), max(values)
    return format_bytes(low) if low == high else f"{format_bytes(low)} – {format_bytes(high)}"


def make_view(job: str, run_dir: str):
    """A live view when stderr is a terminal (and TERM is not dumb), plain lines otherwise."""
    if sys.stderr.isatty() and os.environ.get("TERM") != "dumb":
        return LiveView(job, run_dir)
    return PlainView(job, run_dir)
