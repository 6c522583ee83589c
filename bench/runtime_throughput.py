"""Runtime speed and failure-detection figures, kwdiag beside Dask distributed in the same run.

Prints, for a local cluster of 2 worker processes with 1 thread each (``--workers N`` for more; ``--result-kb K``
for tasks that return K KiB each, the map then has at most ~2 GiB of results) (medians over --repeat runs):
  map      tasks/s for 5,000 no-op tasks (map + gather)
  chain    tasks/s for a 2,000-task dependency chain written as users write it (x = submit(inc, x))
  rtt      median single-task round trip (submit + result, back to back), ms
and failure figures (ms):
  kill->removed      SIGKILL of a busy worker to its removal at the scheduler
  kill->replaced     SIGKILL to the replacement worker registered
  stop->removed      SIGSTOP to removal with a 3 s time-to-live
  memory->stopped    memory over the terminate fraction to the worker stopped

Dask runs when ``distributed`` is importable here, or from another interpreter given with
``--dask-python`` (e.g. a venv with ``pip install "dask[distributed]"``); it is measured twice,
with its default queuing and with queuing off (``worker-saturation: inf``).

    python bench/runtime_throughput.py [--repeat 3] [--dask-python /path/to/python] [--no-failures]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

N_MAP, N_CHAIN, N_RTT = 5000, 2000, 200
WORKERS = 2          # --workers
RESULT_BYTES = 0     # --result-kb: each task returns this many bytes (0: a small int)
MEMORY_LIMIT = 400 * 2**20


def noop(x):
    return x if not RESULT_BYTES else bytes(RESULT_BYTES)


def inc(x):
    return x + 1 if not RESULT_BYTES else bytes(RESULT_BYTES)


def hog(path, limit):
    """Climb to 40 MiB under the terminate line, settle, then cross it: the stamp is the crossing."""
    import psutil

    rss = psutil.Process().memory_info().rss
    below = bytearray(max(0, int(0.95 * limit) - rss - 40 * 2**20))   # touched pages: real resident memory
    time.sleep(0.5)
    with open(path, "w") as f:
        f.write(repr(time.time()))
    above = bytearray(80 * 2**20)
    time.sleep(30)
    return len(below) + len(above)


def sleeper(seconds):
    time.sleep(seconds)


def throughput(client, repeat):
    maps, chains, rtts = [], [], []
    n_map = N_MAP if not RESULT_BYTES else max(50, min(N_MAP, (2 << 30) // RESULT_BYTES))  # at most ~2 GiB gathered
    client.gather(client.map(noop, range(100)))  # warm up connections
    for r in range(repeat):
        start = time.perf_counter()
        futures = client.map(noop, range(r * n_map, (r + 1) * n_map))
        client.gather(futures)
        maps.append(n_map / (time.perf_counter() - start))
        del futures
        # The chain as users write it: each future rebinds the name of the one it depends on (only the last
        # is kept), so every link is released while its dependent still waits for it.
        start = time.perf_counter()
        x = client.submit(inc, r * 10**6, pure=False)
        for _ in range(N_CHAIN - 1):
            x = client.submit(inc, x, pure=False)
        value = x.result()
        chains.append(N_CHAIN / (time.perf_counter() - start))
        if not RESULT_BYTES and value != r * 10**6 + N_CHAIN:
            raise AssertionError(f"chain gave {value}, not {r * 10**6 + N_CHAIN}")
        del x
        samples = []
        for i in range(N_RTT):
            start = time.perf_counter()
            client.submit(inc, i, pure=False).result()
            samples.append(time.perf_counter() - start)
        rtts.append(statistics.median(samples) * 1000)
    return {"map": statistics.median(maps), "chain": statistics.median(chains), "rtt": statistics.median(rtts)}


# ----------------------------------------------------------------------------- kwdiag
def kwdiag_events(log_dir, kind):
    from kwdiag.events import from_json_line

    out = []
    for name in os.listdir(log_dir):
        if name.endswith(".jsonl"):
            with open(os.path.join(log_dir, name)) as f:
                out += [e for e in map(from_json_line, filter(str.strip, f)) if e.kind == kind]
    return sorted(out, key=lambda e: e.ts)


def wait(cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.005)
    raise TimeoutError("benchmark condition not reached")


def busy_worker(client, name_of):
    """Start a long task and return ``(address, info)`` of the worker running it (either runtime)."""
    client.submit(sleeper, 60, pure=False)
    if hasattr(client, "processing"):  # Dask
        address = wait(lambda: next((a for a, keys in client.processing().items() if keys), None))
        return address, client.scheduler_info()["workers"][address]
    return wait(lambda: next(((a, i) for a, i in client.scheduler_info()["workers"].items() if i["executing"]), None))


def kwdiag_figures(repeat, failures):
    from kwdiag.runtime import Client, LocalCluster

    out = {}
    with tempfile.TemporaryDirectory() as log_dir:
        with LocalCluster(n_workers=WORKERS, threads_per_worker=1, memory_limit=None, log_dir=log_dir) as cluster, \
                Client(cluster) as client:
            out.update(throughput(client, repeat))
            if failures:
                removed, replaced = [], []
                for _ in range(repeat):
                    client.restart()
                    address, info = busy_worker(client, None)
                    seen = len(kwdiag_events(log_dir, "worker-registered"))
                    killed = time.time()
                    os.kill(info["pid"], signal.SIGKILL)
                    removal = wait(lambda: [e for e in kwdiag_events(log_dir, "worker-removed")
                                            if e.fields["address"] == address])[0]
                    back = wait(lambda: kwdiag_events(log_dir, "worker-registered")[seen:])[0]
                    removed.append((removal.ts - killed) * 1000)
                    replaced.append((back.ts - killed) * 1000)
                out["kill->removed"] = statistics.median(removed)
                out["kill->replaced"] = statistics.median(replaced)
    if not failures:
        return out
    with tempfile.TemporaryDirectory() as log_dir:
        with LocalCluster(n_workers=2, memory_limit=None, log_dir=log_dir, nanny=False,
                          scheduler_kwargs={"worker_ttl": "3s"}) as cluster, Client(cluster) as client:
            address, info = next(iter(client.scheduler_info()["workers"].items()))
            stopped = time.time()
            os.kill(info["pid"], signal.SIGSTOP)
            try:
                removal = wait(lambda: [e for e in kwdiag_events(log_dir, "worker-removed")
                                        if e.fields["address"] == address], 60)[0]
            finally:
                try:
                    os.kill(info["pid"], signal.SIGCONT)
                except ProcessLookupError:
                    pass
            out["stop->removed"] = (removal.ts - stopped) * 1000
    with tempfile.TemporaryDirectory() as log_dir:
        with LocalCluster(n_workers=1, memory_limit=MEMORY_LIMIT, log_dir=log_dir,
                          scheduler_kwargs={"allowed_failures": 0}) as cluster, Client(cluster) as client:
            acted = []
            for i in range(repeat):
                stamp = os.path.join(log_dir, f"stamp-{i}")
                seen = len(kwdiag_events(log_dir, "worker-exit"))
                client.submit(hog, stamp, MEMORY_LIMIT, pure=False)
                exit_event = wait(lambda: kwdiag_events(log_dir, "worker-exit")[seen:])[0]
                with open(stamp) as f:
                    acted.append((exit_event.ts - float(f.read())) * 1000)
                cluster.wait_for_workers(1)
            out["memory->stopped"] = statistics.median(acted)
    return out


# ----------------------------------------------------------------------------- dask
def dask_figures(repeat, failures, saturation):
    import dask
    from distributed import Client, LocalCluster
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Times(SchedulerPlugin):
        def __init__(self):
            self.added, self.removed = [], []

        def add_worker(self, scheduler, worker):
            self.added.append((time.time(), worker))

        def remove_worker(self, scheduler, worker, **kwargs):
            self.removed.append((time.time(), worker))

    out = {}
    with dask.config.set({"distributed.scheduler.worker-saturation": saturation}):
        with LocalCluster(n_workers=WORKERS, threads_per_worker=1, memory_limit=None, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            out.update(throughput(client, repeat))
            if failures:
                times = Times()
                cluster.scheduler.add_plugin(times)
                removed, replaced = [], []
                for _ in range(repeat):
                    client.restart()
                    address, info = busy_worker(client, None)
                    seen = len(times.added)
                    pid = client.run(os.getpid, workers=[address])[address]
                    killed = time.time()
                    os.kill(pid, signal.SIGKILL)
                    removal = wait(lambda: [t for t, w in times.removed if w == address and t >= killed])[0]
                    back = wait(lambda: times.added[seen:])[0][0]
                    removed.append((removal - killed) * 1000)
                    replaced.append((back - killed) * 1000)
                out["kill->removed"] = statistics.median(removed)
                out["kill->replaced"] = statistics.median(replaced)
    if not failures or saturation != "inf":
        return out
    with dask.config.set({"distributed.scheduler.worker-ttl": "3s"}):
        with LocalCluster(n_workers=2, memory_limit=None, dashboard_address=None, processes=True) as cluster, \
                Client(cluster) as client:
            times = Times()
            cluster.scheduler.add_plugin(times)
            address = next(iter(client.scheduler_info()["workers"]))
            pid = client.run(os.getpid, workers=[address])[address]
            stopped = time.time()
            os.kill(pid, signal.SIGSTOP)
            try:
                removal = wait(lambda: [t for t, w in times.removed if w == address], 120)[0]
            finally:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:  # its nanny already replaced it
                    pass
            out["stop->removed"] = (removal - stopped) * 1000
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(n_workers=1, memory_limit=MEMORY_LIMIT, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        times = Times()
        cluster.scheduler.add_plugin(times)
        acted = []
        for i in range(repeat):
            stamp = os.path.join(tmp, f"stamp-{i}")
            seen = len(times.removed)
            client.submit(hog, stamp, MEMORY_LIMIT, pure=False)
            stopped = wait(lambda: times.removed[seen:], 60)[0][0]
            with open(stamp) as f:
                acted.append((stopped - float(f.read())) * 1000)
            client.wait_for_workers(1)
        out["memory->stopped"] = statistics.median(acted)
    return out


def dask_elsewhere(python, repeat, failures, saturation):
    cmd = [python, os.path.abspath(__file__), "--only-dask", "--json", "--repeat", str(repeat),
           "--saturation", saturation, "--workers", str(WORKERS), "--result-kb", str(RESULT_BYTES // 1024)] + \
        ([] if failures else ["--no-failures"])
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if result.returncode:
        raise RuntimeError(f"dask benchmark failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- report
ROWS = [("map", "tasks/s", True), ("chain", "tasks/s", True), ("rtt", "ms", False), ("kill->removed", "ms", False),
        ("kill->replaced", "ms", False), ("stop->removed", "ms", False), ("memory->stopped", "ms", False)]


def report(columns: dict[str, dict]) -> str:
    names = list(columns)
    lines = [f"{'figure':<16}{'unit':<9}" + "".join(f"{n:>26}" for n in names)]
    base = columns.get("kwdiag", {})
    for key, unit, higher_better in ROWS:
        cells = []
        for n in names:
            value = columns[n].get(key)
            if value is None:
                cells.append(f"{'-':>26}")
                continue
            text = f"{value:,.2f}" if key == "rtt" else f"{value:,.1f}"   # a round trip is about 1 ms
            if n != "kwdiag" and key in base and value:
                ratio = base[key] / value if higher_better else value / base[key]
                text += f" (kwdiag {ratio:.2f}x)"
            cells.append(f"{text:>26}")
        lines.append(f"{key:<16}{unit:<9}" + "".join(cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dask-python", help="interpreter that has dask[distributed] installed")
    parser.add_argument("--no-failures", action="store_true", help="throughput only")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (1 thread each) for the throughput")
    parser.add_argument("--result-kb", type=int, default=0, help="each task returns this many KiB (0: a small int)")
    parser.add_argument("--only-dask", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--saturation", default="1.1", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global WORKERS, RESULT_BYTES
    WORKERS, RESULT_BYTES = args.workers, args.result_kb * 1024
    failures = not args.no_failures
    print(f"{WORKERS} workers x 1 thread; results: {f'{args.result_kb} KiB' if RESULT_BYTES else 'small ints'}")
    if args.only_dask:
        print(json.dumps(dask_figures(args.repeat, failures, args.saturation if args.saturation == "inf"
                                      else float(args.saturation))))
        return
    columns = {"kwdiag": kwdiag_figures(args.repeat, failures)}
    print(report(columns), flush=True)
    try:
        import distributed  # noqa: F401
        here = True
    except ImportError:
        here = False
    for label, saturation in (("dask", "1.1"), ("dask (no queuing)", "inf")):
        if here:
            columns[label] = dask_figures(args.repeat, failures, saturation if saturation == "inf"
                                          else float(saturation))
        elif args.dask_python:
            columns[label] = dask_elsewhere(args.dask_python, args.repeat, failures, saturation)
    if len(columns) == 1:
        print("(Dask not measured: install dask[distributed] here or pass --dask-python)")
    print(report(columns))


if __name__ == "__main__":
    main()
