"""Rendered output: snapshots of the plain report, escaping of hostile log text, JSON schema, CLI commands.

Snapshots (text, Markdown, JSON) live in tests/data/snapshots/; regenerate after a reviewed change with
``KWDIAG_UPDATE_SNAPSHOTS=1 pytest tests/test_explain_output.py``.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze
from kwdiag.report.markdown import render_markdown
from kwdiag.report.terminal import render_plain, render_terminal

ROOT = Path(__file__).resolve().parent.parent
SNAP = Path(__file__).resolve().parent / "data" / "snapshots"
RULES = load_rules()
SNAPSHOT_SCENARIOS = ["dask-killedworker", "dask-memory", "dask-missing-module", "dask-task-error",
                      "kwdiag-segfault-killedworker", "kwdiag-memory"]


@pytest.fixture(autouse=True)
def _utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _in_root(fn):
    cwd = os.getcwd()
    os.chdir(ROOT)  # evidence paths relative to the repository, as a user would type them
    try:
        return fn()
    finally:
        os.chdir(cwd)


def _report(name):
    return _in_root(lambda: analyze([f"sample_logs/{name}"], rules=RULES))


def _render(fmt, report):
    from kwdiag.report.jsonout import render_json

    return {"txt": render_plain, "md": render_markdown, "json": render_json}[fmt](report)


@pytest.mark.parametrize("fmt", ["txt", "md", "json"])
@pytest.mark.parametrize("name", SNAPSHOT_SCENARIOS)
def test_report_snapshot(name, fmt):
    """Every format of the explain report for Dask logs and kwdiag runs; review by eye when one changes."""
    report = _report(name)
    text = _in_root(lambda: _render(fmt, report))
    path = SNAP / f"{name}.{fmt}"
    if os.environ.get("KWDIAG_UPDATE_SNAPSHOTS"):
        path.write_text(text)
    assert text == path.read_text(), f"rendered report changed; review and update {path}"


def test_the_text_report_gives_the_answer_first_one_fix_per_group_in_80_columns():
    text = _in_root(lambda: render_plain(_report("kwdiag-segfault-killedworker")))
    lines = text.splitlines()
    assert lines[0].startswith("Verdict: 2 worker death(s) need attention")
    head = "\n".join(lines[:8])
    assert "What to do:" in head and "[g1] 2× sudden_exit/segfault" in head
    assert " ".join(text.split()).count("Reproduce the task locally (it crashed in segfault") == 1   # one fix for both deaths
    # a fair KilledWorker is told on its group's line instead of repeating the deaths and the fix
    assert "task segfault-task (KilledWorker, blame fair)" in text and "\nKilledWorker" not in text
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert "Chose to exit: 2" in text and "/work/" not in text   # paths relative to the inputs


def test_a_killed_worker_is_never_no_failures():
    from kwdiag.analysis.model import KilledWorkerBlame, Report

    report = Report(killed_workers=(KilledWorkerBlame(task="t", deaths=(), causes=(), fair=None, reasons=()),))
    assert "no failures" not in report.verdict() and "collect" in report.verdict()


HOSTILE = (
    "2026-11-21 10:56:35,201 - distributed.nanny - INFO - Worker process 3407 was killed by signal 9 "
    "[bold red]INJECTED[/bold red] \x1b[31mred\x1b[0m \x1b]0;pwned-title\x07 \x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\"
)


def _hostile_log(tmp_path: Path) -> Path:
    src = (ROOT / "sample_logs" / "dask-sigkill" / "w1.log").read_text().splitlines()
    src.insert(16, HOSTILE)
    p = tmp_path / "w1.log"
    p.write_text("\n".join(src) + "\n")
    return p


def test_log_text_cannot_inject_markup_or_escapes(tmp_path):
    report = analyze([str(_hostile_log(tmp_path))], rules=RULES)
    assert any("INJECTED" in e.text for d in report.deaths for e in d.evidence)
    for render in ("plain", "rich", "markdown", "json"):
        buf = io.StringIO()
        if render == "plain":
            out = render_plain(report)
        elif render == "rich":
            render_terminal(report, buf, force_terminal=True)
            out = buf.getvalue()
        elif render == "markdown":
            out = render_markdown(report)
        else:
            out = json.dumps(report.to_dict())
        assert "pwned-title" not in out or "\x1b]0;" not in out
        assert "\x1b]" not in out and "\x07" not in out
        if render != "rich":
            assert "\x1b" not in out
        else:  # rich's own colours only: every ESC is a CSI colour sequence rich emitted
            import re

            assert not re.search(r"\x1b(?!\[[0-9;]*m)", out)
            assert "[bold red]INJECTED[/bold red]" in out  # shown literally, not interpreted


def test_no_color_is_honoured(tmp_path, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    buf = io.StringIO()
    render_terminal(_report("dask-memory"), buf, force_terminal=True)
    import re

    assert not re.search(r"\x1b\[(?:\d+;)*3[0-7]m", buf.getvalue())  # no foreground colours


def test_json_output_matches_the_documented_schema():
    schema = json.loads((ROOT / "docs" / "explain.schema.json").read_text())
    for name in ("dask-killedworker", "dask-segfault", "dask-task-error"):
        doc = _report(name).to_dict()
        jsonschema.validate(json.loads(json.dumps(doc)), schema)
        assert doc["schema"] == "kwdiag.explain/1"


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "kwdiag", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_cli_formats():
    j = _cli("explain", "--format", "json", "sample_logs/dask-segfault")
    assert j.returncode == 0, j.stderr
    doc = json.loads(j.stdout)
    assert {(d["worker"], d["detail"]) for d in doc["deaths"] if d["failure"]} == {("w1", "segfault"), ("w2", "segfault")}
    md = _cli("explain", "--format", "markdown", "sample_logs/dask-segfault")
    assert md.returncode == 0 and md.stdout.startswith("# kwdiag explain") and "| w1 |" in md.stdout
    txt = _cli("explain", "sample_logs/dask-segfault")
    assert txt.stdout.splitlines()[0].startswith("Verdict: 2 worker death(s) need attention")   # the answer first


def test_cli_rules_commands(tmp_path):
    ls = _cli("rules", "list")
    assert ls.returncode == 0 and "dask-nanny-sigkill" in ls.stdout
    show = _cli("rules", "show", "dask-nanny-memory-terminate")
    assert show.returncode == 0 and "memory budget" in show.stdout and "coiled" in show.stdout
    assert _cli("rules", "show", "no-such-rule").returncode == 2
    chk = _cli("rules", "check")
    assert chk.returncode == 0, chk.stdout
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.toml").write_text('id = "x"\ntitle = ""\n[match]\nkind = "worker-exit"\n')
    chk = _cli("rules", "check", "--rules", str(bad))
    assert chk.returncode == 1 and "empty title" in chk.stdout


def test_user_rule_directory_changes_the_verdict(tmp_path):
    d = tmp_path / "rules"
    d.mkdir()
    (d / "site-oom-reaper.toml").write_text('''
id = "site-oom-reaper"
title = "Our cluster's OOM reaper killed the worker"
why = "Our site runs a reaper that SIGKILLs processes over their memory quota and logs REAPED."
severity = "error"
[match]
keywords = ["REAPED pid="]
patterns = ['REAPED pid=(?P<pid>\\d+)']
[event]
kind = "site-reaper"
source = "kernel"
context = false
[verdict]
cause = "sudden_exit"
detail = "site_reaper"
weight = 0.9
refines = ["sigkill"]
[remediation]
dask = "Ask for a bigger memory quota."
[examples]
match = ["2026-11-21T10:56:57.900Z REAPED pid=3536"]
no_match = ["REAPED"]
''')
    logs = tmp_path / "logs"
    logs.mkdir()
    for f in (ROOT / "sample_logs" / "dask-sigkill").glob("*.log"):
        (logs / f.name).write_text(f.read_text())
    pid = next(line.split()[9] for line in (logs / "w1.log").read_text().splitlines() if "killed by signal 9" in line)
    (logs / "reaper.log").write_text(f"2026-11-21T10:56:57.900Z REAPED pid={pid}\n")
    r = _cli("explain", "--format", "json", "--rules", str(d), str(logs))
    assert r.returncode == 0, r.stderr
    deaths = json.loads(r.stdout)["deaths"]
    assert ("w1", "sudden_exit", "site_reaper") in {(x["worker"], x["cause"], x["detail"]) for x in deaths}


def test_analysis_never_imports_the_runtime():
    code = ("import sys, kwdiag.pipeline as p, kwdiag.cli_analysis, kwdiag.report, kwdiag.readers, kwdiag.timeline;"
            "p.analyze(['sample_logs/dask-sigkill']);"
            "bad=[m for m in sys.modules if m.startswith('kwdiag.runtime')]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    for p in list((ROOT / "kwdiag" / "analysis").rglob("*.py")) + list((ROOT / "kwdiag" / "readers").rglob("*.py")) \
            + list((ROOT / "kwdiag" / "report").rglob("*.py")) + list((ROOT / "kwdiag" / "timeline").rglob("*.py")) \
            + [ROOT / "kwdiag" / "cli_analysis.py"]:
        src = p.read_text()
        assert not re.search(r"^\s*(?:from|import)\s+kwdiag\.runtime|^\s*from\s+kwdiag\s+import\s+runtime", src, re.M), p


def test_help_does_not_load_rich_or_the_rules():
    code = ("import sys; from kwdiag import cli;"
            "print(sorted(m for m in sys.modules if m.startswith(('rich', 'regex', 'kwdiag.analysis', 'kwdiag.readers'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    loaded = eval(r.stdout)
    assert not [m for m in loaded if m.startswith(("regex", "kwdiag.analysis", "kwdiag.readers"))], loaded


# ---------------------------------------------------------------- the progress display
def _explain_on_a_terminal(args: list[str], blocks: list[bytes], pause: float) -> tuple[int, str]:
    """Run ``kwdiag explain ARGS -`` with stderr on a pseudo-terminal, feeding stdin ``blocks`` with ``pause`` seconds
    between them (a slow input: a log on a network share, a pipe from a slow shipper); its exit code and the text
    its terminal received."""
    import pty
    import threading

    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "kwdiag", "explain", *args, "-"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=slave, cwd=ROOT)
    os.close(slave)
    seen = bytearray()

    # The terminal is read all the time, in a thread: a pseudo-terminal holds only a few KiB, and a child whose
    # progress bar cannot be written stops reading its input.
    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:        # EIO: the child's side is closed
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    for block in blocks:
        p.stdin.write(block)
        p.stdin.flush()
        time.sleep(pause)          # the slowness of the input itself, not a wait for a result
    p.stdin.close()
    p.stdout.read()
    code = p.wait(60)
    reader.join(10)
    os.close(master)
    return code, seen.decode("utf-8", "replace")


def _slow_log_blocks() -> list[bytes]:
    """Three blocks just over the reader's block size each (it reads stdin 4 MiB at a time): a real scheduler log
    with a death in the first, then an application's own lines, which the reader passes over quickly, so the
    time is the input's slowness and not the analysis."""
    from kwdiag.readers.scan import BLOCK

    log = (ROOT / "sample_logs" / "dask-sigkill" / "scheduler.log").read_bytes()
    filler = b"2026-11-26 10:00:00,000 - etl.batches - INFO - loaded batch of 5000 rows from s3://bucket/part\n"
    block = filler * (BLOCK // len(filler) + 2)
    return [log + block, block, block]


def test_reading_that_takes_a_while_shows_progress_on_a_terminal():
    code, terminal = _explain_on_a_terminal([], _slow_log_blocks(), pause=1.5)
    assert code == 0, terminal
    assert "reading logs" in terminal and "worker(s) ended so far" in terminal, terminal[-2000:]
    # Once read, the bar gives way to a spinner for the analysis (with many deaths as long as the reading).
    said = re.search(r"explaining ([\d,]+) lifecycle lines \((\d+) worker\(s\) ended\)", terminal)
    assert said and terminal.index("reading logs") < said.start(), terminal[-2000:]
    assert int(said.group(1).replace(",", "")) > 0 and int(said.group(2)) >= 1, said.group(0)


def _finished_reading(events: int, ended: int):
    from kwdiag.readers.text import Progress

    progress = Progress(total=None)
    progress.finished, progress.events, progress._ended = True, events, set(range(ended))
    return progress


def test_an_analysis_that_takes_a_while_after_a_quick_read_shows_a_spinner(monkeypatch):
    """The reading was too quick for its bar; the analysis goes on past ``after``: the spinner appears then, and
    goes when the report is out. An analysis done before ``after`` shows nothing."""
    from kwdiag import cli_io

    monkeypatch.setattr(cli_io.sys.stderr, "isatty", lambda: True, raising=False)
    shown = cli_io.ReadingProgress(after=0.3)
    assert shown.enabled
    with shown:
        shown.update(_finished_reading(144_000, 16_000))
        assert shown._spinner is None          # not yet: most explains are done well before
        deadline = time.monotonic() + 30
        while shown._spinner is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert shown._spinner is not None
        assert "explaining 144,000 lifecycle lines (16,000 worker(s) ended)" in \
            str(shown._spinner.columns[1].text_format)
    assert not shown._spinner.live.is_started

    quick = cli_io.ReadingProgress(after=0.3)
    with quick:
        quick.update(_finished_reading(10, 1))
    timer = quick._timer
    timer.join(5)
    assert quick._spinner is None and not timer.is_alive()


def test_quiet_shows_no_progress():
    code, terminal = _explain_on_a_terminal(["--quiet"], _slow_log_blocks(), pause=1.5)
    assert code == 0 and "reading logs" not in terminal, terminal[-2000:]


def test_a_killed_worker_pasted_alone_says_its_blame_is_unclear(tmp_path):
    """Only the client's KilledWorker line (real Dask 2026.8 wording): the deaths it counts are unseen, and
    whether they were the task's fault cannot be told; both reports say so in words."""
    line = next(x for x in (ROOT / "sample_logs" / "dask-killedworker" / "client.log").read_text().splitlines()
                if "KilledWorker: Attempted to run task" in x)
    (tmp_path / "paste.txt").write_text(line + "\n")
    report = analyze([str(tmp_path / "paste.txt")], rules=RULES)
    assert [(d.cause, d.detail) for d in report.deaths] == [("unknown", "no_evidence")] * 2
    assert "KilledWorker: task suicide: blame unclear (the logs cannot tell); 2 death(s) counted" in \
        " ".join(render_plain(report).split())
    assert "## KilledWorker: `suicide`: blame unclear (the logs cannot tell)" in render_markdown(report)
    from kwdiag.report.html import render_html

    assert "task suicide: blame unclear (the logs cannot tell)</h3>" in render_html(report)


def test_a_report_of_many_deaths_is_written_death_by_death_with_the_same_bytes(tmp_path):
    """Past COMPACT_AFTER deaths, ``write_json`` streams the deaths and incarnations; the document is the one
    ``render_json`` makes, byte for byte (and valid against the schema)."""
    import importlib.util

    from kwdiag.report.jsonout import COMPACT_AFTER, render_json, write_json

    spec = importlib.util.spec_from_file_location("explain_scale", ROOT / "bench" / "explain_scale.py")
    scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scale)
    scale.build(tmp_path / "many.log", COMPACT_AFTER + 50)   # real sample lines, one SIGKILL per incarnation
    report = analyze([str(tmp_path / "many.log")], rules=RULES)
    assert len(report.deaths) == COMPACT_AFTER + 50
    out = io.StringIO()
    write_json(report, out)
    assert out.getvalue() == render_json(report)
    doc = json.loads(out.getvalue())
    jsonschema.validate(doc, json.loads((ROOT / "docs" / "explain.schema.json").read_text()))
    assert len(doc["deaths"]) == COMPACT_AFTER + 50 and len(doc["incarnations"]) >= COMPACT_AFTER + 50
