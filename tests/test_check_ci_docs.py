"""docs/ci.md: the GitHub Actions and GitLab CI examples, run with the commands the page shows.

The commands are extracted from the page's YAML (``run:`` steps; ``script:`` items), never copied
here, and run in a fresh workspace with the checkout's kwdiag first on PATH; ``pip install`` lines
are skipped (the checkout is installed). GitHub steps run one shell each, in order, skipping later
steps without ``if: always()`` once one failed; GitLab's script runs in one shell that stops at the
first failing line, as the runners do. The files the upload steps name must exist and load (JUnit
parses, SARIF validates against the official schema).

The workload (``ci/job.py``, written by the fixture) is a real kwdiag job: a task that segfaults
every worker it lands on, so with ``allowed_failures=1`` two workers die and the job itself fails
with ``KilledWorker`` — ``kwdiag run`` really runs it on an embedded cluster.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ci.md"
SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())


def yaml_block(heading: str) -> list[str]:
    text = DOC.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert m, f"no yaml block under {heading}"
    return m.group(1).splitlines()


def _value_block(lines: list[str], i: int, indent: int) -> tuple[str, int]:
    """The value of a ``key: |`` block starting after line ``i`` (lines more indented than ``indent``)."""
    body = []
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
        body.append(lines[j].strip())
        j += 1
    return "\n".join(b for b in body if b), j


def github_steps() -> list[dict]:
    lines = yaml_block("GitHub Actions")
    start = next(i for i, line in enumerate(lines) if line.strip() == "steps:")
    step_indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    steps: list[dict] = []
    for i in range(start + 1, len(lines)):
        line = lines[i]
        ind = len(line) - len(line.lstrip())
        if ind == step_indent and line.lstrip().startswith("- "):
            steps.append({})
            line = " " * (ind + 2) + line.lstrip()[2:]
        m = re.match(r"\s*([\w-]+):\s*(.*)$", line)
        if not m or not steps:
            continue
        key, value = m.groups()
        if value == "|":
            value, _ = _value_block(lines, i, len(line) - len(line.lstrip()))
        steps[-1][key] = value.strip().strip('"')
    return steps


def gitlab_job() -> tuple[list[str], dict]:
    lines = yaml_block("GitLab CI")
    script, files = [], {}
    section = None
    for line in lines:
        s = line.strip()
        if s.endswith(":") and not s.startswith("- "):
            section = s[:-1]
        elif section == "script" and s.startswith("- "):
            script.append(s[2:])
        elif section == "paths" and s.startswith("- "):
            files.setdefault("paths", []).append(s[2:])
        m = re.match(r"junit:\s*(\S+)", s)
        if m:
            files["junit"] = m.group(1)
    return script, files


SHIM = f"""#!/bin/sh
exec {sys.executable} -m kwdiag "$@"
"""

JOB = """
import ctypes
from kwdiag.runtime import Client


def crash():
    ctypes.string_at(0)  # a real segmentation fault


Client().submit(crash, key="segfault").result()  # raises KilledWorker: the job fails
"""


@pytest.fixture
def workspace(tmp_path):
    ws = tmp_path / "ws"
    (ws / "ci").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "kwdiag"
    exe.write_text(SHIM)  # this checkout's kwdiag, with this interpreter
    (ws / "ci" / "job.py").write_text(JOB)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "GITHUB_WORKSPACE": str(ws),
           "GITHUB_STEP_SUMMARY": str(tmp_path / "step-summary.md"), "NO_COLOR": "1",
           "KWDIAG_ALLOWED_FAILURES": "1", "KWDIAG_MEMORY_LIMIT": "1GiB"}
    env.pop("KWDIAG_JOBS", None)
    return ws, env


def _sh(cmd: str, ws: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-e", "-c", cmd], cwd=ws, env=env, capture_output=True, text=True, timeout=300)


def _check_reports(junit: Path, sarif: Path | None):
    suite = ET.parse(junit).getroot().find("testsuite")
    assert int(suite.get("failures")) == 2  # the two segfaults
    assert all(f.get("type") == "sudden_exit/segfault" for f in suite.iter("failure"))
    if sarif is not None:
        doc = json.loads(sarif.read_text())
        jsonschema.validate(doc, SCHEMA)
        assert len(doc["runs"][0]["results"]) == 2


def test_github_actions_example(workspace):
    ws, env = workspace
    steps = github_steps()
    ran, failed = [], False
    for step in steps:
        cmd = step.get("run")
        if not cmd:
            continue
        if failed and step.get("if") != "always()":
            continue
        if cmd.startswith("pip install"):
            continue
        r = _sh(cmd, ws, env)
        ran.append((cmd, r.returncode))
        failed = failed or r.returncode != 0
        if cmd.startswith("kwdiag check"):
            check = r
    assert [c.split()[1] for c, _ in ran] == ["run", "check"]
    assert [code for _, code in ran] == [1, 1]  # the job failed, and the check says why
    assert check.stdout.count("::error ") == 2 and "title=worker worker-# died" not in check.stdout
    assert re.search(r"^::error file=kwdiag-run/nanny-worker-\d\.jsonl,line=\d+,title=worker worker-\d died%3A "
                     r"sudden_exit/segfault::", check.stdout, re.M)
    assert "sudden\\_exit/segfault" in Path(env["GITHUB_STEP_SUMMARY"]).read_text()
    uploads = {k: v for s in steps for k, v in s.items() if k in ("sarif_file", "report_paths", "path")}
    for name in uploads["path"].split("\n"):
        assert (ws / name).exists(), name
    _check_reports(ws / uploads["report_paths"], ws / uploads["sarif_file"])


def test_gitlab_ci_example(workspace):
    ws, env = workspace
    script, files = gitlab_job()
    assert any(c.startswith("kwdiag run") for c in script) and any(c.startswith("kwdiag check") for c in script)
    body = "\n".join(c for c in script if not c.startswith("pip install"))
    r = _sh(body, ws, env)
    assert r.returncode == 1, (r.stdout, r.stderr)  # the check's verdict, not the workload's status
    assert "FAIL     worker-" in r.stdout and "sudden_exit/segfault" in r.stdout
    for name in files["paths"]:
        assert (ws / name).exists(), name
    sarif = next((ws / p for p in files["paths"] if p.endswith(".sarif")), None)
    _check_reports(ws / files["junit"], sarif)


def test_gitlab_keeps_the_workload_status_when_the_check_passes(workspace):
    """With nothing failing the policy, the job's own failure still fails the GitLab job."""
    ws, env = workspace
    script, _ = gitlab_job()
    body = "\n".join(c if not c.startswith("kwdiag check") else c + " --allow sudden_exit"
                     for c in script if not c.startswith("pip install"))
    r = _sh(body, ws, env)
    assert r.returncode == 1 and "PASSED" in r.stdout
