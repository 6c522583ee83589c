"""The restart scenario of issue 15, measured: a scheduler SIGKILLed mid-job and started again with the same command.

``kwdiag scheduler --scheduler-file sf.json``, two ``kwdiag worker --scheduler-file sf.json``, a job of 400
short tasks (50 ms) by scheduler file; 4 s in, the scheduler is killed with SIGKILL and the same command is
run again. Run once with the journal (the default) and once with ``--set journal=false`` for comparison.

Prints for each: the job's result (right or not), connections refused, tasks finished before the kill
and how many of those ran again (from an execution log the tasks write), the scheduler's own recovery
figures (headless time, reused, recomputed), the seconds from its return to the first finished task,
and the job's duration.

    python bench/restart_scenario.py [--tasks 400] [--task-ms 50] [--kill-after 4]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

JOB = '''
import os, sys, time
from kwdiag.runtime import Client

def short(i):
    started = time.time()
    time.sleep(float(os.environ["KWDIAG_BENCH_TASK_S"]))
    with open(os.environ["KWDIAG_BENCH_EXECLOG"], "a") as f:
        f.write(f"{i} {started:.6f} {time.time():.6f}\\n")
    return i * i

if __name__ == "__main__":
    started = time.monotonic()
    with Client(scheduler_file=sys.argv[1], timeout=30) as client:
        total = sum(client.gather(client.map(short, range(int(sys.argv[2]))), timeout=600))
    print(f"{total} {time.monotonic() - started:.3f}", flush=True)
'''


def events(log_dir: str, kind: str) -> list[dict]:
    out = []
    for path in glob.glob(os.path.join(log_dir, "*.jsonl")):
        with open(path) as f:
            out += [json.loads(line) for line in f if f'"kind":"{kind}"' in line and line.endswith("\n")]
    return sorted(out, key=lambda e: e["ts"])


def scenario(n: int, task_s: float, kill_after: float, journal: bool) -> dict:
    from kwdiag.runtime.spawn import child_env, module_command, script_command

    work = tempfile.mkdtemp(prefix="kwdiag-restart-")
    sf, logs, execlog = (os.path.join(work, name) for name in ("sf.json", "logs", "exec.log"))
    env = child_env({"KWDIAG_SECRET": "", "KWDIAG_BENCH_EXECLOG": execlog, "KWDIAG_BENCH_TASK_S": str(task_s)})
    command = module_command("kwdiag", "scheduler", "--scheduler-file", sf, "--port", "0", "--log-dir", logs,
                             *([] if journal else ["--set", "journal=false"]))

    def spawn(cmd: list[str], name: str) -> subprocess.Popen:
        with open(os.path.join(work, name), "ab") as log:
            return subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)

    procs = [spawn(command, "scheduler-1.log")]
    try:
        while not os.path.exists(sf):
            time.sleep(0.01)
        procs += [spawn(module_command("kwdiag", "worker", "--scheduler-file", sf, "--name", f"w{i}", "--log-dir",
                                       logs), f"w{i}.log") for i in (1, 2)]
        with open(os.path.join(work, "job.py"), "w") as f:
            f.write(JOB)
        job = subprocess.Popen(script_command(os.path.join(work, "job.py"), sf, str(n)), env=env,
                               stdout=subprocess.PIPE, stderr=open(os.path.join(work, "job.err"), "wb"), text=True)
        time.sleep(kill_after)  # the issue's moment: a fixed 4 s into the job, whatever it has done by then
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        killed = time.time()
        procs[0] = spawn(command, "scheduler-2.log")
        out, _ = job.communicate(timeout=600)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    total, seconds = out.split() if job.returncode == 0 else ("-", "-")
    runs: dict[int, list[tuple[float, float]]] = {}
    with open(execlog) as f:
        for line in f:
            i, start, end = line.split()
            runs.setdefault(int(i), []).append((float(start), float(end)))
    done_before = [i for i, r in runs.items() if min(e for _, e in r) < killed]
    recovered = events(logs, "scheduler-recovered")
    return {"journal": journal, "right": total == str(sum(i * i for i in range(n))), "exit": job.returncode,
            "refused": len(events(logs, "auth-refused")), "done_before": len(done_before),
            "ran_again": sum(len(runs[i]) > 1 for i in done_before), "executions": sum(map(len, runs.values())),
            "recovered": recovered[0]["fields"] if recovered else None, "seconds": seconds, "dir": work}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--task-ms", type=float, default=50)
    parser.add_argument("--kill-after", type=float, default=4.0)
    args = parser.parse_args()
    for journal in (True, False):
        r = scenario(args.tasks, args.task_ms / 1000, args.kill_after, journal)
        rec = r["recovered"] or {}
        print(f"journal {'on ' if journal else 'off'}: result {'right' if r['right'] else 'WRONG'} (exit {r['exit']}); "
              f"refused {r['refused']}; {r['done_before']} tasks finished before the kill, {r['ran_again']} of them "
              f"ran again; {r['executions']} executions for {args.tasks} tasks; job {r['seconds']} s")
        if rec:
            print(f"  recovered: headless {rec['headless_for']} s, waited {rec['waited']} s for "
                  f"{len(rec['workers_back'])} workers, reused {rec['reused']}, recomputed {rec['recomputed']}, "
                  f"finished while headless {rec['finished_while_headless']}, adopted {rec['adopted']}, "
                  f"to run {rec['rerun']}   (logs: {r['dir']})")


if __name__ == "__main__":
    sys.exit(main())
