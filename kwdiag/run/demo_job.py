"""kwdiag's demo job: a normal workload, then workers lost in five different ways, for real.

``kwdiag demo`` runs this with ``kwdiag run`` on a cluster of 3 workers (300 MiB each, nannies,
``allowed_failures=1``). It is an ordinary kwdiag job — ``Client()`` finds the cluster ``kwdiag run``
started — so it doubles as an example. Each step loses workers the way real clusters do:

1. a clean exit: one worker is retired (it hands its data back first);
2. a memory blow-up: a task allocates past the limit, the nanny terminates the worker, the task is
   retried on another worker, which dies the same way — so the task fails with KilledWorker;
3. a segfault: a task crashes two workers in a row (KilledWorker again);
4. an unrecoverable exception: a colleague's worker joins with a plugin it cannot import;
5. a version mismatch: a worker from another environment, with a different version of a package the
   cluster requires to match, joins and is refused.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

from kwdiag.runtime import Client, KilledWorker
from kwdiag.runtime.spawn import child_env, module_command


def square(x):
    return x * x


def blow_up_memory():
    blocks = []
    while True:  # until the nanny steps in
        blocks.append(bytearray(25 * 2**20))
        time.sleep(0.02)


def crash():
    ctypes.string_at(0)  # a real segmentation fault, as a bug in compiled code would cause


def wait_for_workers(client, n, timeout=60):
    deadline = time.monotonic() + timeout
    while len(client.scheduler_info()["workers"]) < n and time.monotonic() < deadline:
        time.sleep(0.05)


def start_worker_by_hand(name, *extra, env=None):
    """Join the cluster the way a colleague would, with `kwdiag worker` (its output goes to the run directory)."""
    log_dir = os.environ["KWDIAG_LOG_DIR"]
    with open(os.path.join(log_dir, f"{name}.log"), "ab") as log:
        return subprocess.run(module_command("kwdiag", "worker", "--scheduler-file",
                                             os.environ["KWDIAG_SCHEDULER_FILE"], "--name", name, "--log-dir",
                                             log_dir, "--no-nanny", *extra),
                              stdout=log, stderr=log, env=child_env(env), timeout=120).returncode


def main(other_environment: str) -> None:
    client = Client()
    workers = len(client.scheduler_info()["workers"])
    print(f"demo: connected to {client.scheduler_address} with {workers} workers", flush=True)

    total = client.submit(sum, client.map(square, range(500))).result()
    print(f"demo: 1. ordinary work: sum of squares = {total}", flush=True)

    last = sorted(client.scheduler_info()["workers"].items(), key=lambda kv: kv[1]["name"])[-1]
    client.retire_workers([last[0]])
    print(f"demo: 2. retired {last[1]['name']} (a clean exit)", flush=True)

    try:
        client.submit(blow_up_memory, key="memory-hog").result()
    except KilledWorker as exc:
        print(f"demo: 3. memory-hog failed with KilledWorker (last worker {exc.last_worker})", flush=True)
    wait_for_workers(client, workers - 1)

    try:
        client.submit(crash, key="segfault").result()
    except KilledWorker as exc:
        print(f"demo: 4. segfault failed with KilledWorker (last worker {exc.last_worker})", flush=True)
    wait_for_workers(client, workers - 1)

    code = start_worker_by_hand("plugin-worker", "--preload", "kwdiag_demo_plugin_not_installed")
    print(f"demo: 5. a worker with a missing plugin exited with status {code}", flush=True)

    code = start_worker_by_hand("other-env-worker", env={"PYTHONPATH": other_environment})
    print(f"demo: 6. a worker from another environment was refused (status {code})", flush=True)

    assert client.submit(square, 12).result() == 144
    print("demo: the cluster still works; done", flush=True)
    client.close()


if __name__ == "__main__":
    main(sys.argv[1])
