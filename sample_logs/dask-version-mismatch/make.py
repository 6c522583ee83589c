"""Scenario: a worker from an older Dask (2024.12.1, its own venv) joins a 2026.8 scheduler and is sent a task.

Run with DASK_OLD_PYTHON=/work/dask-old-venv/bin/python (a venv with dask[distributed]==2024.12.1)."""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

if harness.is_client():
    from distributed import Client
    info = harness.client_info()
    with Client(info["address"]) as c:
        f = c.submit(sum, [1, 2, 3], key="sum-123", workers=["w1"])
        try:
            print(f.result(timeout=8), file=sys.stderr)
        except Exception as exc:
            print(f"client: {type(exc).__name__}: {exc}", file=sys.stderr)
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here)
    cl.worker("w1", python=os.environ.get("DASK_OLD_PYTHON", "/work/dask-old-venv/bin/python"))
    cl.wait_workers(1)
    cl.client(__file__)
    cl.shutdown()
