"""The cluster a ``kwdiag run`` job runs on: kwdiag's embedded runtime (here) or Dask (``dask_backend``).

Covers: what the runner needs of a cluster, whichever runtime it is — ``start()`` it (or connect to an
existing one) with every process recording into the run directory, the environment that points the
job's ``Client()`` at it, ``info()`` (a scheduler_info-shaped snapshot for the live view), and
``close()`` (stopping only what it started). ``make_backend`` picks one from the options.

Does not cover: running or watching the job, or the diagnosis (``runner``).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Protocol

from kwdiag.errors import RUNTIME, USAGE, KwdiagError
from kwdiag.run.options import RunOptions
from kwdiag.runtime.spawn import child_env


class Backend(Protocol):
    runtime: str                  # "kwdiag" or "dask"
    scheduler_address: str
    job_env: dict[str, str]       # the job's whole environment

    def start(self) -> None: ...
    def info(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


def make_backend(options: RunOptions, run_dir: str, job_dir: str) -> Backend:
    if options.dask:
        from kwdiag.run.dask_backend import DaskBackend

        return DaskBackend(options, run_dir, job_dir)
    return EmbeddedBackend(options, run_dir, job_dir)


class EmbeddedBackend:
    """kwdiag's own runtime: a LocalCluster started here, or an existing cluster (scheduler file/address)."""

    runtime = "kwdiag"

    def __init__(self, options: RunOptions, run_dir: str, job_dir: str):
        self.options = options
        self.run_dir = run_dir
        self.job_dir = job_dir
        self.cluster: Any = None
        self.client: Any = None
        self.scheduler_address = ""
        self.job_env = child_env({**options.env, "KWDIAG_LOG_DIR": run_dir})

    def start(self) -> None:
        options = self.options
        if options.scheduler_file:
            self.job_env["KWDIAG_SCHEDULER_FILE"] = os.path.abspath(options.scheduler_file)
            target: Any = {"scheduler_file": options.scheduler_file}
        elif options.scheduler:  # the secret comes from KWDIAG_SECRET, for us and for the job
            self.job_env["KWDIAG_SCHEDULER_ADDRESS"] = options.scheduler
            self.job_env.pop("KWDIAG_SCHEDULER_FILE", None)
            target = {"address": options.scheduler}
        else:
            self.cluster = self._start_cluster()
            self.job_env["KWDIAG_SCHEDULER_FILE"] = self.cluster.scheduler_file
            target = {"address": self.cluster}
        from kwdiag.runtime import Client

        try:
            with warnings.catch_warnings():  # our observer's own environment is not the job's: no warning for it
                warnings.simplefilter("ignore")
                self.client = Client(**target)
        except Exception as exc:
            self.close()
            raise KwdiagError(f"cannot reach the scheduler: {exc}", RUNTIME) from None
        self.scheduler_address = self.client.scheduler_address

    def _start_cluster(self) -> Any:
        from kwdiag.runtime import LocalCluster

        options = self.options
        scheduler_kwargs = {k: v for k, v in (("allowed_failures", options.allowed_failures),
                                              ("worker_ttl", options.worker_ttl)) if v is not None}
        # Workers import the job's own modules as the job does: its folder goes on their path, after ours.
        pythonpath = child_env(options.env, append_path=[self.job_dir])["PYTHONPATH"]
        try:
            return LocalCluster(n_workers=options.workers, threads_per_worker=options.threads,
                                memory_limit=options.memory_limit, nanny=options.nanny, log_dir=self.run_dir,
                                scheduler_kwargs=scheduler_kwargs, config=options.config,
                                env={**options.env, "PYTHONPATH": pythonpath})
        except ValueError as exc:
            raise KwdiagError(str(exc), USAGE) from None
        except (OSError, TimeoutError, RuntimeError) as exc:
            raise KwdiagError(f"the cluster could not start: {exc}", RUNTIME) from None

    def info(self) -> dict[str, Any]:
        return self.client.scheduler_info()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()  # deletes the scheduler file: the shared secret does not stay in the run directory
