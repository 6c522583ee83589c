"""Scenario: a task SIGKILLs the worker process it runs on; with distributed.scheduler.allowed-failures=1 the
scheduler gives up after it killed 2 workers and the client gets KilledWorker."""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

def suicide():
    import os, signal, time
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)

if harness.is_client():
    from distributed import Client
    info = harness.client_info()
    with Client(info["address"]) as c:
        c.submit(suicide, key="suicide", pure=False).result(timeout=60)
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here, env={"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1"})
    cl.worker("w1")
    cl.worker("w2")
    cl.worker("w3")
    cl.wait_workers(3)
    cl.client(__file__)
    cl.shutdown()
