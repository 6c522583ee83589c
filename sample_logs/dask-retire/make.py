"""Scenario: client.retire_workers retires w1 while w2 runs on."""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

if harness.is_client():
    from distributed import Client
    info = harness.client_info()
    with Client(info["address"]) as c:
        c.gather(c.map(time.sleep, [0.2] * 6, pure=False))
        addr = [a for a, w in c.scheduler_info()["workers"].items() if w["name"] == "w1"]
        c.retire_workers(addr, close_workers=True)
        time.sleep(2)
        c.gather(c.map(time.sleep, [0.2] * 6, pure=False))
        time.sleep(8)
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here)
    cl.worker("w1")
    cl.worker("w2")
    cl.wait_workers(2)
    cl.client(__file__)
    cl.shutdown()
