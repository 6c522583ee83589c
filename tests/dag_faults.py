"""Random task graphs run on a real kwdiag cluster while workers are SIGKILLed and the scheduler restarts.

``Plan.draw(rng, ...)`` makes a DAG of n tasks (random fan-in and fan-out, chains and wide joins),
decides which futures the client keeps (the rest are dropped at once, as a rebinding loop drops them),
which kept ones it cancels, which tasks fail (some a few times, retried; some always), how many workers
are SIGKILLed and whether the scheduler is SIGKILLed and started again, and at what point of the run.
``expected(plan)`` evaluates the same DAG in-process. ``FaultCluster`` is a scheduler and workers started
as a user starts them (``kwdiag scheduler``/``kwdiag worker`` with nannies, one run directory);
``run_plan`` submits the DAG the way users write it (one ``submit`` per task, futures as arguments),
injects the faults while results arrive, and returns what the client saw. ``test_property_dags`` and
``bench/property_dags.py`` use these.

Does not cover: deciding pass or fail (the callers compare), or KilledWorker (at most two kills per run,
below the allowed failures, so every task must end with its own value or error).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from kwdiag.runtime.spawn import child_env, module_command

MODULUS = 1_000_003
DEADLINE = 180.0


class PlannedFailure(ValueError):
    """What a failing task raises."""


def node(i: int, attempts_dir: str | None, fails: int, *inputs: int) -> int:
    """Task ``i``: fails its first ``fails`` attempts (counted in files, across workers; -1: always), then
    returns ``(i + sum(inputs)) mod MODULUS``."""
    if fails:
        attempt = len(os.listdir(attempts_dir)) if os.path.isdir(attempts_dir) else 0
        if fails < 0 or attempt < fails:
            if os.path.isdir(attempts_dir):
                open(os.path.join(attempts_dir, f"{i}-{attempt}-{os.getpid()}"), "w").close()
            raise PlannedFailure(f"task {i}, attempt {attempt}")
    return (i + sum(inputs)) % MODULUS


@dataclass
class Plan:
    n: int
    deps: list[list[int]]
    fails: dict[int, int]            # task -> failing attempts (-1: always)
    retries: dict[int, int]          # task -> retries
    keep: set[int]                   # futures the client holds to the end
    cancel: list[int]                # kept futures it cancels right after submitting
    kills: list[float] = field(default_factory=list)   # fractions of the kept results after which a worker dies
    restart_at: float | None = None  # fraction after which the scheduler is SIGKILLed and started again

    @classmethod
    def draw(cls, rng: random.Random, n: int, fail_rate: float = 0.03, keep_rate: float = 0.2,
             cancel_rate: float = 0.02, kills: int = 0, restart: bool = False) -> "Plan":
        deps: list[list[int]] = []
        for i in range(n):
            if i == 0:
                deps.append([])
                continue
            shape = rng.random()
            if shape < 0.45:       # a chain link (what a rebinding loop makes)
                chosen = [i - 1]
            elif shape < 0.8:      # a small join of recent and older results
                chosen = rng.sample(range(i), min(i, rng.randint(1, 4)))
            elif shape < 0.9:      # a wide fan-in
                chosen = rng.sample(range(i), min(i, rng.randint(5, 30)))
            else:                  # a new root
                chosen = []
            deps.append(sorted(set(chosen)))
        fails, retries = {}, {}
        for i in range(n):
            if rng.random() < fail_rate:
                kind = rng.random()
                if kind < 0.5:     # flaky, retried enough
                    fails[i] = rng.randint(1, 2)
                    retries[i] = fails[i] + rng.randint(0, 1)
                else:              # always fails (sometimes with retries that cannot help)
                    fails[i] = -1
                    retries[i] = rng.choice([0, 0, 1])
        has_dependents = {d for ds in deps for d in ds}
        keep = {i for i in range(n) if i not in has_dependents or rng.random() < keep_rate}
        cancel = sorted(rng.sample(sorted(keep), min(len(keep), int(cancel_rate * len(keep)))))
        return cls(n, deps, fails, retries, keep, cancel, sorted(rng.random() * 0.8 for _ in range(kills)),
                   rng.uniform(0.1, 0.7) if restart else None)


def cancelled_closure(plan: Plan) -> set[int]:
    """Kept tasks a cancel reaches: the cancelled ones and, through kept dependents only, what depends on them
    (Dask's rule: a cancel also cancels the dependents the client holds)."""
    dependents: dict[int, list[int]] = {}
    for i, ds in enumerate(plan.deps):
        for d in ds:
            dependents.setdefault(d, []).append(i)
    out, stack = set(), list(plan.cancel)
    while stack:
        i = stack.pop()
        if i in out:
            continue
        out.add(i)
        stack.extend(j for j in dependents.get(i, ()) if j in plan.keep)
    return out


def expected(plan: Plan) -> dict[int, Any]:
    """Each kept task's value, ``"PlannedFailure"`` for one that errs, ``"cancelled"`` for a cancelled one."""
    values: dict[int, Any] = {}
    for i in range(plan.n):
        fails, retries = plan.fails.get(i, 0), plan.retries.get(i, 0)
        if fails < 0 or fails > retries or any(values[d] is None for d in plan.deps[i]):
            values[i] = None
        else:
            values[i] = (i + sum(values[d] for d in plan.deps[i])) % MODULUS
    cancelled = cancelled_closure(plan)
    return {i: "cancelled" if i in cancelled else ("PlannedFailure" if values[i] is None else values[i])
            for i in sorted(plan.keep)}


class FaultCluster:
    """A scheduler (journal on) and ``n_workers`` workers with nannies, started as a user starts them."""

    def __init__(self, n_workers: int = 3, nthreads: int = 2, root: str | None = None):
        self.root = root or tempfile.mkdtemp(prefix="kwdiag-dags-")
        self.sf = os.path.join(self.root, "scheduler.json")
        self.logs = os.path.join(self.root, "logs")
        self.env = child_env({"KWDIAG_SECRET": ""})
        self.command = ["scheduler", "--scheduler-file", self.sf, "--port", "0", "--log-dir", self.logs,
                        "--set", "recovery_wait=30s"]
        self.scheduler = self._spawn(self.command, "scheduler-1")
        self.restarts = 0
        self.workers = []
        _wait(lambda: os.path.exists(self.sf), "the scheduler file")
        for k in range(n_workers):
            self.workers.append(self._spawn(["worker", "--scheduler-file", self.sf, "--name", f"w{k}",
                                             "--nthreads", str(nthreads), "--log-dir", self.logs], f"w{k}"))

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen:
        with open(os.path.join(self.root, f"{name}.out"), "ab") as out:
            return subprocess.Popen(module_command("kwdiag", *args), stdout=out, stderr=out,
                                    stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)

    def restart_scheduler(self) -> None:
        self.scheduler.send_signal(signal.SIGKILL)
        self.scheduler.wait(10)
        self.restarts += 1
        self.scheduler = self._spawn(self.command, f"scheduler-{self.restarts + 1}")

    def close(self) -> None:
        for proc in [*self.workers, self.scheduler]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.workers, self.scheduler]:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if not os.environ.get("KWDIAG_KEEP_DAGS"):   # set it to read the processes' output after a failure
            shutil.rmtree(self.root, ignore_errors=True)


def _wait(condition: Any, what: str, timeout: float = DEADLINE) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


def _kill_a_worker(client: Any, rng: random.Random, killed: list[int]) -> int | None:
    """SIGKILL one live worker process the scheduler lists (not one killed already: the scheduler may list a
    dead worker for a moment, and a zombie takes a signal without complaint)."""
    import psutil

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False
    pids = [w["pid"] for w in client.scheduler_info()["workers"].values()
            if w["status"] == "running" and w["pid"] and w["pid"] not in killed and alive(w["pid"])]
    if not pids:
        return None
    pid = rng.choice(sorted(pids))
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    return pid


def run_plan(client: Any, cluster: FaultCluster, plan: Plan, rng: random.Random, as_completed: Any) -> dict:
    """Submit ``plan`` as users write it, inject its faults while results arrive, and return what the client
    saw: ``{"outcomes": {task: value | exception name | "cancelled"}, "killed": [pids], "restarted": bool}``."""
    attempts = tempfile.mkdtemp(prefix="kwdiag-attempts-")
    try:
        futures: dict[int, Any] = {}
        for i in range(plan.n):
            folder = None
            if plan.fails.get(i):
                folder = os.path.join(attempts, str(i))
                os.makedirs(folder, exist_ok=True)
            futures[i] = client.submit(node, i, folder, plan.fails.get(i, 0), *[futures[d] for d in plan.deps[i]],
                                       retries=plan.retries.get(i) or None, pure=False)
            # A future nobody keeps is dropped once its last dependent is submitted (at once if it has none).
            for d in [*plan.deps[i], i]:
                if d not in plan.keep and d in futures and all(j <= i for j in _dependents_of(plan, d)):
                    del futures[d]
        kept = {i: futures[i] for i in sorted(plan.keep)}
        del futures
        client.cancel([kept[i] for i in plan.cancel])
        killed, restarted = [], False
        triggers = sorted([(f, "kill") for f in plan.kills] +
                          ([(plan.restart_at, "restart")] if plan.restart_at is not None else []))
        done = 0
        live = [f for i, f in kept.items() if not f.cancelled()]
        for _ in as_completed(live, timeout=DEADLINE):
            done += 1
            while triggers and done >= triggers[0][0] * len(live):
                _, what = triggers.pop(0)
                if what == "kill":
                    pid = _kill_a_worker(client, rng, killed)
                    if pid is not None:
                        killed.append(pid)
                else:
                    cluster.restart_scheduler()
                    restarted = True
        outcomes = {}
        for i, f in kept.items():
            if f.status == "cancelled":
                outcomes[i] = "cancelled"
            elif f.status == "error":
                outcomes[i] = type(f.exception()).__name__
            else:
                outcomes[i] = f.result(timeout=DEADLINE)
        return {"outcomes": outcomes, "killed": killed, "restarted": restarted}
    finally:
        shutil.rmtree(attempts, ignore_errors=True)


def _dependents_of(plan: Plan, d: int) -> list[int]:
    cache = plan.__dict__.setdefault("_dependents", None)
    if cache is None:
        cache = {}
        for i, ds in enumerate(plan.deps):
            for x in ds:
                cache.setdefault(x, []).append(i)
        plan.__dict__["_dependents"] = cache
    return cache.get(d, [])


def diagnose_stuck(client: Any) -> str:
    """What the scheduler and the workers say of the futures still pending (for a failure's message)."""
    import gc

    from kwdiag.runtime.client import Future

    lines = []
    pending = [o for o in gc.get_objects() if type(o) is Future and o.status == "pending" and o.client is client]
    lines.append(f"{len(pending)} pending futures; scheduler tasks {client.scheduler_info()['tasks']}")
    asked: set[str] = set()
    keys = [f.key for f in pending[:5]]
    while keys and len(asked) < 12:
        key = keys.pop(0)
        if key in asked:
            continue
        asked.add(key)
        try:
            info = client._request("get-task-spec", key=key, timeout=10)
            lines.append(f"  {key}: scheduler says {info['state']} on {info.get('processing_on')} (executing "
                         f"{info.get('executing')}), holders {info.get('who_has')}, missing {info['missing']}")
            keys.extend(info["missing"])
        except Exception as exc:
            lines.append(f"  {key}: scheduler says {type(exc).__name__}: {exc}")
    try:
        for address, state in client.run(_worker_state).items():
            lines.append(f"  worker {address}: {state}")
    except Exception as exc:
        lines.append(f"  workers: {type(exc).__name__}: {exc}")
    return "\n".join(lines)


def _worker_state(dask_worker: Any) -> dict:
    w = dask_worker
    return {"specs": sorted(w.specs)[:5], "waiting": {k: sorted(v) for k, v in list(w.waiting.items())[:5]},
            "executing": sorted(w.executing), "free": w.free_threads, "data": len(w.data), "ready": w.ready[:5],
            "cancelled": sorted(w.cancelled)[:5]}


def cluster_is_empty(client: Any) -> bool:
    """The scheduler holds no task and no worker holds a result (False while a worker cannot be asked)."""
    from kwdiag.runtime import CommClosedError

    try:
        if client.scheduler_info()["tasks"]:
            return False
        return not any(client.run(_held).values())
    except CommClosedError:   # a worker killed a moment ago, still listed: ask again
        return False


def _held(dask_worker: Any) -> int:
    return len(dask_worker.data)


if __name__ == "__main__":  # pragma: no cover  (a quick manual run: python tests/dag_faults.py SEED N)
    from kwdiag.runtime import Client, as_completed as ac

    seed, n = int(sys.argv[1]), int(sys.argv[2])
    cluster = FaultCluster()
    try:
        with Client(scheduler_file=cluster.sf) as c:
            plan = Plan.draw(random.Random(seed), n, kills=1, restart=True)
            got = run_plan(c, cluster, plan, random.Random(seed), ac)
            print(got["outcomes"] == expected(plan), got["killed"], got["restarted"])
    finally:
        cluster.close()
