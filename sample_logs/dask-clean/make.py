"""Scenario: a clean run (a few tasks on two workers), then the whole cluster is closed."""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

if harness.is_client():
    from distributed import Client
    info = harness.client_info()
    with Client(info["address"]) as c:
        print(sum(c.gather(c.map(lambda x: x * x, range(20)))), file=sys.stderr)
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here)
    cl.worker("w1")
    cl.worker("w2")
    cl.wait_workers(2)
    cl.client(__file__)
    cl.shutdown()
