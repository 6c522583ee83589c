"""Scenario: SIGKILL a worker process (with a nanny, which restarts it) and a --no-nanny worker.

w1 runs under a nanny: its worker process gets SIGKILL while running a task; the nanny logs the
signal and restarts it. w2 has no nanny: SIGKILL ends it and only the scheduler notices (a closed
connection). Then the whole cluster is closed with SIGTERM.
"""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

if harness.is_client():
    from distributed import Client
    info = harness.client_info()
    with Client(info["address"]) as c:
        pids = harness.worker_pids(c)
        futs = [c.submit(time.sleep, 3, key=f"sleep-{w}", workers=[w], pure=False) for w in ("w1", "w2")]
        time.sleep(1.0)
        os.kill(pids["w1"], signal.SIGKILL)
        os.kill(pids["w2"], signal.SIGKILL)
        time.sleep(1.0)
        time.sleep(3)
        print("done", file=sys.stderr)
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here)
    cl.worker("w1")
    cl.worker("w2", "--no-nanny")
    cl.wait_workers(2)
    cl.client(__file__)
    cl.shutdown()
