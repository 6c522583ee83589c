"""Scenario: w1 is started with --lifetime 4s (no --lifetime-restart): it closes itself after 4 s while w2 runs on."""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

if harness.is_client():
    from distributed import Client
    info = harness.client_info()
    with Client(info["address"]) as c:
        c.gather(c.map(time.sleep, [0.2] * 6, pure=False))
        time.sleep(8)
        c.gather(c.map(time.sleep, [0.2] * 6, pure=False))
        time.sleep(8)
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here)
    cl.worker("w1", "--lifetime", "4s")
    cl.worker("w2")
    cl.wait_workers(2)
    cl.client(__file__)
    cl.shutdown()
