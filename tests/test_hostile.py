"""Hostile logs through the real CLI: gzip bombs, enormous lines, catastrophic user patterns, injected markup.

Each test guards one protection (named in its docstring) and fails when it is removed.
Memory is measured as the peak RSS of the ``kwdiag`` process alone: a small Python parent runs it
and reports ``getrusage(RUSAGE_CHILDREN).ru_maxrss``, with an address-space limit as a safety net
so a regression fails the test instead of exhausting the machine.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest

from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze

ROOT = Path(__file__).resolve().parent.parent
W1 = ROOT / "sample_logs" / "dask-sigkill" / "w1.log"
RULES = load_rules()
RSS_BOUND_MB = 200

_MEASURE = r"""
import resource, subprocess, sys, time
limit = 2 << 30
t = time.monotonic()
p = subprocess.run([sys.executable, "-m", "kwdiag", *sys.argv[1:]], capture_output=True, timeout=120,
                   stdin=subprocess.DEVNULL,
                   preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
sys.stderr.write(p.stderr.decode("utf-8", "replace"))
sys.stdout.write(f"{p.returncode} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss} {time.monotonic() - t}\n")
"""


def measured(*args: str) -> tuple[int, float, float, str]:
    """``kwdiag ARGS`` in its own process: (exit code, peak RSS in MB, seconds, stderr)."""
    r = subprocess.run([sys.executable, "-c", _MEASURE, *args], capture_output=True, text=True, timeout=180, cwd=ROOT)
    code, rss_kb, secs = r.stdout.split()
    print(f"hostile: kwdiag {' '.join(args[:1])}: exit {code}, peak RSS {int(rss_kb) / 1024:.0f} MB, {float(secs):.2f} s")
    return int(code), int(rss_kb) / 1024, float(secs), r.stderr


def test_gzip_bomb_is_stopped_with_bounded_memory(tmp_path):
    """Protection: bounded decompression in ``readers/scan.py`` (``_GzipChain``: ``max_length`` per call,
    ``MAX_GZIP_RATIO`` stop). A 2 MB member expanding to 2 GiB of newlines follows a real log."""
    bomb = tmp_path / "w1.log.gz"
    with open(bomb, "wb") as f:
        f.write(zlib.compress(W1.read_bytes(), 9, wbits=31))  # the real log: its death must still be found
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
        block = b"\n" * (1 << 20)
        for _ in range(2048):
            f.write(c.compress(block))
        f.write(c.flush())
    assert bomb.stat().st_size < 4 << 20
    code, rss, secs, err = measured("explain", str(bomb), "--format", "json")
    assert "Traceback" not in err and "internal error" not in err, err
    assert code == 2 and "gzip bomb" in err, err
    assert rss < RSS_BOUND_MB and secs < 100


def test_gzip_bomb_keeps_what_came_before(tmp_path):
    bomb = tmp_path / "w1.log.gz"
    with open(bomb, "wb") as f:
        f.write(zlib.compress(W1.read_bytes(), 9, wbits=31))
        f.write(zlib.compress(b"\n" * (300 << 20), 9, wbits=31))
    r = analyze([str(bomb)], rules=RULES)
    assert [d.detail for d in r.deaths if d.failure] == ["sigkill"]
    assert any("gzip bomb" in p.message and p.level == "error" for p in r.problems)


def test_enormous_line_reads_with_bounded_memory(tmp_path):
    """Protection: the line bound ``MAX_LINE`` in ``readers/scan.py``. One 300 MiB line without a newline
    until its end, then a death: memory stays small, the line is reported, the death is found."""
    p = tmp_path / "w1.log"
    with open(p, "wb") as f:
        f.write(b"2026-11-21 10:56:35,201 - distributed.nanny - INFO - Worker process 9 was killed by signal 9 ")
        chunk = b"x" * (1 << 20)
        for _ in range(300):
            f.write(chunk)
        f.write(b"\n")
        f.write(W1.read_bytes())
    code, rss, secs, err = measured("explain", str(p), "--format", "json")
    assert code == 0 and "Traceback" not in err, err
    assert "line(s) longer than 1 MiB (first at line 1)" in err
    assert rss < RSS_BOUND_MB and secs < 60


def _catastrophic_rules(tmp_path: Path) -> Path:
    d = tmp_path / "myrules"
    d.mkdir()
    (d / "my-catastrophic.toml").write_text(r'''
id = "my-catastrophic"
title = "A pattern that backtracks catastrophically"
why = "Written by a user; (a|aa)+$ is exponential on a run of a's that does not end the line."
severity = "error"
[match]
keywords = ["BOOM"]
patterns = ['BOOM (a|aa)+$']
[event]
kind = "x-boom"
[examples]
match = ["BOOM aaa"]
no_match = ["BOOM b"]
''')
    return d


def test_catastrophic_user_pattern_is_stopped_and_reported(tmp_path):
    """Protection: the ``regex`` match timeout (``engine.MATCH_TIMEOUT``) and the switch-off after
    ``TIMEOUT_LIMIT`` timeouts (``engine.RuleTimeouts``). 300 lines that each take the pattern far
    past the timeout: the run ends in seconds, names the rule, the file and the first line, and the
    built-in rules still find the death."""
    rules = _catastrophic_rules(tmp_path)
    log = tmp_path / "w1.log"
    hostile = "2026-11-21 10:56:30,000 - distributed.worker - ERROR - BOOM " + "a" * 5000 + "b\n"
    lines = W1.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:5]) + hostile * 300 + "".join(lines[5:]))
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "kwdiag", "explain", str(log), "--rules", str(rules), "--format", "json"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    secs = time.monotonic() - t
    print(f"hostile: catastrophic pattern: {secs:.2f} s for the whole run")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    warn = [x for x in r.stderr.splitlines() if "my-catastrophic" in x]
    assert len(warn) == 1 and f"{log}:" in warn[0] and "first at line 6" in warn[0] and "switched off" in warn[0]
    assert "match timeout" in warn[0]
    doc = json.loads(r.stdout)
    assert [d["detail"] for d in doc["deaths"] if d["failure"]] == ["sigkill"]
    assert any("my-catastrophic" in p["message"] for p in doc["problems"])
    assert secs < 60   # a hang guard, not a speed test: without the match timeout this run never ends


def test_timeout_costs_at_most_the_limit(tmp_path):
    from kwdiag.engine import MATCH_TIMEOUT, TIMEOUT_LIMIT

    rules = load_rules([str(_catastrophic_rules(tmp_path))])
    log = tmp_path / "x.log"
    log.write_text(("BOOM " + "a" * 5000 + "b\n") * 100)
    t = time.monotonic()
    r = analyze([str(log)], rules=rules)
    secs = time.monotonic() - t
    print(f"hostile: time to hit the regex timeout {TIMEOUT_LIMIT} times and switch the rule off: {secs:.2f} s")
    # A hang guard, not a speed test (bench/ measures speed): without the match timeout one such line takes
    # longer than the age of the universe; with it, the whole run costs about TIMEOUT_LIMIT * MATCH_TIMEOUT.
    assert secs < TIMEOUT_LIMIT * MATCH_TIMEOUT * 100 + 5
    (p,) = [p for p in r.problems if "my-catastrophic" in p.message]
    assert p.level == "warning" and "on 5 line(s) (first at line 1)" in p.message


# ------------------------------------------------------------------ escaping in every output
MARKUP = "[bold red]RICH[/] [link=http://evil]L[/link]"
ESCAPES = "\x1b[31mRED\x1b[0m \x1b]8;;http://evil\x07HYPER\x1b]8;;\x07 \x1b]0;TITLE\x07 \x9b2J \x9d0;T2\x9c"
HTML = "<script>alert(1)</script> \"><img src=x onerror=alert(2)> &amp;"
GH = "\n::error file=x::PWNED%0A"
HOSTILE = f"{MARKUP} {ESCAPES} {HTML}"


def _hostile_inputs(tmp_path: Path) -> list[str]:
    """A Dask text log with the hostile text in evidence and a JSONL log with it in worker names and task keys."""
    lines = W1.read_text().splitlines()
    i = next(n for n, x in enumerate(lines) if "killed by signal 9" in x)
    lines[i] = lines[i] + " " + HOSTILE
    text = tmp_path / "w1.log"
    text.write_text("\n".join(lines) + "\n")
    name, key = "w" + HOSTILE + GH, "task-" + HOSTILE + GH + "\ud800"
    evs = [
        {"v": 1, "ts": 100.0, "source": "worker", "kind": "worker-start", "worker": name,
         "fields": {"address": "tcp://h:1", "incarnation": 1}},
        {"v": 1, "ts": 101.0, "source": "nanny", "kind": "worker-exit", "worker": name,
         "fields": {"pid": 7, "incarnation": 1, "exitcode": -9, "signal": 9, "signal_name": "SIGKILL",
                    "running": [key], "stderr_tail": [HOSTILE + " Fatal Python error: Segmentation fault"]}},
        {"v": 1, "ts": 102.0, "source": "scheduler", "kind": "killed-worker", "worker": name,
         "fields": {"key": key, "task": key}},
    ]
    jl = tmp_path / "events.jsonl"
    jl.write_text("".join(json.dumps(e) + "\n" for e in evs))
    return [str(text), str(jl)]


def _assert_inert(out: str, fmt: str) -> None:
    out.encode("utf-8")  # no lone surrogate survived
    if fmt == "tty":
        assert not re.search(r"\x1b(?!\[[0-9;]*m)", out), "only rich's own SGR colour sequences"
        assert "[bold red]RICH[/]" in out  # markup shown literally, not interpreted
    else:
        assert "\x1b" not in out, fmt
    for c in ("\x07", "\x9b", "\x9d", "\x9c"):
        assert c not in out, (fmt, c)
    if fmt not in ("json", "sarif"):  # JSON keeps the raw text as data, its controls as \\u escapes
        assert "TITLE" not in out and "HYPER" in out  # an OSC payload goes with its sequence; text around stays


def test_hostile_text_is_inert_in_explain_outputs(tmp_path):
    """Protections: ``readers.text.clean`` (ANSI/OSC, C0/C1 controls, surrogates) for every output;
    rich ``markup=False`` + ``Text`` for the terminal; ``report.markdown._md`` (HTML and markdown
    escaped); ``report.text.to_json`` (JSON stays data); ``html.escape`` in the HTML report."""
    from kwdiag.report.html import render_html
    from kwdiag.report.jsonout import render_json
    from kwdiag.report.markdown import render_markdown
    from kwdiag.report.terminal import render_plain, render_terminal

    report = analyze(_hostile_inputs(tmp_path), rules=RULES)
    assert any("RICH" in e.text for d in report.deaths for e in d.evidence)
    assert any("RICH" in d.worker for d in report.deaths) and any("RICH" in k.task for k in report.killed_workers)
    tty = io.StringIO()
    render_terminal(report, tty, force_terminal=True)
    outs = {"plain": render_plain(report), "tty": tty.getvalue(), "markdown": render_markdown(report),
            "json": render_json(report), "html": render_html(report)}
    for fmt, out in outs.items():
        _assert_inert(out, fmt)
    assert "[bold red]RICH[/]" in outs["plain"]
    fenced = re.findall(r"^```\n(.*?)^```$", outs["markdown"], flags=re.S | re.M)
    assert fenced and not any("```" in block for block in fenced)  # log text cannot close its code block
    md = re.sub(r"^```\n.*?^```$", "", outs["markdown"], flags=re.S | re.M)  # code blocks render literally
    md = re.sub(r"`[^`\n]*`", "", md)  # so do code spans
    md = re.sub(r"</?(details|summary)>", "", md)  # the report's own collapsible sections
    assert "<" not in md and "&lt;script&gt;" in md and "\\[link=" in md
    doc = json.loads(outs["json"])
    assert any("[bold red]RICH[/]" in d["worker"] for d in doc["deaths"])
    page = outs["html"].lower()
    assert "<script" not in page and "<img" not in page and "&lt;script&gt;" in page


def test_hostile_text_is_inert_in_check_outputs_through_the_cli(tmp_path):
    """Protections: ``junit.x`` (XML), ``github.escape_data``/``escape_property`` (no injected command),
    ``check.textout.md``, ``report.text.to_json`` (SARIF/JSON), all after ``clean``."""
    inputs = _hostile_inputs(tmp_path)
    for fmt in ("text", "json", "junit", "sarif", "github", "markdown"):
        r = subprocess.run([sys.executable, "-m", "kwdiag", "check", *inputs, "--no-config", "--format", fmt],
                           capture_output=True, timeout=120, cwd=tmp_path)
        out, err = r.stdout.decode("utf-8"), r.stderr.decode("utf-8")
        assert r.returncode == 1 and "Traceback" not in err, (fmt, err)
        _assert_inert(out, fmt)
        if fmt == "github":
            for line in out.splitlines():
                assert line.startswith(("::error ", "::warning ", "::notice ", "kwdiag check: ")), line
            assert not re.search(r"^::error file=x::PWNED", out, re.M)
        elif fmt == "junit":
            ET.fromstring(r.stdout)
        elif fmt in ("json", "sarif"):
            assert "RICH" in json.dumps(json.loads(out))
        elif fmt == "markdown":
            assert "<script" not in re.sub(r"`[^`\n]*`", "", out)
    for fmt in ("text", "json", "markdown"):
        r = subprocess.run([sys.executable, "-m", "kwdiag", "explain", *inputs, "--format", fmt,
                            "--html", str(tmp_path / "r.html")], capture_output=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr
        _assert_inert(r.stdout.decode("utf-8"), fmt)


# ------------------------------------------------------------------ the real CLI on a representative set
def _junk(tmp_path: Path) -> dict[str, list[str]]:
    p = {}
    (tmp_path / "bin.log").write_bytes(os.urandom(4096) + b"\x00" * 10)
    p["binary"] = [str(tmp_path / "bin.log")]
    (tmp_path / "cut.log.gz").write_bytes(zlib.compress(W1.read_bytes(), 9, wbits=31)[:700])
    p["truncated gzip"] = [str(tmp_path / "cut.log.gz")]
    (tmp_path / "fake.gz").write_bytes(b"\x1f\x8bnot gzip at all")
    p["not gzip"] = [str(tmp_path / "fake.gz")]
    (tmp_path / "empty.log").write_bytes(b"")
    p["empty"] = [str(tmp_path / "empty.log")]
    (tmp_path / "latin1.log").write_bytes(W1.read_bytes().replace(b"signal 9", b"signal 9 \xe9\xff\xfe"))
    p["invalid utf-8"] = [str(tmp_path / "latin1.log")]
    (tmp_path / "clock.log").write_bytes(re.sub(rb"^2026-11-21 10:", b"2026-13-45 25:", W1.read_bytes(), flags=re.M))
    p["impossible timestamps"] = [str(tmp_path / "clock.log")]
    odd = os.fsencode(str(tmp_path)) + b"/w\xff\xfe.log"
    with open(odd, "wb") as f:
        f.write(W1.read_bytes())
    p["non-UTF-8 file name"] = [os.fsdecode(odd)]
    (tmp_path / "dir").mkdir()
    p["empty directory"] = [str(tmp_path / "dir")]
    p["missing"] = [str(tmp_path / "missing.log")]
    return p


@pytest.mark.parametrize("command", ["explain", "check"])
def test_cli_on_junk_exits_with_a_documented_code(tmp_path, command):
    allowed = {"explain": {0, 2}, "check": {0, 1, 2}}[command]
    for what, args in _junk(tmp_path).items():
        extra = ["--no-config"] if command == "check" else ["--format", "json"]
        r = subprocess.run([sys.executable, "-m", "kwdiag", command, *args, *extra], capture_output=True,
                           timeout=120, cwd=tmp_path)
        err = r.stderr.decode("utf-8")
        assert r.returncode in allowed and "Traceback" not in err and "internal error" not in err, (what, err)
        assert err.strip() or what == "non-UTF-8 file name", what  # every problem is reported
        for line in err.splitlines():
            assert line.startswith(("kwdiag: error: ", "kwdiag: warning: ")), (what, line)
        if what == "non-UTF-8 file name":
            assert r.returncode in (0, 1) and "w\ufffd\ufffd.log" in r.stdout.decode("utf-8")


def test_report_data_from_jsonl_has_no_lone_surrogates(tmp_path):
    """Protection: ``readers.text._no_lone_surrogates`` -- a ``\\ud800`` escape in a JSONL event becomes U+FFFD,
    so the ``Report`` a Python caller gets can be printed or encoded (not only kwdiag's own outputs)."""
    p = tmp_path / "e.jsonl"
    p.write_text('{"v": 1, "ts": 5, "source": "nanny", "kind": "worker-exit", "worker": "w\\ud800x", '
                 '"fields": {"exitcode": -9, "signal": 9, "key": "k\\udfff", "ok": "\\ud83d\\ude00 \\\\ud800"}}\n')
    r = analyze([str(p)], rules=RULES)
    assert [d.worker for d in r.deaths] == ["w\ufffdx"]
    json.dumps(r.to_dict(), ensure_ascii=False).encode("utf-8")
