"""`kwdiag run`, `kwdiag runs` and `kwdiag demo` as a user runs them: real jobs, real clusters, real deaths.

The output is checked in a pipe (plain lines, no control codes) and in a pseudo-terminal (the live view).
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from conftest import wait_until
from kwdiag.run.options import resolve

KWDIAG = [sys.executable, "-m", "kwdiag"]
ANSI = re.compile(rb"\x1b[\[\]]")
COLOUR = re.compile(rb"\x1b\[[0-9;]*(3[0-7]|38;[0-9;]+|9[0-7])m")

JOB = textwrap.dedent('''
    """A job that computes, prints, and kills one worker with SIGKILL from inside a task."""
    import os, signal, sys
    from kwdiag.runtime import Client

    def square(x):
        return x * x

    def kill_my_worker():
        os.kill(os.getpid(), signal.SIGKILL)

    client = Client()
    print("args:", sys.argv[1:], flush=True)
    print("sum:", client.submit(sum, client.map(square, range(100))).result(), flush=True)
    try:
        client.submit(kill_my_worker, key="killer").result()
    except Exception as exc:
        print("killer failed:", type(exc).__name__, flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    sys.exit(int(os.environ.get("JOB_EXIT", "0")))
''')

SLOW_JOB = textwrap.dedent('''
    import time
    from kwdiag.runtime import Client

    client = Client()
    print("started", flush=True)
    client.submit(time.sleep, 600).result()
''')


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return path


def run_kwdiag(args, cwd, env=None, timeout=180):
    return subprocess.run([*KWDIAG, *args], cwd=cwd, capture_output=True, timeout=timeout,
                          env={**os.environ, "KWDIAG_ALLOWED_FAILURES": "0", **(env or {})})


def only_run_dir(tmp_path):
    runs = [p for p in (tmp_path / "kwdiag-runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def test_run_in_a_pipe_passes_the_job_through_and_ends_with_the_diagnosis(tmp_path, job):
    result = run_kwdiag(["run", "--workers", "2", "--memory-limit", "1GiB", str(job), "--a", "b"], tmp_path,
                        env={"JOB_EXIT": "3"})
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 3                                   # the job's own exit code
    assert "args: ['--a', 'b']" in out and "sum: 328350" in out      # arguments and stdout pass through
    assert "killer failed: KilledWorker" in out
    assert "to stderr" in err
    assert not ANSI.search(result.stderr), "control codes in a pipe"
    assert re.search(r"\d\d:\d\d:\d\d kwdiag: worker worker-\d #1 died: sudden_exit/sigkill", err)  # said at once
    assert "Verdict:" in err and "Run: job exit code 3" in err
    run_dir = only_run_dir(tmp_path)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["exit_code"] == 3 and manifest["job_exit_code"] == 3 and manifest["status"] == "finished"
    # Every worker's end, counted once: the SIGKILL, and the two processes the run closed at its end.
    assert manifest["deaths_by_cause"] == {"sudden_exit/sigkill": 1, "chose_to_exit/shutdown": 2}
    assert manifest["tasks"]["finished"] >= 101 and manifest["tasks"]["erred"] == 1
    assert manifest["versions"]["kwdiag"] and manifest["args"] == ["--a", "b"]
    # the command as typed, its own options too
    assert manifest["command"] == ["kwdiag", "run", "--workers", "2", "--memory-limit", "1GiB", str(job), "--a", "b"]
    assert "notes" not in manifest and "ran no task on kwdiag's cluster" not in err   # it ran on kwdiag's cluster
    assert (run_dir / "job.stdout").read_text() == out
    assert "to stderr" in (run_dir / "job.stderr").read_text()
    assert not (run_dir / "scheduler.json").exists()                 # the shared secret does not stay behind
    for name in ("scheduler.jsonl", "nanny-worker-0.jsonl", "worker-worker-0.jsonl", "scheduler.log", "worker-0.log"):
        assert (run_dir / name).exists(), name
    # `kwdiag explain <run dir>` reproduces the same diagnosis.
    explained = run_kwdiag(["explain", str(run_dir), "--format", "json"], tmp_path)
    deaths = json.loads(explained.stdout)["deaths"]
    from collections import Counter
    assert Counter(f"{d['cause']}/{d['detail']}" for d in deaths) == Counter(manifest["deaths_by_cause"])
    listing = run_kwdiag(["runs"], tmp_path)
    assert listing.returncode == 0 and "job" in listing.stdout.decode() and "exit 3" in listing.stdout.decode()
    assert "sudden_exit/sigkill" in listing.stdout.decode()


def test_fail_on_turns_matching_deaths_into_a_failing_exit(tmp_path, job):
    result = run_kwdiag(["run", "--memory-limit", "1GiB", "--fail-on", "sudden_exit", "--log-dir",
                         str(tmp_path / "here"), str(job)], tmp_path)
    assert result.returncode == 1, result.stderr.decode()[-2000:]
    assert b"--fail-on matched 1 death(s)" in result.stderr
    assert json.loads((tmp_path / "here" / "manifest.json").read_text())["job_exit_code"] == 0
    shutdown_only = run_kwdiag(["run", "--memory-limit", "1GiB", "--fail-on", "version_mismatch", "--log-dir",
                                str(tmp_path / "there"), str(job)], tmp_path)
    assert shutdown_only.returncode == 0


def test_timeout_stops_a_hung_job_and_leaves_a_complete_run_directory(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW_JOB)
    started = time.monotonic()
    result = run_kwdiag(["run", "--timeout", "3s", "--memory-limit", "1GiB", "slow.py"], tmp_path)
    assert result.returncode == 124
    assert time.monotonic() - started < 150   # a hang guard; bench/ and docs/run.md give the real figures
    assert b"ran past --timeout" in result.stderr and b"Verdict:" in result.stderr
    manifest = json.loads((only_run_dir(tmp_path) / "manifest.json").read_text())
    assert manifest["status"] == "timed-out" and manifest["exit_code"] == 124 and manifest["verdict"]


def test_ctrl_c_stops_job_and_cluster_and_still_diagnoses(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW_JOB)
    proc = subprocess.Popen([*KWDIAG, "run", "--memory-limit", "1GiB", "slow.py"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    wait_until(lambda: list((tmp_path / "kwdiag-runs").glob("*/job.stdout")), what="job started")
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground process group
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert b"interrupted" in err and b"Verdict:" in err
    run_dir = only_run_dir(tmp_path)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["exit_code"] == 130
    scheduler = [json.loads(line) for line in (run_dir / "scheduler.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in scheduler]
    assert "scheduler-close" in kinds                                   # the cluster was closed, not abandoned
    assert set(kinds[kinds.index("scheduler-close") + 1:]) <= {"worker-removed"}   # and nothing ran after it
    leftovers = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout.split()
    assert not leftovers, f"processes left behind: {leftovers}"


def child_running(parent: int, script: str) -> int | None:
    """The pid of ``parent``'s child running ``python script``: this run's job, never another test's."""
    for child in psutil.Process(parent).children():
        try:
            if child.cmdline()[1:2] == [script]:
                return child.pid
        except psutil.Error:
            pass
    return None


def test_a_job_killed_from_outside_leaves_a_complete_run_directory(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW_JOB)
    proc = subprocess.Popen([*KWDIAG, "run", "--memory-limit", "1GiB", "slow.py"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: list((tmp_path / "kwdiag-runs").glob("*/job.stdout")), what="job started")
    run_dir = only_run_dir(tmp_path)
    job_pid = wait_until(lambda: child_running(proc.pid, "slow.py"), what="job pid")
    os.kill(job_pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 128 + 9
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["job_exit_code"] == -9 and manifest["status"] == "finished" and manifest["verdict"]


def test_live_view_in_a_terminal(tmp_path, job):
    """The live view is drawn in a real pseudo-terminal, the death line shows, and the diagnosis follows."""
    for no_color in (False, True):
        env = {**os.environ, "KWDIAG_ALLOWED_FAILURES": "0", "TERM": "xterm-256color", "COLUMNS": "120"}
        env.pop("NO_COLOR", None)
        if no_color:
            env["NO_COLOR"] = "1"
        pid, fd = pty.fork()
        if pid == 0:  # the child: kwdiag run with a terminal for stdout and stderr
            os.chdir(tmp_path)
            os.execvpe(sys.executable, [*KWDIAG, "run", "--memory-limit", "1GiB", "--log-dir",
                                        str(tmp_path / f"tty-{no_color}"), str(job)], env)
        output = b""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
        exit_by = max(deadline, time.monotonic() + 60)   # the terminal closes a moment before the process ends
        done, status = os.waitpid(pid, os.WNOHANG)
        while not done and time.monotonic() < exit_by:
            time.sleep(0.05)
            done, status = os.waitpid(pid, os.WNOHANG)
        if not done:   # still running past the deadline: a hang, reported as such rather than waited on forever
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            output += b"\n[killed: still running after 300 s]"
        assert os.waitstatus_to_exitcode(status) == 0, output[-3000:]
        text = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", output).decode("utf-8", "replace")
        (tmp_path / f"tty-{no_color}.out").write_bytes(output)
        assert "restarts" in text and "memory" in text                   # the worker table was drawn
        assert re.search(r"done \d+", text)                               # task progress
        assert "sum: 328350" in text                                       # the job's output got through
        assert re.search(r"worker worker-\d #1 died: sudden_exit/sigkill", text)
        assert "Verdict:" in text
        assert ANSI.search(output), "a terminal should get the live view's control codes"
        if no_color:
            assert not COLOUR.search(output), "NO_COLOR must remove colours"
        else:
            assert COLOUR.search(output)


def test_run_on_an_existing_cluster(tmp_path, job):
    from kwdiag.runtime import LocalCluster

    with LocalCluster(n_workers=2, memory_limit="1GiB", log_dir=str(tmp_path / "cluster"),
                      scheduler_kwargs={"allowed_failures": 0}) as cluster:
        result = run_kwdiag(["run", "--scheduler-file", cluster.scheduler_file, "--log-dir", str(tmp_path / "run"),
                             str(job)], tmp_path)
        assert result.returncode == 0, result.stderr.decode()[-2000:]
        assert b"sum: 328350" in result.stdout and b"killer failed: KilledWorker" in result.stdout
        # The cluster is not ours to close: it keeps both workers (the one the job killed is replaced by its nanny).
        wait_until(lambda: len(cluster.scheduler_info()["workers"]) == 2, what="both workers still there")
    assert (tmp_path / "run" / "manifest.json").exists() and (tmp_path / "run" / "job.stdout").exists()


def test_options_come_from_flags_then_environment_then_config_file(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.kwdiag]\nworkers = 5\nthreads = 2\nnanny = false\n'
                                             'timeout = "1m"\nfail-on = ["sudden_exit"]\n')
    monkeypatch.chdir(tmp_path)
    options = resolve({}, environ={})
    assert (options.workers, options.threads, options.nanny, options.timeout, options.fail_on) == \
        (5, 2, False, 60.0, ["sudden_exit"])
    assert resolve({}, environ={"KWDIAG_WORKERS": "3"}).workers == 3
    assert resolve({"workers": 1}, environ={"KWDIAG_WORKERS": "3"}).workers == 1
    from kwdiag.errors import KwdiagError

    with pytest.raises(KwdiagError, match="bad value for workers in KWDIAG_WORKERS"):
        resolve({}, environ={"KWDIAG_WORKERS": "many"})


def test_usage_errors(tmp_path):
    for args, message in ((["run", "missing.py"], b"no such job script"),
                          (["run", "--workers", "0", "x.py"], b"bad value for workers"),
                          (["run", "--log-dir", "/proc/kwdiag-cannot-write", "x.py"], b"cannot use the run directory"),
                          (["run", "--fail-on", "bogus", "x.py"], b"unknown cause")):
        (tmp_path / "x.py").write_text("print('hi')\n")
        result = run_kwdiag(args, tmp_path)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and b"Traceback" not in result.stderr


def test_demo_diagnoses_every_death_correctly(tmp_path):
    started = time.monotonic()
    result = run_kwdiag(["demo"], tmp_path, env={"KWDIAG_ALLOWED_FAILURES": ""})
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    assert time.monotonic() - started < 150   # a hang guard; bench/ and docs/run.md give the real figures
    manifest = json.loads((only_run_dir(tmp_path) / "manifest.json").read_text())
    deaths = manifest["deaths_by_cause"]
    assert deaths.pop("nanny_memory_restart/memory_limit") == 2
    assert deaths.pop("sudden_exit/segfault") == 2
    assert deaths.pop("chose_to_exit/retired") == 1
    assert deaths.pop("unrecoverable_exception/missing_module") == 1
    assert deaths.pop("version_mismatch/package_versions") == 1
    assert deaths == {"chose_to_exit/shutdown": 2}   # the two workers left when the run closes: nothing else
    err = result.stderr.decode()
    assert err.count("(KilledWorker, blame fair)") == 2           # memory-hog and segfault: KilledWorker, fairly
    assert "kwdiag_demo_plugin_not_installed" in err              # the fix names the missing module
    # Each segfault, said at once and in the fix, with the frame of the job's own code it crashed in
    # (the job's file as the frame shows it: run/demo_job.py from a clone, kwdiag/run/demo_job.py when installed)
    frame = r"crash \((?:kwdiag/)?run/demo_job\.py:\d+\)"
    assert len(re.findall(r"died: sudden_exit/segfault .*; crashed in " + frame, err)) == 2
    assert re.search("it crashed in " + frame, " ".join(err.split()))
    # The report: the answer and the fixes first, one fix per group, under 50 lines, 80 columns.
    report = err[err.index("\nVerdict: "):err.index("\nRun: ")].strip("\n").splitlines()
    assert report[0].startswith("Verdict: 6 worker death(s) need attention") and report[1] == "What to do:"
    assert [line.split()[0] for line in report[2:] if line.startswith("  [g")] == ["[g1]", "[g2]", "[g3]", "[g4]"]
    assert len(report) < 50 and max(len(line) for line in report) <= 80, "\n".join(report)
    assert " ".join(err.split()).count("start workers with more memory") == 1   # two memory deaths, one fix


def test_the_secret_never_reaches_the_run_directory_or_the_output(tmp_path):
    keeper = tmp_path / "secret.txt"  # outside the run directory
    (tmp_path / "job.py").write_text(textwrap.dedent(f'''
        import json, os
        from kwdiag.runtime import Client
        with open(os.environ["KWDIAG_SCHEDULER_FILE"]) as f:
            secret = json.load(f)["secret"]
        open({str(keeper)!r}, "w").write(secret)
        client = Client()
        print(client.submit(sum, [1, 2]).result())
    '''))
    result = run_kwdiag(["run", "--memory-limit", "1GiB", "--log-dir", str(tmp_path / "run"), "job.py"], tmp_path)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    secret = keeper.read_text()
    assert len(secret) == 64
    assert secret.encode() not in result.stdout + result.stderr
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_a_config_file_that_does_not_parse_is_one_clear_error_for_every_command(tmp_path):
    """run, check and the runtime's own commands read [tool.kwdiag] from the nearest kwdiag.toml or
    pyproject.toml; one that does not parse is named in a one-line error (exit 2), never silently skipped."""
    (tmp_path / "pyproject.toml").write_text('[tool.kwdiag]\nworkers = 2\nbroken = "\n')
    (tmp_path / "job.py").write_text("print('never runs')\n")
    (tmp_path / "logs").mkdir()
    for args in (["run", "job.py"], ["check", "logs"], ["scheduler", "--scheduler-file", "sf.json"]):
        result = run_kwdiag(args, tmp_path)
        err = result.stderr.decode()
        assert result.returncode == 2, (args, err[-2000:])
        assert "pyproject.toml" in err and "Traceback" not in err, (args, err[-2000:])
        assert b"never runs" not in result.stdout


ETL_JOB = textwrap.dedent('''
    """A Dask ETL as its author wrote it (dask.bag and dask.array, .compute()), the import switched to kwdiag.
    One partition kills its worker with os._exit the first time it runs."""
    import os, sys
    import dask.array as da
    import dask.bag as db
    from kwdiag.runtime import Client

    def parse(record):
        if record == 137 and not os.path.exists(sys.argv[1]):
            open(sys.argv[1], "w").close()
            os._exit(3)                       # the worker dies mid-task; the task runs again elsewhere
        return {"id": record, "score": record % 7}

    client = Client()                         # the cluster `kwdiag run` started: Dask's scheduler from now on
    records = db.from_sequence(range(500), npartitions=10).map(parse).filter(lambda r: r["score"] > 2)
    print("kept:", records.count().compute(), flush=True)
    print("total:", int(da.arange(10_000, chunks=1_000).sum().compute()), flush=True)
''')


def test_a_dask_etl_runs_on_the_embedded_runtime_and_its_worker_death_is_diagnosed(tmp_path):
    """No --dask: the job's dask.bag/dask.array .compute() calls run on kwdiag's own cluster, and the worker a
    partition killed is the one death in the report."""
    pytest.importorskip("dask.array")
    (tmp_path / "etl.py").write_text(ETL_JOB)
    result = run_kwdiag(["run", "--workers", "2", "--allowed-failures", "3", str(tmp_path / "etl.py"),
                         str(tmp_path / "marker")], tmp_path)
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    assert "kept: 284" in out and "total: 49995000" in out
    manifest = json.loads((only_run_dir(tmp_path) / "manifest.json").read_text())
    # Every worker's end, counted once: the partition's os._exit, and the two workers the run closed at its end.
    assert manifest["deaths_by_cause"] == {"unrecoverable_exception/os_exit": 1, "chose_to_exit/shutdown": 2}
    assert "running ('filter-lambda-from_sequence-parse" in result.stderr.decode()   # the partition it ran


OWN_DASK_CLUSTER_JOB = textwrap.dedent('''
    """A Dask job run unchanged: it imports Client from dask.distributed and starts its own LocalCluster."""
    import os, signal, sys
    from dask.distributed import Client, LocalCluster

    def kill_my_worker_once(marker):
        if not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return 42

    if __name__ == "__main__":
        with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as client:
            print("value:", client.submit(kill_my_worker_once, sys.argv[1]).result(), flush=True)
''')


def test_a_dask_job_that_starts_its_own_cluster_is_told_how_to_be_watched(tmp_path):
    """Without --dask a job that imports Client from dask.distributed runs on a Dask cluster of its own, not on
    kwdiag's: its death is still read from the WARNING lines Dask printed (the cause is not in them), and the run
    ends by saying what happened and the two ways to have the cluster watched."""
    pytest.importorskip("distributed")
    (tmp_path / "etl.py").write_text(OWN_DASK_CLUSTER_JOB)
    result = run_kwdiag(["run", "--workers", "2", str(tmp_path / "etl.py"), str(tmp_path / "marker")], tmp_path)
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, err[-3000:]
    assert "value: 42" in out
    said = " ".join(err.split())   # the note is wrapped to 80 columns
    assert "ran no task on kwdiag's cluster" in said and "kwdiag run --dask" in said and "kwdiag.runtime" in said
    assert all(len(line) <= 80 for line in err[err.index("Note:"):].splitlines())
    manifest = json.loads((only_run_dir(tmp_path) / "manifest.json").read_text())
    assert manifest["tasks"]["submitted"] == 0 and len(manifest["notes"]) == 1
    # The Dask worker's SIGKILL (its cause not in WARNING lines), and kwdiag's two unused workers closed at the end.
    assert manifest["deaths_by_cause"] == {"unknown/restarted": 1, "chose_to_exit/shutdown": 2}



def test_a_job_that_runs_no_task_on_kwdiags_cluster_is_told_so_even_when_dask_printed_nothing(tmp_path):
    """A Dask job whose own LocalCluster printed nothing (no death, or none at WARNING) left no Dask line to go by:
    the run still says that its workers ran no task of the job's, and how to have them watched."""
    (tmp_path / "quiet.py").write_text("print('nothing distributed here')\n")
    result = run_kwdiag(["run", "--workers", "1", str(tmp_path / "quiet.py")], tmp_path)
    err = result.stderr.decode()
    assert result.returncode == 0, err[-3000:]
    manifest = json.loads((only_run_dir(tmp_path) / "manifest.json").read_text())
    assert manifest["tasks"]["submitted"] == 0
    assert len(manifest["notes"]) == 1 and "If it uses Dask" in manifest["notes"][0]
    assert "ran no task on kwdiag's cluster. If it uses Dask" in " ".join(err.split())


def test_runs_lines_up_its_columns_whatever_the_jobs_are_called(tmp_path):
    """Two runs, one of a job whose name is longer than the usual column: the exit codes still line up, and a name
    past 40 characters is cut with its end marked."""
    names = ["etl.py", "nightly_segfault_reproduction_client.py", "a" * 50 + ".py"]
    for k, name in enumerate(names):
        run_dir = tmp_path / "kwdiag-runs" / f"2026112{k}-000000-job"
        run_dir.mkdir(parents=True)
        (run_dir / "manifest.json").write_text(json.dumps({
            "job": f"/home/me/{name}", "args": [], "started": 1795000000 + k, "exit_code": k, "duration": 1.5,
            "verdict": "no failures", "status": "finished"}))
    lines = run_kwdiag(["runs"], tmp_path).stdout.decode().splitlines()
    assert len(lines) == 3
    assert len({line.index(" exit ") for line in lines}) == 1, lines
    assert re.search(r"nightly_segfault_reproduction_client\.py +exit 1 ", lines[1]) and "a" * 38 + "…" in lines[2]
