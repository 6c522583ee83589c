"""Scenario: a notebook cell's whole output, as a user pastes it: the LocalCluster's own warnings (Dask logs them to
stderr, which the notebook shows in the cell) and then the printed value of ``client.get_worker_logs(nanny=True)``,
in one text. A LocalCluster of two nannies in the notebook's process; a task that SIGKILLs every worker that runs it,
until the scheduler gives up (four deaths with the default allowed-failures). Run with dask[distributed]==2026.8.0:
``python make.py`` runs the cell twice, each time in a child Python with stderr and stdout in one pipe (the order
the notebook shows them): with ``print(...)`` (the value on one long line) into ``cell_output.txt`` here, and with
``pprint.pprint(...)`` (long strings cut into adjacent literals over many lines) into
``../dask-notebook-mixed-pprint/cell_output.txt``."""
import subprocess
import sys
from pathlib import Path

CELL = r'''
import os, pprint, signal, sys, time
from distributed import Client, LocalCluster


def die():
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as client:
        try:
            client.submit(die, pure=False).result(timeout=60)
        except Exception as exc:
            print(type(exc).__name__, exc, file=sys.stderr, flush=True)
        deadline = time.monotonic() + 60
        while len(client.scheduler_info()["workers"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        sys.stderr.flush()
        {show}(client.get_worker_logs(nanny=True))
        sys.stdout.flush()
'''

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    for show, where in (("print", here), ("pprint.pprint", here.parent / "dask-notebook-mixed-pprint")):
        out = subprocess.run([sys.executable, "-c", CELL.replace("{show}", show)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, cwd=here, check=True).stdout
        where.mkdir(exist_ok=True)
        (where / "cell_output.txt").write_bytes(out)
