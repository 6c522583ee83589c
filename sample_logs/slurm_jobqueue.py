#!/usr/bin/env python3
"""Real dask-jobqueue runs on a real SLURM cluster, for the ``sample_logs/slurm-*`` scenarios.

    python sample_logs/slurm_jobqueue.py memory|time-limit|cancel|job-memory|adapt|lifetime|preempt

Each scenario starts a ``dask_jobqueue.SLURMCluster`` (its scheduler in this process, each worker a SLURM batch
job running ``dask worker`` with a nanny), does one thing to it, closes it, and writes
``sample_logs/slurm-<scenario>/``: every job's output files exactly as SLURM wrote them (``dask-worker-<job>.err``
holds the worker's log and slurmstepd's own lines; the ``.out`` stays empty), this script's stderr as
``client.log``, and ``expected.json`` from what the script did. Nothing here writes a line into a log.

What each does:

* ``memory``: one worker job with ``memory="500MB"`` (SLURM's ``--mem``, and the worker's memory limit), a task
  that grows past it, ``allowed-failures`` 1: the nanny restarts the worker twice, the task fails with
  ``KilledWorker``; the script waits for the third process to register, then closes the cluster (dask-jobqueue
  cancels the job: SIGTERM, which the worker handles). ``slurm-memory-close-race`` is this scenario's first run,
  which closed at once: the close reached the third process while its nanny was still starting it.
* ``time-limit``: one worker job with ``walltime="00:01:00"`` running a task of 150 s: SLURM ends the job at its
  time limit (slurmstepd's ``DUE TO TIME LIMIT``, SIGTERM, SIGKILL after ``KillWait``).
* ``cancel``: two worker jobs; the script runs ``scancel`` on the job whose worker runs a long task, as a user or
  an administrator would; the task reruns on the other worker.

* ``job-memory``: one worker job with ``memory="500MB"``; a task runs a program of its own that takes 900 MB. The
  nanny watches its worker process only; SLURM's accounting counts every process of the job and ends it.
* ``adapt``: ``cluster.adapt(minimum=0, maximum=2)``, a burst of tasks, then idle: adaptive scaling retires the
  workers and cancels their jobs.
* ``lifetime``: dask-jobqueue's advice for walltimes, ``--lifetime`` (20 s here) with adaptive scaling: the worker
  closes itself at its lifetime and a new job takes its place; then the close.
* ``preempt``: one worker job on the partition ``debug`` runs a task; a job of the partition ``urgent`` (a higher
  ``PriorityTier``, ``PreemptType=preempt/partition_prio``, ``PreemptMode=CANCEL``) needs the whole node: SLURM
  cancels the worker's job (``DUE TO PREEMPTION``).

Needs, besides ``dask[distributed]`` and ``dask-jobqueue`` in the running Python (made with 2026.8.0 and 0.9.0), a
SLURM controller and node on this machine. How the committed runs had one (Debian 12, as root; 2 cores):

    apt-get install slurm-wlm munge
    munged --force
    # /etc/slurm/slurm.conf (the node's name is `hostname -s`):
    #   ClusterName=kw  SlurmctldHost=vm(127.0.0.1)  SlurmUser=root  SlurmdUser=root  AuthType=auth/munge
    #   ProctrackType=proctrack/linuxproc  TaskPlugin=task/none  SelectType=select/cons_tres
    #   SelectTypeParameters=CR_Core_Memory  JobAcctGatherType=jobacct_gather/linux  JobAcctGatherFrequency=1
    #   JobAcctGatherParams=OverMemoryKill  SlurmdParameters=config_overrides  KillWait=5  MinJobAge=300
    #   StateSaveLocation=/var/spool/slurmctld  SlurmdSpoolDir=/var/spool/slurmd  ReturnToService=2
    #   NodeName=vm NodeAddr=127.0.0.1 CPUs=8 RealMemory=8000 State=UNKNOWN
    #   PartitionName=debug Nodes=vm Default=YES MaxTime=INFINITE State=UP PriorityTier=1
    #   (for ``preempt``: PreemptType=preempt/partition_prio  PreemptMode=CANCEL
    #    PartitionName=urgent Nodes=vm MaxTime=INFINITE State=UP PriorityTier=10)
    slurmctld; slurmd
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def hold(seconds: float) -> float:
    import time as _t

    _t.sleep(seconds)
    return seconds


def grow(mb: int) -> int:
    import time as _t

    blocks = []
    for _ in range(mb // 50):
        blocks.append(bytearray(50 * 2**20))
        _t.sleep(0.05)
    _t.sleep(5)
    return len(blocks)


def spawn_hog(mb: int) -> int:
    """A task that runs a program of its own which takes ``mb`` MB (as a task calling a command-line tool does):
    the nanny watches its worker process only; SLURM counts every process of the job."""
    import subprocess as _sp
    import sys as _sys

    return _sp.run([_sys.executable, "-c", f"import time; b = bytearray({mb} * 2**20); time.sleep(60)"]).returncode


def wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def job_of(cluster, client, address: str) -> str:
    """The SLURM job id of the worker at ``address``."""
    name = client.scheduler_info()["workers"][address]["name"]
    return cluster.workers[name].job_id


def run(scenario: str, out: Path) -> dict:
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    kw = dict(cores=1, processes=1, memory="1GB", walltime="00:10:00", log_directory=str(out), queue="debug",
              scheduler_options={"host": "127.0.0.1"})
    if scenario == "time-limit":
        kw["walltime"] = "00:01:00"
    if scenario in ("memory", "job-memory"):
        kw["memory"] = "500MB"
    if scenario == "lifetime":   # dask-jobqueue's advice: a worker lifetime shorter than the job's walltime
        kw["worker_extra_args"] = ["--lifetime", "20s", "--lifetime-stagger", "2s"]
    n = 2 if scenario in ("cancel", "adapt") else 1
    cluster = SLURMCluster(**kw)
    cluster.scale(n)
    client = Client(cluster)
    client.wait_for_workers(n, timeout=180)
    names = sorted(w["name"] for w in client.scheduler_info()["workers"].values())
    did: dict = {"scenario": scenario, "workers": names, "deaths": [], "killed_workers": []}
    if scenario == "memory":
        try:
            client.submit(grow, 1500, pure=False, key="grow-1").result(timeout=300)
        except Exception as e:   # KilledWorker: the nanny restarted the worker twice for memory
            did["task_error"] = type(e).__name__
        did["deaths"] += [{"worker": names[0], "cause": "nanny_memory_restart", "detail": "memory_limit",
                           "did": "a task grew past the 500 MB limit; the nanny terminated the worker"}] * 2
        did["killed_workers"] = [{"task": "grow-1", "deaths": 2, "fair": True}]
        client.wait_for_workers(1, timeout=180)   # the third process, started after the second restart
    elif scenario == "time-limit":
        t0 = time.time()
        try:
            client.submit(hold, 150, pure=False, key="hold-1").result(timeout=240)
        except Exception as e:   # the job ended at its time limit and no worker is left to run the task
            did["task_error"] = type(e).__name__
        did["ran_s"] = round(time.time() - t0, 1)
        did["deaths"].append({"worker": names[0], "cause": "sudden_exit", "detail": "time_limit",
                              "did": "the job reached its 1-minute walltime: SLURM ended it"})
    elif scenario == "cancel":
        fut = client.submit(hold, 30, pure=False, key="hold-1")
        wait_until(lambda: client.processing() and any(client.processing().values()), 60, "the task to start")
        address = next(a for a, keys in client.processing().items() if keys)
        victim = client.scheduler_info()["workers"][address]["name"]
        job = job_of(cluster, client, address)
        subprocess.run(["scancel", job], check=True)
        did["deaths"].append({"worker": victim, "cause": "chose_to_exit", "detail": "sigterm",
                              "did": f"scancel {job} while its worker ran a task (SIGTERM, handled by the worker)"})
        did["result"] = fut.result(timeout=120)   # rerun on the other worker
    elif scenario == "job-memory":
        try:
            client.submit(spawn_hog, 900, pure=False, key="spawn-hog-1").result(timeout=120)
        except Exception as e:   # SLURM ended the job: no worker is left to run the task again
            did["task_error"] = type(e).__name__
        did["deaths"].append({"worker": names[0], "cause": "sudden_exit", "detail": "oom_killer",
                              "did": "a task's own program took 900 MB in a job of --mem 500M: SLURM ended the job"})
    elif scenario == "adapt":
        cluster.adapt(minimum=0, maximum=2, interval="500ms", wait_count=4)
        did["sum"] = sum(client.gather(client.map(hold, [0.5] * 8, pure=False)))
        wait_until(lambda: not client.scheduler_info()["workers"], 120, "adaptive scaling to let the workers go")
        did["deaths"] += [{"worker": name, "cause": "chose_to_exit", "detail": "retired",
                           "did": "adaptive scaling let the idle worker go: retired, then its job cancelled"}
                          for name in names]
    elif scenario == "preempt":
        fut = client.submit(hold, 60, pure=False, key="hold-1")
        wait_until(lambda: any(client.processing().values()), 60, "the task to start")
        job = job_of(cluster, client, next(iter(client.scheduler_info()["workers"])))
        # a job of a partition with a higher PriorityTier that needs the whole node: SLURM cancels the worker's job
        subprocess.run(["sbatch", "-p", "urgent", "-c", "8", "--mem", "100M", "-o", "/dev/null", "--wrap", "sleep 5"],
                       check=True, capture_output=True)
        wait_until(lambda: not client.scheduler_info()["workers"], 120, "the worker's job to be preempted")
        fut.cancel()
        did["deaths"].append({"worker": names[0], "cause": "sudden_exit", "detail": "cancelled",
                              "did": f"a higher-priority job preempted job {job} (PreemptMode=CANCEL)"})
    elif scenario == "lifetime":
        cluster.adapt(minimum=1, maximum=1, interval="500ms")   # a new job when the worker leaves
        first = names[0]
        wait_until(lambda: first not in {w["name"] for w in client.scheduler_info()["workers"].values()}, 120,
                   "the worker to reach its lifetime")
        client.wait_for_workers(1, timeout=180)
        did["deaths"].append({"worker": first, "cause": "chose_to_exit", "detail": "lifetime",
                              "did": "the worker reached its --lifetime (20 s) and closed itself; adaptive scaling "
                                     "started a new job"})
    alive = {w["name"]: job_of(cluster, client, a) for a, w in client.scheduler_info()["workers"].items()}
    client.close()
    cluster.close()   # the scheduler closes, and dask-jobqueue cancels every job (SIGTERM, handled)
    time.sleep(3)   # slurmstepd writes its last lines as the job ends
    for name, job in sorted(alive.items()):
        death = {"worker": name, "cause": "chose_to_exit", "detail": "shutdown",
                 "did": f"cluster.close(): the scheduler closed and dask-jobqueue cancelled job {job}"}
        # which reached the worker first is a race: the scheduler's close, or the SIGTERM of the job's cancel
        if "Reason: scheduler-close" not in (out / f"dask-worker-{job}.err").read_text():
            death["detail_in_logs"] = "sigterm"
        did["deaths"].append(death)
    return did


def main() -> int:
    scenario = sys.argv[1]
    out = HERE / f"slurm-{scenario}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    log = open(out / "client.log", "wb")
    os.dup2(log.fileno(), 2)   # Dask's logging (the scheduler runs here) and any traceback: the client's log
    env_before = os.environ.get("DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES")
    if scenario == "memory":
        os.environ["DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES"] = "1"
    did = run(scenario, out)
    if env_before is None:
        os.environ.pop("DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES", None)
    import dask_jobqueue
    import distributed

    expected = {
        "scenario": f"slurm-{scenario}",
        "produced_with": f"dask[distributed]=={distributed.__version__}, dask-jobqueue {dask_jobqueue.__version__}, "
                         f"SLURM {subprocess.run(['sinfo', '-V'], capture_output=True, text=True).stdout.strip()}, "
                         f"Python {sys.version.split()[0]}",
        "how": "python sample_logs/slurm_jobqueue.py " + scenario + " (needs a SLURM cluster: see that file)",
        "deaths": did["deaths"],
        "killed_workers": did["killed_workers"],
        "task_errors": 0,
        "did": {k: v for k, v in did.items() if k not in ("deaths", "killed_workers")},
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    print(json.dumps(expected, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
