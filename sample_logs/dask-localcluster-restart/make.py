"""Scenario: LocalCluster (default silence_logs=WARNING) in one process, three workers; the client restarts them
all (`client.restart()`), retires one, and closes. At WARNING level the only lines are each nanny's
`Restarting worker (status=Status.running)`, which Dask from 2022.4.2 on prints for a restart that was asked for
as for a crash: the lines cannot tell which (the retirement and the close print nothing).

Run: .venv/bin/python sample_logs/dask-localcluster-restart/make.py
(writes client.log here: the stderr of a child process running the cluster and the client).
"""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def inc(x):
    return x + 1


if __name__ == "__main__" and "--child" in sys.argv:
    from distributed import Client

    with Client(n_workers=3, threads_per_worker=1, dashboard_address=":0") as client:
        print(sum(client.gather(client.map(inc, range(20)))), file=sys.stderr)
        client.restart()
        print(sum(client.gather(client.map(inc, range(20)))), file=sys.stderr)
        client.retire_workers(workers=[next(iter(client.scheduler_info()["workers"]))])
        print(sum(client.gather(client.map(inc, range(20, 40)))), file=sys.stderr)
elif __name__ == "__main__":
    with open(HERE / "client.log", "wb") as f:
        subprocess.run([sys.executable, __file__, "--child"], stdout=f, stderr=f, timeout=180)
