"""Scenario: a task raises ZeroDivisionError (a task error: no worker dies), then the cluster is closed."""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

def div(a, b):
    return a / b

if harness.is_client():
    from distributed import Client
    info = harness.client_info()
    with Client(info["address"]) as c:
        f = c.submit(div, 1, 0, key="div-1-0")
        try:
            f.result(timeout=30)
        except ZeroDivisionError as exc:
            print(f"client: ZeroDivisionError: {exc}", file=sys.stderr)
        print(c.submit(div, 4, 2, key="div-4-2").result(), file=sys.stderr)
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here)
    cl.worker("w1")
    cl.wait_workers(1)
    cl.client(__file__)
    cl.shutdown()
