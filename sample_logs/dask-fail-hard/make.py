"""Scenario: an exception inside the worker itself, not in a task: w1's data store raises when a result is deleted.

w1 runs with ``--worker-class badstore.BadStoreWorker`` (this folder's badstore.py: a ``data=`` store whose
``__delitem__`` raises OSError for a key named 'poison'). The task succeeds and its result is fetched; when the
client releases it, deleting it raises inside the worker's state machine, which Dask treats as a broken worker:
it fails hard (closes itself, and its nanny closes too: the `dask worker` process ends). w2 is a plain worker. Then the cluster is closed."""
import os, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness


def inc(x):
    return x + 1


if harness.is_client():
    from distributed import Client
    info = harness.client_info()
    with Client(info["address"]) as c:
        import time
        f = c.submit(inc, 1, key="poison-1", workers=["w1"])
        print(f.result(timeout=60), file=sys.stderr)
        before = {w["name"]: a for a, w in c.scheduler_info()["workers"].items()}
        del f                                  # the release reaches w1, whose store raises
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:     # until w1 has left the cluster
            now = {w["name"]: a for a, w in c.scheduler_info()["workers"].items()}
            if now.get("w1") != before["w1"]:  # gone, or back at a new address
                break
            time.sleep(0.2)
        print("w1 before", before["w1"], "after", now.get("w1"), file=sys.stderr)
        print(c.submit(inc, 2, key="fine-2", workers=["w2"]).result(timeout=60), file=sys.stderr)
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here, env={"PYTHONPATH": str(here)})
    cl.worker("w1", "--worker-class", "badstore.BadStoreWorker")
    cl.worker("w2")
    cl.wait_workers(2)
    cl.client(__file__, timeout=180)
    cl.shutdown()
