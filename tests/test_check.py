"""kwdiag check: policy, fingerprints, baselines, configuration and the CLI's exit codes.

Inputs are the real sample runs in sample_logs/ (their expected.json says what happened). Formats
are tested in test_check_formats.py, real reruns in test_check_runs.py, docs/ci.md in
test_check_ci_docs.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze
from kwdiag.check import evaluate
from kwdiag.analysis.fingerprint import worker_role
from kwdiag.check.policy import Policy
from kwdiag.errors import KwdiagError

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_logs"
RULES = load_rules()


def report(*names):
    return analyze([str(SAMPLES / n) for n in names], rules=RULES)


def cli(*args, cwd=ROOT, env=None):
    return subprocess.run([sys.executable, "-m", "kwdiag", "check", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env={**os.environ, **(env or {})})


def expected(name):
    return json.loads((SAMPLES / name / "expected.json").read_text())


# ----------------------------------------------------------------------------- policy
@pytest.mark.parametrize("name", sorted(p.name for p in SAMPLES.iterdir() if (p / "expected.json").is_file()))
def test_default_policy_fails_exactly_the_unchosen_deaths(name):
    """Every death the lines do not show as chosen fails: a crash, and an ``unknown`` that may be one (a restart
    at WARNING level that was in fact ``client.restart()`` fails too: the gate cannot tell it from a crash)."""
    exp = expected(name)
    outcome = evaluate(report(name))
    want = sorted((d.get("worker_in_logs", d["worker"]), d.get("cause_in_logs", d["cause"]))
                  for d in exp["deaths"] if d.get("cause_in_logs", d["cause"]) != "chose_to_exit")
    got = sorted((f.death.worker, f.death.cause) for f in outcome.failed)
    assert got == want
    assert outcome.exit_code == (1 if want else 0)


def test_fail_on_causes_and_allow():
    r = report("dask-sigkill")  # w1 sigkill, w2 abrupt_end (unknown: no nanny to say how), w1 shutdown
    status = lambda p: sorted((f.death.detail, f.status) for f in evaluate(r, p).findings)  # noqa: E731
    assert status(Policy.parse(fail_on=["sudden_exit/sigkill"])) == [
        ("abrupt_end", "passed"), ("shutdown", "allowed"), ("sigkill", "fail")]
    assert status(Policy.parse(allow=["chose_to_exit,*/abrupt_end"])) == [
        ("abrupt_end", "allowed"), ("shutdown", "allowed"), ("sigkill", "fail")]
    assert status(Policy.parse(fail_on=["none"])) == [
        ("abrupt_end", "passed"), ("shutdown", "allowed"), ("sigkill", "passed")]
    # naming a cause in --fail-on beats the *default* allow-list, not an explicit one
    assert ("shutdown", "fail") in status(Policy.parse(fail_on=["chose_to_exit"]))
    assert ("shutdown", "allowed") in status(Policy.parse(fail_on=["chose_to_exit"], allow=["chose_to_exit"]))
    # any: even an info-level death fails once it is no longer allowed
    assert ("shutdown", "fail") in status(Policy.parse(fail_on=["any"], allow=[]))


@pytest.mark.parametrize("bad", ["sudden", "*", "errror", ""])
def test_bad_policy_items_are_usage_errors(bad):
    with pytest.raises(KwdiagError) as exc:
        Policy.parse(fail_on=[bad] if bad else [","])
    assert exc.value.exit_code == 2


def test_severity_threshold():
    r = report("dask-sigkill")
    for d in r.deaths:
        assert d.severity in ("info", "warning", "error")
    assert evaluate(r, Policy.parse(fail_on=["error"], allow=[])).counts["fail"] == 2
    # threshold above every death's severity: nothing fails
    r_info = [d for d in r.deaths if d.severity == "info"]
    assert r_info and all(Policy.parse(fail_on=["warning"], allow=[]).judge(d)[0] == "passed" for d in r_info)


# ----------------------------------------------------------------------------- fingerprints
@pytest.mark.parametrize("name,role", [
    ("worker-0", "worker-#"), ("w12", "w#"), ("tcp://127.0.0.1:35069", "<address>"), ("10.1.2.3:8786", "<address>"),
    ("tls://[::1]:40000", "<address>"), ("dask-worker-7f9c8d-xk2lp", "dask-worker-*-*"), ("bare", "bare"),
    ("gpu-worker-a", "gpu-worker-a"),
])
def test_worker_roles(name, role):
    assert worker_role(name) == role


def test_fingerprints_ignore_times_pids_ports_and_paths(tmp_path):
    """A copy of a real run with every timestamp, pid and port shifted has the same fingerprints."""
    src = SAMPLES / "kwdiag-sigkill"
    dst = tmp_path / "elsewhere" / "run"
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.suffix == ".jsonl":
            out = []
            for line in p.read_text().splitlines():
                ev = json.loads(line)
                ev["ts"] += 86400 * 3 + 0.123
                ev["time"] = None
                ev["pid"] = ev.get("pid", 0) + 1000
                for k in ("pid",):
                    if isinstance(ev["fields"].get(k), int):
                        ev["fields"][k] += 1000
                text = json.dumps(ev).replace("127.0.0.1:", "127.0.0.1:1")
                out.append(text)
            (dst / p.name).write_text("\n".join(out) + "\n")
    a, b = evaluate(report("kwdiag-sigkill")), evaluate(analyze([str(dst)], rules=RULES))
    assert b.report.deaths and [d.at for d in a.report.deaths] != [d.at for d in b.report.deaths]
    assert sorted((f.fingerprint, f.status) for f in a.findings) == sorted((f.fingerprint, f.status) for f in b.findings)


def test_fingerprints_distinguish_verdicts():
    fps = {f.fingerprint: f.verdict for f in evaluate(report("dask-segfault", "dask-memory", "dask-exit")).findings}
    verdicts = set(fps.values())
    assert len(verdicts) >= 4 and len(set(fps)) >= len(verdicts)


# ----------------------------------------------------------------------------- CLI and exit codes
def test_exit_codes_pass_fail():
    ok = cli("sample_logs/kwdiag-clean")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("kwdiag check: PASSED")
    bad = cli("sample_logs/kwdiag-sigkill")
    assert bad.returncode == 1, bad.stderr
    assert "FAIL     worker-0 #1  sudden_exit/sigkill" in bad.stdout
    assert "fix (kwdiag):" in bad.stdout and "nanny-worker-0.jsonl:3:" in bad.stdout
    assert cli("sample_logs/kwdiag-sigkill", "--fail-on", "none").returncode == 0
    assert cli("sample_logs/kwdiag-sigkill", "--allow", "sudden_exit").returncode == 0


@pytest.mark.parametrize("args,message", [
    (["sample_logs/no-such-dir"], "no-such-dir"),
    (["sample_logs/kwdiag-clean", "--format", "xml"], "unknown --format 'xml'"),
    (["sample_logs/kwdiag-clean", "--fail-on", "oom"], "unknown cause 'oom'"),
    (["sample_logs/kwdiag-clean", "--baseline", "/nonexistent/b.json"], "cannot read baseline"),
    (["sample_logs/kwdiag-clean", "--junit", "/nonexistent/dir/j.xml"], "cannot write /nonexistent/dir/j.xml"),
    (["sample_logs/kwdiag-clean", "--config", "/nonexistent.toml"], "cannot read config"),
    ([], "Missing argument"),
])
def test_usage_errors_exit_2_with_one_line(args, message):
    r = cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_unreadable_input_still_reports_the_rest(tmp_path):
    junk = tmp_path / "junk.log"
    junk.write_bytes(b"\x00\x01\x02binary\x00" * 100)
    r = cli("sample_logs/kwdiag-sigkill", str(junk), "--junit", str(tmp_path / "j.xml"))
    assert r.returncode == 2
    assert r.stderr.count("kwdiag: error:") == 1 and "junk.log" in r.stderr and "Traceback" not in r.stderr
    assert "sudden_exit/sigkill" in r.stdout
    assert 'classname="kwdiag.input"' in (tmp_path / "j.xml").read_text()


def test_broken_baseline_and_config_files(tmp_path):
    b = tmp_path / "b.json"
    b.write_text("{not json")
    r = cli("sample_logs/kwdiag-clean", "--baseline", str(b))
    assert r.returncode == 2 and "not JSON" in r.stderr
    b.write_text(json.dumps({"schema": "kwdiag.check.baseline/1", "fingerprint_version": "0", "findings": {}}))
    r = cli("sample_logs/kwdiag-clean", "--baseline", str(b))
    assert r.returncode == 2 and "fingerprint version" in r.stderr
    # A key nobody knows: one warning naming it and the closest known one (kwdiag.settings), never a refusal.
    (tmp_path / "pyproject.toml").write_text("[tool.kwdiag.check]\nfail_onn = 'error'\n")
    r = cli(str(SAMPLES / "kwdiag-clean"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("kwdiag: warning: unknown setting 'fail_onn'") == 1 and "did you mean 'fail-on'?" in r.stderr
    (tmp_path / "pyproject.toml").write_text("[tool.kwdiag.check\n")
    r = cli(str(SAMPLES / "kwdiag-clean"), cwd=tmp_path)
    assert r.returncode == 2 and "cannot read config" in r.stderr and "Traceback" not in r.stderr


# ----------------------------------------------------------------------------- baselines
def test_baseline_accepts_known_and_fails_on_new(tmp_path):
    base = tmp_path / "baseline.json"
    w = cli("sample_logs/kwdiag-sigkill", "--write-baseline", str(base))
    assert w.returncode == 0, w.stderr
    doc = json.loads(base.read_text())
    assert doc["schema"] == "kwdiag.check.baseline/1"
    assert [(e["worker_role"], e["cause"], e["detail"]) for e in doc["findings"].values()] == [
        ("worker-#", "sudden_exit", "sigkill")]
    known = cli("sample_logs/kwdiag-sigkill", "--baseline", str(base))
    assert known.returncode == 0, known.stdout
    assert "KNOWN    worker-0 #1  sudden_exit/sigkill" in known.stdout
    # a new death signature (segfault) fails; the known sigkill does not count
    new = cli("sample_logs/kwdiag-sigkill", "sample_logs/dask-segfault", "--baseline", str(base),
              "--format", "json")
    assert new.returncode == 1
    out = json.loads(new.stdout)
    assert {(f["death"]["detail"], f["status"]) for f in out["findings"] if f["status"] in ("fail", "baselined")} == {
        ("sigkill", "baselined"), ("segfault", "fail")}
    assert out["result"] == "fail" and out["exit_code"] == 1


def test_baseline_from_config_relative_to_the_file(tmp_path):
    proj = tmp_path / "proj"
    (proj / "ci").mkdir(parents=True)
    w = cli(str(SAMPLES / "dask-memory"), "--write-baseline", str(proj / "ci" / "known.json"), cwd=proj)
    assert w.returncode == 0, w.stderr
    (proj / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.kwdiag.check]\nbaseline = "ci/known.json"\n'
                                         'fail-on = "warning"\nallow = ["chose_to_exit"]\n')
    (proj / "sub").mkdir()
    assert cli(str(SAMPLES / "dask-memory"), cwd=proj / "sub").returncode == 0
    assert cli(str(SAMPLES / "dask-memory"), "--no-config", cwd=proj / "sub").returncode == 1


def test_kwdiag_toml_policy(tmp_path):
    (tmp_path / "kwdiag.toml").write_text('[check]\nfail-on = ["none", "*/segfault"]\n')
    assert cli(str(SAMPLES / "kwdiag-sigkill"), cwd=tmp_path).returncode == 0
    assert cli(str(SAMPLES / "kwdiag-segfault-killedworker"), cwd=tmp_path).returncode == 1
    assert cli(str(SAMPLES / "kwdiag-sigkill"), "--fail-on", "error", cwd=tmp_path).returncode == 1  # CLI wins


def test_stdin_input():
    data = b"".join(p.read_bytes() for p in sorted((SAMPLES / "dask-sigkill").glob("*.log")))
    r = subprocess.run([sys.executable, "-m", "kwdiag", "check", "-", "--format", "json"], input=data,
                       capture_output=True, cwd=ROOT, timeout=120)
    assert r.returncode == 1, r.stderr
    assert json.loads(r.stdout)["counts"]["fail"] >= 1
