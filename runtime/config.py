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
from pathlib import Path
from typing import Any

import kwdiag.settings as settings
import kwdiag.units as units

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

_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_bytes(value: str | int | float | None) -> int | None:
    """``"2GiB"`` -> 2147483648 (``kwdiag.units``, the one size parser); ``"auto"`` -> this machine's memory;
    ``None``/``0``/``"none"`` -> None (no limit)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        import psutil

        return psutil.virtual_memory().total
    return units.parse_bytes(value)


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


format_bytes = units.format_bytes   # the one size dialect (``412 MiB``), in log lines and reports alike


def find_config_file(start: str | os.PathLike | None = None) -> tuple[Path, dict] | None:
    """The nearest settings file (``kwdiag.settings``' search rule) and its runtime keys; ``ValueError`` (a
    ``SettingsError``) naming the file when it does not parse."""
    found = settings.find(start)
    return (found.path, found.runtime()) if found is not None else None


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
            path, table = found
            settings.unknown(table, set(DEFAULTS) | settings.RUN_KEYS, f"[tool.kwdiag] of {path}")
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
