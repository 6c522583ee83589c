"""Scenario: a task allocates memory past the worker's --memory-limit (300 MB); the nanny terminates and restarts the worker.

The task blows up only the first time (a marker file); the retry succeeds."""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

def hog(marker):
    import os, time
    if os.path.exists(marker):
        return "ok"
    open(marker, "w").close()
    chunks = []
    for _ in range(200):
        chunks.append(bytearray(20 * 2**20))
        time.sleep(0.05)
    return len(chunks)

if harness.is_client():
    from distributed import Client
    import tempfile
    info = harness.client_info()
    tmp = tempfile.mkdtemp()
    with Client(info["address"]) as c:
        f = c.submit(hog, os.path.join(tmp, "m"), key="hog", workers=["w1"])
        print(f.result(timeout=90), file=sys.stderr)
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here)
    cl.worker("w1", "--memory-limit", "300MB")
    cl.wait_workers(1)
    cl.client(__file__)
    cl.shutdown()
