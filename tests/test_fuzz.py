"""Property-based tests (hypothesis) over every reader, the rule engine and every output format.

Whatever bytes, Unicode, truncation or interleaving a log holds: no exception escapes, the CLI
exits with a documented code (``explain``: 0 or 2, ``check``: 0, 1 or 2 -- never 70, an internal
error), every rendering can be written as UTF-8 and parsed back (JSON, XML), and the block scanner
hands over exactly the lines a reference split finds, however lines fall across block boundaries.

Runs are derandomized, so CI sees the same inputs every time; set ``KWDIAG_FUZZ_RANDOM=1`` to
explore new ones (and ``KWDIAG_FUZZ_SCALE=10`` for ten times as many). Each test asserts how many
generated inputs ran and prints it (``pytest -s`` or ``-rP`` shows ``fuzz: ...`` lines).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kwdiag.analysis import analyze_events
from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze
from kwdiag.events import Event, Origin
from kwdiag.readers import scan as scanmod
from kwdiag.escape import clean

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_logs"
RULES = load_rules()
SCALE = max(1, int(os.environ.get("KWDIAG_FUZZ_SCALE", "1")))
RANDOM = os.environ.get("KWDIAG_FUZZ_RANDOM") == "1"
EXPLAIN_CODES = {0, 2}
CHECK_CODES = {0, 1, 2}

RAN: dict[str, int] = {}


def fuzz_settings(n: int):
    # no shrinking phase in CI: a failure is reported at once with its (unshrunk) input
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if os.environ.get("KWDIAG_FUZZ_SHRINK") else [])
    return settings(max_examples=n * SCALE, deadline=None, derandomize=not RANDOM, database=None, phases=phases,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def _ran(name: str, n: int, at_least: int) -> None:
    RAN[name] = n
    print(f"fuzz: {name}: {n} generated inputs ran (total so far {sum(RAN.values())})")
    assert n >= at_least, f"only {n} generated inputs ran for {name}"


# ------------------------------------------------------------------ material to build hostile logs from
SAMPLE_FILES = sorted(p for p in SAMPLES.rglob("*") if p.is_file() and p.suffix in (".log", ".jsonl"))
REAL_LINES = sorted({line for p in SAMPLE_FILES[:40] for line in p.read_bytes().splitlines(keepends=True)[:200]})
# one literal of every line rule, so generated lines reach the rules' patterns, not only the prefilter
KEYWORDS = sorted({k for r in RULES.line_rules for k in r.keywords})
HOSTILE_TEXT = [
    "[bold red]x[/]", "[link=http://evil]y[/link]", "\x1b[31m", "\x1b]8;;http://evil\x07", "\x1b]0;title\x07",
    "\x1b[2J", "\x9b31m", "\x9d0;t\x9c", "<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "&amp;",
    "]]>", "::error::pwned", "%0A", "|", "`", "\u202e", "\ufeff", "\x00", "\r", "\t", "\\ud800",
]
DASK_PREFIX = "2026-11-21 10:56:35,201 - distributed.nanny - INFO - "

unicode_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=120)  # surrogates included
hostile_piece = st.one_of(unicode_text, st.sampled_from(HOSTILE_TEXT), st.sampled_from(KEYWORDS))
hostile_line = st.lists(hostile_piece, max_size=8).map("".join)


def _encode(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")  # lone surrogates become invalid UTF-8 bytes on disk


@st.composite
def hostile_files(draw) -> bytes:
    """Bytes of one log: real lines, generated text lines, raw bytes, JSONL, in any mix."""
    parts = draw(st.lists(st.one_of(
        st.sampled_from(REAL_LINES),
        hostile_line.map(lambda s: _encode(DASK_PREFIX + s + "\n")),
        hostile_line.map(lambda s: _encode(s + "\n")),
        st.binary(max_size=200),
        st.sampled_from([b"\r\n", b"\n\n", b"\x00", b"\xff\xfe", b"\xed\xa0\x80", b"\x1f\x8b", b'{"v":1,',
                         b'{"v":1,"ts":1e999,"source":"x","kind":"y"}\n',
                         b'{"v": 1, "ts": 5, "source": "nanny", "kind": "worker-exit", "worker": "\\ud800",'
                         b' "fields": {"stderr_tail": "Segmentation fault\\n\\udfff"}}\n']),
    ), max_size=30))
    return b"".join(parts)


def _maybe_gzip(data: bytes, how: str) -> bytes:
    if how == "plain":
        return data
    gz = gzip.compress(data, mtime=0)
    if how == "gzip":
        return gz
    if how == "gzip-truncated":
        return gz[: max(2, len(gz) * 2 // 3)]
    return gz + gzip.compress(b"second member\n", mtime=0)  # multi-member


# ------------------------------------------------------------------ the CLI, in-process
def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``kwdiag ARGV`` in this process with real UTF-8 (strict) stdout/stderr; (exit code, out, err)."""
    from kwdiag.cli import main

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.buffer.getvalue().decode("utf-8"), err.buffer.getvalue().decode("utf-8")


def test_fuzz_explain_and_check_cli_on_any_log(tmp_path_factory):
    """Generated logs (plain, gzip, truncated gzip, multi-member) through ``explain`` and ``check``."""
    n = [0]
    d = tmp_path_factory.mktemp("cli")

    @fuzz_settings(120)
    @given(data=hostile_files(), how=st.sampled_from(["plain", "gzip", "gzip-truncated", "multi"]),
           fmt=st.sampled_from(["text", "json", "markdown", "c-text", "c-json", "c-junit", "c-sarif", "c-github",
                                "c-markdown"]))
    def prop(data, how, fmt):
        n[0] += 1
        p = d / "w.log"
        p.write_bytes(_maybe_gzip(data, how))
        if fmt.startswith("c-"):
            code, out, err = run_cli(["check", str(p), "--no-config", "--format", fmt[2:]])
            assert code in CHECK_CODES, err
        else:
            code, out, err = run_cli(["explain", str(p), "--format", fmt, "--html", str(d / "r.html")])
            assert code in EXPLAIN_CODES, err
        assert "Traceback" not in err and "internal error" not in err
        for line in err.splitlines():
            assert line.startswith(("kwdiag: error: ", "kwdiag: warning: ")), line
        if fmt in ("json", "c-json", "c-sarif"):
            json.loads(out)
        elif fmt == "c-junit":
            ET.fromstring(out.encode())
        if fmt in ("text", "markdown", "c-text", "c-markdown", "c-github"):
            assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", out), out

    prop()
    _ran("explain/check CLI on generated logs", n[0], 120 * SCALE)


# ------------------------------------------------------------------ every renderer, in-process
def _render_all(report, tmp: Path) -> None:
    from kwdiag.check import evaluate
    from kwdiag.check.github import render_github
    from kwdiag.check.junit import render_junit
    from kwdiag.check.policy import Policy
    from kwdiag.check.sarif import render_sarif
    from kwdiag.check.textout import render_markdown as check_md
    from kwdiag.check.textout import render_text
    from kwdiag.report.html import render_html
    from kwdiag.report.jsonout import render_json
    from kwdiag.report.markdown import render_markdown
    from kwdiag.report.terminal import render_plain, render_terminal

    tty = io.StringIO()
    render_terminal(report, tty, force_terminal=True)
    outputs = {"plain": render_plain(report), "tty": tty.getvalue(), "markdown": render_markdown(report),
               "json": render_json(report), "html": render_html(report)}
    outcome = evaluate(report, Policy())
    outputs.update({"junit": render_junit(outcome), "sarif": render_sarif(outcome),
                    "github": render_github(outcome, root=str(tmp)), "c-text": render_text(outcome),
                    "c-markdown": check_md(outcome)})
    for name, text in outputs.items():
        text.encode("utf-8")  # strict: a lone surrogate anywhere would fail every real output
        if name == "tty":
            assert not re.search(r"\x1b(?!\[[0-9;]*m)", text), "only rich's own colour sequences"
        else:
            assert "\x1b" not in text and "\x9b" not in text and "\x07" not in text, name
    json.loads(outputs["json"])
    json.loads(outputs["sarif"])
    ET.fromstring(outputs["junit"].encode())
    assert "<script" not in outputs["html"].lower() and "<img" not in outputs["html"].lower()
    for line in outputs["github"].splitlines():
        assert line.startswith(("::error", "::warning", "::notice", "kwdiag check: ")), line


def test_fuzz_every_renderer_on_hostile_jsonl_events(tmp_path_factory):
    """Events whose worker names, task keys, messages and stderr tails are arbitrary Unicode."""
    n = [0]
    d = tmp_path_factory.mktemp("jsonl")
    kinds = ["worker-start", "worker-exit", "killed-worker", "task-erred", "worker-removed", "nanny-memory-terminate",
             "heartbeat-missed", "versions-mismatch", "memory-sample", "x-unknown"]

    @fuzz_settings(80)
    @given(st.lists(st.fixed_dictionaries({
        "ts": st.one_of(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12),
                        st.integers(-2**70, 2**70)),
        "kind": st.sampled_from(kinds),
        "worker": st.one_of(st.none(), hostile_line, st.sampled_from(["w1", "w2"])),
        "key": hostile_line, "message": hostile_line,
        "tail": st.lists(st.one_of(hostile_line, st.sampled_from(["Fatal Python error: Segmentation fault",
                                                                  "MemoryError"])), max_size=4),
        "extra": st.dictionaries(st.sampled_from(["exitcode", "signal", "incarnation", "pid", "rss", "limit",
                                                   "address", "running", "exception"]),
                                 st.one_of(st.none(), st.integers(-2**64, 2**64), st.floats(), hostile_line,
                                           st.lists(hostile_line, max_size=3)), max_size=5),
    }), max_size=12))
    def prop(recs):
        n[0] += 1
        lines = []
        for r in recs:
            fields = {"key": r["key"], "task": r["key"], "stderr_tail": r["tail"], **r["extra"]}
            rec = {"v": 1, "ts": r["ts"], "source": "nanny", "kind": r["kind"], "worker": r["worker"],
                   "message": r["message"], "fields": fields}
            lines.append(json.dumps(rec, allow_nan=True))  # ensure_ascii: lone surrogates as \\udxxx escapes
        p = d / "events.jsonl"
        p.write_text("\n".join(lines) + "\n")
        report = analyze([str(p)], rules=RULES)
        _render_all(report, d)

    prop()
    _ran("renderers on generated JSONL events", n[0], 80 * SCALE)


def test_fuzz_every_renderer_on_hostile_text_logs(tmp_path_factory):
    """Dask text logs whose worker names, task keys and messages carry markup, escapes and HTML."""
    n = [0]
    d = tmp_path_factory.mktemp("text")
    base = (SAMPLES / "dask-sigkill" / "w1.log").read_text().splitlines()

    @fuzz_settings(60)
    @given(name=hostile_line, key=hostile_line, msg=hostile_line, at=st.integers(0, len(base)))
    def prop(name, key, msg, at):
        n[0] += 1
        lines = list(base)
        lines[at:at] = [
            DASK_PREFIX.replace("nanny", "worker") + f"Worker name: {name}",
            DASK_PREFIX + f"Worker process 3407 was killed by signal 9 {msg}",
            DASK_PREFIX.replace("nanny", "scheduler") + f"Task {key} marked as failed because 3 workers died "
            f"while trying to run it",
            DASK_PREFIX.replace("INFO", "ERROR") + f"Compute Failed\nKey: {key}\nException: 'ValueError({msg!r})'",
        ]
        p = d / "w1.log"
        p.write_bytes(_encode("\n".join(lines) + "\n"))
        _render_all(analyze([str(p)], rules=RULES), d)

    prop()
    _ran("renderers on generated Dask text logs", n[0], 60 * SCALE)


# ------------------------------------------------------------------ truncated and interleaved real logs
def test_fuzz_truncated_and_interleaved_real_logs(tmp_path_factory):
    """Real sample logs cut anywhere (plain or gzip) and several interleaved line by line."""
    n = [0]
    d = tmp_path_factory.mktemp("cut")
    texts = [p.read_bytes() for p in SAMPLE_FILES[:30]]

    @fuzz_settings(80)
    @given(picks=st.lists(st.integers(0, len(texts) - 1), min_size=1, max_size=3), seed=st.randoms(),
           cut=st.floats(0, 1), how=st.sampled_from(["plain", "gzip", "gzip-truncated"]))
    def prop(picks, seed, cut, how):
        n[0] += 1
        streams = [texts[i].splitlines(keepends=True) for i in picks]
        mixed = []
        while any(streams):
            s = seed.choice([s for s in streams if s])
            mixed.append(s.pop(0))
        data = b"".join(mixed)
        data = data[: int(len(data) * cut)]
        p = d / "mixed.log"
        p.write_bytes(_maybe_gzip(data, how))
        report = analyze([str(p)], rules=RULES)
        for death in report.deaths:
            assert 0.0 <= death.confidence <= 1.0
            assert all(e.file == str(p) and e.line >= 1 for e in death.evidence)
        if how == "gzip-truncated" and data:
            assert any("ends early" in x.message or "not a readable gzip" in x.message for x in report.problems)

    prop()
    _ran("truncated/interleaved real logs", n[0], 80 * SCALE)


# ------------------------------------------------------------------ the block scanner against a reference
def _reference(data: bytes, needle: bytes, max_line: int) -> list[tuple[int, bytes]]:
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [(i + 1, line[:max_line]) for i, line in enumerate(lines) if needle in line[:max_line]]


def test_fuzz_scanner_hands_over_exactly_the_right_lines(tmp_path_factory, monkeypatch):
    """Tiny blocks and line bound, so lines straddle blocks and the bound in every way (gzip too)."""
    n = [0]
    d = tmp_path_factory.mktemp("scan")
    monkeypatch.setattr(scanmod, "BLOCK", 16)
    monkeypatch.setattr(scanmod, "MAX_LINE", 24)
    prefilter = re.compile(b"K")

    @fuzz_settings(250)
    @given(lines=st.lists(st.tuples(st.integers(0, 70), st.booleans(), st.integers(0, 70)), max_size=12),
           final_newline=st.booleans(), gz=st.booleans())
    def prop(lines, final_newline, gz):
        n[0] += 1
        data = b"\n".join(b"x" * a + (b"K" if k else b"") + b"y" * b for a, k, b in lines)
        if final_newline and data:
            data += b"\n"
        if data[:1] == b"\x1f":
            return
        p = d / "s.log"
        p.write_bytes(gzip.compress(data, mtime=0) if gz else data)
        got = []
        stats = scanmod.scan(str(p), prefilter, lambda ln, line, prev: got.append((ln, line)))
        # nothing lost: every line with the needle within its first MAX_LINE bytes, at its true number;
        # and nothing made up: whatever is handed over is the (cut) line at that number
        assert set(_reference(data, b"K", 24)) <= set(got)
        real = data.split(b"\n")
        assert all(line == real[ln - 1][:24] for ln, line in got)
        assert [ln for ln, _ in got] == sorted({ln for ln, _ in got})
        assert stats.long_lines == sum(1 for line in data.split(b"\n") if len(line) > 24)

    prop()
    _ran("block scanner vs reference split", n[0], 250 * SCALE)


def test_fuzz_gzip_reader_is_bounded_and_loses_nothing(tmp_path_factory, monkeypatch):
    """Decompressed output per read never exceeds what was asked; a stream is read whole below the ratio bound."""
    n = [0]
    monkeypatch.setattr(scanmod, "GZIP_RATIO_AFTER", 1 << 12)

    @fuzz_settings(120)
    @given(payload=st.binary(max_size=3000), repeat=st.integers(1, 400), members=st.integers(1, 3),
           want=st.integers(1, 5000))
    def prop(payload, repeat, members, want):
        n[0] += 1
        data = payload * repeat
        gz = b"".join(gzip.compress(data, mtime=0) for _ in range(members))
        raw = io.BytesIO(gz)
        chain = scanmod._GzipChain(raw.read(64), raw)
        out, bomb = [], False
        while True:
            try:
                chunk = chain.read(want)
            except scanmod.GzipBomb:
                bomb = True
                break
            if not chunk:
                break
            assert len(chunk) <= want
            out.append(chunk)
        got = b"".join(out)
        if bomb:
            assert len(got) > scanmod.GZIP_RATIO_AFTER and len(got) > scanmod.MAX_GZIP_RATIO * 0.5 * 1
        else:
            assert got == data * members

    prop()
    _ran("gzip reader chunks", n[0], 120 * SCALE)


# ------------------------------------------------------------------ the rule engine
def test_fuzz_rule_engine_on_any_line_and_event():
    """``RuleSet.match_line`` on any text and ``analyze_events`` on any events: no exception, sane verdicts."""
    n = [0]

    @fuzz_settings(250)
    @given(line=hostile_line, events=st.lists(st.builds(
        lambda ts, kind, worker, fields: Event(ts=ts, source="nanny", kind=kind, worker=worker, fields=fields,
                                               origin=Origin("f.jsonl", 1)),
        st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=2e9),
        st.sampled_from(["worker-start", "worker-exit", "worker-removed", "killed-worker", "task-erred",
                         "nanny-memory-terminate", "memory-sample", "worker-closing", "q"]),
        st.one_of(st.none(), st.sampled_from(["w1", "w2"]), hostile_line),
        st.dictionaries(st.sampled_from(["incarnation", "exitcode", "signal", "signal_name", "key", "task",
                                         "rss", "limit", "caused_by", "reason", "stderr_tail", "rule"]),
                        st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(), hostile_line,
                                  st.lists(hostile_line, max_size=2)), max_size=6)), max_size=10))
    def prop(line, events):
        n[0] += 1
        for rule, groups in RULES.match_line(line):
            assert rule.is_line_rule and isinstance(groups, dict)
        report = analyze_events(events, RULES)
        for death in report.deaths:
            assert 0.0 <= death.confidence <= 1.0
        json.dumps(report.to_dict(), allow_nan=True)

    prop()
    _ran("rule engine lines/events", n[0], 250 * SCALE)


def test_fuzz_clean_leaves_nothing_a_terminal_acts_on():
    n = [0]

    @fuzz_settings(300)
    @given(hostile_line)
    def prop(s):
        n[0] += 1
        out = clean(s)
        out.encode("utf-8")
        assert not re.search("[\x00-\x08\x0a-\x1f\x7f-\x9f]", out)

    prop()
    _ran("clean()", n[0], 300 * SCALE)
