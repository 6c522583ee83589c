"""The run directory: where a run keeps everything, and the manifest that sums it up.

Covers: naming and creating ``<runs_dir>/<timestamp>-<job>/`` (refusing, with one clear error, a
folder that cannot be written), writing ``manifest.json`` atomically (command, options, versions,
then the outcome), and listing past runs for ``kwdiag runs``. Does not cover: what the cluster or
the job write into it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

from kwdiag.errors import USAGE, KwdiagError

MANIFEST = "manifest.json"
SCHEMA = "kwdiag.run/1"


def create(runs_dir: str, job_name: str, explicit: str | None = None) -> str:
    if explicit:
        path = os.path.abspath(explicit)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", job_name).strip("-.") or "job"
        path = os.path.abspath(os.path.join(runs_dir, f"{stamp}-{slug}"))
        n = 1
        while os.path.exists(path):
            n += 1
            path = os.path.abspath(os.path.join(runs_dir, f"{stamp}-{slug}-{n}"))
    from kwdiag.runtime.cluster import check_log_dir

    try:
        check_log_dir(path)
    except OSError as exc:
        raise KwdiagError(f"cannot use the run directory: {exc}", USAGE) from None
    return path


def write_manifest(run_dir: str, manifest: dict[str, Any]) -> None:
    tmp = os.path.join(run_dir, f".{MANIFEST}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"schema": SCHEMA, **manifest}, f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, os.path.join(run_dir, MANIFEST))


def read_manifest(run_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(run_dir, MANIFEST), encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def versions(dask: bool = False) -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    names = ["kwdiag", "tornado", "msgpack", "cloudpickle", "psutil", "rich", "typer", "regex"]
    for name in names + (["dask", "distributed"] if dask else []):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def list_runs(runs_dir: str) -> list[tuple[str, dict[str, Any]]]:
    """``(path, manifest)`` of each run under ``runs_dir``, oldest first."""
    if not os.path.isdir(runs_dir):
        return []
    runs = []
    for name in sorted(os.listdir(runs_dir)):
        path = os.path.join(runs_dir, name)
        manifest = read_manifest(path) if os.path.isdir(path) else None
        if manifest is not None:
            runs.append((path, manifest))
    return runs
