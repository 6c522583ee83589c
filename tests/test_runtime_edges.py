"""Faults at the edges of a running cluster: its run directory fills up or is deleted, the wall clock jumps.

Real processes (``kwdiag scheduler`` / ``kwdiag worker`` with their stderr kept elsewhere, as a user's
terminal or systemd would), a real 4 MiB filesystem, a real ``rm -r`` of the run directory, and a
wall clock moved by an hour in every runtime process (a ``sitecustomize`` that offsets ``time.time``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess

import pytest

from conftest import read_events, spawn_kwdiag, stop, wait_for_event, wait_until
from kwdiag.events import from_json_line
from kwdiag.runtime import Client, LocalCluster
from kwdiag.runtime.spawn import module_command


def inc(x):
    return x + 1


def nap(x):
    import time

    time.sleep(0.1)
    return x


@pytest.fixture
def small_disk(tmp_path):
    """A real 4 MiB filesystem (tmpfs); skipped only where mounting is not allowed."""
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root?)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(path) -> None:
    """Write until the filesystem is full."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass


def _cluster(tmp_path, logs, name="w1"):
    sf = str(tmp_path / "sf.json")
    env = {"KWDIAG_SECRET": ""}
    scheduler = spawn_kwdiag(["scheduler", "--scheduler-file", sf, "--port", "0", "--log-dir", str(logs)],
                             str(tmp_path / "scheduler.stderr"), env)
    wait_until(lambda: os.path.exists(sf), what="scheduler file")
    worker = spawn_kwdiag(["worker", "--scheduler-file", sf, "--name", name, "--log-dir", str(logs)],
                          str(tmp_path / "worker.stderr"), env)
    return sf, [scheduler, worker]


def _worker_pid(client, incarnation=None):
    def pid():
        workers = list(client.scheduler_info()["workers"].values())
        return workers and (incarnation is None or workers[0]["incarnation"] == incarnation) and workers[0]["pid"]
    return wait_until(pid, what=f"worker incarnation {incarnation}")


def _explain(logs) -> dict:
    result = subprocess.run(module_command("kwdiag", "explain", "--format", "json", str(logs)),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_full_disk_mid_run_loses_events_not_the_job_and_explain_says_what_is_missing(small_disk, tmp_path):
    logs = small_disk / "logs"
    sf, procs = _cluster(tmp_path, logs)
    try:
        with Client(scheduler_file=sf) as client:
            held = client.map(inc, range(300))
            assert sum(client.gather(held)) == sum(range(1, 301))
            _fill(small_disk / "filler")
            # Full: the job goes on, through more work (journal appends fail) and a worker death (events fail:
            # its worker-removed event names the 300 results lost, far more than a file's last page can take).
            os.kill(_worker_pid(client), signal.SIGKILL)
            assert sum(client.gather(client.map(inc, range(300, 400)), timeout=60)) == sum(range(301, 401))
            assert sum(client.gather(held, timeout=60)) == sum(range(1, 301))   # recomputed
            _worker_pid(client, incarnation=2)
            stderr = (tmp_path / "scheduler.stderr").read_text()
            # The file lacks them; stderr has them all (the first loss is the one named, whichever it was).
            assert "Remove worker addr" in stderr and "Could not record event" in stderr
            assert "No space left on device" in stderr
            assert "Could not write the journal" in stderr
            (small_disk / "filler").unlink()
            # Room again: the next events are written, each file first saying what it is missing.
            wait_for_event(str(logs), "journal-restored")
            os.kill(_worker_pid(client, incarnation=2), signal.SIGKILL)
            wait_for_event(str(logs), "worker-exit", worker="w1", incarnation=2)
            assert client.submit(inc, 1).result(timeout=60) == 2
        lost = read_events(str(logs), "events-lost")
        assert "scheduler.jsonl" in {e.fields["file"] for e in lost}
        assert all("No space left on device" in e.fields["reason"] and e.fields["lost"] >= 1 for e in lost)
        doc = _explain(logs)
        notes = [n for n in doc["notes"] if n["rule"] == "kwdiag-events-lost"]
        assert "scheduler.jsonl" in {n["fields"]["file"] for n in notes}
        assert "some events are missing" in doc["verdict"]
        assert [(d["incarnation"], d["detail"]) for d in doc["deaths"] if d["failure"]][-1] == (2, "sigkill")
    finally:
        for proc in procs:
            stop(proc)


def test_a_run_directory_deleted_mid_run_is_recreated_and_the_journal_rewritten(tmp_path):
    logs = tmp_path / "logs"
    sf, procs = _cluster(tmp_path, logs)
    try:
        with Client(scheduler_file=sf) as client:
            futures = client.map(inc, range(50))
            assert client.gather(futures, timeout=60) == list(range(1, 51))
            shutil.rmtree(logs)
            os.kill(_worker_pid(client), signal.SIGKILL)   # a death right after: its evidence must not vanish
            assert client.gather(futures, timeout=60) == list(range(1, 51))   # still right after the death
            exit_event = wait_for_event(str(logs), "worker-exit", worker="w1")[0]
            assert exit_event.fields["signal_name"] == "SIGKILL"
            with open(logs / "nanny-w1.jsonl") as f:
                first = from_json_line(f.readline())
            assert first.kind == "events-lost" and "deleted" in first.fields["reason"] and first.fields["lost"] >= 1
            wait_for_event(str(logs), "journal-restored")
            _worker_pid(client, incarnation=2)
            # The gather above may have been answered from the values the client already had (small results
            # come with their news): wait for the lost copies to be computed again on the new incarnation.
            wait_until(lambda: all(client.who_has(futures).values()), what="the lost results computed again")
            # The scheduler dies now: its successor recovers from the journal written after the deletion.
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(10)
            procs[0] = spawn_kwdiag(["scheduler", "--scheduler-file", sf, "--port", "0", "--log-dir", str(logs)],
                                    str(tmp_path / "scheduler-2.stderr"), {"KWDIAG_SECRET": ""})
            recovered = wait_for_event(str(logs), "scheduler-recovered")[0]
            assert recovered.fields["reused"] == 50 and recovered.fields["recomputed"] == 0, recovered.fields
            assert client.gather(futures, timeout=60) == list(range(1, 51))
        doc = _explain(logs)
        assert [(d["worker"], d["detail"]) for d in doc["deaths"] if d["failure"]] == [("w1", "sigkill")]
        assert {n["rule"] for n in doc["notes"]} >= {"kwdiag-events-lost", "kwdiag-scheduler-recovered"}
    finally:
        for proc in procs:
            stop(proc)


SITECUSTOMIZE = '''
import os, time
_real, _path, _cache = time.time, os.environ.get("KWDIAG_TEST_CLOCK_FILE"), [0.0, -1.0]

def _shifted():
    now = time.monotonic()
    if now - _cache[1] > 0.05:   # the test moves the clock by writing an offset (seconds) to this file
        try:
            _cache[0] = float(open(_path).read() or 0)
        except (OSError, ValueError):
            pass
        _cache[1] = now
    return _real() + _cache[0]

if _path:
    time.time = _shifted
'''


def test_a_wall_clock_jump_disturbs_no_timeout(tmp_path, log_dir):
    """Every timeout and duration is on the monotonic clock: an hour forward, then two back, changes nothing."""
    clock_dir = tmp_path / "clock"
    clock_dir.mkdir()
    (clock_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    clock = tmp_path / "offset"
    clock.write_text("0")
    env = {"PYTHONPATH": str(clock_dir), "KWDIAG_TEST_CLOCK_FILE": str(clock)}
    # A heartbeat check on the wall clock would see an hour of silence at the first jump and drop every worker.
    with LocalCluster(n_workers=2, memory_limit=None, log_dir=log_dir, env=env,
                      scheduler_kwargs={"worker_ttl": "3s", "heartbeat_interval": "0.2s"}) as cluster, \
            Client(cluster) as client:
        shifted = read_events(log_dir, "scheduler-start")[0].ts
        assert client.gather(client.map(nap, range(10))) == list(range(10))
        for offset in (3600, -3600):
            clock.write_text(str(offset))
            # Long enough for many heartbeats and several time-to-lives on either side of the jump.
            assert client.gather(client.map(nap, range(offset % 97, offset % 97 + 30))) == \
                list(range(offset % 97, offset % 97 + 30))
        assert read_events(log_dir, "heartbeat-missed") == [] and read_events(log_dir, "worker-removed") == []
        pid = next(iter(client.scheduler_info()["workers"].values()))["pid"]
        os.kill(pid, signal.SIGKILL)
        exit_event = wait_for_event(log_dir, "worker-exit", predicate=lambda e: e.fields["pid"] == pid)[0]
        assert abs(exit_event.ts - shifted + 3600) < 600   # the events did see the jumps: the fake clock worked
        assert 0 < exit_event.fields["uptime"] < 600, exit_event.fields["uptime"]
        assert client.submit(inc, 1).result(timeout=60) == 2


def test_a_scheduler_that_dies_while_registering_a_new_worker_is_waited_for_not_fatal(tmp_path):
    """The chaos soak saw it: a worker's first registration was cut by the scheduler dying (a restart was on its
    way); the worker exited with status 1 ('Unable to connect to scheduler'), an uninjected death. Here the
    scheduler file first names a server that accepts the worker's connection and drops it as it registers (a
    scheduler dying at that moment), then the real scheduler of the same cluster: the worker must wait, as
    for a scheduler not up yet, and register with the real one."""
    import asyncio
    import threading

    from kwdiag.runtime.comm import Listener
    from kwdiag.runtime.identity import read_scheduler_file, write_scheduler_file

    logs, real_file, worker_file = tmp_path / "logs", tmp_path / "real.json", tmp_path / "worker.json"
    scheduler = spawn_kwdiag(["scheduler", "--scheduler-file", str(real_file), "--port", "0", "--log-dir",
                              str(logs)], str(tmp_path / "scheduler.out"))
    dropped = threading.Event()
    loop = asyncio.new_event_loop()
    try:
        wait_until(lambda: real_file.exists(), what="the scheduler file")
        address, secret = read_scheduler_file(str(real_file))

        async def drop_at_registration(comm):
            await comm.read()   # the worker's register-worker: the scheduler "dies" now
            comm.abort()
            dropped.set()

        listener = Listener(secret, drop_at_registration, lambda peer, why: None)
        threading.Thread(target=loop.run_forever, daemon=True).start()
        fake = asyncio.run_coroutine_threadsafe(listener.start("127.0.0.1", 0), loop).result(10)
        write_scheduler_file(str(worker_file), fake, secret)
        worker = spawn_kwdiag(["worker", "--scheduler-file", str(worker_file), "--name", "w1", "--no-nanny",
                               "--log-dir", str(logs)], str(tmp_path / "worker.out"))
        try:
            wait_until(dropped.is_set, what="the first registration to be cut")
            write_scheduler_file(str(worker_file), address, secret)   # the successor is up
            wait_for_event(str(logs), "worker-registered", name="w1")
            assert worker.poll() is None, (tmp_path / "worker.out").read_text()
            assert not read_events(str(logs), "worker-fatal")
        finally:
            stop(worker)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        stop(scheduler)
