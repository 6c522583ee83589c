"""A job written for Dask, unchanged, for `kwdiag run --dask` (needs `pip install 'kwdiag[dask]'`).

    kwdiag run --dask examples/dask_job.py

Its `Client()` connects to the Dask cluster kwdiag started (through DASK_SCHEDULER_ADDRESS). It maps a
function from its own module (`shapes.py`, beside it), then loses one worker to a SIGKILL from inside a
task, the way the kernel's OOM killer would end it. kwdiag run ends with the diagnosis: one
`sudden_exit/sigkill` death, with its exit signal and the task that was executing, and the job still
succeeds because Dask reruns the lost task on the worker the nanny starts in its place.
"""

import os
import signal
import sys
import tempfile

from dask.distributed import Client
from shapes import area


def killed_once(marker: str) -> str:
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived on a fresh worker"


if __name__ == "__main__":
    with Client() as client:
        total = client.submit(sum, client.map(area, range(100))).result()
        print(f"sum of areas: {total}")
        marker = os.path.join(tempfile.mkdtemp(prefix="kwdiag-example-"), "killed")
        print(client.submit(killed_once, marker, key="killed-once").result(timeout=120))
    sys.exit(0 if total == sum(i * i for i in range(100)) else 1)
