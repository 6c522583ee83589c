"""Scenario (Dask 2024.12.1): w1 blows past --memory-limit 300MB (nanny restarts it), w2 segfaults.

Run with the Python of a venv holding dask[distributed]==2024.12.1, e.g. /work/dask-old-venv/bin/python."""
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
        # allow_other_workers: a restriction by name is not carried over to the restarted worker's
        # new address, so the retry may run anywhere (the marker file makes it harmless).
        g = c.submit(crash, os.path.join(tmp, "c"), key="crash", workers=["w2"], allow_other_workers=True)
        print(g.result(timeout=60), file=sys.stderr)
        f = c.submit(hog, os.path.join(tmp, "m"), key="hog", workers=["w1"], allow_other_workers=True)
        print(f.result(timeout=60), file=sys.stderr)
else:
    here = Path(__file__).resolve().parent
    cl = harness.Cluster(here)
    cl.worker("w1", "--memory-limit", "300MB")
    cl.worker("w2", env={"PYTHONFAULTHANDLER": "1"})
    cl.wait_workers(2)
    cl.client(__file__)
    cl.shutdown()
