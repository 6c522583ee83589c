"""Quickstart: run work on kwdiag's embedded runtime, lose workers for real, and see why they died.

    python examples/quickstart.py

Starts a local cluster (a scheduler and two workers, each under a nanny), runs ordinary tasks,
then a task that segfaults every worker it lands on — the scheduler blames it after two deaths
and raises KilledWorker, as Dask does — and ends with `kwdiag explain` on the cluster's logs.
"""

import ctypes
import subprocess
import sys

from kwdiag.runtime import Client, KilledWorker, LocalCluster


def square(x):
    return x * x


def crash():
    ctypes.string_at(0)  # a real segmentation fault, as buggy compiled code would cause


if __name__ == "__main__":
    with LocalCluster(n_workers=2, memory_limit="1GiB", scheduler_kwargs={"allowed_failures": 1}) as cluster, \
            Client(cluster) as client:
        total = client.submit(sum, client.map(square, range(1000)))
        print(f"sum of squares: {total.result()}")
        try:
            client.submit(crash).result()
        except KilledWorker as exc:
            print(f"KilledWorker: task {exc.task!r} killed the workers it ran on")
        log_dir = cluster.log_dir
    print(f"\nlogs: {log_dir}\n$ kwdiag explain {log_dir}\n", flush=True)
    sys.exit(subprocess.run([sys.executable, "-P", "-m", "kwdiag", "explain", log_dir]).returncode)
