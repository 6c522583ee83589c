"""kwdiag where Dask users already are: a live Dask cluster, a notebook's client, ``kwdiag run --dask``.

For each way a worker dies — a task that segfaults, a task that calls ``os._exit(1)``, a task past the memory
limit, a worker SIGKILLed from outside, a retired worker — on a real Dask LocalCluster (nannies, 300 MiB
each): ``kwdiag.dask.explain(client)`` inside ``kwdiag.dask.recording(client)``, ``kwdiag explain
--dask-scheduler``, and ``kwdiag run --dask`` of the same job each give exactly the expected multiset of
deaths (an extra death fails as surely as a missing one), and a ``KilledWorker`` raised inside
``recording`` carries kwdiag's verdict as a note. Without ``recording``, ``explain(client)`` on a default
LocalCluster gives the deaths Dask's in-memory logs show, and no wrong cause.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ANY, assert_deaths, wait_until

distributed = pytest.importorskip("distributed")
import dask  # noqa: E402

import kwdiag.dask  # noqa: E402
from kwdiag.runtime.spawn import child_env  # noqa: E402

DEADLINE = 120.0
MiB = 1 << 20


# ---------------------------------------------------------------------- tasks (run on the workers)
def segfault():
    ctypes.string_at(0)


def exit_one():
    os._exit(1)


def hog_once(marker: str) -> str:
    """The first time, climb past the memory limit (the nanny stops it); the rerun returns."""
    if os.path.exists(marker):
        return "rerun survived"
    Path(marker).touch()
    chunks = []
    while len(chunks) < 64:
        chunks.append(b"x" * (16 * MiB))
        time.sleep(0.05)
    time.sleep(60)
    return "not stopped"


def sleep_until(path: str) -> str:
    deadline = time.monotonic() + DEADLINE
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return "woken"


def my_pid() -> int:
    return os.getpid()


# ---------------------------------------------------------------------- scenarios
def kill_from_outside(client, tmp_path):
    future = client.submit(sleep_until, str(tmp_path / "wake"), key="sleeping-when-killed")
    address = wait_until(lambda: next((a for a, keys in client.processing().items() if keys), None), DEADLINE)
    pid = client.run(my_pid, workers=[address])[address]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: address not in client.scheduler_info()["workers"] and
               len(client.scheduler_info()["workers"]) == 2, DEADLINE, what="the killed worker replaced")
    (tmp_path / "wake").touch()
    assert future.result(timeout=DEADLINE) == "woken"


def retire_one(client, tmp_path):
    address = sorted(client.scheduler_info()["workers"])[0]
    client.retire_workers([address])
    wait_until(lambda: address not in client.scheduler_info()["workers"], DEADLINE, what="the retirement")


def killed_worker(task):
    """A task that kills every worker it runs on: the KilledWorker goes to the caller, as in a user's code."""
    def run(client, tmp_path):
        client.submit(task, key=f"{task.__name__}-task").result(timeout=DEADLINE)
    return run


def memory(client, tmp_path):
    assert client.submit(hog_once, str(tmp_path / "hogged"), key="hogs-memory").result(timeout=DEADLINE) == \
        "rerun survived"


SCENARIOS = {
    "segfault": (killed_worker(segfault), [(ANY, ANY, "sudden_exit", "segfault")] * 2),
    "os-exit": (killed_worker(exit_one), [(ANY, ANY, "unrecoverable_exception", "os_exit")] * 2),
    "memory": (memory, [(ANY, ANY, "nanny_memory_restart", "memory_limit")]),
    "sigkill": (kill_from_outside, [(ANY, ANY, "sudden_exit", "sigkill")]),
    "retired": (retire_one, [(ANY, ANY, "chose_to_exit", "retired")]),
}


def local_cluster(run_dir: Path, monkeypatch):
    monkeypatch.setenv("KWDIAG_RUN_DIR", str(run_dir))   # where the plugins write (the cluster's processes too)
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        return distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit=300 * MiB,
                                        dashboard_address=":0")


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_explain_client_inside_recording_and_explain_dask_scheduler_count_each_death_once(tmp_path, scenario,
                                                                                        monkeypatch):
    act, expected = SCENARIOS[scenario]
    monkeypatch.chdir(tmp_path)   # the KilledWorker note fetches into ./kwdiag-dask-TIME, as for a user: not the clone
    with local_cluster(tmp_path / "run", monkeypatch) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(2, timeout=DEADLINE)
        raised = None
        try:
            with kwdiag.dask.recording(client):
                act(client, tmp_path)
        except distributed.KilledWorker as exc:
            raised = exc
        assert (raised is not None) == (scenario in ("segfault", "os-exit"))
        live = kwdiag.dask.explain(client, folder=str(tmp_path / "fetched"))
        assert live.recorded
        assert_deaths(live.deaths, expected)
        if raised is not None:   # KilledWorker: the traceback says why those workers died
            note = "\n".join(getattr(raised, "__notes__", []))
            cause = "/".join(expected[0][2:])
            assert note.startswith("kwdiag: 2 worker death(s) counted against this task") and \
                note.count(cause) == 2, note
        cli = subprocess.run([sys.executable, "-m", "kwdiag", "explain", "--dask-scheduler", cluster.scheduler_address,
                              "--save", str(tmp_path / "cli"), "--format", "json"], capture_output=True, text=True,
                             timeout=DEADLINE, env=child_env())
        assert cli.returncode == 0, cli.stderr[-3000:]
        assert_deaths(json.loads(cli.stdout)["deaths"], expected)
    assert "_repr_html_" in dir(live) and "<iframe" in live._repr_html_() and "Verdict:" in str(live)


def test_explain_client_without_recording_gives_what_the_logs_show_and_no_wrong_cause(tmp_path, monkeypatch):
    with local_cluster(tmp_path / "run", monkeypatch) as cluster, distributed.Client(cluster) as client:
        with pytest.raises(distributed.KilledWorker):
            killed_worker(segfault)(client, tmp_path)
        live = kwdiag.dask.explain(client, folder=str(tmp_path / "fetched"))
    assert not live.recorded
    # A LocalCluster's nannies log "killed by signal 11" at INFO in memory: both deaths and their cause.
    assert_deaths(live.deaths, [(ANY, ANY, "sudden_exit", "segfault")] * 2)


JOB = '''
import os, sys
sys.path.insert(0, {tests!r})
from dask.distributed import Client
import test_dask_live as t

with Client() as client:          # the cluster kwdiag run --dask started
    try:
        t.SCENARIOS[{scenario!r}][0](client, __import__("pathlib").Path(sys.argv[1]))
    except Exception as exc:
        print("raised", type(exc).__name__)
    print("done")
'''


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_kwdiag_run_dask_counts_each_death_once(tmp_path, scenario):
    _, expected = SCENARIOS[scenario]
    (tmp_path / "job.py").write_text(JOB.format(tests=str(Path(__file__).parent), scenario=scenario))
    result = subprocess.run([sys.executable, "-m", "kwdiag", "run", "--dask", "--workers", "2", "--memory-limit",
                             "300MiB", "--allowed-failures", "1", "--log-dir", "run", "job.py", str(tmp_path)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300, env=child_env({"NO_COLOR": "1"}))
    assert "done" in result.stdout, result.stderr[-3000:]
    report = json.loads(subprocess.run([sys.executable, "-m", "kwdiag", "explain", str(tmp_path / "run"), "--format",
                                        "json"], capture_output=True, text=True, timeout=DEADLINE).stdout)
    survivors = 1 if scenario == "retired" else 2   # the workers the run closes at its end
    assert_deaths(report["deaths"], [*expected, *[(ANY, ANY, "chose_to_exit", "shutdown")] * survivors])


def test_the_notebook_view_renders_in_a_dark_page(tmp_path):
    """``_repr_html_`` as a notebook shows it, in a dark page, drawn by headless Chromium: the frame holds the
    report (not a blank box). KWDIAG_UPDATE_SNAPSHOTS=1 keeps the picture as docs/images/notebook-explain.png."""
    import html as html_module

    from test_html import chromium, run_chromium
    from kwdiag.dask.live import LiveReport
    from kwdiag.pipeline import analyze

    if chromium() is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)")
    folder = Path(__file__).parent.parent / "sample_logs" / "kwdiag-segfault-killedworker"
    live = LiveReport(analyze([str(folder)]), str(folder), {"kwdiag_plugins": True})
    cell = html_module.escape("with kwdiag.dask.recording(client):\n    client.submit(crash, 1).result()\n\n"
                              "kwdiag.dask.explain(client)")
    page = tmp_path / "notebook.html"
    page.write_text(f'<!DOCTYPE html><html><head><meta charset="utf-8"><style>body{{background:#111;color:#ddd;'
                    f'margin:0;padding:16px}}pre{{background:#1e1e1e;padding:8px}}</style></head><body><pre>{cell}'
                    f'</pre>{live._repr_html_()}</body></html>', encoding="utf-8")
    png = tmp_path / "notebook.png"
    # A blank frame compresses to ~15 KB; the drawn report (text, table, timeline) to several times that.
    # Headless Chromium may take its picture before a srcdoc frame is painted on a loaded machine (CI saw one
    # blank frame in ~30 runs), so a blank picture is taken again, up to three times, before it counts.
    sizes = []
    for attempt in range(3):
        png.unlink(missing_ok=True)
        done = run_chromium(page.as_uri(), f"--screenshot={png}", "--window-size=1200,1000", "--hide-scrollbars",
                            f"--virtual-time-budget={3000 * (attempt + 1)}")
        assert png.exists(), done.stderr[-2000:]
        data = png.read_bytes()
        sizes.append(len(data))
        if len(data) > 40_000:
            break
    assert sizes[-1] > 40_000, sizes
    if os.environ.get("KWDIAG_UPDATE_SNAPSHOTS"):
        (Path(__file__).parent.parent / "docs" / "images" / "notebook-explain.png").write_bytes(data)


OWN_CLUSTER_JOBS = {
    # the documented idiom, which Dask refuses once a scheduler address is configured
    "client-with-cluster-arguments": ("from dask.distributed import Client\n"
                                      "if __name__ == '__main__':\n"
                                      "    with Client(n_workers=1, threads_per_worker=1) as client:\n"
                                      "        print(client.submit(sum, [1, 2]).result())\n",
                                      "refused the job's cluster arguments"),
    # (the main-module guard Dask's docs use: its nannies start their workers by spawning Python afresh)
    "its-own-localcluster": ("from dask.distributed import Client, LocalCluster\n"
                             "if __name__ == '__main__':\n"
                             "    with LocalCluster(n_workers=1, dashboard_address=None) as c, Client(c) as client:\n"
                             "        print(client.submit(sum, [1, 2]).result())\n",
                             "ran no task on the Dask cluster kwdiag started"),
}


@pytest.mark.parametrize("shape", sorted(OWN_CLUSTER_JOBS))
def test_kwdiag_run_dask_says_when_the_job_did_not_join_its_cluster(tmp_path, shape):
    """Under --dask a job's Client() joins the cluster kwdiag started; one that makes its own cluster (or passes
    cluster arguments to Client, which Dask then refuses) is told why kwdiag's workers ran nothing of it."""
    code, said = OWN_CLUSTER_JOBS[shape]
    (tmp_path / "job.py").write_text(code)
    result = subprocess.run([sys.executable, "-m", "kwdiag", "run", "--dask", "--workers", "1", "--log-dir", "run",
                             "job.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env=child_env({"NO_COLOR": "1"}))
    assert "3" in result.stdout.split() or shape == "client-with-cluster-arguments", result.stderr[-3000:]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["tasks"]["submitted"] == 0, result.stderr[-3000:]
    assert len(manifest["notes"]) == 1 and said in manifest["notes"][0], manifest.get("notes")
    assert said in " ".join(result.stderr.split())
