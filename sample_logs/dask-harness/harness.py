"""Run a real Dask cluster (scheduler + `dask worker` processes) and make its workers die.

Used by every ``sample_logs/dask-*/make.py``. Each process's stderr goes to a file in the
scenario directory (``scheduler.log``, ``<worker>.log``, ``client.log``): these are the logs
kwdiag explains. Nothing here writes a log line itself; Dask and Python do.

Run a scenario with the Python of a virtual environment that has Dask installed, e.g.::

    python3 -m venv /work/dask-venv && /work/dask-venv/bin/pip install "dask[distributed]==2026.*"
    /work/dask-venv/bin/python sample_logs/dask-sigkill/make.py

The scenario's client code runs in a child process (``make.py --client``) whose stderr is
``client.log``. At the end every worker and the scheduler get SIGTERM together (an orderly
close of the whole cluster), and everything started is waited for.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


class Cluster:
    def __init__(self, outdir: Path, env: dict | None = None, scheduler_env: dict | None = None):
        self.outdir = outdir
        self.env = dict(os.environ, **(env or {}))
        self.env.pop("PYTHONFAULTHANDLER", None)
        self.port = _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.files = []
        for old in outdir.glob("*.log"):
            old.unlink()
        senv = dict(self.env, **(scheduler_env or {}))
        self._start("scheduler", [_bin("dask"), "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                  "--no-dashboard"], senv)
        time.sleep(2.0)

    def _start(self, name, argv, env):
        f = open(self.outdir / f"{name}.log", "wb")
        self.files.append(f)
        self.procs[name] = subprocess.Popen(argv, stdout=f, stderr=f, env=env, stdin=subprocess.DEVNULL)

    def worker(self, name: str, *args: str, env: dict | None = None, python: str | None = None):
        dask = str(Path(python).with_name("dask")) if python else _bin("dask")
        wenv = dict(self.env, **(env or {}))
        self._start(name, [dask, "worker", self.address, "--name", name, "--nthreads", "1",
                           "--host", "127.0.0.1", "--no-dashboard", *args], wenv)

    def wait_workers(self, n: int, timeout: float = 30.0) -> None:
        from distributed import Client

        with Client(self.address, timeout=timeout) as c:
            c.wait_for_workers(n, timeout=timeout)

    def client(self, script: str, *, env: dict | None = None, timeout: float = 120.0) -> int:
        info = {"address": self.address, "pids": {k: p.pid for k, p in self.procs.items()}}
        with open(self.outdir / "client.log", "wb") as f:
            cenv = dict(self.env, **(env or {}))
            p = subprocess.run([sys.executable, script, "--client", json.dumps(info)], stdout=f, stderr=f,
                               env=cenv, timeout=timeout)
        return p.returncode

    def shutdown(self, settle: float = 1.0) -> None:
        time.sleep(settle)
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 20
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in self.files:
            f.close()


def client_info() -> dict:
    return json.loads(sys.argv[sys.argv.index("--client") + 1])


def worker_pids(client) -> dict[str, int]:
    """{worker name: pid of its worker process} (the nanny's child, not the CLI process)."""
    import os as _os

    pids = client.run(_os.getpid)
    names = {a: w["name"] for a, w in client.scheduler_info()["workers"].items()}
    return {names[a]: pid for a, pid in pids.items()}


def is_client() -> bool:
    return "--client" in sys.argv
