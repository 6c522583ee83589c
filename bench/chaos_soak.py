"""Chaos soak: a dependency graph computed correctly while workers are killed, stopped, terminated and
memory-bombed at random — and every injected fault found in the diagnosis with the right cause.

A local cluster of 3 workers (nannies, 400 MiB each) computes leaves ``x_i = i*i``, pairs
``y_i = x_i + x_{i+1}``, chunk sums of the pairs and a total (about 10,000 tasks by default) while a
seeded chaos loop picks a random worker every few seconds and does one of:

  sigkill        SIGKILL                        -> expect sudden_exit/sigkill
  sigterm        SIGTERM to the worker process  -> expect sudden_exit/sigterm
  stop-long      SIGSTOP past the time-to-live  -> expect sudden_exit/heartbeat_timeout
  stop-short     SIGSTOP well within it, SIGCONT -> expect no death at all
  memory         a task on it that allocates until the nanny acts -> expect nanny_memory_restart

Every result is checked against the same arithmetic done locally. Prints: tasks, faults injected,
faults diagnosed correctly, results wrong (must be 0), deaths nobody injected (must be 0), time.

    python bench/chaos_soak.py [--tasks 10000] [--seed 1] [--every 2] [--task-ms 10] [--max-faults 30]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

TTL = 2.0  # the soak's worker time-to-live by default; the suite's shorter soak passes a roomier one
EXPECTED = {"sigkill": ("sudden_exit", "sigkill"), "sigterm": ("sudden_exit", "sigterm"),
            "stop-long": ("sudden_exit", "heartbeat_timeout"), "memory": ("nanny_memory_restart", "memory_limit")}


TASK_SECONDS = float(os.environ.get("KWDIAG_SOAK_TASK_MS", "10")) / 1000  # set before the cluster starts


def leaf(i):
    time.sleep(TASK_SECONDS)
    return i * i


def add(a, b):
    time.sleep(TASK_SECONDS)
    return a + b


def total(*values):
    return sum(values)


def bomb(marker):
    """Allocate until the nanny steps in — once: a retry (after the restart) finds the marker and returns."""
    if os.path.exists(marker):
        return "spared"
    open(marker, "w").close()
    blocks = []
    for _ in range(48):  # 1.2 GiB at most, well past the 400 MiB limit: never a job for the kernel's OOM killer
        blocks.append(bytearray(25 * 2**20))
        time.sleep(0.02)
    time.sleep(600)  # hold it until the nanny acts


@dataclass
class Fault:
    kind: str
    worker: str
    pid: int
    at: float


class Chaos(threading.Thread):
    def __init__(self, client, seed: int, every: float, scratch: str, kinds: list[str] | None = None,
                 max_faults: int = 30, ttl: float = TTL):
        super().__init__(daemon=True)
        self.ttl = ttl
        # Bounded: faults arriving faster than the graph recovers could otherwise keep it from finishing.
        self.max_faults = max_faults
        self.script = list(kinds or [])  # fault kinds to inject in this order; random when empty
        self.client = client
        self.random = random.Random(seed)
        self.every = every
        self.scratch = scratch
        self.faults: list[Fault] = []
        self.stop_event = threading.Event()
        self.bombs: list = []

    def run(self) -> None:
        while len(self.faults) < self.max_faults:
            if self.stop_event.wait(self.every * self.random.uniform(0.6, 1.4)):
                return
            try:
                self.inject()
            except Exception as exc:  # the client may be between states; try again next round
                print(f"chaos: skipped a round ({type(exc).__name__}: {exc})", file=sys.stderr)

    def inject(self) -> None:
        running = [i for i in self.client.scheduler_info()["workers"].values() if i["status"] == "running"]
        if len(running) < 2:
            return  # keep the job moving: never hit the last worker standing
        target = self.random.choice(sorted(running, key=lambda i: i["name"]))
        if self.script:
            kind = self.script[len(self.faults) % len(self.script)]
        else:
            kind = self.random.choice(["sigkill", "sigterm", "stop-long", "stop-short", "memory"])
        name, pid = target["name"], target["pid"]
        at = time.time()
        try:
            if kind == "sigkill":
                os.kill(pid, signal.SIGKILL)
            elif kind == "sigterm":
                os.kill(pid, signal.SIGTERM)
            elif kind == "stop-long":
                os.kill(pid, signal.SIGSTOP)
                try:  # held until the scheduler gives up on it, even if the job ends meanwhile
                    self.wait_until_removed(pid)
                finally:
                    self.resume(pid)
            elif kind == "stop-short":
                os.kill(pid, signal.SIGSTOP)
                time.sleep(self.ttl / 4)
                self.resume(pid)
            elif kind == "memory":
                marker = os.path.join(self.scratch, f"bomb-{len(self.faults)}")
                future = self.client.submit(bomb, marker, workers=[name], pure=False, priority=10)
                self.bombs.append(future)
                # Let it land before the next fault: a bomb whose worker is killed first never goes off.
                self.faults.append(Fault(kind, name, pid, at))
                try:
                    future.result(timeout=60)
                except Exception:
                    pass
                return
        except ProcessLookupError:
            return  # it died of something else first: nothing was injected
        self.faults.append(Fault(kind, name, pid, at))

    def wait_until_removed(self, pid: int, deadline: float = 120.0) -> None:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if all(i["pid"] != pid for i in self.client.scheduler_info()["workers"].values()):
                return
            time.sleep(0.1)

    @staticmethod
    def resume(pid: int) -> None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # its nanny killed it after the scheduler gave up on it: as expected


def soak(n_tasks: int = 10_000, seed: int = 1, every: float = 2.0, log_dir: str | None = None,
         kinds: list[str] | None = None, max_faults: int = 30, ttl: float = TTL) -> dict:
    from kwdiag.pipeline import analyze
    from kwdiag.runtime import Client, LocalCluster

    started = time.monotonic()
    n_leaves = max(10, (n_tasks - 1) * 100 // 201)  # leaves + pairs + chunk sums + total ~= n_tasks
    log_dir = log_dir or tempfile.mkdtemp(prefix="kwdiag-soak-")
    with LocalCluster(n_workers=3, threads_per_worker=2, memory_limit="400MiB", log_dir=log_dir,
                      scheduler_kwargs={"allowed_failures": 50, "worker_ttl": f"{ttl}s",
                                        "heartbeat_interval": "0.25s"}) as cluster, Client(cluster) as client:
        chaos = Chaos(client, seed, every, log_dir, kinds, max_faults, ttl)
        chaos.start()
        xs = client.map(leaf, range(n_leaves))
        ys = [client.submit(add, xs[i], xs[i + 1]) for i in range(n_leaves - 1)]
        chunks = [client.submit(total, *ys[j:j + 100]) for j in range(0, len(ys), 100)]
        final = client.submit(total, *chunks)
        answer = final.result(timeout=1800)
        if kinds:  # a scripted run injects every fault it promised, even if the graph finished first
            chaos.join(timeout=600)
        chaos.stop_event.set()
        chaos.join()
        got_x, got_y, got_chunks = client.gather(xs), client.gather(ys), client.gather(chunks)
        client.gather(chaos.bombs, errors="skip")
        submitted = client.scheduler_info()["counters"]["submitted"]
    want_x = [i * i for i in range(n_leaves)]
    want_y = [want_x[i] + want_x[i + 1] for i in range(n_leaves - 1)]
    want_chunks = [sum(want_y[j:j + 100]) for j in range(0, len(want_y), 100)]
    wrong = (sum(a != b for a, b in zip(got_x, want_x)) + sum(a != b for a, b in zip(got_y, want_y))
             + sum(a != b for a, b in zip(got_chunks, want_chunks)) + (answer != sum(want_chunks)))
    elapsed = time.monotonic() - started

    outcomes, uninjected = judge(chaos.faults, analyze([log_dir]))
    return {"tasks": submitted, "faults": len(chaos.faults),
            "by_kind": {k: sum(f.kind == k for f in chaos.faults) for k in sorted({f.kind for f in chaos.faults})},
            "diagnosed": sum(ok for _, ok, _ in outcomes), "wrong_results": wrong,
            "uninjected_deaths": [f"{d.worker}#{d.incarnation} {d.cause}/{d.detail}" for d in uninjected],
            "misdiagnosed": [f"{f.kind} on {f.worker} (pid {f.pid}): got "
                             f"{(d.cause + '/' + d.detail) if d else 'no death'}" for f, ok, d in outcomes if not ok],
            "faults_list": [(f.kind, f.worker, f.pid) for f in chaos.faults],
            "seconds": round(elapsed, 1), "log_dir": log_dir}


def judge(faults: list, report) -> tuple[list, list]:
    """Match each injected worker fault to the death the analyzer found: ``(outcomes, deaths nobody injected)``.

    An outcome is ``(fault, diagnosed right, death or None)``; kinds not in ``EXPECTED`` (other than
    ``stop-short``, which must cause no death) are left to the caller."""
    deaths = [d for d in report.deaths if not (d.cause == "chose_to_exit" and d.detail == "shutdown")]
    used: set[int] = set()
    outcomes = []
    for fault in faults:
        if fault.kind not in EXPECTED:
            continue
        cause = EXPECTED[fault.kind]
        if fault.kind == "memory":  # the bomb may run on a later incarnation of the worker it targeted
            match = next((i for i, d in enumerate(deaths) if i not in used and d.worker == fault.worker
                          and (d.cause, d.detail) == cause and (d.at or 0) >= fault.at - 1), None)
        else:
            match = next((i for i, d in enumerate(deaths) if i not in used and d.pid == fault.pid), None)
        if match is not None:
            used.add(match)
        found = deaths[match] if match is not None else None
        outcomes.append((fault, found is not None and (found.cause, found.detail) == cause, found))
    for fault in faults:
        if fault.kind == "stop-short":  # a pause within the time-to-live must not be taken for a death
            found = next((d for i, d in enumerate(deaths) if i not in used and d.pid == fault.pid), None)
            outcomes.append((fault, found is None, found))
    return outcomes, [d for i, d in enumerate(deaths) if i not in used]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--every", type=float, default=2.0, help="mean seconds between faults")
    parser.add_argument("--task-ms", type=float, default=10.0, help="how long each leaf and pair task sleeps")
    parser.add_argument("--max-faults", type=int, default=30, help="stop injecting after this many faults")
    args = parser.parse_args()
    os.environ["KWDIAG_SOAK_TASK_MS"] = str(args.task_ms)  # the workers inherit it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.abspath(__file__)),
                                                             os.environ.get("PYTHONPATH")]))
    import chaos_soak  # task functions pickle by reference to this module, importable by the workers

    r = chaos_soak.soak(args.tasks, args.seed, args.every, max_faults=args.max_faults)
    print(f"tasks                {r['tasks']:,}")
    print(f"faults injected      {r['faults']}  {r['by_kind']}")
    print(f"faults diagnosed     {r['diagnosed']} of {r['faults']} correctly")
    print(f"results wrong        {r['wrong_results']}")
    print(f"deaths not injected  {len(r['uninjected_deaths'])} {r['uninjected_deaths'] or ''}")
    for line in r["misdiagnosed"]:
        print(f"  misdiagnosed: {line}")
    print(f"time                 {r['seconds']} s   (logs: {r['log_dir']})")


if __name__ == "__main__":
    main()
