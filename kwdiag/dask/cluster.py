"""The process that holds a Dask cluster for ``kwdiag run --dask``: ``python -m kwdiag.dask.cluster``.

Covers: starting a Dask ``LocalCluster`` (a scheduler and workers under nannies) or, with
``--no-nanny``, a scheduler with each worker in a process of its own (Dask's ``SubprocessWorker``:
a LocalCluster without nannies would run its workers inside this process, where one worker's death
is everyone's), with the kwdiag scheduler plugin preloaded through Dask's own preload setting (it has
Dask install the nanny and worker plugins on every nanny and worker);
``--allowed-failures`` and ``--worker-ttl`` as Dask's config; announcing the scheduler's address in a
file (written whole, then renamed); and closing the cluster when stdin reaches its end (the runner
closed it or died) or on SIGTERM/SIGINT. Its stderr, with every Dask process's log lines, is kept by
the runner in the run directory (``dask-cluster.log``).

Without nannies this process is the parent of every worker process, so it records how each one
ended (``LauncherRecorder``).

Does not cover: the job, watching, or the diagnosis (``kwdiag.run``). The workers of a LocalCluster
are started by Dask's nannies (multiprocessing), not by kwdiag's spawn helper; they get kwdiag and the
job's folder through the ``PYTHONPATH`` this process was started with.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import Any

from kwdiag.errors import RUNTIME

PRELOAD = "kwdiag.dask"
# The scheduler plugin has Dask install the nanny and worker plugins on every nanny and worker.
PRELOAD_KEYS = ("distributed.scheduler.preload",)
EXIT_START_FAILED = RUNTIME  # kwdiag's "the cluster could not start"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kwdiag.dask.cluster")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--address-file", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--memory-limit", default="auto")
    p.add_argument("--no-nanny", action="store_true")
    p.add_argument("--allowed-failures", type=int)
    p.add_argument("--worker-ttl")
    return p.parse_args(argv)


def dask_settings(allowed_failures: int | None, worker_ttl: str | None) -> dict[str, Any]:
    """The Dask config for a recorded cluster: our preload added to any the user has, and the options."""
    import dask.config

    settings: dict[str, Any] = {}
    for key in PRELOAD_KEYS:
        existing = list(dask.config.get(key, default=None) or [])
        settings[key] = existing if PRELOAD in existing else existing + [PRELOAD]
    if allowed_failures is not None:
        settings["distributed.scheduler.allowed-failures"] = allowed_failures
    if worker_ttl:
        settings["distributed.scheduler.worker-ttl"] = worker_ttl
    return settings


def _memory_limit(value: str, workers: int) -> Any:
    """Bytes, or a size Dask parses ("2GiB"); "auto" is the machine's memory shared among the workers."""
    if value == "auto":
        import psutil

        return psutil.virtual_memory().total // max(1, workers)
    return int(value) if value.isdigit() else value


def worker_process_class() -> type:
    """Dask's ``SubprocessWorker``, started as ``python -P -m distributed.cli.dask_spec``: Dask 2024.x runs a
    ``dask`` executable found on PATH, which need not be this interpreter's (or exist); ``-P`` for the
    reason kwdiag's own children use it (runtime/spawn.py): the current folder must not shadow packages."""
    from distributed.deploy.subprocess import SubprocessWorker

    class WorkerProcess(SubprocessWorker):
        async def _start(self) -> None:
            import asyncio

            spec = json.dumps({"cls": self.worker_class, "opts": {**self.worker_kwargs}})
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-P", "-m", "distributed.cli.dask_spec", self.scheduler, "--spec", spec)

    return WorkerProcess


def start_cluster(args: argparse.Namespace) -> Any:
    limit = _memory_limit(args.memory_limit, args.workers)
    if not args.no_nanny:
        from distributed import LocalCluster

        return LocalCluster(n_workers=args.workers, threads_per_worker=args.threads, memory_limit=limit,
                            processes=True, host="127.0.0.1", dashboard_address=None)
    from distributed import Scheduler, SpecCluster

    def worker(name: Any) -> dict[str, Any]:
        kwargs = {"nthreads": args.threads, "memory_limit": limit, "host": "127.0.0.1",
                  "silence_logs": logging.WARNING}  # as a LocalCluster's workers
        if name is not None:
            kwargs["name"] = name
        return {"cls": worker_process_class(), "options": {"worker_class": "distributed.Worker",
                                                           "worker_kwargs": kwargs}}

    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "port": 0, "dashboard": False,
                                               "dashboard_address": ":0"}}
    return SpecCluster(workers={i: worker(i) for i in range(args.workers)}, scheduler=scheduler, worker=worker(None),
                       name="kwdiag-no-nanny", silence_logs=logging.WARNING)


class LauncherRecorder:
    """Without nannies this process is the parent of every worker process (Dask's ``SubprocessWorker``):
    the one place that learns each one's exit status. Records ``worker-exit`` (source ``cluster``) with the
    exit code or signal, the executing tasks and the log tail, as a nanny would. A worker started by
    ``dask worker --no-nanny`` elsewhere has no such parent."""

    def __init__(self, run_dir: str):
        from kwdiag.dask._common import Recorder

        self.run_dir = run_dir
        self.rec = Recorder(run_dir, "cluster", source="cluster")
        self.closing = False

    async def watch(self, name: Any, process: Any) -> None:
        import signal as signals

        from kwdiag.dask._common import last_executing, process_log_tail, signal_name, stem

        code = await process.wait()
        signum = -code if code < 0 else None
        caused_by = "shutdown" if self.closing and (code == 0 or signum == signals.SIGKILL) else None
        files = os.path.join(self.run_dir, f"worker-{stem(name)}")
        running = last_executing(files + ".jsonl", process.pid)
        tail = process_log_tail(files + ".log", process.pid)
        text = (f"Worker process {process.pid} was killed by signal {signum} ({signal_name(signum)})" if signum
                else f"Worker process {process.pid} exited with status {code}")
        self.rec.event("worker-exit", text, level="info" if caused_by else "warning", worker=str(name),
                       pid=process.pid, exitcode=code, signal=signum,
                       signal_name=signal_name(signum) if signum else None, caused_by=caused_by, nanny_was=None,
                       running_tasks=running or [], stderr_tail=tail or [], will_restart=False,
                       **({"missing": [k for k, v in (("running_tasks", running), ("stderr_tail", tail))
                                       if v is None]} if running is None or tail is None else {}))


def record_launched_exits(cluster: Any, run_dir: str) -> LauncherRecorder:
    recorder = LauncherRecorder(run_dir)

    async def start() -> None:
        import asyncio

        for name, worker in cluster.workers.items():
            if getattr(worker, "process", None) is not None:
                asyncio.ensure_future(recorder.watch(name, worker.process))

    cluster.sync(start)
    return recorder


def close_cluster(cluster: Any, no_nanny: bool, timeout: float = 30.0,
                  launcher: LauncherRecorder | None = None) -> None:
    """Close in an order that records what happens: first tell the scheduler plugin the cluster is closing;
    without nannies, ask every worker to close and let its process end before Dask's ``SubprocessWorker``
    would SIGKILL it; then close the cluster."""
    import time

    from kwdiag.dask.scheduler import SchedulerRecorder

    scheduler = getattr(cluster, "scheduler", None)
    plugins = getattr(scheduler, "plugins", {}) or {}
    recorder = next((p for p in plugins.values() if isinstance(p, SchedulerRecorder)), None)

    async def closing() -> None:
        if launcher is not None:
            launcher.closing = True
        if recorder is not None:
            recorder.cluster_closing("cluster-close")
        if no_nanny and scheduler is not None and scheduler.workers:
            await scheduler.retire_workers(workers=list(scheduler.workers), close_workers=True)

    try:
        cluster.sync(closing, callback_timeout=timeout)
        deadline = time.monotonic() + timeout
        processes = [getattr(w, "process", None) for w in getattr(cluster, "workers", {}).values()]
        while no_nanny and time.monotonic() < deadline and any(
                p is not None and p.returncode is None for p in processes):
            time.sleep(0.1)
    finally:
        cluster.close(timeout=timeout)


def _announce(path: str, address: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"address": address, "pid": os.getpid()}, f)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    os.environ["KWDIAG_RUN_DIR"] = os.path.abspath(args.run_dir)  # inherited by every worker process
    import dask.config

    dask.config.set(dask_settings(args.allowed_failures, args.worker_ttl))

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        cluster = start_cluster(args)
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # the runner shows this line from the log
        sys.stderr.write(f"kwdiag: the Dask cluster could not start: {type(exc).__name__}: {exc}\n")
        return EXIT_START_FAILED
    launcher = None
    try:
        if args.no_nanny:
            launcher = record_launched_exits(cluster, os.environ["KWDIAG_RUN_DIR"])
        _announce(args.address_file, cluster.scheduler_address)
        sys.stdin.buffer.read()  # until the runner closes our stdin (or dies)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the close short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        close_cluster(cluster, args.no_nanny, launcher=launcher)
    return 0


if __name__ == "__main__":
    sys.exit(main())
