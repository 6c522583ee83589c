"""kwdiag on real Dask clusters: the kwdiag.dask plugins record each death, and kwdiag's analysis explains it.

Every test starts real Dask processes on loopback (``python -m kwdiag.dask.cluster``, the same host
``kwdiag run --dask`` uses, or Dask's own ``dask scheduler``/``dask worker`` command lines) and kills
workers for real: SIGKILL from outside, a segfault (``ctypes.string_at(0)``), ``os._exit``, a memory
blow-up the nanny stops, a hang past the worker TTL. CI runs this file against the newest Dask (the
test extras) and against Dask 2024.12.1 (``.ci/run``). Waits are on conditions with generous deadlines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import distributed
import pytest
from distributed import Client

from conftest import ANY, assert_deaths, read_events, wait_until
from kwdiag.pipeline import analyze
from kwdiag.runtime.spawn import child_env, module_command

DEADLINE = 120.0   # a loaded 2-core machine starts Dask processes slowly
MiB = 1 << 20
DASK_VERSION = tuple(int(p) for p in distributed.__version__.split(".")[:2])
KWDIAG = [sys.executable, "-m", "kwdiag"]


# ---------------------------------------------------------------------- task functions (run on the workers)
def sleep_until(path: str, limit: float) -> str:
    """Run until ``path`` exists (a test's way to end a task whose thread a cancel would not free)."""
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return "woken"


def segfault() -> None:
    import ctypes

    ctypes.string_at(0)


def exit_once(marker: str, code: int) -> str:
    """``os._exit(code)`` the first time (the task kills its worker); the rerun returns."""
    if not os.path.exists(marker):
        Path(marker).touch()
        os._exit(code)
    return "rerun survived"


def hog_once(marker: str, cap: int) -> str:
    """The first time, allocate 16 MiB a step up to ``cap`` bytes and hold it (the nanny stops it long
    before the cap, which keeps the kernel's OOM killer out of it); the rerun returns."""
    if os.path.exists(marker):
        return "rerun survived"
    Path(marker).touch()
    chunks = []
    while len(chunks) * 16 * MiB < cap:
        chunks.append(b"x" * (16 * MiB))
        time.sleep(0.05)  # slow enough for the nanny's samples to show the climb
    time.sleep(60)
    return "not stopped"


# ---------------------------------------------------------------------- clusters
@contextmanager
def dask_host(run_dir: Path, *args: str):
    """A Dask cluster hosted by ``python -m kwdiag.dask.cluster`` (plugins preloaded); yields its address."""
    run_dir.mkdir(parents=True, exist_ok=True)
    address_file = run_dir / "address.json"
    with open(run_dir / "dask-cluster.log", "ab") as log:
        host = subprocess.Popen(module_command("kwdiag.dask.cluster", "--run-dir", str(run_dir), "--address-file",
                                               str(address_file), *args),
                                stdin=subprocess.PIPE, stdout=log, stderr=log, env=child_env())
    try:
        wait_until(lambda: address_file.exists() or host.poll() is not None, DEADLINE, 0.1, "the cluster")
        assert address_file.exists(), (run_dir / "dask-cluster.log").read_text()[-3000:]
        yield json.loads(address_file.read_text())["address"]
    finally:
        host.stdin.close()   # the host closes its cluster in order
        try:
            host.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            host.kill()
            host.wait()


def executing_pid(run_dir: Path, key: str) -> int:
    """The pid of the worker process whose last executing set names ``key`` (the worker plugin's record)."""
    def found():
        events = read_events(str(run_dir), "tasks-executing")
        return next((e.pid for e in reversed(events) if key in e.fields.get("executing", ())), None)
    return wait_until(found, DEADLINE, 0.05, f"{key} executing")


def exit_of(run_dir: Path, pid: int):
    events = wait_until(lambda: read_events(str(run_dir), "worker-exit", source="nanny", pid=pid), DEADLINE, 0.05,
                        f"the nanny's record of pid {pid}")
    return events[0]


def removal_of(run_dir: Path, pid: int):
    return wait_until(lambda: read_events(str(run_dir), "worker-removed", pid=pid), DEADLINE, 0.05,
                      f"the scheduler's removal of pid {pid}")[0]


def death_of(run_dir: Path, pid: int):
    report = analyze([str(run_dir)])
    deaths = [d for d in report.deaths if d.pid == pid]
    assert len(deaths) == 1, [(d.worker, d.incarnation, d.pid, d.cause, d.detail) for d in report.deaths]
    return deaths[0]


@pytest.fixture(scope="module")
def nanny_cluster(tmp_path_factory):
    """Two workers under nannies, 300 MiB each; a task may cause one death (the second is KilledWorker)."""
    run_dir = tmp_path_factory.mktemp("dask-nanny")
    with dask_host(run_dir, "--workers", "2", "--memory-limit", str(300 * MiB), "--allowed-failures", "1") as address:
        with Client(address, timeout="60s") as client:
            yield client, run_dir


# ---------------------------------------------------------------------- deaths under a nanny
def test_sigkill_is_recorded_by_the_nanny_with_the_signal_and_the_executing_task(nanny_cluster, tmp_path):
    client, run_dir = nanny_cluster
    future = client.submit(sleep_until, str(tmp_path / "wake"), 600, key="sleeping-when-killed")
    pid = executing_pid(run_dir, "sleeping-when-killed")
    os.kill(pid, signal.SIGKILL)
    exit_event = exit_of(run_dir, pid)
    f = exit_event.fields
    assert (f["exitcode"], f["signal"], f["signal_name"]) == (-9, 9, "SIGKILL")
    assert f["caused_by"] is None and f["will_restart"] is True
    assert f["running_tasks"] == ["sleeping-when-killed"]
    assert f["memory_samples"] and f["memory_samples"][-1][1] > 20 * MiB   # a Python worker with Dask loaded
    removed = removal_of(run_dir, pid).fields
    assert removed["expected"] is False and removed["blamed"] == ["sleeping-when-killed"]
    assert removed["running_tasks"] == ["sleeping-when-killed"]
    (tmp_path / "wake").touch()
    assert future.result(timeout=DEADLINE) == "woken"   # rerun on the other worker
    death = death_of(run_dir, pid)
    assert (death.cause, death.detail) == ("sudden_exit", "sigkill")
    assert "sleeping-when-killed" in death.running


def test_os_exit_in_a_task_is_an_os_exit(nanny_cluster, tmp_path):
    client, run_dir = nanny_cluster
    future = client.submit(exit_once, str(tmp_path / "exited"), 3, key="exits-its-worker")
    assert future.result(timeout=DEADLINE) == "rerun survived"   # the death counted once: allowed
    exit_event = next(e for e in read_events(str(run_dir), "worker-exit", source="nanny")
                      if e.fields["exitcode"] == 3)
    assert exit_event.fields["signal"] is None and exit_event.fields["running_tasks"] == ["exits-its-worker"]
    death = death_of(run_dir, exit_event.fields["pid"])
    # The spec: the process ended itself with a non-zero status and left no traceback in its own log.
    assert (death.cause, death.detail) == ("unrecoverable_exception", "os_exit")
    assert death.running == ("exits-its-worker",)


def test_the_nanny_memory_kill_comes_with_the_samples_before_it(nanny_cluster, tmp_path):
    client, run_dir = nanny_cluster
    future = client.submit(hog_once, str(tmp_path / "hogged"), 900 * MiB, key="hogs-memory")
    assert future.result(timeout=DEADLINE) == "rerun survived"
    terminate = wait_until(lambda: read_events(str(run_dir), "nanny-memory-terminate", source="nanny"), DEADLINE)[0]
    pid = terminate.fields["pid"]
    f = exit_of(run_dir, pid).fields
    assert f["caused_by"] == "memory" and f["signal_name"] in ("SIGTERM", "SIGKILL")
    assert f["running_tasks"] == ["hogs-memory"] and f["will_restart"] is True
    samples = [rss for _, rss in f["memory_samples"]]
    assert len(samples) >= 5, samples
    assert max(samples) >= 0.8 * 300 * MiB and samples[0] < max(samples), samples   # the climb is there
    death = death_of(run_dir, pid)
    assert (death.cause, death.detail) == ("nanny_memory_restart", "memory_limit")
    assert death.memory is not None and len(death.memory.samples) >= 5
    assert death.memory.limit == 300 * MiB and death.running == ("hogs-memory",)


def test_a_segfaulting_task_gets_killed_worker_and_each_death_its_dump(nanny_cluster):
    client, run_dir = nanny_cluster
    future = client.submit(segfault, key="segfaults")
    with pytest.raises(Exception) as raised:
        future.result(timeout=DEADLINE)
    assert type(raised.value).__name__ == "KilledWorker"
    killed = wait_until(lambda: read_events(str(run_dir), "killed-worker", key="segfaults"), DEADLINE)[0].fields
    assert killed["deaths"] == 2 and killed["allowed_failures"] == 1 and len(killed["workers"]) == 2
    assert killed["last_worker"] == killed["workers"][-1]

    def both_exits():
        found = [e for e in read_events(str(run_dir), "worker-exit", source="nanny")
                 if e.fields["running_tasks"] == ["segfaults"]]
        return found if len(found) == 2 else None

    exits = wait_until(both_exits, DEADLINE, what="both segfaults recorded")
    for e in exits:
        assert (e.fields["signal_name"], e.fields["caused_by"]) == ("SIGSEGV", None)
        assert "Fatal Python error: Segmentation fault" in e.fields["stderr_tail"]
        assert e.fields["crash_dump"][0] == "Fatal Python error: Segmentation fault"   # the dump, whole
    report = analyze([str(run_dir)])
    deaths = [d for d in report.deaths if d.pid in {e.fields["pid"] for e in exits}]
    assert [(d.cause, d.detail) for d in deaths] == [("sudden_exit", "segfault")] * 2
    assert all([f.function for f in d.stack[:2]] == ["string_at", "segfault"] for d in deaths)   # where it crashed
    blame = next(b for b in report.killed_workers if b.task == "segfaults")
    assert blame.fair is True and {(d.worker, d.incarnation) for d in blame.deaths} == \
        {(d.worker, d.incarnation) for d in deaths}


def test_dasks_own_log_lines_join_the_recorded_deaths_and_add_none(nanny_cluster):
    """The run directory keeps Dask's text log (``Restarting worker``, faulthandler dumps, the nanny's memory
    warning) beside the plugins' records of the same deaths: each death is counted once, as the recorded
    process, never again as an unnamed one."""
    _, run_dir = nanny_cluster
    recorded = {e.fields["pid"] for e in read_events(str(run_dir), "worker-exit", source="nanny")
                if e.fields["caused_by"] is None or e.fields["caused_by"] == "memory"}
    assert recorded, "the tests above this one died no worker"
    text = (run_dir / "dask-cluster.log").read_text() + "".join(p.read_text() for p in run_dir.glob("worker-*.log"))
    assert "Restarting worker" in text and "Fatal Python error" in text   # the copies are there to be joined
    deaths = analyze([str(run_dir)]).deaths
    assert all(d.pid is not None for d in deaths), [(d.worker, d.cause, d.detail) for d in deaths]
    assert len({d.pid for d in deaths}) == len(deaths)
    assert recorded <= {d.pid for d in deaths if d.cause != "chose_to_exit"}


# ---------------------------------------------------------------------- without a nanny
def test_without_a_nanny_the_scheduler_and_the_launcher_record_each_death(tmp_path):
    """No nanny: the scheduler's view (the connection closed while the task was executing), the worker's own
    last words (its faulthandler dump), and, because kwdiag's cluster host launched the worker processes,
    their exit status."""
    run_dir = tmp_path / "run"
    with dask_host(run_dir, "--workers", "2", "--no-nanny") as address, Client(address, timeout="60s") as client:
        killed = client.submit(sleep_until, str(tmp_path / "wake"), 600, key="running-on-killed")
        pid = executing_pid(run_dir, "running-on-killed")
        os.kill(pid, signal.SIGKILL)
        removed = removal_of(run_dir, pid).fields
        assert (removed["how"], removed["expected"], removed["nanny"]) == ("connection-closed", False, None)
        assert removed["running_tasks"] == ["running-on-killed"] and removed["blamed"] == ["running-on-killed"]
        (tmp_path / "wake").touch()
        assert killed.result(timeout=DEADLINE) == "woken"   # rerun on the worker that is left
        crashed = client.submit(segfault, key="segfaults-alone")
        crashed_pid = executing_pid(run_dir, "segfaults-alone")
        tail = removal_of(run_dir, crashed_pid).fields["stderr_tail"]
        assert "Fatal Python error: Segmentation fault" in tail
    exits = {e.fields["pid"]: e.fields for e in read_events(str(run_dir), "worker-exit", source="cluster")}
    assert (exits[pid]["signal_name"], exits[pid]["caused_by"]) == ("SIGKILL", None)
    assert (exits[crashed_pid]["signal_name"], exits[crashed_pid]["running_tasks"]) == ("SIGSEGV", ["segfaults-alone"])
    killed_death, crashed_death = death_of(run_dir, pid), death_of(run_dir, crashed_pid)
    assert (killed_death.cause, killed_death.detail) == ("sudden_exit", "sigkill")
    assert killed_death.running == ("running-on-killed",)
    assert (crashed_death.cause, crashed_death.detail) == ("sudden_exit", "segfault")
    assert crashed_death.running == ("segfaults-alone",)
    assert [f.function for f in crashed_death.stack[:2]] == ["string_at", "segfault"]   # the scheduler kept the dump


@pytest.mark.parametrize("nanny", [True, False], ids=["nanny", "no-nanny"])
def test_a_clean_run_ends_with_the_cluster_and_nothing_else(tmp_path, nanny):
    run_dir = tmp_path / "run"
    args = ["--workers", "2"] + ([] if nanny else ["--no-nanny"])
    with dask_host(run_dir, *args) as address, Client(address, timeout="60s") as client:
        assert sum(client.gather(client.map(abs, range(-50, 50)))) == 2500
    report = analyze([str(run_dir)])
    assert not report.failures and not report.killed_workers
    assert_deaths(report.deaths, [(ANY, 1, "chose_to_exit", "shutdown")] * 2)
    exits = read_events(str(run_dir), "worker-exit", source="nanny" if nanny else "cluster")
    assert len(exits) == 2 and {e.fields["caused_by"] for e in exits} == {"shutdown"}


# ---------------------------------------------------------------------- a hang past the worker TTL
def test_a_hung_worker_is_removed_for_missing_heartbeats(tmp_path):
    """Dask 2024.x and later have the nanny restart a worker that missed its heartbeats (the nanny's record
    says so); 2023.x removes it and leaves its nanny alone (the scheduler's record says so)."""
    run_dir = tmp_path / "run"
    with dask_host(run_dir, "--workers", "1", "--worker-ttl", "1s") as address, \
            Client(address, timeout="60s") as client:
        client.submit(sleep_until, str(tmp_path / "never"), 600, key="hung-task")
        pid = executing_pid(run_dir, "hung-task")
        os.kill(pid, signal.SIGSTOP)   # silent: no heartbeat, no closed connection
        try:
            removed = removal_of(run_dir, pid).fields
            if DASK_VERSION >= (2024,):
                f = exit_of(run_dir, pid).fields
                assert f["caused_by"] == "heartbeat-timeout" and f["signal_name"] == "SIGKILL"
                assert f["kill_reason"].startswith("check-worker-ttl") and f["running_tasks"] == ["hung-task"]
                assert read_events(str(run_dir), "heartbeat-missed", address=removed["address"])
            else:
                assert removed["how"] == "heartbeat-timeout" and removed["noticed_after"] >= 1
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert removed["running_tasks"] == ["hung-task"]
    death = death_of(run_dir, pid)
    assert (death.cause, death.detail) == ("sudden_exit", "heartbeat_timeout")


# ---------------------------------------------------------------------- Dask's own command lines
@contextmanager
def dask_process(module: str, args: list[str], log: Path, env: dict):
    """``python -m distributed.cli.<module> ARGS`` (``dask scheduler``/``dask worker``), stopped with SIGTERM."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(module_command(f"distributed.cli.{module}", *args), stdout=out, stderr=out,
                                stdin=subprocess.DEVNULL, env=child_env(env))
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def cli_cluster(tmp_path: Path, scheduler_env: dict, worker_env: dict, scheduler_args=(), worker_args=()):
    """A ``dask scheduler`` and one ``dask worker`` (with a nanny, named w) started from their command lines."""
    address_file = tmp_path / "scheduler.json"
    with dask_process("dask_scheduler", ["--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
                                         str(address_file), *scheduler_args], tmp_path / "scheduler.log",
                      scheduler_env):
        wait_until(address_file.exists, DEADLINE, 0.1, "the scheduler")
        address = json.loads(address_file.read_text())["address"]
        with dask_process("dask_worker", [address, "--name", "w", "--nthreads", "1", "--host", "127.0.0.1",
                                          "--no-dashboard", *worker_args], tmp_path / "worker.log", worker_env):
            with Client(address, timeout="60s") as client:
                client.wait_for_workers(1, timeout=DEADLINE)
                yield client, address_file


def test_preloads_from_config_and_command_line_and_a_death_forwarded_to_the_scheduler(tmp_path):
    """The scheduler preloads kwdiag.dask through its config key (an environment variable, as on Kubernetes);
    the worker and its nanny load it too from the command line (as with dask-jobqueue's worker_extra_args):
    each plugin records once. They record into different directories, as on two hosts."""
    sched_dir, worker_dir = tmp_path / "on-scheduler-host", tmp_path / "on-worker-host"
    scheduler_env = {"DASK_KWDIAG__RUN_DIR": str(sched_dir), "DASK_DISTRIBUTED__SCHEDULER__PRELOAD": "kwdiag.dask"}
    with cli_cluster(tmp_path, scheduler_env, {"KWDIAG_RUN_DIR": str(worker_dir)},
                     worker_args=["--nanny", "--preload", "kwdiag.dask", "--preload-nanny", "kwdiag.dask"]) as (
                         client, _):
        client.submit(sleep_until, str(tmp_path / "never"), 600, key="on-the-other-host")
        pid = executing_pid(worker_dir, "on-the-other-host")
        os.kill(pid, signal.SIGKILL)
        local = exit_of(worker_dir, pid).fields
        forwarded = wait_until(lambda: read_events(str(sched_dir), "worker-exit", pid=pid), DEADLINE)[0]
    assert forwarded.source == "scheduler" and forwarded.worker == "w" and forwarded.fields["forwarded"] is True
    for name in ("exitcode", "signal_name", "caused_by", "running_tasks", "will_restart"):
        assert forwarded.fields[name] == local[name], name
    assert forwarded.fields["running_tasks"] == ["on-the-other-host"]
    assert not list(sched_dir.glob("nanny-*")) and not list(worker_dir.glob("scheduler*"))
    assert len(read_events(str(worker_dir), "nanny-start")) == 1
    starts = [e.pid for e in read_events(str(worker_dir), "worker-start")]
    assert len(starts) == len(set(starts)) == 2   # one per worker process: the killed one and its replacement
    death = death_of(sched_dir, pid)   # the scheduler's directory alone is enough to tell
    assert (death.cause, death.detail) == ("sudden_exit", "sigkill") and death.running == ("on-the-other-host",)


def test_a_dask_worker_without_a_nanny_has_no_exit_code_but_its_dump_tells_the_segfault(tmp_path):
    """`dask worker --no-nanny`: no process is left to read the exit status; the scheduler's record carries the
    tasks that were executing and the worker's last log lines, which name the segfault."""
    run_dir = tmp_path / "run"
    env = {"KWDIAG_RUN_DIR": str(run_dir), "DASK_DISTRIBUTED__SCHEDULER__PRELOAD": "kwdiag.dask"}
    with cli_cluster(tmp_path, env, env, worker_args=["--no-nanny"]) as (client, _):
        client.submit(segfault, key="segfaults-unwatched")
        pid = executing_pid(run_dir, "segfaults-unwatched")
        removed = removal_of(run_dir, pid).fields
    assert removed["running_tasks"] == ["segfaults-unwatched"] and removed["nanny"] is None
    assert "Fatal Python error: Segmentation fault" in removed["stderr_tail"]
    assert not read_events(str(run_dir), "worker-exit")
    death = death_of(run_dir, pid)
    assert (death.cause, death.detail) == ("sudden_exit", "segfault") and death.running == ("segfaults-unwatched",)


JOB = '''
import os, signal, sys, tempfile
from dask.distributed import Client

def killed_once(marker):
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"

with Client() as client:          # DASK_SCHEDULER_ADDRESS, set by kwdiag run
    print(sum(client.gather(client.map(abs, range(-10, 10)))))
    print(client.submit(killed_once, os.path.join(tempfile.mkdtemp(), "m"), key="kills-its-worker").result())
'''


def run_kwdiag(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*KWDIAG, *args], cwd=cwd, capture_output=True, timeout=300,
                          env=child_env({"NO_COLOR": "1", **(env or {})}))


def test_kwdiag_run_registers_the_plugins_on_an_existing_dask_cluster(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    with cli_cluster(tmp_path, {}, {}, worker_args=["--nanny"]) as (client, address_file):
        result = run_kwdiag(["run", "--dask", "--scheduler-file", str(address_file), "--log-dir", "run", "job.py"],
                            tmp_path)
        assert result.returncode == 0, result.stderr.decode()[-3000:]
        assert result.stdout.decode().split() == ["100", "survived"]
        plugins = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.plugins))
        assert not [p for p in plugins if p.startswith("kwdiag")]   # removed at the end
    run_dir = tmp_path / "run"
    exit_event = read_events(str(run_dir), "worker-exit", source="nanny")[0].fields
    assert exit_event["signal_name"] == "SIGKILL" and exit_event["running_tasks"] == ["kills-its-worker"]
    assert b"sudden_exit/sigkill" in result.stderr and b"running kills-its-worker" in result.stderr
    assert json.loads((run_dir / "manifest.json").read_text())["runtime"] == "dask"


# ---------------------------------------------------------------------- kwdiag run --dask
@pytest.mark.parametrize("nanny", [True, False], ids=["nanny", "no-nanny"])
def test_kwdiag_run_dask_runs_an_unchanged_dask_job_and_diagnoses_it(tmp_path, nanny):
    (tmp_path / "job.py").write_text(JOB)
    args = ["run", "--dask", "--workers", "2", "--threads", "1", "--memory-limit", "1GiB", "--log-dir", "run"]
    result = run_kwdiag(args + ([] if nanny else ["--no-nanny"]) + ["--fail-on", "sudden_exit", "job.py"], tmp_path)
    stderr = result.stderr.decode()
    assert result.stdout.decode().split() == ["100", "survived"], stderr[-3000:]
    assert result.returncode == 1 and "--fail-on matched 1 death(s)" in stderr   # the job itself succeeded
    expected = "sudden_exit/sigkill"   # without a nanny, kwdiag's cluster host saw the exit status
    assert f"died: {expected}" in stderr and "running kills-its-worker" in stderr
    run_dir = tmp_path / "run"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["runtime"] == "dask" and manifest["versions"]["distributed"]
    # Every end counted once: the SIGKILL, and the workers the run closed at its end (without a nanny, nobody
    # replaced the killed one).
    survivors = 2 if nanny else 1
    assert manifest["deaths_by_cause"] == {expected: 1, "chose_to_exit/shutdown": survivors}
    assert manifest["job_exit_code"] == 0
    assert (run_dir / "dask-cluster.log").exists() and not (run_dir / ".dask-scheduler.json").exists()
    explained = json.loads(run_kwdiag(["explain", str(run_dir), "--format", "json"], tmp_path).stdout)
    assert any(f.endswith("dask-cluster.log") for f in explained["files"])   # Dask's own text log is read too
    assert_deaths(explained["deaths"],
                  [(ANY, ANY, *expected.split("/")), *[(ANY, ANY, "chose_to_exit", "shutdown")] * survivors])


def test_kwdiag_run_dask_usage_errors(tmp_path):
    (tmp_path / "job.py").write_text("print('hi')\n")
    no_dask = subprocess.run([sys.executable, "-c", "import sys; sys.modules['distributed'] = None; "
                              "from kwdiag.cli import main; sys.argv = ['kwdiag', 'run', '--dask', 'job.py']; main()"],
                             cwd=tmp_path, capture_output=True, env=child_env(), timeout=120)
    assert no_dask.returncode == 2 and b"pip install 'kwdiag[dask]'" in no_dask.stderr
    missing = run_kwdiag(["run", "--dask", "--scheduler-file", "nowhere.json", "job.py"], tmp_path)
    assert missing.returncode == 2 and b"cannot read the Dask scheduler file" in missing.stderr
    unreachable = run_kwdiag(["run", "--dask", "--scheduler", "tcp://127.0.0.1:9", "job.py"], tmp_path,
                             env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"})
    assert unreachable.returncode == 3 and b"cannot reach the Dask scheduler" in unreachable.stderr
    for result in (no_dask, missing, unreachable):
        assert b"Traceback" not in result.stderr


def test_ctrl_c_closes_the_dask_cluster_in_order_and_still_diagnoses(tmp_path):
    (tmp_path / "slow.py").write_text("import time\nfrom dask.distributed import Client\n"
                                      "with Client() as c:\n    c.submit(time.sleep, 600, key='sleeps').result()\n")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([*KWDIAG, "run", "--dask", "--log-dir", str(run_dir), "slow.py"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=child_env())
    executing_pid(run_dir, "sleeps")
    os.killpg(proc.pid, signal.SIGINT)   # what Ctrl-C does: the whole foreground process group
    out, err = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 130, err.decode()[-3000:]
    assert b"interrupted" in err and b"Verdict:" in err
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["exit_code"] == 130
    assert read_events(str(run_dir), "scheduler-close", reason="cluster-close")
    leftovers = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout.split()
    assert not leftovers, f"processes left behind: {leftovers}"


def _run_job_recording_pids(tmp_path, source: str, until: str | None = None):
    """Run a job script whose tasks write their worker's pid as a file name into the folder it is given: the
    finished run and those pids. With ``until`` (a file the job writes when it has what the test reads), the job's
    own end is not waited for past a minute more: Dask 2024.12.1's LocalCluster close can hang after its workers
    were killed (4 of 6 runs here), and the test is not about that close; its processes are then killed."""
    pids = tmp_path / "pids"
    pids.mkdir()
    (tmp_path / "job.py").write_text(source)
    if until is None:
        run = subprocess.run([sys.executable, "job.py", str(pids)], cwd=tmp_path, capture_output=True, text=True,
                             timeout=DEADLINE * 3, env=child_env())
        return run, sorted(int(p) for p in os.listdir(pids))
    with open(tmp_path / "job.err", "w") as err:
        proc = subprocess.Popen([sys.executable, "job.py", str(pids)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=err, env=child_env(), start_new_session=True)
        try:
            wait_until(lambda: (tmp_path / until).exists() or proc.poll() is not None, DEADLINE * 2, 0.1, until)
            proc.wait(60)
        except (subprocess.TimeoutExpired, AssertionError):
            os.killpg(proc.pid, signal.SIGKILL)   # the job and every process it started
            proc.wait(30)
    run = subprocess.CompletedProcess(proc.args, proc.returncode, "", (tmp_path / "job.err").read_text())
    return run, sorted(int(p) for p in os.listdir(pids))


# A LocalCluster whose workers cannot stop when asked: each worker's event loop is blocked by a coroutine that
# sleeps without awaiting, so at the close each nanny escalates (its kill) and then reports the exit. The three
# nannies live in the job's process and log to its stderr: three kill lines, then three exits, in one stream.
HUNG_AT_CLOSE_JOB = '''
import logging, os, sys, time
from pathlib import Path
from distributed import Client, LocalCluster

async def hang(up):
    Path(up, str(os.getpid())).touch()
    time.sleep(300)   # no await: the worker's event loop stops, so it cannot stop when its nanny asks

if __name__ == "__main__":
    up = sys.argv[1]
    cluster = LocalCluster(n_workers=3, threads_per_worker=1, silence_logs=logging.INFO, dashboard_address=None)
    client = Client(cluster)
    client.run(hang, up, wait=False)
    deadline = time.monotonic() + 120
    while len(os.listdir(up)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    client.close()
    cluster.close(timeout=120)
'''


def test_nannies_that_kill_their_hung_workers_at_a_close_are_one_death_each(tmp_path):
    """The whole log: three chosen closes that the nannies finished by killing. What a user pastes of it (the kill
    lines and the exit lines, in their order in the log, with or without their time prefix): three deaths whose
    close the lines do not show (``unknown/close_timeout``), one per pid, none extra (each kill line pairs with
    an exit that follows it: which with which, the lines cannot tell)."""
    import re

    run, pids = _run_job_recording_pids(tmp_path, HUNG_AT_CLOSE_JOB)
    lines = run.stderr.splitlines()
    told = [line for line in lines if "still alive after" in line or re.search(r"Worker process \d+ was killed", line)]
    assert len(pids) == 3 and len(told) == 6, run.stderr[-3000:]
    (tmp_path / "cluster.log").write_text(run.stderr)
    whole = analyze([str(tmp_path / "cluster.log")]).deaths
    assert sorted((d.pid, d.cause, d.detail) for d in whole) == [(p, "chose_to_exit", "shutdown") for p in pids]
    expected = sorted((f"process {p}", "unknown", "close_timeout") for p in pids)
    for paste in (told, [re.sub(r"^\d{4}-\d\d-\d\d [\d:,]+ - ", "", line) for line in told]):
        (tmp_path / "paste.txt").write_text("\n".join(paste) + "\n")
        assert sorted((d.worker, d.cause, d.detail) for d in analyze([str(tmp_path / "paste.txt")]).deaths) \
            == expected, paste


# What a notebook shows of Dask's own log-fetching calls: a task that SIGKILLs every worker that runs it (four, with
# the default allowed-failures), then the logs printed and pretty-printed as users paste them.
LOGS_IN_A_NOTEBOOK_JOB = '''
import os, pprint, signal, sys, time
from pathlib import Path
from distributed import Client, LocalCluster

def die(killed):
    Path(killed, str(os.getpid())).touch()
    os.kill(os.getpid(), signal.SIGKILL)

if __name__ == "__main__":
    killed = sys.argv[1]
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as client:
        try:
            client.submit(die, killed, pure=False).result(timeout=120)
        except Exception as exc:
            print(type(exc).__name__, file=sys.stderr)
        deadline = time.monotonic() + 120
        while len(client.scheduler_info()["workers"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        nanny_logs = client.get_worker_logs(nanny=True)
        Path("print_worker_logs.txt").write_text(str(nanny_logs) + "\\n")
        with open("pprint_worker_logs.txt", "w") as f:
            pprint.pprint(nanny_logs, stream=f)
        with open("pprint_cluster_logs.txt", "w") as f:
            pprint.pprint(dict(cluster.get_logs()), stream=f)
        Path("written").touch()
'''


def test_logs_printed_from_a_notebook_are_read_as_the_lines_they_hold(tmp_path):
    """``print(client.get_worker_logs(nanny=True))`` and its ``pprint`` (long strings cut into adjacent literals over
    several lines, newest line first, each nanny of the LocalCluster returning the whole process's nanny records)
    tell each SIGKILL once; ``pprint(cluster.get_logs())`` holds the scheduler's view: as many deaths, of unknown
    cause, and the KilledWorker. Read from a file, from stdin, and cut off mid-value as a paste is."""
    run, killed = _run_job_recording_pids(tmp_path, LOGS_IN_A_NOTEBOOK_JOB, until="written")
    assert len(killed) == 4 and "KilledWorker" in run.stderr, run.stderr[-3000:]
    sigkills = sorted((f"process {pid}", "sudden_exit", "sigkill") for pid in killed)

    def deaths(path):
        r = analyze([str(path)])
        return sorted((d.worker, d.cause, d.detail) for d in r.deaths), len(r.killed_workers)

    assert deaths(tmp_path / "print_worker_logs.txt") == (sigkills, 0)
    assert deaths(tmp_path / "pprint_worker_logs.txt") == (sigkills, 0)
    cluster_deaths, killed_workers = deaths(tmp_path / "pprint_cluster_logs.txt")
    assert [d[1:] for d in cluster_deaths] == [("unknown", "no_evidence")] * 4 and killed_workers == 1
    text = (tmp_path / "pprint_worker_logs.txt").read_text()
    piped = subprocess.run([*KWDIAG, "explain", "-", "--format", "json"], input=text, capture_output=True,
                           text=True, env=child_env(), timeout=120)
    assert sorted((d["worker"], d["cause"], d["detail"]) for d in json.loads(piped.stdout)["deaths"]) == sigkills
    cut = tmp_path / "cut.txt"   # a paste that stops inside the value: the deaths whose lines it holds
    cut.write_text(text[: len(text) * 3 // 5])
    part, _ = deaths(cut)
    assert part and set(part) <= set(sigkills)


def test_dask_worker_commands_sharing_one_log_each_die_of_the_sigterm_they_were_sent(tmp_path):
    """Three ``dask worker`` commands whose output goes to one file (as ``srun`` gathers a job's stderr), stopped
    together with SIGTERM (as SLURM cancels a job): one death each, by its address, of the SIGTERM it handled, none
    extra. The same file without its time prefixes (a custom ``logging`` format, as in a job's ``worker.e``) reads
    the same. (Dask before 2022 also printed "Exiting on signal 15", which names no process, and closed its nanny
    without a reason: ``tests/test_timeline.py`` gives each command's line to one death.)"""
    import re

    address_file, log = tmp_path / "scheduler.json", tmp_path / "worker.e"
    with dask_process("dask_scheduler", ["--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
                                         str(address_file)], tmp_path / "scheduler.log", {}):
        wait_until(address_file.exists, DEADLINE, 0.1, "the scheduler")
        address = json.loads(address_file.read_text())["address"]
        with open(log, "ab") as out:
            workers = [subprocess.Popen(module_command("distributed.cli.dask_worker", address, "--nthreads", "1",
                                                       "--host", "127.0.0.1", "--no-dashboard"),
                                        stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=child_env({}))
                       for _ in range(3)]
        try:
            with Client(address, timeout="60s") as client:
                client.wait_for_workers(3, timeout=DEADLINE)
                addresses = sorted(client.scheduler_info()["workers"])
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                w.wait(DEADLINE)
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                    w.wait()
    text = log.read_text()
    assert text.count("Reason: signal-15") >= 3, text
    expected = [(a, "chose_to_exit", "sigterm") for a in addresses]
    (tmp_path / "unstamped.e").write_text(re.sub(r"(?m)^\d{4}-\d\d-\d\d [\d:,]+ - ", "", text))
    for name in ("worker.e", "unstamped.e"):
        deaths = analyze([str(tmp_path / name)]).deaths
        assert sorted((d.address, d.cause, d.detail) for d in deaths) == expected, (name, deaths)


def _refused_attempt(address: str, log: Path) -> int | None:
    """Run ``dask worker --name w`` against ``address`` (where w runs) into ``log``; its exit status, or None when it
    had to be killed: Dask 2024.12.1's command once hung for minutes after its nanny closed on the refusal (seen in
    CI), and how the process then ends is not what the caller tests (the refusal is logged by then)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(module_command("distributed.cli.dask_worker", address, "--name", "w", "--nthreads", "1",
                                               "--host", "127.0.0.1", "--no-dashboard"),
                                stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=child_env({}))
    deadline = time.monotonic() + DEADLINE
    while proc.poll() is None and "nanny-instantiate-failed" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        assert "name taken, w" in log.read_text(errors="replace")
        proc.kill()
        proc.wait()
        return None


def test_a_worker_refused_for_a_name_another_worker_holds_is_told_so(tmp_path):
    """A second ``dask worker --name w`` while w runs (a pod restarted under its old name, a copied command line):
    the scheduler refuses the name, the worker raises while starting and its command exits 1. Its death says so
    and names the fix (a unique name); the first w ends in the cluster's close (SIGTERM to it, then to the
    scheduler); nothing else."""
    refused = tmp_path / "refused"
    refused.mkdir()
    with cli_cluster(tmp_path, {}, {}) as (client, address_file):
        address = json.loads(address_file.read_text())["address"]
        for attempt in ("second.log", "third.log"):   # a replacement tried twice (a pod's restarts)
            status = _refused_attempt(address, refused / attempt)
            assert status is None or status != 0, (refused / attempt).read_text()
        assert list(client.scheduler_info()["workers"].values())[0]["name"] == "w"
    report = analyze([str(tmp_path)])
    assert sorted((d.worker, d.cause, d.detail) for d in report.deaths) == [("w", "chose_to_exit", "shutdown")] + [
        ("w", "unrecoverable_exception", "name_taken")] * 2, report.deaths
    told = [d for d in report.deaths if d.detail == "name_taken"]
    assert sorted(next(e.file for e in d.evidence if "name taken, w" in e.text).rsplit("/", 1)[1] for d in told) == [
        "second.log", "third.log"]
    assert "already holds the name `w`" in told[0].hints[0].text
    # The scheduler's log alone (what is pasted from a Kubernetes scheduler pod): each refusal is a refused worker's
    # death, not the holder's; beside the refused workers' own logs (each tells its refusal several times: the error
    # line, then its traceback's), still one death per refusal.
    scheduler = tmp_path / "scheduler.log"
    assert scheduler.read_text().count("Worker tried to connect with a duplicate name: w") == 2
    for inputs in ([scheduler], [scheduler, refused / "second.log"], [scheduler, refused]):
        deaths = analyze([str(f) for f in inputs]).deaths
        assert sorted((d.worker, d.cause, d.detail) for d in deaths) == [("w", "chose_to_exit", "shutdown")] + [
            ("w", "unrecoverable_exception", "name_taken")] * 2, (inputs, deaths)
