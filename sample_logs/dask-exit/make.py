"""Scenario: a task calls sys.exit(3) on w1 and os._exit(1) on w2 (both under a nanny, which restarts them).

Each does it only the first time (a marker file)."""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

def leave(marker, how):
    import os, sys
    if not os.path.exists(marker):
        open(marker, "w").close()
        if how == "sys":
            sys.exit(3)
        os._exit(1)
    return "ok"

if harness.is_client():
    from distributed import Client
    import tempfile
    info = harness.client_info()
    tmp = tempfile.mkdtemp()
    with Client(info["address"]) as c:
        a = c.submit(leave, os.path.join(tmp, "a"), "sys", key="sys-exit", workers=["w1"], allow_other_workers=True)
        print(a.result(timeout=60), file=sys.stderr)
        b = c.submit(leave, os.path.join(tmp, "b"), "os", key="os-exit", workers=["w2"], allow_other_workers=True)
        print(b.result(timeout=60), file=sys.stderr)
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here)
    cl.worker("w1")
    cl.worker("w2")
    cl.wait_workers(2)
    cl.client(__file__)
    cl.shutdown()
