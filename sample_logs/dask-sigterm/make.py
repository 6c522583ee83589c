"""Scenario: SIGTERM to one `dask worker` process with a nanny (w1) and one without (w2) while the cluster runs on (w3)."""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

if harness.is_client():
    from distributed import Client
    info = harness.client_info()
    with Client(info["address"]) as c:
        futs = c.map(time.sleep, [0.2] * 10, pure=False)
        c.gather(futs)
        os.kill(info["pids"]["w1"], signal.SIGTERM)
        os.kill(info["pids"]["w2"], signal.SIGTERM)
        time.sleep(2)
        futs = c.map(time.sleep, [0.2] * 10, pure=False)
        c.gather(futs)
        time.sleep(8)
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here)
    cl.worker("w1")
    cl.worker("w2", "--no-nanny")
    cl.worker("w3")
    cl.wait_workers(3)
    cl.client(__file__)
    cl.shutdown()
