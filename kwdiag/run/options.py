"""``kwdiag run`` settings: flags > ``KWDIAG_*`` environment > ``[tool.kwdiag]`` (pyproject.toml / kwdiag.toml) > defaults.

Covers: the ``RunOptions`` type and resolving it from those layers, with one clear error for a bad
value. Does not cover: runtime-only settings (``kwdiag.runtime.config`` reads those from the same
places and passes them to every cluster process).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

from kwdiag.errors import USAGE, KwdiagError
import kwdiag.settings as settings

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass
class RunOptions:
    workers: int = 2
    threads: int = 1
    memory_limit: str | int | None = "auto"
    nanny: bool = True
    allowed_failures: int | None = None
    worker_ttl: str | None = None
    log_dir: str | None = None          # the run directory itself; default <runs_dir>/<timestamp>-<job>
    runs_dir: str = "kwdiag-runs"
    timeout: float | None = None        # seconds the job may run
    fail_on: list[str] = field(default_factory=list)
    scheduler_file: str | None = None   # run on an existing cluster instead of starting one
    scheduler: str | None = None
    dask: bool = False                  # run on a real Dask cluster (kwdiag[dask]) instead of kwdiag's runtime
    config: dict = field(default_factory=dict)  # extra runtime settings for the cluster
    env: dict = field(default_factory=dict)     # extra environment for the cluster's processes and the job


def _coerce(name: str, value: Any, where: str) -> Any:
    try:
        if name in ("workers", "threads", "allowed_failures"):
            number = int(value)
            if number < (0 if name == "allowed_failures" else 1):
                raise ValueError
            return number
        if name in ("nanny", "dask"):
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
            raise ValueError
        if name == "timeout":
            from kwdiag.runtime.config import parse_timedelta

            return parse_timedelta(value)
        if name == "memory_limit":
            from kwdiag.runtime.config import parse_bytes

            return value if value in ("auto", None) else parse_bytes(value)
        if name == "fail_on":
            return [p.strip() for p in value.split(",") if p.strip()] if isinstance(value, str) else list(value)
        return value
    except (TypeError, ValueError):
        raise KwdiagError(f"bad value for {name.replace('_', '-')} in {where}: {value!r}", USAGE) from None


_FILE_KEYS = set(settings.RUN_KEYS)


def resolve(flags: dict[str, Any], environ: dict[str, str] | None = None) -> RunOptions:
    """Layer the sources; ``flags`` holds only options given on the command line (None = not given)."""
    options = RunOptions()
    env = os.environ if environ is None else environ
    try:
        found = settings.find()
    except settings.SettingsError as exc:  # a kwdiag.toml or pyproject.toml on the way that does not parse
        raise KwdiagError(str(exc), USAGE) from None
    if found:
        path, table = found.path, found.runtime()
        for key, value in table.items():
            name = key.replace("-", "_")
            if name in _FILE_KEYS:
                setattr(options, name, _coerce(name, value, str(path)))
    for name in _FILE_KEYS - {"log_dir"}:  # KWDIAG_LOG_DIR belongs to the runtime (where a client records)
        raw = env.get("KWDIAG_" + name.upper())
        if raw not in (None, ""):
            setattr(options, name, _coerce(name, raw, f"KWDIAG_{name.upper()}"))
    known = {f.name for f in fields(RunOptions)}
    for name, value in flags.items():
        if name not in known:
            raise KwdiagError(f"unknown run option {name}", USAGE)
        if value is not None and value != []:
            setattr(options, name, _coerce(name, value, "the command line"))
    if options.scheduler_file and options.scheduler:
        raise KwdiagError("give --scheduler-file or --scheduler, not both", USAGE)
    return options
