"""Scenario: logs as a notebook shows them. A LocalCluster (two nannies in the notebook's process); a task that
SIGKILLs every worker that runs it, until the scheduler gives up (four deaths with the default allowed-failures);
then ``pprint.pprint(client.get_worker_logs(nanny=True))``, the call Dask's documentation suggests for reading
workers' logs from a notebook. Run with dask[distributed]==2026.8.0: ``python make.py`` writes
``pprint_worker_logs.txt`` here (newest line first, as Dask returns them; each nanny of the process returns the
process's nanny records, so both keys hold the same lines)."""
import os, pprint, signal, sys, time
from distributed import Client, LocalCluster


def die():
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as client:
        try:
            client.submit(die, pure=False).result(timeout=60)
        except Exception as exc:
            print(type(exc).__name__, exc, file=sys.stderr)
        deadline = time.monotonic() + 60
        while len(client.scheduler_info()["workers"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        with open("pprint_worker_logs.txt", "w") as f:
            pprint.pprint(client.get_worker_logs(nanny=True), stream=f)
