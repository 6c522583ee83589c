"""``kwdiag run --dask``: the job runs on a real Dask cluster recorded by the ``kwdiag.dask`` plugins.

Covers: starting a Dask LocalCluster in a process of its own (``python -P -m kwdiag.dask.cluster``
through kwdiag's spawn helper, with the job's folder on its path, its stderr — every Dask process's
log lines — kept as ``dask-cluster.log`` in the run directory) and mapping ``--workers``, ``--threads``,
``--memory-limit``, ``--no-nanny``, ``--allowed-failures`` and ``--worker-ttl`` to it; or, with
``--scheduler``/``--scheduler-file``, registering the plugins on an existing Dask cluster (and
removing them at the end); pointing the job's ``dask.distributed.Client()`` at the cluster through
``DASK_SCHEDULER_ADDRESS``; the live view's snapshot (``kwdiag.dask.cluster_info`` on the scheduler).

Does not cover: the plugins (``kwdiag.dask``) or the job and the diagnosis (``runner``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import warnings
from typing import Any

from kwdiag.errors import RUNTIME, USAGE, KwdiagError
from kwdiag.run.options import RunOptions
from kwdiag.runtime.spawn import child_env, module_command

START_TIMEOUT = 120.0   # a loaded 2-core machine can take a while to import Dask in every process
CLOSE_TIMEOUT = 60.0
CLUSTER_LOG = "dask-cluster.log"
ADDRESS_FILE = ".dask-scheduler.json"


def _require_dask() -> None:
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise KwdiagError("--dask needs Dask: pip install 'kwdiag[dask]'", USAGE) from None


def _log_tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return " | ".join(line.strip() for line in f.read().splitlines()[-lines:])
    except OSError:
        return ""


class DaskBackend:
    runtime = "dask"

    def __init__(self, options: RunOptions, run_dir: str, job_dir: str):
        self.options = options
        self.run_dir = run_dir
        self.job_dir = job_dir
        self.host: subprocess.Popen | None = None
        self.client: Any = None
        self.registered = False
        self.scheduler_address = ""
        self.job_env = child_env(options.env)
        for name in ("KWDIAG_SCHEDULER_FILE", "KWDIAG_SCHEDULER_ADDRESS"):
            self.job_env.pop(name, None)

    def start(self) -> None:
        _require_dask()
        existing = self.options.scheduler or self._address_from_file()
        try:
            address = existing or self._start_host()
            self._connect(address)
            if existing:
                import kwdiag.dask

                kwdiag.dask.register(self.client, self.run_dir)
                self.registered = True
        except BaseException:
            self.close()
            raise
        self.scheduler_address = address
        self.job_env["DASK_SCHEDULER_ADDRESS"] = address

    def _address_from_file(self) -> str | None:
        path = self.options.scheduler_file
        if not path:
            return None
        try:
            with open(path, encoding="utf-8") as f:
                return str(json.load(f)["address"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KwdiagError(f"cannot read the Dask scheduler file {path}: {exc}", USAGE) from None

    def _host_command(self) -> list[str]:
        o = self.options
        cmd = module_command("kwdiag.dask.cluster", "--run-dir", self.run_dir, "--address-file",
                             os.path.join(self.run_dir, ADDRESS_FILE), "--workers", str(o.workers),
                             "--threads", str(o.threads), "--memory-limit", str(o.memory_limit or "auto"))
        if not o.nanny:
            cmd.append("--no-nanny")
        if o.allowed_failures is not None:
            cmd += ["--allowed-failures", str(o.allowed_failures)]
        if o.worker_ttl:
            cmd += ["--worker-ttl", str(o.worker_ttl)]
        return cmd

    def _start_host(self) -> str:
        env = child_env({**self.options.env, "KWDIAG_RUN_DIR": self.run_dir}, append_path=[self.job_dir])
        log_path = os.path.join(self.run_dir, CLUSTER_LOG)
        with open(log_path, "ab") as log:
            # Its own session: Ctrl-C at the terminal reaches the runner, which closes the cluster in order.
            self.host = subprocess.Popen(self._host_command(), env=env, stdin=subprocess.PIPE, stdout=log,
                                         stderr=log, start_new_session=True)
        address_file = os.path.join(self.run_dir, ADDRESS_FILE)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if os.path.exists(address_file):
                with open(address_file, encoding="utf-8") as f:
                    return str(json.load(f)["address"])
            if self.host.poll() is not None:
                raise KwdiagError(f"the Dask cluster could not start (exit code {self.host.returncode}): "
                                  f"{_log_tail(log_path)}", RUNTIME)
            time.sleep(0.1)
        raise KwdiagError(f"the Dask cluster did not start within {START_TIMEOUT:.0f}s (see {log_path})", RUNTIME)

    def _connect(self, address: str) -> None:
        import dask.config
        from distributed import Client

        try:
            with warnings.catch_warnings():  # the observer's environment is not the job's: no version warning
                warnings.simplefilter("ignore")
                self.client = Client(address, name="kwdiag-run",
                                     timeout=dask.config.get("distributed.comm.timeouts.connect", "30s"))
        except Exception as exc:
            raise KwdiagError(f"cannot reach the Dask scheduler at {address}: {exc}", RUNTIME) from None

    def info(self) -> dict[str, Any]:
        from kwdiag.dask import cluster_info

        return self.client.run_on_scheduler(cluster_info)

    def close(self) -> None:
        if self.client is not None:
            if self.registered:
                import kwdiag.dask

                kwdiag.dask.unregister(self.client)
            self.client.close()
            self.client = None
        if self.host is not None:
            self._stop_host()
        try:
            os.unlink(os.path.join(self.run_dir, ADDRESS_FILE))
        except FileNotFoundError:
            pass

    def _stop_host(self) -> None:
        """Closing its stdin asks the host to close the cluster in order; a signal, then SIGKILL, if it hangs."""
        try:
            self.host.stdin.close()
        except OSError:
            pass
        for stop in (None, self.host.terminate, self.host.kill):
            if stop is not None:
                stop()
            try:
                self.host.wait(CLOSE_TIMEOUT if stop is None else 10)
                return
            except subprocess.TimeoutExpired:
                continue
