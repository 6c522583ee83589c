"""Fetch what a live Dask cluster remembers of its workers' lives into a folder that ``kwdiag explain`` reads.

Covers: the scheduler's in-memory log (``Client.get_scheduler_logs``), every worker's and every nanny's
(``get_worker_logs``; nannies that share a process — a LocalCluster's — share one log, kept once), Dask's
events of every topic (``get_events``, kept as ``dask-events.json``, for the record), and, where the kwdiag
plugins run, the events they recorded (kept in memory by each process: ``kwdiag.dask._common.KEPT``), which
name the exit code or signal, the executing task and the memory samples of each death. Workers that already
died are covered by what their nannies and the scheduler kept. A ``collected.json`` says what was fetched and
what could not be.

Does not cover: explaining (``kwdiag.pipeline``), or logs Dask did not keep (its in-memory logs hold the last
``distributed.admin.log-length`` lines of each process, at the level its loggers let through).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from kwdiag.dask._common import recorded_lines, stem

LOG_LINES = 100_000   # asked for; Dask keeps at most distributed.admin.log-length (10,000 by default)


def _lines(entries: Any) -> list[str]:
    """Dask's (level, formatted line) pairs, newest first, as lines oldest first."""
    out = []
    for entry in reversed(list(entries or ())):
        text = entry[1] if isinstance(entry, (list, tuple)) and len(entry) == 2 else str(entry)
        out.append(str(text).rstrip("\n"))
    return out


def _write(folder: str, name: str, lines: list[str]) -> str:
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    return name


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_json_safe(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (set, frozenset)) else items
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def collect(client: Any, folder: str) -> dict:
    """Write the cluster's logs, events and kwdiag records into ``folder``; returns the ``collected.json``
    summary (files written, sources that could not be read and why)."""
    os.makedirs(folder, exist_ok=True)
    files: list[str] = []
    problems: dict[str, str] = {}

    def attempt(what: str, call: Any) -> Any:
        try:
            return call()
        except Exception as exc:   # a source the cluster cannot give: say so, keep the rest
            problems[what] = f"{type(exc).__name__}: {exc}"
            return None

    # Servers that share a process (a LocalCluster's scheduler and nannies) each hold that process's whole log:
    # every line is kept once, in the first file that has it, so the process is told once, in one file.
    seen: set[str] = set()

    def keep(name: str, entries: Any) -> None:
        fresh = [line for line in _lines(entries) if line not in seen]
        seen.update(fresh)
        if fresh:
            files.append(_write(folder, name, fresh))
    scheduler = attempt("scheduler log", lambda: client.get_scheduler_logs(n=LOG_LINES))
    if scheduler:
        keep("scheduler.log", scheduler)
    for nanny, label in ((True, "nanny"), (False, "worker")):
        logs = attempt(f"{label} logs", lambda nanny=nanny: client.get_worker_logs(n=LOG_LINES, nanny=nanny)) or {}
        for address, entries in sorted(logs.items()):
            if not isinstance(entries, (list, tuple)):   # a worker that could not answer
                problems[f"{label} log of {address}"] = str(entries)[:200]
                continue
            keep(f"{label}-{stem(address)}.log", entries)
    events = attempt("events", client.get_events) or {}
    if events:   # kept for the record (a .json file: explain does not read it as a log)
        with open(os.path.join(folder, "dask-events.json"), "w", encoding="utf-8") as f:
            json.dump({str(topic): [[ts, _json_safe(msg)] for ts, msg in items] for topic, items in events.items()},
                      f, indent=0, sort_keys=True)
        files.append("dask-events.json")
    files += _kwdiag_records(client, folder, attempt)
    summary = {"collected_at": round(time.time(), 3), "scheduler": getattr(client, "scheduler", None) and
               str(client.scheduler.address), "files": sorted(files), "problems": problems,
               "kwdiag_plugins": any(f.endswith(".jsonl") for f in files), "dask": _dask_version()}
    with open(os.path.join(folder, "collected.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    return summary


def _kwdiag_records(client: Any, folder: str, attempt: Any) -> list[str]:
    """The kwdiag plugins' records, from the scheduler, the nannies and the workers (where kwdiag runs)."""
    found: dict[str, list[str]] = {}
    replies = [attempt("kwdiag records (scheduler)", lambda: {"scheduler": client.run_on_scheduler(recorded_lines)}),
               attempt("kwdiag records (nannies)", lambda: client.run(recorded_lines, nanny=True, on_error="ignore")),
               attempt("kwdiag records (workers)", lambda: client.run(recorded_lines, on_error="ignore"))]
    for reply in replies:
        for per_process in (reply or {}).values():
            if not isinstance(per_process, dict):
                continue
            for name, lines in per_process.items():
                if len(lines) > len(found.get(name, ())):   # one process's file, told by each of its servers
                    found[name] = lines
    return [_write(folder, name, lines) for name, lines in sorted(found.items()) if name.endswith(".jsonl")]


def _dask_version() -> str | None:
    try:
        import distributed

        return distributed.__version__
    except ImportError:
        return None
