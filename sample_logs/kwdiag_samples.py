"""Produce the ``sample_logs/kwdiag-*`` scenarios by running kwdiag's runtime into each kind of death.

Every log line in those folders was written by real scheduler, nanny and worker processes; this
script only drives them (kills, signals, tasks that blow up) and writes ``expected.json`` from what
it did — never from what the analyzer says. Regenerate with::

    python sample_logs/kwdiag_samples.py            # all scenarios
    python sample_logs/kwdiag_samples.py sigkill    # one

The shared secret file (``scheduler.json``) is deleted from each folder.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def inc(x):
    return x + 1


def sleepy(seconds):
    time.sleep(seconds)
    return seconds


def segfault():
    ctypes.string_at(0)


def hog_memory():
    chunks = []
    for _ in range(200):
        chunks.append(bytearray(20 * 2**20))
        time.sleep(0.02)
    return len(chunks)


def exit_three():
    sys.exit(3)


def hard_exit():
    os._exit(1)


def divide(a, b):
    return a / b


def wait(cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError("scenario condition not reached")


def worker_named(client, name):
    return wait(lambda: next(((a, i) for a, i in client.scheduler_info()["workers"].items() if i["name"] == name),
                             None))


def executing(client, name):
    return worker_named(client, name)[1]["executing"]


def events(log_dir, kind):
    from kwdiag.events import from_json_line

    out = []
    for name in os.listdir(log_dir):
        if name.endswith(".jsonl"):
            with open(os.path.join(log_dir, name)) as f:
                out += [e for e in map(from_json_line, filter(str.strip, f)) if e.kind == kind]
    return out


def spawn_worker(cluster, name, *extra, env=None):
    log = open(os.path.join(cluster.log_dir, f"{name}.log"), "ab")
    from kwdiag.runtime.spawn import child_env, entry_command

    return subprocess.Popen(entry_command("worker", "--scheduler-file", cluster.scheduler_file, "--name", name,
                                          "--log-dir", cluster.log_dir, *extra),
                            stdout=log, stderr=log, env=child_env({"KWDIAG_SECRET": cluster.secret.hex(), **(env or {})}),
                            start_new_session=True)


def death(worker, cause, detail, did):
    return {"worker": worker, "cause": cause, "detail": detail, "did": did}


def shutdown(*workers):
    return [death(w, "chose_to_exit", "shutdown", "cluster closed at the end of the run") for w in workers]


# ----------------------------------------------------------------------------- scenarios
def sigkill(log_dir):
    from kwdiag.runtime import Client, LocalCluster

    with LocalCluster(n_workers=2, memory_limit="1GiB", log_dir=log_dir) as cluster, Client(cluster) as client:
        job = client.submit(sleepy, 2, workers=["worker-0"], allow_other_workers=True, pure=False)
        wait(lambda: executing(client, "worker-0"))
        os.kill(worker_named(client, "worker-0")[1]["pid"], signal.SIGKILL)
        job.result(timeout=60)
        wait(lambda: len(client.scheduler_info()["workers"]) == 2)
    return [death("worker-0", "sudden_exit", "sigkill", "os.kill(worker pid, SIGKILL) mid-task; its nanny restarted it"),
            *shutdown("worker-0", "worker-1")], []


def segfault_killedworker(log_dir):
    from kwdiag.runtime import Client, KilledWorker, LocalCluster

    with LocalCluster(n_workers=2, memory_limit="1GiB", log_dir=log_dir,
                      scheduler_kwargs={"allowed_failures": 1}) as cluster, Client(cluster) as client:
        bad = client.submit(segfault, key="segfault-task")
        try:
            bad.result(timeout=60)
        except KilledWorker:
            pass
        wait(lambda: len(client.scheduler_info()["workers"]) == 2)
        assert client.submit(inc, 1).result(timeout=30) == 2
    deaths = [death("worker-0", "sudden_exit", "segfault", "task ran ctypes.string_at(0)"),
              death("worker-1", "sudden_exit", "segfault", "the same task, rerouted, segfaulted again")]
    return deaths + shutdown("worker-0", "worker-1"), [{"task": "segfault-task", "deaths": 2, "fair": True}]


def memory(log_dir):
    from kwdiag.runtime import Client, KilledWorker, LocalCluster

    with LocalCluster(n_workers=1, memory_limit="400MiB", log_dir=log_dir,
                      scheduler_kwargs={"allowed_failures": 0}) as cluster, Client(cluster) as client:
        try:
            client.submit(hog_memory, key="hog-task").result(timeout=60)
        except KilledWorker:
            pass
        wait(lambda: any(i["incarnation"] == 2 for i in client.scheduler_info()["workers"].values()))
    return ([death("worker-0", "nanny_memory_restart", "memory_limit",
                   "task allocated 20 MiB every 20 ms past the 400 MiB limit; the nanny terminated it")]
            + shutdown("worker-0"), [{"task": "hog-task", "deaths": 1, "fair": True}])


def task_exits(log_dir):
    from kwdiag.runtime import Client, KilledWorker, LocalCluster

    with LocalCluster(n_workers=2, memory_limit="1GiB", log_dir=log_dir,
                      scheduler_kwargs={"allowed_failures": 0}) as cluster, Client(cluster) as client:
        for fn, where, key in ((exit_three, "worker-0", "sys-exit-task"), (hard_exit, "worker-1", "os-exit-task")):
            try:
                client.submit(fn, workers=[where], key=key).result(timeout=60)
            except KilledWorker:
                pass
            wait(lambda: len(client.scheduler_info()["workers"]) == 2)
    return ([death("worker-0", "unrecoverable_exception", "system_exit", "a task called sys.exit(3)"),
             death("worker-1", "sudden_exit", "exit_status", "a task called os._exit(1)")]
            + shutdown("worker-0", "worker-1"),
            [{"task": "sys-exit-task", "deaths": 1, "fair": True}, {"task": "os-exit-task", "deaths": 1, "fair": True}])


def missing_module(log_dir):
    from kwdiag.runtime import LocalCluster

    with LocalCluster(n_workers=1, memory_limit="1GiB", log_dir=log_dir) as cluster:
        broken = spawn_worker(cluster, "broken", "--preload", "kwdiag_sample_plugin_that_is_not_installed",
                              env={"KWDIAG_RESTART_BACKOFF_AFTER": "2"})
        wait(lambda: events(log_dir, "restart-backoff"))
        broken.send_signal(signal.SIGTERM)
        broken.wait(30)
    starts = [e for e in events(log_dir, "worker-exit") if e.worker == "broken"]
    deaths = [death("broken", "unrecoverable_exception", "missing_module",
                    f"--preload of a module that is not installed (start #{i + 1})") for i in range(len(starts))]
    return deaths + shutdown("worker-0"), []


def graceful(log_dir):
    from kwdiag.runtime import Client, LocalCluster

    with LocalCluster(n_workers=3, memory_limit="1GiB", log_dir=log_dir) as cluster, Client(cluster) as client:
        bare = spawn_worker(cluster, "bare", "--no-nanny")
        lifetime = spawn_worker(cluster, "short-lived", "--lifetime", "2s")
        wait(lambda: len(client.scheduler_info()["workers"]) == 5)
        x = client.submit(inc, 1, workers=["worker-2"])
        x.result(timeout=30)
        client.retire_workers([worker_named(client, "worker-2")[0]])
        bare.send_signal(signal.SIGTERM)
        cluster.processes["worker-1"].send_signal(signal.SIGTERM)
        for proc in (bare, lifetime, cluster.processes["worker-1"], cluster.processes["worker-2"]):
            proc.wait(30)
        assert x.result(timeout=30) == 2
    return ([death("worker-2", "chose_to_exit", "retired", "client.retire_workers"),
             death("bare", "chose_to_exit", "sigterm", "SIGTERM to a --no-nanny worker"),
             death("worker-1", "chose_to_exit", "sigterm", "SIGTERM to the worker's nanny process"),
             death("short-lived", "chose_to_exit", "lifetime", "kwdiag worker --lifetime 2s")]
            + shutdown("worker-0"), [])


def heartbeat(log_dir):
    from kwdiag.runtime import Client, LocalCluster

    with LocalCluster(n_workers=2, memory_limit="1GiB", log_dir=log_dir,
                      scheduler_kwargs={"worker_ttl": "1s", "heartbeat_interval": "0.2s"}) as cluster, \
            Client(cluster) as client:
        pid = worker_named(client, "worker-0")[1]["pid"]
        os.kill(pid, signal.SIGSTOP)
        wait(lambda: events(log_dir, "worker-removed"))
        wait(lambda: len(client.scheduler_info()["workers"]) == 2)
    return ([death("worker-0", "sudden_exit", "heartbeat_timeout",
                   "SIGSTOP: no heartbeats for the 1 s ttl; the scheduler removed it and its nanny killed it")]
            + shutdown("worker-0", "worker-1"), [])


def version_mismatch(log_dir):
    from kwdiag.runtime import LocalCluster

    site = os.path.join(log_dir, "_site")
    for version, folder in (("1.0", "same"), ("2.0", "other")):
        info = os.path.join(site, folder, f"kwdiagsamplepkg-{version}.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(f"Metadata-Version: 2.1\nName: kwdiagsamplepkg\nVersion: {version}\n")
    settings = {"versions_packages": ["kwdiagsamplepkg"], "versions_required": ["kwdiagsamplepkg"]}
    with LocalCluster(n_workers=1, memory_limit="1GiB", log_dir=log_dir, config=settings,
                      env={"PYTHONPATH": os.path.join(site, "same")}) as cluster:
        odd = spawn_worker(cluster, "odd", env={"PYTHONPATH": os.path.join(site, "other"),
                                                "KWDIAG_VERSIONS_PACKAGES": "kwdiagsamplepkg"})
        odd.wait(60)
    shutil.rmtree(site)
    return ([death("odd", "version_mismatch", "package_versions",
                   "worker with kwdiagsamplepkg 2.0 joined a scheduler that requires 1.0")] + shutdown("worker-0"), [])


def task_error(log_dir):
    from kwdiag.runtime import Client, LocalCluster

    with LocalCluster(n_workers=2, memory_limit="1GiB", log_dir=log_dir) as cluster, Client(cluster) as client:
        bad = client.submit(divide, 1, 0)
        try:
            bad.result(timeout=30)
        except ZeroDivisionError:
            pass
        assert client.submit(inc, 1).result(timeout=30) == 2
    return shutdown("worker-0", "worker-1"), [], {"task_errors": 1}


def clean(log_dir):
    from kwdiag.runtime import Client, LocalCluster

    with LocalCluster(n_workers=2, memory_limit="1GiB", log_dir=log_dir) as cluster, Client(cluster) as client:
        assert sum(client.gather(client.map(inc, range(100)))) == 5050
    return shutdown("worker-0", "worker-1"), [], {"task_errors": 0}


SCENARIOS = {"sigkill": sigkill, "segfault-killedworker": segfault_killedworker, "memory": memory,
             "task-exits": task_exits, "missing-module": missing_module, "graceful": graceful,
             "heartbeat": heartbeat, "version-mismatch": version_mismatch, "task-error": task_error,
             "clean": clean}


def produce(name: str) -> None:
    folder = os.path.join(HERE, f"kwdiag-{name}")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    result = SCENARIOS[name](folder)
    deaths, killed = result[0], result[1]
    extra = result[2] if len(result) > 2 else {}
    for leftover in ("scheduler.json",):
        try:
            os.unlink(os.path.join(folder, leftover))
        except FileNotFoundError:
            pass
    expected = {"scenario": f"kwdiag-{name}", "produced_with": "kwdiag runtime (this repository), Python 3.11",
                "how": f"sample_logs/kwdiag_samples.py {name}", "deaths": deaths, "killed_workers": killed, **extra}
    with open(os.path.join(folder, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")
    print(f"kwdiag-{name}: {len(deaths)} deaths")


if __name__ == "__main__":
    sys.path.insert(0, HERE)  # task functions are pickled by reference to this module
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))
    import kwdiag_samples  # noqa: F401  (so functions pickle as kwdiag_samples.X, importable by workers)

    for scenario in sys.argv[1:] or list(SCENARIOS):
        kwdiag_samples.produce(scenario)
