"""The property test of tests/test_property_dags.py at scale: N random graphs on one real cluster, with kills.

Each example is a random DAG of 100–2,000 tasks (random fan-in and fan-out, dropped futures, cancels, flaky
and failing tasks with retries), up to two worker SIGKILLs and, for some, a scheduler SIGKILL-and-restart
(``tests/dag_faults.py``). Every example must give the in-process evaluation, leave the cluster holding
nothing once its futures are released, and every kill must be diagnosed as ``sudden_exit/sigkill`` with its pid
(checked every ``--diagnose-every`` examples, on the whole run directory). Prints progress, the examples that
failed with their parameters (each then becomes a regular test in tests/test_property_dags.py), and figures.

    python bench/property_dags.py [--examples 10000] [--seed 1] [--diagnose-every 200]

The parameters are drawn as the test's hypothesis strategies draw them, from ``random.Random(--seed)`` so a run
is repeatable (hypothesis adds nothing at this count, and shrinking on a real cluster is not worth its time);
a failure prints its parameters, to rerun it alone with ``tests/dag_faults.py`` or add it to the test's FOUND.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from dag_faults import (DEADLINE, FaultCluster, Plan, _wait, cluster_is_empty, diagnose_stuck,  # noqa: E402
                        expected, run_plan)


def draw_params(rng: random.Random) -> dict:
    return dict(seed=rng.randrange(2**32), n=rng.randint(100, 2000), kills=rng.choice([0, 0, 1, 2]),
                restart=rng.random() < 0.25, fail_rate=rng.choice([0.0, 0.02, 0.1]),
                keep_rate=rng.choice([0.05, 0.2, 1.0]), cancel_rate=rng.choice([0.0, 0.05]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--diagnose-every", type=int, default=200)
    args = parser.parse_args()

    from kwdiag.pipeline import analyze
    from kwdiag.runtime import Client, as_completed

    rng = random.Random(args.seed)
    cluster = FaultCluster(n_workers=3, nthreads=2)
    failures, killed, tasks, restarts = [], [], 0, 0
    started = time.monotonic()
    times = []
    try:
        with Client(scheduler_file=cluster.sf, timeout=30) as client:
            client.wait_for_workers(3, timeout=DEADLINE)
            for k in range(1, args.examples + 1):
                params = draw_params(rng)
                t0 = time.monotonic()
                try:
                    plan = Plan.draw(random.Random(params["seed"]), params["n"], fail_rate=params["fail_rate"],
                                     keep_rate=params["keep_rate"], cancel_rate=params["cancel_rate"],
                                     kills=params["kills"], restart=params["restart"])
                    got = run_plan(client, cluster, plan, random.Random(params["seed"] + 1), as_completed)
                    want = expected(plan)
                    wrong = sum(1 for i, v in want.items() if got["outcomes"].get(i) != v)
                    if wrong:
                        raise AssertionError(f"{wrong} of {len(want)} kept futures differ")
                    killed.extend(got["killed"])
                    restarts += got["restarted"]
                    tasks += plan.n
                    _wait(lambda: cluster_is_empty(client), "the cluster to hold nothing")
                    client.wait_for_workers(3, timeout=DEADLINE)
                    if k % args.diagnose_every == 0 or k == args.examples:
                        deaths = [d for d in analyze([cluster.logs]).deaths if d.cause != "chose_to_exit"]
                        causes = Counter((d.cause, d.detail) for d in deaths)
                        if causes != Counter({("sudden_exit", "sigkill"): len(killed)}) \
                                or sorted(d.pid for d in deaths) != sorted(killed):
                            raise AssertionError(f"diagnosis: {dict(causes)} for {len(killed)} kills")
                except Exception as exc:
                    failures.append((params, f"{type(exc).__name__}: {exc}"))
                    print(f"FAILED example {k}: {params}: {type(exc).__name__}: {exc}", flush=True)
                    print(diagnose_stuck(client), flush=True)
                    del exc
                    import gc

                    gc.collect()   # the failure's traceback held the example's futures: let them go
                    if len(failures) >= 5:
                        break
                    client.wait_for_workers(3, timeout=DEADLINE)
                times.append(time.monotonic() - t0)
                if k % 100 == 0:
                    elapsed = time.monotonic() - started
                    print(f"{k} examples, {len(failures)} failed, {tasks:,} tasks, {len(killed)} workers killed, "
                          f"{restarts} scheduler restarts, {elapsed / 60:.1f} min", flush=True)
    finally:
        cluster.close()
    elapsed = time.monotonic() - started
    times.sort()
    print(f"\nexamples {len(times)}, failed {len(failures)}; tasks {tasks:,}; workers SIGKILLed {len(killed)} "
          f"(all diagnosed: {not any('diagnosis' in f[1] for f in failures)}); scheduler restarts {restarts}")
    if times:
        print(f"time per example: median {times[len(times) // 2]:.2f} s, p95 {times[int(len(times) * 0.95)]:.2f} s, "
              f"max {times[-1]:.2f} s; total {elapsed / 60:.1f} min")
    for params, why in failures:
        print(f"  {params}: {why}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
