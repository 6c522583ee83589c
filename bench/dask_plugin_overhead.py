"""What the kwdiag.dask plugins cost Dask: map throughput with and without them, side by side in one run.

A Dask LocalCluster (2 workers under nannies, 1 thread each, as bench/runtime_throughput.py) maps
``--tasks`` no-op tasks and gathers them, ``--rounds`` times after a warm-up; the median tasks/s of a
cluster is one sample. Samples alternate between a plain cluster and one with kwdiag's scheduler plugin
preloaded (which installs the nanny and worker plugins everywhere, as ``kwdiag run --dask`` does), each
in a fresh process, ``--repeat`` times; the medians and the overhead are printed. The goal is under 5 %.

    python bench/dask_plugin_overhead.py [--repeat 5] [--tasks 3000] [--rounds 3]

Run it on an otherwise idle machine (``flock /tmp/heavy.lock ...`` on a shared one): the figures are
ratios of the same run, but noise from elsewhere still widens them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def noop(x):
    return x


def one_cluster(variant: str, tasks: int, rounds: int) -> dict:
    """Measure one cluster, in this process; ``variant`` is "plain" or "kwdiag"."""
    import dask.config
    from distributed import Client, LocalCluster

    run_dir = tempfile.mkdtemp(prefix="kwdiag-bench-dask-")
    settings = {"distributed.scheduler.preload": ["kwdiag.dask"], "kwdiag.run-dir": run_dir} if variant == "kwdiag" else {}
    try:
        with dask.config.set(settings), LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                                     dashboard_address=None) as cluster, Client(cluster) as client:
            client.gather(client.map(noop, range(100), key=[f"warm-{i}" for i in range(100)]))
            rates = []
            for r in range(rounds):
                start = time.perf_counter()
                client.gather(client.map(noop, range(r * tasks, (r + 1) * tasks)))
                rates.append(tasks / (time.perf_counter() - start))
        events = sum(1 for name in os.listdir(run_dir) if name.endswith(".jsonl")
                     for _ in open(os.path.join(run_dir, name), encoding="utf-8"))
        return {"rate": statistics.median(rates), "events": events}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def sample(variant: str, tasks: int, rounds: int) -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, os.path.join(here, "dask_plugin_overhead.py"), "--one", variant,
                          "--tasks", str(tasks), "--rounds", str(rounds)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--tasks", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--one", choices=("plain", "kwdiag"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one_cluster(args.one, args.tasks, args.rounds)))
        return
    import distributed

    results: dict[str, list[dict]] = {"plain": [], "kwdiag": []}
    for i in range(args.repeat):
        for variant in (("plain", "kwdiag") if i % 2 == 0 else ("kwdiag", "plain")):  # alternate who goes first
            results[variant].append(sample(variant, args.tasks, args.rounds))
            print(f"  run {i + 1} {variant:<6} {results[variant][-1]['rate']:8.0f} tasks/s", file=sys.stderr)
    plain = statistics.median(r["rate"] for r in results["plain"])
    kwdiag = statistics.median(r["rate"] for r in results["kwdiag"])
    events = statistics.median(r["events"] for r in results["kwdiag"])
    total = args.tasks * args.rounds + 100
    print(f"Dask {distributed.__version__}, LocalCluster 2 workers x 1 thread under nannies, map of {args.tasks} no-op "
          f"tasks, medians of {args.repeat} clusters x {args.rounds} rounds")
    print(f"  without kwdiag plugins  {plain:8.0f} tasks/s")
    print(f"  with kwdiag plugins     {kwdiag:8.0f} tasks/s   ({events:.0f} events for {total} tasks)")
    print(f"  overhead                {100 * (plain - kwdiag) / plain:8.1f} %   (goal: under 5 %)")


if __name__ == "__main__":
    main()
