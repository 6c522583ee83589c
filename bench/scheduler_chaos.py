"""Scheduler chaos: a dependency graph computed correctly on a multi-host-style cluster whose scheduler is
SIGKILLed and started again mid-run, while workers are partitioned (SIGSTOP), killed and terminated and the
client's connection is broken — every result checked, every task accounted for, every death diagnosed.

The cluster is what a user starts by hand on several machines: one ``kwdiag scheduler --scheduler-file``
process and three ``kwdiag worker --scheduler-file`` processes (each with its nanny), all on loopback, and
this process as the client (by scheduler file). The graph is chaos_soak's (leaves, pairs, chunk sums, a
total: about 10,000 tasks by default). A scripted list of faults (20 by default) is injected one at a time:

  scheduler-kill     SIGKILL the scheduler, start it again with the same command
                     -> expect a `scheduler-recovered` note naming the dead scheduler's pid
  client-disconnect  break the client's connection and keep it away ~1.5 s -> it comes back knowing its futures
  stop-long          SIGSTOP a worker past the time-to-live     -> sudden_exit/heartbeat_timeout
  stop-short         SIGSTOP well within it, then SIGCONT         -> no death at all
  sigkill, sigterm   to a worker process                          -> sudden_exit/sigkill, sudden_exit/sigterm

Prints: tasks, faults, faults diagnosed right, wrong results (must be 0), tasks lost (must be 0), for each
scheduler restart the tasks recomputed (the scheduler's own count, and re-executions of tasks that had
finished before the kill, read from an execution log the tasks write), the seconds from the scheduler's
return to the first finished task (median, max), connections refused (must be 0), deaths nobody injected.

    python bench/scheduler_chaos.py [--tasks 10000] [--faults 20] [--seed 1] [--every 2] [--task-ms 10]
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chaos_soak import Chaos, Fault, judge  # noqa: E402  (a sibling bench: its fault machinery and its judge)

TASK_SECONDS = float(os.environ.get("KWDIAG_SOAK_TASK_MS", "10")) / 1000
SCRIPT = ["stop-short", "scheduler-kill", "sigkill", "client-disconnect", "stop-long", "sigterm", "stop-short",
          "client-disconnect", "scheduler-kill", "sigkill", "stop-long", "stop-short", "sigterm",
          "client-disconnect", "stop-long", "sigkill", "stop-short", "sigterm", "client-disconnect", "stop-long"]


def _log_execution(kind: str, index: int, started: float) -> None:
    path = os.environ.get("KWDIAG_SOAK_EXECLOG")
    if path:  # one short O_APPEND write per execution: whole lines, even from several processes
        with open(path, "a") as f:
            f.write(f"{kind} {index} {started:.6f} {time.time():.6f}\n")


def leaf(i):
    started = time.time()
    time.sleep(TASK_SECONDS)
    _log_execution("leaf", i, started)
    return i * i


def pair(a, b, i):
    started = time.time()
    time.sleep(TASK_SECONDS)
    _log_execution("pair", i, started)
    return a + b


def chunk(j, *values):
    _log_execution("chunk", j, time.time())
    return sum(values)


def total(*values):
    return sum(values)


class CliCluster:
    """``kwdiag scheduler`` and ``kwdiag worker`` processes, started as a user starts them on several hosts."""

    def __init__(self, log_dir: str, n_workers: int, ttl: float, env: dict):
        from kwdiag.runtime.spawn import child_env

        self.log_dir = log_dir
        self.scheduler_file = os.path.join(log_dir, "scheduler.json")
        self.env = child_env({**env, "KWDIAG_SECRET": ""})
        self.command = ["scheduler", "--scheduler-file", self.scheduler_file, "--port", "0", "--log-dir", log_dir,
                        "--set", f"worker_ttl={ttl}s", "--set", "heartbeat_interval=0.25s",
                        "--set", "allowed_failures=50"]
        self.starts = 0
        self.scheduler = self.start_scheduler()
        deadline = time.monotonic() + 60
        while not os.path.exists(self.scheduler_file):
            if time.monotonic() > deadline or self.scheduler.poll() is not None:
                raise RuntimeError("the scheduler did not start (see scheduler-1.log)")
            time.sleep(0.02)
        self.workers = [self._spawn(["worker", "--scheduler-file", self.scheduler_file, "--name", f"worker-{i}",
                                     "--nthreads", "2", "--memory-limit", "400MiB", "--log-dir", log_dir],
                                    f"worker-{i}.log") for i in range(n_workers)]

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen:
        from kwdiag.runtime.spawn import module_command

        with open(os.path.join(self.log_dir, log_name), "ab") as log:
            return subprocess.Popen(module_command("kwdiag", *args), stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)

    def start_scheduler(self) -> subprocess.Popen:
        """The same command every time, as systemd or a SLURM requeue would run it."""
        self.starts += 1
        return self._spawn(self.command, f"scheduler-{self.starts}.log")

    def close(self) -> None:
        if self.scheduler.poll() is None:
            self.scheduler.send_signal(signal.SIGTERM)   # a clean close: it tells the workers to leave
        for proc in [self.scheduler, *self.workers]:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class SchedulerChaos(Chaos):
    """chaos_soak's worker faults, plus the scheduler's death and return and a broken client connection."""

    def __init__(self, client, cluster: CliCluster, script: list[str], every: float, ttl: float):
        super().__init__(client, seed=1, every=every, scratch=cluster.log_dir, kinds=script,
                         max_faults=len(script), ttl=ttl)
        self.cluster = cluster
        self.restarts: list[dict] = []

    def inject(self) -> None:
        kind = self.script[len(self.faults) % len(self.script)]
        if kind == "scheduler-kill":
            self.kill_scheduler()
        elif kind == "client-disconnect":
            self.disconnect_client()
        else:
            super().inject()

    def kill_scheduler(self) -> None:
        old = self.cluster.scheduler
        at = time.time()
        old.send_signal(signal.SIGKILL)
        old.wait()
        self.faults.append(Fault("scheduler-kill", "scheduler", old.pid, at))
        self.cluster.scheduler = self.cluster.start_scheduler()
        restart = {"pid": old.pid, "killed": at, "restarted": time.time()}
        self.restarts.append(restart)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # back, recovered, and computing again (or nothing left to compute)
            try:
                info = self.client.scheduler_info()
            except Exception:
                time.sleep(0.05)
                continue
            recovery = info.get("recovery") or {}
            busy = any(w["processing"] for w in info["workers"].values())
            if recovery and not recovery["open"] and (info["first_finished_after"] is not None or not busy):
                restart.update(first_finished_after=info["first_finished_after"], recovery=recovery)
                return
            time.sleep(0.02)

    def disconnect_client(self) -> None:
        def reconnects(log_dir: str) -> int:
            return len(events(log_dir, "reconnected", source="client"))

        before = reconnects(self.cluster.log_dir)
        at = time.time()
        client = self.client

        def break_it() -> None:
            stream = client._stream
            if stream is not None:
                stream.comm.abort()
            time.sleep(1.5)  # the client's loop stalls: it stays away a while before it reconnects

        client._loop.call(break_it)
        deadline = time.monotonic() + 60
        while reconnects(self.cluster.log_dir) <= before and time.monotonic() < deadline:
            time.sleep(0.05)
        self.faults.append(Fault("client-disconnect", "client", os.getpid(), at))


def events(log_dir: str, kind: str, source: str | None = None) -> list:
    """The kwdiag events of ``kind`` in ``log_dir``, in time order (a half-written last line is skipped)."""
    import glob

    from kwdiag.events import from_json_line

    out = []
    for path in glob.glob(os.path.join(log_dir, "*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if f'"kind":"{kind}"' in line and line.endswith("\n"):
                    e = from_json_line(line)
                    if source is None or e.source == source:
                        out.append(e)
    return sorted(out, key=lambda e: e.ts)


def executions(path: str) -> dict[tuple[str, int], list[tuple[float, float]]]:
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    kind, index, start, end = line.split()
                    runs.setdefault((kind, int(index)), []).append((float(start), float(end)))
    return runs


def reexecuted_after_restarts(restarts: list[dict], runs: dict, key_of: dict, removed: list) -> list[int]:
    """For each restart: tasks that had finished before the kill and ran again before the next kill, which no
    worker's death explains (its ``worker-removed`` event lists the key as lost or rerouted in between)."""
    out = []
    for k, restart in enumerate(restarts):
        start = restart["killed"]
        end = restarts[k + 1]["killed"] if k + 1 < len(restarts) else float("inf")
        count = 0
        for task, spans in runs.items():
            done = [e for _, e in spans if e < start]
            again = [s for s, _ in spans if start <= s < end]
            if not done or not again:
                continue
            key = key_of.get(task)
            explained = any(key in e.fields.get("lost", ()) or key in e.fields.get("rerouted", ())
                            for e in removed if max(done) <= e.ts <= min(again))
            count += not explained
        out.append(count)
    return out


def diagnose(chaos: SchedulerChaos, log_dir: str) -> tuple[list, list]:
    """chaos_soak's judge for worker faults; scheduler deaths must be recovered notes naming their pid, and a
    broken client connection must be no death and a client that came back known to the scheduler."""
    from kwdiag.pipeline import analyze

    report = analyze([log_dir])
    outcomes, uninjected = judge(chaos.faults, report)
    recovered = {n.fields.get("previous_pid") for n in report.notes if n.kind == "scheduler-recovered"}
    back = events(log_dir, "reconnected", source="client")
    for fault in chaos.faults:
        if fault.kind == "scheduler-kill":
            outcomes.append((fault, fault.pid in recovered, None))
        elif fault.kind == "client-disconnect":
            outcomes.append((fault, any(e.ts >= fault.at and e.fields.get("known") for e in back), None))
    return outcomes, uninjected


def soak(n_tasks: int = 10_000, script: list[str] | None = None, every: float = 2.0, ttl: float = 2.0,
         log_dir: str | None = None) -> dict:
    from kwdiag.runtime import Client

    script = list(script or SCRIPT)
    started = time.monotonic()
    log_dir = log_dir or tempfile.mkdtemp(prefix="kwdiag-scheduler-chaos-")
    os.makedirs(log_dir, exist_ok=True)
    execlog = os.path.join(log_dir, "executions.txt")
    env = {"KWDIAG_SOAK_EXECLOG": execlog, "KWDIAG_SOAK_TASK_MS": str(TASK_SECONDS * 1000)}
    os.environ["KWDIAG_LOG_DIR"] = log_dir   # the client's events go there too
    n_leaves = max(10, (n_tasks - 1) * 100 // 201)
    cluster = CliCluster(log_dir, 3, ttl, env)
    try:
        with Client(scheduler_file=cluster.scheduler_file, timeout=30) as client:
            # Faults start once the workers are up: a scheduler killed before any worker registered (a loaded CI
            # box starts them slowly) had nothing to recover and no first task to time.
            client.wait_for_workers(3, timeout=120)
            chaos = SchedulerChaos(client, cluster, script, every, ttl)
            chaos.start()
            xs = client.map(leaf, range(n_leaves))
            ys = [client.submit(pair, xs[i], xs[i + 1], i) for i in range(n_leaves - 1)]
            chunks = [client.submit(chunk, j // 100, *ys[j:j + 100]) for j in range(0, len(ys), 100)]
            final = client.submit(total, *chunks)
            answer = final.result(timeout=1800)
            chaos.join(timeout=900)   # every scripted fault is injected, even if the graph finished first
            chaos.stop_event.set()
            chaos.join()
            everything = [*xs, *ys, *chunks, final]
            # Results lost to a late fault are being recomputed: gathering waits for them. Lost is what erred or
            # was cancelled, or never came back.
            got_x, got_y, got_chunks = (client.gather(g, errors="skip", timeout=600) for g in (xs, ys, chunks))
            statuses = collections.Counter(f.status for f in everything)
            lost = len(everything) - statuses["finished"]
            submitted = client.scheduler_info()["counters"]["submitted"]
            key_of = {**{("leaf", i): f.key for i, f in enumerate(xs)}, **{("pair", i): f.key for i, f in enumerate(ys)},
                      **{("chunk", j): f.key for j, f in enumerate(chunks)}}
    finally:
        cluster.close()
        os.environ.pop("KWDIAG_LOG_DIR", None)
    want_x = [i * i for i in range(n_leaves)]
    want_y = [want_x[i] + want_x[i + 1] for i in range(n_leaves - 1)]
    want_chunks = [sum(want_y[j:j + 100]) for j in range(0, len(want_y), 100)]
    # Every value compared (a skipped error makes a list shorter: each missing one counts as wrong too).
    wrong = (sum(a != b for a, b in zip(got_x, want_x)) + sum(a != b for a, b in zip(got_y, want_y))
             + sum(a != b for a, b in zip(got_chunks, want_chunks)) + (answer != sum(want_chunks))
             + abs(len(got_x) - len(want_x)) + abs(len(got_y) - len(want_y)) + abs(len(got_chunks) - len(want_chunks)))
    outcomes, uninjected = diagnose(chaos, log_dir)
    recovered = events(log_dir, "scheduler-recovered")
    firsts = [r["first_finished_after"] for r in chaos.restarts if r.get("first_finished_after") is not None]
    return {"tasks": submitted, "faults": len(chaos.faults),
            "by_kind": {k: sum(f.kind == k for f in chaos.faults) for k in sorted({f.kind for f in chaos.faults})},
            "diagnosed": sum(ok for _, ok, _ in outcomes), "wrong_results": wrong, "lost": lost,
            "statuses": dict(statuses),
            "restarts": len(chaos.restarts),
            "recomputed": [e.fields["recomputed"] for e in recovered],
            "reexecuted": reexecuted_after_restarts(chaos.restarts, executions(execlog), key_of,
                                                    events(log_dir, "worker-removed")),
            "headless": [e.fields.get("headless_for") for e in recovered],
            "first_finished": firsts, "refused": len(events(log_dir, "auth-refused")),
            "uninjected_deaths": [f"{d.worker}#{d.incarnation} {d.cause}/{d.detail}" for d in uninjected],
            "misdiagnosed": [f"{f.kind} on {f.worker} (pid {f.pid}): got "
                             f"{(d.cause + '/' + d.detail) if d else 'no death'}" for f, ok, d in outcomes if not ok],
            "seconds": round(time.monotonic() - started, 1), "log_dir": log_dir}


def report(r: dict) -> str:
    firsts = r["first_finished"]
    lines = [
        f"tasks                      {r['tasks']:,}",
        f"faults injected            {r['faults']}  {r['by_kind']}",
        f"faults diagnosed right     {r['diagnosed']} of {r['faults']}",
        f"results wrong              {r['wrong_results']}",
        f"tasks lost                 {r['lost']}",
        f"scheduler restarts         {r['restarts']}",
        f"  recomputed (scheduler)   {r['recomputed']}",
        f"  finished before the kill, run again (execution log)  {r['reexecuted']}",
        f"  headless for (s)         {r['headless']}",
        "  return -> first finished task (s)  "
        + (f"median {statistics.median(firsts):.3f}, max {max(firsts):.3f}  {firsts}" if firsts else "-"),
        f"connections refused        {r['refused']}",
        f"deaths not injected        {len(r['uninjected_deaths'])} {r['uninjected_deaths'] or ''}",
    ]
    lines += [f"  misdiagnosed: {m}" for m in r["misdiagnosed"]]
    lines.append(f"time                       {r['seconds']} s   (logs: {r['log_dir']})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--faults", type=int, default=len(SCRIPT), help="how many of the scripted faults to inject")
    parser.add_argument("--every", type=float, default=2.0, help="mean seconds between faults")
    parser.add_argument("--task-ms", type=float, default=10.0, help="how long each leaf and pair task sleeps")
    parser.add_argument("--ttl", type=float, default=2.0, help="the workers' time-to-live, seconds")
    args = parser.parse_args()
    os.environ["KWDIAG_SOAK_TASK_MS"] = str(args.task_ms)
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    import scheduler_chaos  # task functions pickle by reference to this module, importable by the workers

    script = (SCRIPT * (args.faults // len(SCRIPT) + 1))[: args.faults]
    print(report(scheduler_chaos.soak(args.tasks, script, args.every, args.ttl)))


if __name__ == "__main__":
    main()
