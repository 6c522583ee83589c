"""Runtime configuration: defaults, a ``kwdiag.toml`` / ``[tool.kwdiag]`` file, ``KWDIAG_*`` env vars.

Covers: the defaults every runtime process uses, parsing human sizes (``"2GiB"``) and
durations (``"5s"``, ``"300ms"``), and layering: explicit arguments > ``KWDIAG_<KEY>``
environment variables > the nearest ``kwdiag.toml`` or ``pyproject.toml [tool.kwdiag]``
(searched upward from the working directory) > defaults.

Does not cover: ``kwdiag run``'s own options, which live in its command and reuse ``load``.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

DEFAULTS: dict[str, Any] = {
    "allowed_failures": 3,          # deaths a task may cause before it is blamed (KilledWorker)
    "worker_ttl": 5.0,              # seconds without a heartbeat before a worker is removed
    "heartbeat_interval": 0.5,      # seconds between worker heartbeats
    "memory_terminate_fraction": 0.95,  # of the memory limit: the nanny terminates the worker past it
    "memory_monitor_interval": 0.1,  # seconds between the nanny's memory samples
    "memory_kill_grace": 1.0,       # seconds after SIGTERM before the nanny sends SIGKILL
    "close_timeout": 5.0,           # seconds a worker gets to close gracefully before it is killed
    "restart_backoff_window": 30.0,  # deaths within this many seconds count towards a restart loop
    "restart_backoff_after": 3,     # deaths in the window before the nanny starts to back off
    "restart_backoff_max": 30.0,    # the longest wait between restarts
    "versions_packages": [],        # extra packages whose versions must match across processes
    "versions_required": [],        # packages whose mismatch refuses the peer instead of warning
    "connect_timeout": 10.0,
    "reconnect_timeout": 60.0,      # how long workers and clients keep trying to reach a lost scheduler
    "worker_window": 4,             # tasks sent to a worker beyond its thread count (prefetch)
    "worker_window_seconds": 0.01,  # short tasks: widen the window to hold about this much estimated work
    "worker_window_max": 64,        # ... but never more tasks than this beyond the threads
    "journal": True,                # the scheduler journals its work in its log directory, to survive a restart
    "recovery_wait": 5.0,           # how long a recovering scheduler waits for the old workers before placing work
    "client_grace": 60.0,           # how long a disconnected client's tasks are kept for it to come back
}

_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_bytes(value: str | int | float | None) -> int | None:
    """``"2GiB"`` -> 2147483648; ``None``/``0``/``"none"`` -> None (no limit)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return int(value) or None
    text = str(value).strip().lower().replace(" ", "")
    if text in ("", "none", "0", "auto"):
        if text == "auto":
            import psutil
            return psutil.virtual_memory().total
        return None
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)([a-z]*)", text)
    if not match or match.group(2) not in _SIZE_UNITS:
        raise ValueError(f"not a size: {value!r} (try 2GiB, 500MB, 1e9)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def parse_timedelta(value: str | int | float | None) -> float | None:
    """``"5s"`` -> 5.0, ``"300ms"`` -> 0.3, a number -> seconds."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip().lower().replace(" ", "")
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)([a-z]*)", text)
    if not match or match.group(2) not in _TIME_UNITS:
        raise ValueError(f"not a duration: {value!r} (try 5s, 300ms, 2m)")
    return float(match.group(1)) * _TIME_UNITS[match.group(2)]


def format_bytes(n: int | float | None) -> str:
    if n is None:
        return "none"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def find_config_file(start: str | os.PathLike | None = None) -> tuple[Path, dict] | None:
    """The nearest ``kwdiag.toml`` or ``pyproject.toml`` with ``[tool.kwdiag]``, and its table; ``ValueError``
    naming the file when one on the way does not parse."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        own = folder / "kwdiag.toml"
        if own.is_file():
            data = _read_toml(own)
            return own, data.get("tool", {}).get("kwdiag", data)
        project = folder / "pyproject.toml"
        if project.is_file():
            table = _read_toml(project).get("tool", {}).get("kwdiag")
            if table is not None:
                return project, table
    return None


def _read_toml(path: Path) -> dict:
    """A configuration file that does not parse is an error naming it (as `kwdiag check` says too), never a
    silent default: settings the user wrote would be ignored without a word."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"cannot read config {path}: {exc}") from None
    except OSError as exc:
        raise ValueError(f"cannot read config {path}: {exc.strerror or exc}") from None


def _coerce(key: str, raw: Any) -> Any:
    default = DEFAULTS[key]
    if isinstance(default, bool):
        if isinstance(raw, str):
            if raw.strip().lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(f"{key} must be true or false, not {raw!r}")
            return raw.strip().lower() in ("1", "true", "yes", "on")
        return bool(raw)
    if isinstance(default, list):
        return [p.strip() for p in raw.split(",") if p.strip()] if isinstance(raw, str) else list(raw)
    if key in ("worker_ttl", "heartbeat_interval", "memory_monitor_interval", "memory_kill_grace", "close_timeout",
               "restart_backoff_window", "restart_backoff_max", "connect_timeout", "reconnect_timeout",
               "worker_window_seconds", "recovery_wait", "client_grace"):
        return parse_timedelta(raw)
    if isinstance(default, int) and not isinstance(default, bool):
        return int(raw)
    if isinstance(default, float):
        return float(raw)
    return raw


def load(overrides: dict[str, Any] | None = None, *, environ: dict[str, str] | None = None,
         use_file: bool = True) -> dict[str, Any]:
    """The effective runtime configuration."""
    config = dict(DEFAULTS)
    if use_file:
        found = find_config_file()
        if found:
            table = found[1]
            for key, value in table.items():
                key = key.replace("-", "_")
                if key in DEFAULTS:
                    config[key] = _coerce(key, value)
    env = os.environ if environ is None else environ
    for key in DEFAULTS:
        raw = env.get("KWDIAG_" + key.upper())
        if raw not in (None, ""):
            config[key] = _coerce(key, raw)
    for key, value in (overrides or {}).items():
        key = key.replace("-", "_")
        if key not in DEFAULTS:
            raise ValueError(f"unknown runtime setting {key!r}")
        if value is not None:
            config[key] = _coerce(key, value)
    return config
