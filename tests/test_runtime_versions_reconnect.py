"""Version reporting and mismatches (real installed package metadata), and scheduler loss and return."""

from __future__ import annotations

import os
import signal

import pytest

from conftest import _TESTS, read_events, spawn_entry, stop, wait_for_event, wait_until
from kwdiag.runtime import Client, FutureCancelledError, LocalCluster, VersionMismatchError
from kwdiag.runtime.comm import parse_address


def inc(x):
    return x + 1


def fake_site(root, **packages):
    """A folder on which importlib.metadata finds the given packages at the given versions."""
    os.makedirs(root, exist_ok=True)
    for name, version in packages.items():
        info = os.path.join(root, f"{name}-{version}.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def test_versions_are_reported_compared_and_enforced(tmp_path, log_dir, monkeypatch):
    same = fake_site(str(tmp_path / "same"), kwdiagfakepkg="1.0", kwdiagfakereq="1.0")
    odd = fake_site(str(tmp_path / "odd"), kwdiagfakepkg="2.0", kwdiagfakereq="1.0")
    refused = fake_site(str(tmp_path / "refused"), kwdiagfakepkg="1.0", kwdiagfakereq="9.9")
    settings = {"versions_packages": ["kwdiagfakepkg", "kwdiagfakereq"], "versions_required": ["kwdiagfakereq"]}
    env = {f"KWDIAG_{k.upper()}": ",".join(v) for k, v in settings.items()}
    monkeypatch.syspath_prepend(same)
    monkeypatch.setenv("KWDIAG_VERSIONS_PACKAGES", env["KWDIAG_VERSIONS_PACKAGES"])
    with LocalCluster(n_workers=1, memory_limit=None, log_dir=log_dir, config=settings,
                      env={"PYTHONPATH": os.pathsep.join([same, _TESTS])}) as cluster, Client(cluster) as client:
        versions = client.get_versions(check=True)      # all alike: no error
        assert versions["scheduler"]["kwdiagfakepkg"] == "1.0" and versions["client"]["kwdiagfakepkg"] == "1.0"
        assert {"python", "msgpack", "cloudpickle", "psutil", "kwdiag"} <= set(versions["scheduler"])
        secret = {"KWDIAG_SECRET": cluster.secret.hex(), **env}
        odd_worker = spawn_entry(["worker", "--scheduler-file", cluster.scheduler_file, "--name", "odd",
                                  "--log-dir", log_dir], os.path.join(log_dir, "odd.log"),
                                 env={**secret, "PYTHONPATH": os.pathsep.join([odd, _TESTS])})
        bad_worker = spawn_entry(["worker", "--scheduler-file", cluster.scheduler_file, "--name", "refused",
                                  "--log-dir", log_dir], os.path.join(log_dir, "refused.log"),
                                 env={**secret, "PYTHONPATH": os.pathsep.join([refused, _TESTS])})
        try:
            mismatch = wait_for_event(log_dir, "versions-mismatch", source="scheduler", worker="odd")[0]
            assert mismatch.level == "warning" and mismatch.fields["required"] is False
            assert mismatch.fields["differences"] == [{"package": "kwdiagfakepkg", "scheduler": "1.0", "peer": "2.0"}]
            assert wait_for_event(log_dir, "versions-mismatch", source="worker", worker="odd")  # the worker says so too
            wait_until(lambda: len(client.scheduler_info()["workers"]) == 2, what="odd worker accepted")
            with pytest.raises(VersionMismatchError, match=r"kwdiagfakepkg: scheduler=1.0; worker tcp://\S+=2.0"):
                client.get_versions(check=True)
            # A mismatch in a required package refuses the worker, and its nanny does not spin restarting it.
            refusal = wait_for_event(log_dir, "versions-mismatch", source="scheduler", worker="refused")[0]
            assert refusal.level == "error" and refusal.fields["required"] is True
            exit_event = wait_for_event(log_dir, "worker-exit", worker="refused")[0]
            assert exit_event.fields["exitcode"] == 78 and exit_event.fields["will_restart"] is False
            assert bad_worker.wait(30) == 0
            assert len(read_events(log_dir, "worker-spawn", worker="refused")) == 1
        finally:
            stop(odd_worker)
            stop(bad_worker)


def _kill_scheduler(cluster, log_dir):
    old = cluster.processes["scheduler"]
    old.send_signal(signal.SIGKILL)
    old.wait(10)
    wait_until(lambda: len(read_events(log_dir, "scheduler-lost", source="worker")) == 2, what="workers notice")
    wait_for_event(log_dir, "scheduler-lost", source="client")


def _restart_scheduler(cluster, log_dir, port, *extra):
    new = spawn_entry(["scheduler", "--port", str(port), "--scheduler-file", cluster.scheduler_file,
                       "--log-dir", log_dir, *extra], os.path.join(log_dir, "scheduler-2.log"),
                      env={"KWDIAG_SECRET": cluster.secret.hex()})
    cluster.processes["scheduler"] = new      # so the cluster closes the new one
    reconnects = wait_until(lambda: len(read_events(log_dir, "reconnected", source="worker")) == 2
                            and read_events(log_dir, "reconnected", source="worker"), what="workers reconnect")
    assert all(e.fields["after"] > 0 for e in reconnects)
    return wait_for_event(log_dir, "reconnected", source="client")[0]


def test_workers_and_clients_reconnect_and_the_journal_keeps_the_work(log_dir):
    with LocalCluster(n_workers=2, memory_limit=None, log_dir=log_dir) as cluster, Client(cluster) as client:
        port = parse_address(cluster.scheduler_address)[1]   # the new scheduler comes back on the same port
        before = client.submit(inc, 1)
        assert before.result(timeout=30) == 2
        chained = client.submit(inc, before)
        assert chained.result(timeout=30) == 3
        scattered = client.scatter({"scattered-before": 5})["scattered-before"]
        dropped = client.submit(inc, 100)
        assert dropped.result(timeout=30) == 101
        _kill_scheduler(cluster, log_dir)
        # Headless, the workers keep their results and the client its futures: gathering still works.
        assert before.done() and client.gather([before, chained, scattered], timeout=30) == [2, 3, 5]
        dropped_key = dropped.key
        dropped.release()          # released while the scheduler is away: it is told when it is back
        reconnected = _restart_scheduler(cluster, log_dir, port)
        assert reconnected.fields["known"] is True      # the new scheduler replayed the journal
        recovered = wait_for_event(log_dir, "scheduler-recovered")[0]
        # 3 or 4: the released result is reused if its worker is back before the client says it is released.
        assert recovered.fields["reused"] >= 3 and recovered.fields["recomputed"] == 0, recovered.fields
        assert sorted(recovered.fields["workers_back"]) == ["worker-0", "worker-1"]
        assert recovered.fields["headless_for"] > 0
        assert client.gather([before, chained, scattered], timeout=30) == [2, 3, 5]
        wait_until(lambda: len(client.scheduler_info()["workers"]) == 2, what="workers registered again")
        info = client.scheduler_info()
        assert info["counters"]["finished"] == 3 and info["first_finished_after"] is None  # nothing ran again
        wait_until(lambda: dropped_key not in client.who_has(), what="the released key forgotten")
        assert client.submit(inc, 41).result(timeout=30) == 42
        assert sum(client.gather(client.map(inc, range(20)))) == sum(range(1, 21))
        assert client.submit(inc, scattered).result(timeout=30) == 6   # the scattered data survived too


def test_without_a_journal_the_client_submits_its_work_again(log_dir):
    with LocalCluster(n_workers=2, memory_limit=None, log_dir=log_dir, config={"journal": False}) as cluster, \
            Client(cluster) as client:
        port = parse_address(cluster.scheduler_address)[1]
        before = client.submit(inc, 1)
        chained = client.submit(inc, before)
        assert chained.result(timeout=30) == 3
        scattered = client.scatter({"scattered-before": 5})["scattered-before"]
        _kill_scheduler(cluster, log_dir)
        reconnected = _restart_scheduler(cluster, log_dir, port, "--set", "journal=false")
        assert reconnected.fields["known"] is False and reconnected.fields["resubmitted"] == 2
        # Scattered data is in no lineage: a scheduler that does not know it cannot bring it back, and says so.
        with pytest.raises(FutureCancelledError, match="scheduler-connection-lost"):
            scattered.result(timeout=30)
        # What could be resubmitted was: the results come back, recomputed by the new scheduler's workers.
        assert before.result(timeout=30) == 2 and chained.result(timeout=30) == 3
        assert not read_events(log_dir, "scheduler-recovered")
        assert client.submit(inc, 41).result(timeout=30) == 42
