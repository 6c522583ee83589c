"""Scenario: a Jupyter notebook as Jupyter saves it (``.ipynb``), executed for real by a Jupyter kernel. A
LocalCluster of two nannies in the kernel's process; a task that SIGKILLs every worker that runs it, until the
scheduler gives up (four deaths with the default allowed-failures); the KilledWorker the cell raises (an ``error``
output); then ``client.get_worker_logs(nanny=True)`` as a cell's last expression (IPython's repr of the value, an
``execute_result``). The nannies' WARNING lines reach the cells' stderr (the nannies run in the kernel). Run with
dask[distributed]==2026.8.0, nbformat, nbclient and ipykernel installed: ``python make.py`` writes
``executed.ipynb`` here."""
from pathlib import Path

import nbformat
from nbclient import NotebookClient

CELLS = [
    "import os, signal, time\nfrom distributed import Client, LocalCluster\n\n"
    "cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)\nclient = Client(cluster)",
    "def die():\n    os.kill(os.getpid(), signal.SIGKILL)\n\n"
    "client.submit(die, pure=False).result(timeout=60)",
    "deadline = time.monotonic() + 60\n"
    "while len(client.scheduler_info()['workers']) < 2 and time.monotonic() < deadline:\n    time.sleep(0.1)\n"
    "client.get_worker_logs(nanny=True)",
    "client.close()\ncluster.close()",
]

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(here)}}).execute()
    nbformat.write(nb, here / "executed.ipynb")
