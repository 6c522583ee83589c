"""kwdiag check's formats: JUnit shape, SARIF against the official 2.1.0 schema, GitHub workflow
commands (escaping, 10-per-type limit, job summary), markdown/text escaping of hostile log text."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze
from kwdiag.analysis.model import Death, Evidence, Hint, Report
from kwdiag.check import evaluate
from kwdiag.check.github import LIMIT, escape_data, escape_property, render_github
from kwdiag.check.junit import render_junit
from kwdiag.check.policy import Policy
from kwdiag.check.sarif import to_dict as sarif_dict
from kwdiag.check.textout import render_markdown, render_text

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_logs"
RULES = load_rules()
SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())
HOSTILE = ("2026-11-21 10:56:57,911 - distributed.nanny - INFO - Worker process 3536 was killed by signal 9 "
           "\x1b]0;pwned\x07 \x1b[31mred\x1b[0m </failure>]]><x a='1'>&amp; ::error::fake%0A, "
           "**bold** [link](http://evil) <script>alert(1)</script> | cell \x08\x7f")


def outcome(*names, **policy):
    return evaluate(analyze([str(SAMPLES / n) for n in names], rules=RULES), Policy.parse(**policy))


@pytest.fixture
def hostile(tmp_path):
    lines = (SAMPLES / "dask-sigkill" / "w1.log").read_text().splitlines()
    i = next(n for n, line in enumerate(lines) if "killed by signal 9" in line)
    lines[i] = HOSTILE
    (tmp_path / "w1.log").write_text("\n".join(lines) + "\n")
    o = evaluate(analyze([str(tmp_path / "w1.log"), str(SAMPLES / "dask-sigkill" / "scheduler.log")], rules=RULES))
    assert any("]]><x" in e.text for f in o.failed for e in f.death.evidence), "the hostile line must be evidence"
    return o


# ----------------------------------------------------------------------------- JUnit
def test_junit_shape():
    o = outcome("dask-killedworker")
    root = ET.fromstring(render_junit(o))
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == len(o.findings) == int(suite.get("tests")) == int(root.get("tests"))
    failing = [c for c in cases if c.find("failure") is not None]
    assert len(failing) == int(suite.get("failures")) == len(o.failed) == 2
    assert suite.get("errors") == "0" and suite.get("skipped") == "0"
    for c in cases:
        assert c.get("name") and c.get("classname", "").startswith("kwdiag.") and c.get("time") == "0"
    f = failing[0].find("failure")
    assert f.get("type") == "sudden_exit/sigkill"
    assert f.get("message").startswith("sudden_exit/sigkill: Something outside the worker sent SIGKILL")
    assert "w1.log:16:" in f.text and "fix (dask):" in f.text and "fix (coiled):" in f.text


def test_junit_baselined_is_skipped_and_empty_run_has_one_case():
    o = outcome("dask-memory")
    fp = o.failed[0].fingerprint
    known = evaluate(o.report, Policy.parse(), {fp})
    suite = ET.fromstring(render_junit(known)).find("testsuite")
    assert suite.get("skipped") == "1" and suite.get("failures") == "0"
    assert suite.find("testcase/skipped") is not None
    empty = ET.fromstring(render_junit(evaluate(Report())))
    assert empty.get("tests") == "1" and empty.find("testsuite/testcase").get("name") == "no worker deaths"


def test_junit_escapes_hostile_log_text(hostile):
    xml = render_junit(hostile)
    root = ET.fromstring(xml)  # well-formed despite ]]>, </failure>, NUL and ESC in the log line
    text = root.find(".//failure").text
    assert "</failure>]]><x a='1'>&amp;" in text  # shown literally
    assert "\x1b" not in xml and "\x7f" not in xml and "\x07" not in xml and "\x08" not in xml


# ----------------------------------------------------------------------------- SARIF
@pytest.mark.parametrize("names", [("dask-killedworker",), ("dask-sigkill",), ("kwdiag-memory",),
                                   ("dask-2024-memory-segfault",), ("kwdiag-clean",), ("dask-version-mismatch",)])
def test_sarif_is_valid_and_points_at_evidence(names):
    o = outcome(*names)
    doc = sarif_dict(o, RULES, root=ROOT)
    jsonschema.validate(doc, SCHEMA)
    run = doc["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert len(run["results"]) == len(o.failed)  # allowed deaths are left out
    for res in run["results"]:
        rule = rules[res["ruleIndex"]]
        assert rule["id"] == res["ruleId"] and rule["help"]["text"] and rule["shortDescription"]["text"]
        loc = res["locations"][0]["physicalLocation"]
        path = ROOT / loc["artifactLocation"]["uri"]
        assert loc["artifactLocation"]["uriBaseId"] == "%SRCROOT%" and path.is_file()
        assert loc["region"]["startLine"] <= len(path.read_text().splitlines())
        assert re.fullmatch(r"[0-9a-f]{16}", res["partialFingerprints"]["kwdiagDeathSignature/v1"])
        if res["ruleId"] in RULES.by_id:
            assert rule["fullDescription"]["text"] == RULES.by_id[res["ruleId"]].why


def test_sarif_synthetic_rule_baseline_and_input_errors(tmp_path):
    junk = tmp_path / "junk.log"
    junk.write_bytes(b"\x00\x00binary")
    r = analyze([str(SAMPLES / "dask-sigkill"), str(junk)], rules=RULES)
    o = evaluate(r)
    known = evaluate(r, Policy.parse(), {o.failed[0].fingerprint}, "b.json")
    doc = sarif_dict(known, RULES, root=ROOT)
    jsonschema.validate(doc, SCHEMA)
    run = doc["runs"][0]
    ids = {x["ruleId"] for x in run["results"]}
    assert "fact-vanished-own-log" in ids  # abrupt_end comes from a rule too: every verdict names its rule
    states = sorted(x["baselineState"] for x in run["results"])
    assert states == ["new", "unchanged"]
    assert all("suppressions" in x for x in run["results"] if x["baselineState"] == "unchanged")
    inv = run["invocations"][0]
    assert inv["executionSuccessful"] is False and inv["exitCode"] == 2
    assert inv["toolExecutionNotifications"][0]["level"] == "error"


def test_sarif_from_the_cli_validates(tmp_path):
    r = subprocess.run([sys.executable, "-m", "kwdiag", "check", str(SAMPLES / "kwdiag-segfault-killedworker"),
                        "--sarif", str(tmp_path / "k.sarif"), "--junit", str(tmp_path / "k.xml"), "-f", "sarif"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 1, r.stderr
    jsonschema.validate(json.loads(r.stdout), SCHEMA)
    assert json.loads((tmp_path / "k.sarif").read_text()) == json.loads(r.stdout)
    uri = json.loads(r.stdout)["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri.startswith("file:///")  # outside the working directory: an absolute file URI
    ET.parse(tmp_path / "k.xml")


# ----------------------------------------------------------------------------- GitHub
def test_github_escaping_rules():
    assert escape_data("50% a\r\nb") == "50%25 a%0D%0Ab"
    assert escape_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"


def test_github_hostile_text_cannot_start_a_command(hostile):
    out = render_github(hostile)
    for line in out.splitlines():
        assert line.startswith(("::error ", "::warning ", "::notice ", "kwdiag check:")), line
    assert "\x1b" not in out and "\x07" not in out
    err = next(line for line in out.splitlines() if "fake" in line)
    props, _, message = err[len("::error "):].partition("::")
    assert "::error::fake%250A%2C" not in props
    assert "::error::fake%250A," in message  # '%' escaped; the line stays one command
    assert dict(p.split("=", 1) for p in props.split(","))["line"].isdigit()


def _many(n_err, n_warn, n_known):
    base = Death(worker="w", incarnation=1, cause="sudden_exit", detail="sigkill", confidence=0.9, at=1.0,
                 evidence=(Evidence("logs/w.log", 3, "killed by signal 9", "dask-nanny-sigkill"),),
                 hints=(Hint("give it more memory", "dask"),), rules=("dask-nanny-sigkill",), summary="killed")
    deaths = [replace(base, worker=f"w{i}", incarnation=i + 1) for i in range(n_err)]
    deaths += [replace(base, worker=f"v{i}", severity="warning", detail="heartbeat_timeout") for i in range(n_warn)]
    deaths += [replace(base, worker=f"k{i}", cause="unknown", detail="no_evidence") for i in range(n_known)]
    r = Report(deaths=tuple(deaths))
    from kwdiag.analysis.fingerprint import fingerprint

    return evaluate(r, Policy.parse(), {fingerprint(deaths[-1])} if n_known else set())


def test_github_at_most_ten_per_type_then_a_summary(tmp_path):
    out = render_github(_many(14, 12, 11), root=tmp_path).splitlines()
    count = lambda k: sum(1 for line in out if line.startswith(f"::{k} "))  # noqa: E731
    assert count("error") == LIMIT and count("warning") == LIMIT and count("notice") == LIMIT
    summary = [line for line in out if "not annotated" in line]
    assert len(summary) == 2 and "4 + 2 + 2" not in summary[0] and summary[0].startswith("::notice ")
    assert "8 more finding(s)" in summary[1]  # 4 errors, 2 warnings, 2 known over their budgets
    assert "file=logs/w.log,line=3," in out[0]
    few = render_github(_many(2, 0, 0), root=tmp_path)
    assert few.count("::error ") == 2 and "not annotated" not in few


def test_github_format_appends_the_job_summary(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    r = subprocess.run([sys.executable, "-m", "kwdiag", "check", "sample_logs/dask-sigkill", "--format", "github"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_WORKSPACE": str(ROOT)})
    assert r.returncode == 1, r.stderr
    assert r.stdout.count("::error ") == 2 and "file=sample_logs/dask-sigkill/w1.log,line=17" in r.stdout
    text = summary.read_text()
    assert text.startswith("earlier step\n## ❌ kwdiag check") and "sudden\\_exit/sigkill" in text


# ----------------------------------------------------------------------------- text and markdown
def test_text_and_markdown_escape_hostile_log_text(hostile):
    text = render_text(hostile)
    assert "\x1b" not in text and "\x07" not in text and "\x00" not in text
    md = render_markdown(hostile)
    assert "\x1b" not in md
    assert "<script>" not in md and "&lt;script&gt;" in md
    assert "[link](http://evil)" not in md and "\\[link\\](http://evil)" in md
    assert "**bold**" not in md and "\\*\\*bold\\*\\*" in md and "\\| cell" in md and " | cell" not in md


def test_markdown_table_and_details():
    md = render_markdown(outcome("dask-memory"))
    assert md.startswith("## ❌ kwdiag check")
    assert "| FAIL | w1 \\#1 | nanny\\_memory\\_restart/memory\\_limit | error |" in md
    assert "**fix (dask)**" in md


def test_json_document():
    r = subprocess.run([sys.executable, "-m", "kwdiag", "check", "sample_logs/kwdiag-memory", "-f", "json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    doc = json.loads(r.stdout)
    assert doc["schema"] == "kwdiag.check/1" and doc["result"] == "fail" and doc["exit_code"] == r.returncode == 1
    assert doc["counts"] == {"fail": 1, "baselined": 0, "allowed": 1, "passed": 0}
    assert doc["killed_workers"][0]["task"] == "hog-task"
    f = next(x for x in doc["findings"] if x["status"] == "fail")
    assert f["rule"] == "kwdiag-exit-memory" and f["death"]["cause"] == "nanny_memory_restart"


# ----------------------------------------------------------------------------- snapshots
CHECK_SNAPSHOTS = ["dask-killedworker", "kwdiag-segfault-killedworker"]


def _check_render(fmt: str, o) -> str:
    from kwdiag.check.jsonout import render_json
    from kwdiag.check.sarif import render_sarif

    return {"sarif": lambda: render_sarif(o, RULES, root=ROOT), "junit": lambda: render_junit(o),
            "github": lambda: render_github(o, root=ROOT), "txt": lambda: render_text(o),
            "md": lambda: render_markdown(o), "json": lambda: render_json(o)}[fmt]()


@pytest.mark.parametrize("fmt", ["sarif", "junit", "github", "txt", "md", "json"])
@pytest.mark.parametrize("name", CHECK_SNAPSHOTS)
def test_check_output_snapshot(name, fmt, monkeypatch):
    """Every `kwdiag check` format for a Dask log and a kwdiag run, paths relative to the repository;
    regenerate after a reviewed change with KWDIAG_UPDATE_SNAPSHOTS=1."""
    import time

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.chdir(ROOT)
    o = evaluate(analyze([f"sample_logs/{name}"], rules=RULES))
    text = _check_render(fmt, o).replace(ROOT.as_uri() + "/", "file:///REPO/")   # where the clone is varies
    path = Path(__file__).parent / "data" / "snapshots" / f"check-{name}.{fmt}"
    if os.environ.get("KWDIAG_UPDATE_SNAPSHOTS"):
        path.write_text(text)
    assert text == path.read_text(), f"rendered check output changed; review and update {path}"


def test_html_structure_snapshot(monkeypatch):
    """The HTML page's outline (headings, ids, classes of its sections) for a kwdiag run and a Dask log."""
    from html.parser import HTMLParser

    from kwdiag.report.html import render_html

    class Outline(HTMLParser):
        def __init__(self):
            super().__init__()
            self.lines, self._in = [], None

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag in ("h1", "h2", "h3"):
                self._in = tag
            if a.get("id") and not a["id"].startswith("death-") or tag in ("svg", "details", "table"):
                self.lines.append(f"<{tag} id={a.get('id', '')} class={a.get('class', '')}>")

        def handle_data(self, data):
            if self._in:
                self.lines.append(f"{self._in}: {data.strip()}")

        def handle_endtag(self, tag):
            if tag == self._in:
                self._in = None

    monkeypatch.chdir(ROOT)
    out = []
    for name in CHECK_SNAPSHOTS:
        p = Outline()
        p.feed(render_html(analyze([f"sample_logs/{name}"], rules=RULES)))
        out += [f"# {name}", *[line for line in p.lines if line.strip(": ")]]
    text = "\n".join(out) + "\n"
    path = Path(__file__).parent / "data" / "snapshots" / "html-outline.txt"
    if os.environ.get("KWDIAG_UPDATE_SNAPSHOTS"):
        path.write_text(text)
    assert text == path.read_text(), f"the page's outline changed; review and update {path}"
