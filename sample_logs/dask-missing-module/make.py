"""Scenario: the task's function lives in a module (clientonly/onlyclient.py) that the client and the
scheduler can import but the worker cannot: the worker fails to deserialize the task and closes."""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

if harness.is_client():
    from distributed import Client
    info = harness.client_info()
    from onlyclient import double
    with Client(info["address"]) as c:
        f = c.submit(double, 21, key="double-21")
        try:
            print(f.result(timeout=8), file=sys.stderr)
        except Exception as exc:
            print(f"client: {type(exc).__name__}: {exc}", file=sys.stderr)
else:
    here = Path(__file__).resolve().parent
    mod = str(here / "clientonly")
    cl = harness.Cluster(here, scheduler_env={"PYTHONPATH": mod})
    cl.worker("w1")
    cl.wait_workers(1)
    cl.client(__file__, env={"PYTHONPATH": mod})
    cl.shutdown()
