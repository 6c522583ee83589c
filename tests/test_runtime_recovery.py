"""A scheduler killed with SIGKILL and started again: the cluster keeps its identity and its work.

Real processes on loopback: ``kwdiag scheduler`` / ``kwdiag worker`` as a user starts them, LocalClusters
whose scheduler is killed and replaced, real journals (one with a torn last record). What the journal's
file format does on its own is tests/test_journal.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import jsonschema
import pytest

from conftest import read_events, spawn_entry, spawn_kwdiag, stop, wait_for_event, wait_until
from kwdiag.runtime import Client, KilledWorker, LocalCluster
from kwdiag.runtime.comm import parse_address
from kwdiag.runtime.journal import FILE_NAME, FRAME
from kwdiag.runtime.spawn import child_env, script_command

N_TASKS = 400
JOB = '''
import os, sys, time
from kwdiag.runtime import Client

def short(i):
    started = time.time()
    time.sleep(0.05)
    with open(os.environ["KWDIAG_TEST_EXECLOG"], "a") as f:   # one line per execution, for the test to count
        f.write(f"{i} {started:.6f} {time.time():.6f}\\n")
    return i * i

if __name__ == "__main__":
    with Client(scheduler_file=sys.argv[1]) as client:
        total = sum(client.gather(client.map(short, range(int(sys.argv[2]))), timeout=300))
    print("total", total, flush=True)
'''


def inc(x):
    return x + 1


def slow_inc(x):
    time.sleep(0.2)
    return x + 1


def executions(path: str) -> dict[int, list[tuple[float, float]]]:
    runs: dict[int, list[tuple[float, float]]] = {}
    with open(path) as f:
        for line in f:
            if line.endswith("\n"):
                key, start, end = line.split()
                runs.setdefault(int(key), []).append((float(start), float(end)))
    return runs


def test_the_restart_scenario_of_the_issue(tmp_path):
    """Scheduler by scheduler file, two workers by scheduler file, 400 short tasks by scheduler file; the
    scheduler is SIGKILLed mid-job and started again with the same command."""
    sf, logs, execlog = str(tmp_path / "sf.json"), str(tmp_path / "logs"), str(tmp_path / "exec.log")
    env = {"KWDIAG_SECRET": "", "KWDIAG_TEST_EXECLOG": execlog}
    # --port 0: the scheduler comes back on another port, found through the file. recovery_wait is roomy so
    # that a loaded machine cannot make a returning worker late (the window closes when both are back).
    command = ["scheduler", "--scheduler-file", sf, "--port", "0", "--log-dir", logs, "--set", "recovery_wait=30s"]
    procs = [spawn_kwdiag(command, str(tmp_path / "scheduler-1.log"), env)]
    try:
        wait_until(lambda: os.path.exists(sf), what="scheduler file")
        for name in ("w1", "w2"):
            procs.append(spawn_kwdiag(["worker", "--scheduler-file", sf, "--name", name, "--log-dir", logs],
                                      str(tmp_path / f"{name}.log"), env))
        (tmp_path / "job.py").write_text(JOB)
        job = subprocess.Popen(script_command(str(tmp_path / "job.py"), sf, str(N_TASKS)),
                               env=child_env({**env, "KWDIAG_LOG_DIR": logs}),
                               stdout=subprocess.PIPE, stderr=open(tmp_path / "job.err", "wb"), text=True)
        procs.append(job)
        # About 4 s in (the issue's moment): a quarter of the tasks done, the rest running or queued.
        wait_until(lambda: os.path.exists(execlog) and len(executions(execlog)) >= N_TASKS // 4, what="progress")
        first_secret = json.load(open(sf))["secret"]
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        killed_at = time.time()
        procs[0] = spawn_kwdiag(command, str(tmp_path / "scheduler-2.log"), env)   # the same command
        out, _ = job.communicate(timeout=180)
        assert job.returncode == 0, (tmp_path / "job.err").read_text()[-3000:]
        assert f"total {sum(i * i for i in range(N_TASKS))}" in out
        assert json.load(open(sf))["secret"] == first_secret          # the cluster kept its identity
        assert read_events(logs, "auth-refused") == []                 # so nobody was refused
        runs = executions(execlog)
        assert sorted(runs) == list(range(N_TASKS))
        done_before = {k for k, r in runs.items() if min(end for _, end in r) < killed_at}
        assert len(done_before) >= N_TASKS // 4
        assert [k for k in done_before if len(runs[k]) > 1] == []      # nothing finished before the kill ran again
        recovered = wait_for_event(logs, "scheduler-recovered")[0]
        assert recovered.fields["recomputed"] == 0 and recovered.fields["reused"] > 0, recovered.fields
        assert recovered.fields["workers_back"] == ["w1", "w2"] and recovered.fields["headless_for"] > 0
        client_back = [e for e in read_events(logs, "reconnected", source="client")]
        assert client_back and client_back[0].fields["known"] is True
    finally:
        for proc in procs:
            stop(proc)


def _free_port_other_than(port: int) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            new = s.getsockname()[1]
        if new != port:
            return new


def test_workers_clients_and_new_incarnations_follow_the_scheduler_file_to_a_new_port(tmp_path):
    sf, logs = str(tmp_path / "sf.json"), str(tmp_path / "logs")
    env = {"KWDIAG_SECRET": ""}
    procs = [spawn_kwdiag(["scheduler", "--scheduler-file", sf, "--port", "0", "--log-dir", logs],
                          str(tmp_path / "s1.log"), env)]
    try:
        wait_until(lambda: os.path.exists(sf), what="scheduler file")
        procs.append(spawn_kwdiag(["worker", "--scheduler-file", sf, "--name", "w1", "--log-dir", logs],
                                  str(tmp_path / "w1.log"), env))
        with Client(scheduler_file=sf) as client:
            assert client.submit(inc, 1).result(timeout=60) == 2
            old_port = parse_address(client.scheduler_address)[1]
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(10)
            port = _free_port_other_than(old_port)
            procs[0] = spawn_kwdiag(["scheduler", "--scheduler-file", sf, "--port", str(port), "--log-dir", logs],
                                    str(tmp_path / "s2.log"), env)
            back = wait_for_event(logs, "reconnected", source="worker")[0]
            assert parse_address(back.fields["address"])[1] == port
            assert client.submit(inc, 2).result(timeout=60) == 3
            assert parse_address(client.scheduler_address)[1] == port
            # A worker its nanny starts after the move (a new incarnation) finds the scheduler through the file too.
            pid = next(iter(client.scheduler_info()["workers"].values()))["pid"]
            os.kill(pid, signal.SIGKILL)
            wait_for_event(logs, "worker-registered", worker="w1", incarnation=2)
            assert client.submit(inc, 3).result(timeout=60) == 4
    finally:
        for proc in procs:
            stop(proc)


def _restart(cluster, log_dir, *extra, env=None):
    port = parse_address(cluster.scheduler_address)[1]
    old = cluster.processes["scheduler"]
    old.send_signal(signal.SIGKILL)
    old.wait(10)
    cluster.processes["scheduler"] = spawn_entry(
        ["scheduler", "--port", str(port), "--scheduler-file", cluster.scheduler_file, "--log-dir", log_dir, *extra],
        os.path.join(log_dir, "scheduler-again.log"), env={"KWDIAG_SECRET": cluster.secret.hex(), **(env or {})})


def test_a_torn_last_journal_record_is_skipped_with_a_warning_and_the_rest_replayed(log_dir):
    with LocalCluster(n_workers=2, memory_limit=None, log_dir=log_dir) as cluster, Client(cluster) as client:
        futures = client.map(inc, range(50))
        assert client.gather(futures, timeout=60) == list(range(1, 51))
        wait_until(lambda: os.path.getsize(os.path.join(log_dir, FILE_NAME)) > 0, what="journal")
        port = parse_address(cluster.scheduler_address)[1]
        old = cluster.processes["scheduler"]
        old.send_signal(signal.SIGKILL)
        old.wait(10)
        torn = FRAME.pack(4096, 0) + b"the scheduler died in the middle of this"
        with open(os.path.join(log_dir, FILE_NAME), "ab") as f:
            f.write(torn)
        cluster.processes["scheduler"] = spawn_entry(
            ["scheduler", "--port", str(port), "--scheduler-file", cluster.scheduler_file, "--log-dir", log_dir],
            os.path.join(log_dir, "scheduler-again.log"), env={"KWDIAG_SECRET": cluster.secret.hex()})
        replayed = wait_for_event(log_dir, "journal-replayed")[0]
        assert replayed.level == "warning" and replayed.fields["skipped_bytes"] == len(torn)
        assert "torn record" in replayed.fields["problem"] and replayed.fields["finished"] == 50
        recovered = wait_for_event(log_dir, "scheduler-recovered")[0]
        assert recovered.fields["reused"] == 50 and recovered.fields["recomputed"] == 0
        assert client.gather(futures, timeout=60) == list(range(1, 51))
        assert client.submit(sum, futures).result(timeout=60) == sum(range(1, 51))
    _explain_shows_the_recovery(log_dir)


def _explain_shows_the_recovery(log_dir):
    """``kwdiag explain`` names the scheduler's death and recovery and the torn record (rules/kwdiag/...)."""
    result = subprocess.run(module_kwdiag("explain", log_dir), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())   # the report wraps at 80 columns
    assert "The scheduler died; a new one recovered its work from the journal" in text
    assert "torn record, which was skipped" in text and "headless for" in text
    verdict = " ".join(result.stdout.split("\nWhat to do")[0].split("\n\n")[0].split())
    assert verdict.startswith("Verdict: ") and "the scheduler died and was recovered 1 time(s)" in verdict
    doc = json.loads(subprocess.run(module_kwdiag("explain", "--format", "json", log_dir), capture_output=True,
                                    text=True, timeout=120).stdout)
    notes = {n["rule"]: n for n in doc["notes"]}
    assert notes["kwdiag-scheduler-recovered"]["fields"]["reused"] == 50
    assert notes["kwdiag-journal-torn"]["fields"]["skipped_bytes"] > 0
    schema = json.loads(open(os.path.join(os.path.dirname(__file__), "..", "docs", "explain.schema.json")).read())
    jsonschema.validate(doc, schema)


def killer(marker_dir):
    """Kill the worker running it. The second time, only once the test says so (it restarts the scheduler first)."""
    runs = len(os.listdir(marker_dir))
    open(os.path.join(marker_dir, f"run-{runs}"), "w").close()
    if runs >= 1:
        while not os.path.exists(marker_dir + ".go"):
            time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGKILL)


def test_killed_worker_counts_carry_on_across_a_scheduler_restart(log_dir, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    with LocalCluster(n_workers=2, memory_limit=None, log_dir=log_dir, scheduler_kwargs={"allowed_failures": 1}) \
            as cluster, Client(cluster) as client:
        future = client.submit(killer, str(markers))
        wait_until(lambda: len(os.listdir(markers)) == 2, what="first death, second run started")
        first = wait_for_event(log_dir, "worker-removed", predicate=lambda e: e.fields["blamed"])[0]
        assert first.fields["blamed"] == [future.key]
        _restart(cluster, log_dir, "--set", "allowed_failures=1")
        recovered = wait_for_event(log_dir, "scheduler-recovered")[0]
        assert recovered.fields["adopted"] == 1      # the second run kept running where it was
        (tmp_path / "markers.go").touch()
        with pytest.raises(KilledWorker) as info:
            future.result(timeout=60)
        assert len(info.value.workers) == 2          # the death before the restart still counts
        killed = wait_for_event(log_dir, "killed-worker", source="scheduler")[0]
        assert killed.fields["deaths"] == 2


def test_a_client_that_disconnects_and_comes_back_keeps_its_futures(log_dir):
    with LocalCluster(n_workers=2, memory_limit=None, log_dir=log_dir) as cluster, Client(cluster) as client:
        futures = client.map(slow_inc, range(20))
        wait_until(lambda: client.scheduler_info()["counters"]["finished"] >= 4, what="some progress")
        client._loop.call(lambda: client._stream.comm.abort())   # the connection breaks under it
        back = wait_for_event(log_dir, "reconnected", source="client")[0]
        assert back.fields["known"] is True
        assert client.gather(futures, timeout=60) == list(range(1, 21))
        assert client.scheduler_info()["counters"]["finished"] == 20     # nothing was computed twice


GONE_CLIENT = '''
import sys, time
from kwdiag.runtime import Client
client = Client(scheduler_file=sys.argv[1])
futures = client.map(time.sleep, [30] * 4, workers=["nobody"])   # never placed: only the release ends them
print("submitted", flush=True)
time.sleep(600)
'''


def test_a_client_that_never_comes_back_is_released_after_its_grace_period(log_dir, tmp_path):
    with LocalCluster(n_workers=1, memory_limit=None, log_dir=log_dir, config={"client_grace": "1s"}) as cluster, \
            Client(cluster) as client:
        (tmp_path / "gone.py").write_text(GONE_CLIENT)
        gone = subprocess.Popen(script_command(str(tmp_path / "gone.py"), cluster.scheduler_file),
                                env=child_env({"KWDIAG_SECRET": cluster.secret.hex()}), stdout=subprocess.PIPE,
                                text=True)
        try:
            assert gone.stdout.readline().strip() == "submitted"
            wait_until(lambda: client.scheduler_info()["tasks"], what="its tasks")
            gone.send_signal(signal.SIGKILL)
            gone.wait(10)
            wait_until(lambda: not client.scheduler_info()["tasks"], what="its tasks released")
        finally:
            stop(gone)


def test_the_journal_is_compacted_on_long_runs(log_dir):
    with LocalCluster(n_workers=2, memory_limit=None, log_dir=log_dir) as cluster, Client(cluster) as client:
        journal = os.path.join(log_dir, FILE_NAME)
        biggest = 0
        for round_ in range(2):
            futures = client.map(inc, range(round_ * 10_000, (round_ + 1) * 10_000))
            assert sum(client.gather(futures)) == sum(range(round_ * 10_000 + 1, (round_ + 1) * 10_000 + 1))
            del futures
            biggest = max(biggest, os.path.getsize(journal))
        # ~80,000 records were appended; once the released tasks are compacted away, only a snapshot remains.
        wait_until(lambda: not client.scheduler_info()["tasks"], what="tasks released")
        wait_until(lambda: os.path.getsize(journal) < 20_000, what="compaction", timeout=60)
        assert biggest > 200_000


def test_a_restarted_scheduler_keeps_the_secret_and_new_secret_starts_a_new_cluster(tmp_path):
    sf, logs = str(tmp_path / "sf.json"), str(tmp_path / "logs")
    env = {"KWDIAG_SECRET": ""}
    first = spawn_kwdiag(["scheduler", "--scheduler-file", sf, "--port", "0", "--log-dir", logs],
                         str(tmp_path / "s1.log"), env)
    second = None
    try:
        wait_until(lambda: os.path.exists(sf), what="scheduler file")
        secret = json.load(open(sf))["secret"]
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        mtime = os.stat(sf).st_mtime_ns
        second = spawn_kwdiag(["scheduler", "--scheduler-file", sf, "--port", "0", "--log-dir", logs, "--new-secret"],
                              str(tmp_path / "s2.log"), env)
        wait_until(lambda: os.stat(sf).st_mtime_ns != mtime, what="the file rewritten")
        assert json.load(open(sf))["secret"] != secret
        aside = wait_for_event(logs, "journal-set-aside")[0]
        assert "another cluster" in aside.fields["reason"] and os.path.exists(aside.fields["moved_to"])
        with Client(scheduler_file=sf, timeout=30):   # serving (so its SIGTERM handler is in place): a clean close
            pass
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0
        # Started again with the file (no --new-secret): the secret stays, and a clean close left nothing to replay.
        secret = json.load(open(sf))["secret"]
        second = spawn_kwdiag(["scheduler", "--scheduler-file", sf, "--port", "0", "--log-dir", logs],
                              str(tmp_path / "s3.log"), env)
        wait_until(lambda: len(read_events(logs, "scheduler-start")) == 3, what="third start")
        assert json.load(open(sf))["secret"] == secret
        assert read_events(logs, "journal-replayed") == []
    finally:
        for proc in (first, second):
            if proc is not None:
                stop(proc)


def test_two_schedulers_never_share_a_run_directory(tmp_path):
    logs = str(tmp_path / "logs")
    env = {"KWDIAG_SECRET": "ab" * 32}
    first = spawn_kwdiag(["scheduler", "--port", "0", "--log-dir", logs], str(tmp_path / "s1.log"), env)
    try:
        wait_for_event(logs, "scheduler-start")   # started without --scheduler-file: KWDIAG_SECRET is enough
        result = subprocess.run(module_kwdiag("scheduler", "--port", "0", "--log-dir", logs),
                                capture_output=True, text=True, timeout=60, env=child_env(env))
        assert result.returncode == 3, result.stderr
        assert f"run directory {logs} is in use by another scheduler (pid {first.pid})" in result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    finally:
        stop(first)


def module_kwdiag(*args: str) -> list[str]:
    from kwdiag.runtime.spawn import module_command

    return module_command("kwdiag", *args)
