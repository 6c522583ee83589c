"""Scenario: w1's worker process is frozen with SIGSTOP; with distributed.scheduler.worker-ttl=2s the scheduler
notices missed heartbeats and asks the nanny to restart it (the nanny SIGKILLs the frozen process)."""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

if harness.is_client():
    from distributed import Client
    info = harness.client_info()
    with Client(info["address"]) as c:
        pids = harness.worker_pids(c)
        os.kill(pids["w1"], signal.SIGSTOP)
        time.sleep(25)
        try:
            os.kill(pids["w1"], signal.SIGCONT)
        except ProcessLookupError:
            pass
        time.sleep(1)
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here, env={"DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "2s"})
    cl.worker("w1")
    cl.worker("w2")
    cl.wait_workers(2)
    cl.client(__file__)
    cl.shutdown()
