"""Scenario: LocalCluster (default silence_logs=WARNING) in one process; a task blows past the
300 MB memory limit of its worker, whose nanny restarts it. Everything Dask prints goes to one
stderr: only WARNING and above, no start banners, no worker names.

Run: /work/dask-venv/bin/python sample_logs/dask-localcluster-memory/make.py
(writes client.log here: the stderr of a child process running the cluster and the client).
"""
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def hog(marker):
    import os, time
    if os.path.exists(marker):
        return "ok"
    open(marker, "w").close()
    chunks = []
    for _ in range(200):
        chunks.append(bytearray(20 * 2**20))
        time.sleep(0.05)
    return len(chunks)


if __name__ == "__main__" and "--child" in sys.argv:
    import tempfile
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="300MB", dashboard_address=":0") as cl:
        with Client(cl) as c:
            print(c.submit(hog, os.path.join(tempfile.mkdtemp(), "m"), key="hog").result(timeout=60), file=sys.stderr)
elif __name__ == "__main__":
    with open(HERE / "client.log", "wb") as f:
        subprocess.run([sys.executable, __file__, "--child"], stdout=f, stderr=f, timeout=120)
