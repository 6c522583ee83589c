"""Scenario (Dask 2024.8.0): the job ends with ``client.shutdown()``, which closes the scheduler and, through it,
every worker. From 2023.8.0 to 2024.8.0 the scheduler says "Scheduler closing due to unknown reason..." when no
reason is passed (``Scheduler.close(reason="")``), then "Scheduler closing all comms": it sends each worker
``{'op': 'close', 'reason': 'scheduler-close'}`` and closes its connection, and removes it.

Run with the Python of a venv holding dask[distributed]==2024.8.0, e.g.
    python3 -m venv /tmp/v2408 && /tmp/v2408/bin/pip install "distributed==2024.8.0" "dask==2024.8.0"
    /tmp/v2408/bin/python sample_logs/dask-2024-client-shutdown/make.py"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

if harness.is_client():
    from distributed import Client
    info = harness.client_info()
    client = Client(info["address"])
    print(sum(client.gather(client.map(lambda x: x + 1, range(10)))), file=sys.stderr)
    client.shutdown()
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here)
    cl.worker("w1")
    cl.worker("w2")
    cl.wait_workers(2)
    cl.client(__file__)
    cl.shutdown()
