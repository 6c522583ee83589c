"""An ordinary job for `kwdiag run`: its Client() connects to the cluster kwdiag started.

    kwdiag run examples/job.py            # from the clone's root, or from anywhere with its path

It maps a function from its own module (`shapes.py`, beside it; workers import it by name), then
loses one worker to a SIGKILL from inside a task, the way the kernel's OOM killer would end it.
kwdiag run ends with the diagnosis: one `sudden_exit/sigkill` death, and the job still succeeds
because the scheduler reruns the lost task on a fresh worker.
"""

import os
import signal
import sys
import tempfile

from shapes import area

from kwdiag.runtime import Client


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
        print(client.submit(killed_once, marker).result(timeout=120))
    sys.exit(0 if total == sum(i * i for i in range(100)) else 1)
