"""`kwdiag scheduler` and `kwdiag worker` as a user runs them by hand, and their errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import read_events, wait_for_event, wait_until
from kwdiag.runtime import Client

KWDIAG = [sys.executable, "-m", "kwdiag"]


def inc(x):
    return x + 1


def run_cli(*args, env=None, timeout=30):
    return subprocess.run([*KWDIAG, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_scheduler_and_worker_by_hand(tmp_path):
    log_dir, sched_file = str(tmp_path / "logs"), str(tmp_path / "scheduler.json")
    env = {**os.environ}
    env.pop("KWDIAG_SECRET", None)
    scheduler = subprocess.Popen([*KWDIAG, "scheduler", "--port", "0", "--scheduler-file", sched_file,
                                  "--log-dir", log_dir, "--allowed-failures", "7"], env=env,
                                 stderr=open(tmp_path / "s.log", "wb"), start_new_session=True)
    worker = None
    try:
        wait_until(lambda: os.path.exists(sched_file), what="scheduler file")
        assert oct(os.stat(sched_file).st_mode & 0o777) == "0o600"
        info = json.load(open(sched_file))
        assert info["address"].startswith("tcp://127.0.0.1:") and len(bytes.fromhex(info["secret"])) == 32
        worker = subprocess.Popen([*KWDIAG, "worker", "--scheduler-file", sched_file, "--name", "by-hand",
                                   "--memory-limit", "1GiB", "--log-dir", log_dir], env=env,
                                  stderr=open(tmp_path / "w.log", "wb"), start_new_session=True)
        with Client(scheduler_file=sched_file) as client:
            wait_until(lambda: client.scheduler_info()["workers"], what="worker registered")
            state = client.scheduler_info()
            assert state["allowed_failures"] == 7
            assert [w["name"] for w in state["workers"].values()] == ["by-hand"]
            assert client.submit(inc, 1).result(timeout=30) == 2
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        assert wait_for_event(log_dir, "worker-end", worker="by-hand")[0].fields["reason"] == "signal-15"
        scheduler.send_signal(signal.SIGTERM)
        assert scheduler.wait(30) == 0
        assert read_events(log_dir, "scheduler-close")[0].fields["reason"] == "signal-15"
        text = (tmp_path / "w.log").read_text()
        assert " - kwdiag.nanny - INFO - " in text and " - kwdiag.worker - INFO - " in text
    finally:
        for proc in (worker, scheduler):
            if proc is not None and proc.poll() is None:
                proc.kill()


@pytest.mark.parametrize("args, env, message", [
    (["worker", "tcp://127.0.0.1:9"], {"KWDIAG_SECRET": ""}, "no shared secret"),
    (["worker", "--scheduler-file", "/nonexistent/s.json"], {}, "cannot read scheduler file"),
    (["worker", "tcp://127.0.0.1:9", "--memory-limit", "banana"], {"KWDIAG_SECRET": "00"}, "not a size"),
    (["scheduler", "--port", "0"], {"KWDIAG_SECRET": ""}, "--scheduler-file is required unless KWDIAG_SECRET"),
    (["scheduler", "--port", "0", "--new-secret"], {"KWDIAG_SECRET": "ab" * 32}, "--new-secret asks for a new"),
    (["worker", "--no-such-option"], {}, "No such option: --no-such-option"),
    (["scheduler", "--scheduler-file", "x", "--set", "allowed_failures"], {}, "KEY=VALUE"),
    (["explain", "--bogus", "x.log"], {}, "No such option: --bogus"),
    (["explain", "--format"], {}, "Option '--format' requires an argument"),
    (["run", "--fial-on", "sudden_exit", "job.py"], {}, "no such option: --fial-on (see `kwdiag run --help`)"),
    (["no-such-command"], {}, "No such command 'no-such-command'"),
])
def test_usage_errors_are_one_line_and_exit_2(args, env, message):
    result = run_cli(*args, env=env)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("kwdiag: error: "), \
        result.stderr


def test_scheduler_file_problems_are_one_clear_line(tmp_path):
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"type": "kwdiag-scheduler", "address": "tcp://127.0.0.1:9", "secret": "cd" * 32}))
    cases = [
        (["scheduler", "--scheduler-file", str(garbage), "--port", "0"], {"KWDIAG_SECRET": ""},
         "not a kwdiag scheduler file"),
        (["scheduler", "--scheduler-file", str(tmp_path), "--port", "0"], {"KWDIAG_SECRET": ""},
         "cannot read scheduler file"),
        (["scheduler", "--scheduler-file", str(other), "--port", "0"], {"KWDIAG_SECRET": "ab" * 32},
         "belongs to another cluster"),
        (["worker", "--scheduler-file", str(other)], {"KWDIAG_SECRET": "ab" * 32}, "belongs to another cluster"),
        (["worker", "--scheduler-file", str(garbage)], {"KWDIAG_SECRET": ""}, "not a kwdiag scheduler file"),
    ]
    for args, env, message in cases:
        result = run_cli(*args, "--log-dir", str(tmp_path / "logs"), env=env)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert json.loads(other.read_text())["secret"] == "cd" * 32   # another cluster's file is left alone


def test_a_port_in_use_is_one_clear_error_and_exit_3(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("scheduler", "--port", str(port), "--scheduler-file", str(tmp_path / "sf.json"),
                         "--log-dir", str(tmp_path / "logs"), env={"KWDIAG_SECRET": ""})
    assert result.returncode == 3, result.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "sf.json").exists()   # nothing announced for a scheduler that did not start
