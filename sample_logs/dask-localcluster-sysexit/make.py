"""Scenario: LocalCluster (default silence_logs=WARNING) in one process, two workers; a task calls sys.exit(0),
so each worker that runs it dies and its nanny restarts it, until the scheduler gives up on the task
(KilledWorker after 4 deaths: allowed-failures 3). Everything Dask prints goes to one stderr: only WARNING and
above, no start banners, no worker names; each death is the worker's SystemExit traceback, then the scheduler's
removal of its address, then the nanny's restart, and the next worker's traceback comes right after.

Run: .venv/bin/python sample_logs/dask-localcluster-sysexit/make.py
(writes client.log here: the stderr of a child process running the cluster and the client, as a user's
`python job.py 2> client.log` would).
"""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def quit_now(x):
    import sys
    if x == 2:
        sys.exit(0)
    return x


if __name__ == "__main__" and "--child" in sys.argv:
    from distributed import Client

    with Client(n_workers=2, threads_per_worker=1, dashboard_address=":0") as client:
        try:
            print(client.gather(client.map(quit_now, range(4))), file=sys.stderr)
        except Exception as exc:
            print("gather raised", type(exc).__name__, exc, file=sys.stderr)
elif __name__ == "__main__":
    with open(HERE / "client.log", "wb") as f:
        subprocess.run([sys.executable, __file__, "--child"], stdout=f, stderr=f, timeout=180)
