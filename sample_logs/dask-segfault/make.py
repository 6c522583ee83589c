"""Scenario: a task segfaults (ctypes.string_at(0)) on w1 (PYTHONFAULTHANDLER=1) and on w2 (no faulthandler).

Each task segfaults only the first time (a marker file), so the retry after the nanny restart succeeds."""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

def crash(marker):
    import ctypes, os
    if not os.path.exists(marker):
        open(marker, "w").close()
        ctypes.string_at(0)
    return "ok"

if harness.is_client():
    from distributed import Client
    import tempfile
    info = harness.client_info()
    tmp = tempfile.mkdtemp()
    with Client(info["address"]) as c:
        a = c.submit(crash, os.path.join(tmp, "a"), key="crash-a", workers=["w1"], allow_other_workers=True)
        print(a.result(timeout=60), file=sys.stderr)
        b = c.submit(crash, os.path.join(tmp, "b"), key="crash-b", workers=["w2"], allow_other_workers=True)
        print(b.result(timeout=60), file=sys.stderr)
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here)
    cl.worker("w1", env={"PYTHONFAULTHANDLER": "1"})
    cl.worker("w2")
    cl.wait_workers(2)
    cl.client(__file__)
    cl.shutdown()
