"""Fingerprints across real reruns: the same scenario run again on kwdiag's runtime (new pids, ports,
times, paths) gives the same death signatures as the recorded run in sample_logs/, so a baseline
written from one run accepts the other.

Runs sample_logs/kwdiag_samples.py's ``sigkill`` scenario for real (LocalCluster, SIGKILL to a worker
mid-task, nanny restart) into a temporary directory: 5-20 s depending on the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze
from kwdiag.check import evaluate

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_logs"


@pytest.fixture(scope="module")
def rerun(tmp_path_factory):
    out = tmp_path_factory.mktemp("rerun") / "sigkill"
    out.mkdir()
    (out.parent / "started").write_text(repr(time.time()))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import kwdiag_samples as k; "
            "k.SCENARIOS['sigkill'](sys.argv[2])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SAMPLES), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-c", code, str(SAMPLES), str(out)], check=True, env=env, timeout=240,
                   capture_output=True)
    return out


def test_a_real_rerun_has_the_same_fingerprints(rerun):
    rules = load_rules()
    old = evaluate(analyze([str(SAMPLES / "kwdiag-sigkill")], rules=rules))
    new = evaluate(analyze([str(rerun)], rules=rules))
    assert {d.pid for d in old.report.deaths}.isdisjoint({d.pid for d in new.report.deaths} - {None})
    started = float((rerun.parent / "started").read_text())   # a new run's deaths, whatever the recorded run's date
    assert all(started <= d.at <= time.time() for d in new.report.deaths)
    sig = lambda o: sorted((f.fingerprint, f.verdict, f.status) for f in o.findings)  # noqa: E731
    assert sig(old) == sig(new)
    assert [f.verdict for f in new.failed] == ["sudden_exit/sigkill"]


def test_a_baseline_from_one_run_accepts_the_other(rerun, tmp_path):
    base = tmp_path / "baseline.json"
    cli = [sys.executable, "-m", "kwdiag", "check"]
    w = subprocess.run([*cli, str(SAMPLES / "kwdiag-sigkill"), "--write-baseline", str(base)], capture_output=True,
                       text=True, timeout=120)
    assert w.returncode == 0, w.stderr
    assert subprocess.run([*cli, str(rerun)], capture_output=True, timeout=120).returncode == 1
    r = subprocess.run([*cli, str(rerun), "--baseline", str(base)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "KNOWN    worker-0 #1  sudden_exit/sigkill" in r.stdout
