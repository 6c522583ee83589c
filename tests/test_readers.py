"""Readers on bad and unusual input: one clear problem each, never a traceback, the rest still read."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ANY, assert_deaths
from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze
from kwdiag.readers.text import parse_prefix

SAMPLES = Path(__file__).resolve().parent.parent / "sample_logs"
SIGKILL_W1 = SAMPLES / "dask-sigkill" / "w1.log"
RULES = load_rules()
# What the clean file says: w1's first process was SIGKILLed, its second left on SIGTERM. Every bad input
# below must still say exactly that (nothing missing, nothing extra).
CLEAN = [("w1", 1, "sudden_exit", "sigkill"), ("w1", 2, "chose_to_exit", "sigterm")]


def _kwdiag(*args: str, stdin: bytes | None = None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kwdiag", *args], input=stdin, capture_output=True, timeout=60,
                          env=env)


def _sigkill_report(paths):
    return analyze([str(p) for p in paths], rules=RULES)


def test_missing_path_is_reported_and_the_rest_analyzed(tmp_path):
    r = _sigkill_report([tmp_path / "nope.log", SIGKILL_W1])
    assert [p.message for p in r.input_errors] == ["no such file or directory"]
    assert_deaths(r.deaths, CLEAN)


def test_binary_file(tmp_path):
    p = tmp_path / "core.log"
    p.write_bytes(b"\x7fELF\x00\x00\x01" * 1000)
    r = _sigkill_report([p, SIGKILL_W1])
    assert len(r.input_errors) == 1 and "binary" in r.input_errors[0].message
    assert_deaths(r.deaths, CLEAN)


def test_gzip_and_truncated_gzip(tmp_path):
    data = SIGKILL_W1.read_bytes()
    full = tmp_path / "w1.log.gz"
    full.write_bytes(gzip.compress(data))
    r = _sigkill_report([full])
    assert not r.problems
    assert_deaths(r.deaths, CLEAN)
    cut = tmp_path / "cut.gz"
    blob = gzip.compress(data * 20)
    cut.write_bytes(blob[: len(blob) * 3 // 4])
    r = _sigkill_report([cut])
    assert any("ends early" in p.message for p in r.input_errors)
    # What could be read is still analyzed: 20 copies of the log, cut short (the last ones' ends are lost).
    assert {(w, c, d) for w, _, c, d in r.deaths and [(x.worker, x.incarnation, x.cause, x.detail)
                                                      for x in r.deaths]} >= {("w1", "sudden_exit", "sigkill")}


def test_enormous_single_line_is_bounded(tmp_path):
    p = tmp_path / "huge.log"
    with open(p, "wb") as f:
        f.write(b"x" * (60 << 20))
        f.write(b"\n")
        f.write(SIGKILL_W1.read_bytes())
    r = _sigkill_report([p])
    assert any("longer than" in x.message for x in r.problems)
    assert_deaths(r.deaths, CLEAN)


@pytest.mark.parametrize("where", ["garbled", "copy-before", "copy-after"])
def test_invalid_utf8_is_replaced_and_reported(tmp_path, where):
    """The kill line with its pid's bytes garbled: in place of the real one, or as a copy beside it (a tee'd
    or duplicated log). Either way the same two deaths as the clean file, the garbled copy no extra one."""
    p = tmp_path / "bad.log"
    lines = SIGKILL_W1.read_bytes().splitlines(keepends=True)
    i = next(k for k, line in enumerate(lines) if b"was killed by signal 9" in line)
    bad = lines[i].replace(b"3536", b"\xff\xfe")
    lines[i:i + 1] = {"garbled": [bad], "copy-before": [bad, lines[i]], "copy-after": [lines[i], bad]}[where]
    p.write_bytes(b"".join(lines))
    r = _sigkill_report([p])
    assert any("UTF-8" in x.message for x in r.problems)
    assert_deaths(r.deaths, CLEAN)
    assert [d.pid for d in r.deaths if d.detail == "sigkill"] == [None if where == "garbled" else 3536]


def test_empty_file_and_empty_directory(tmp_path):
    (tmp_path / "empty.log").write_bytes(b"")
    d = tmp_path / "nothing"
    d.mkdir()
    r = _sigkill_report([tmp_path / "empty.log", d])
    msgs = {(p.level, p.message) for p in r.problems}
    assert ("warning", "empty input") in msgs
    assert ("error", "directory has no log files to read") in msgs


def test_empty_files_in_a_directory_are_passed_over_quietly(tmp_path):
    """A batch job's folder holds an empty .out beside every .err (dask-jobqueue under SLURM): nothing to warn of."""
    (tmp_path / "dask-worker-4.out").write_bytes(b"")
    (tmp_path / "dask-worker-4.err").write_bytes((SAMPLES / "dask-sigkill" / "w1.log").read_bytes())
    r = _sigkill_report([tmp_path])
    assert [p for p in r.problems if p.message == "empty input"] == [] and r.files == (str(tmp_path / "dask-worker-4.err"),)
    assert [d.detail for d in r.deaths if d.failure] == ["sigkill"]
    only_empty = tmp_path / "only-empty"   # a quiet run's only log may be empty: read, and said so
    only_empty.mkdir()
    (only_empty / "cluster.log").write_bytes(b"")
    r = _sigkill_report([only_empty])
    assert [(p.level, p.message) for p in r.problems] == [("warning", "empty input")] and r.deaths == ()


def test_directory_is_read_recursively_and_merged(tmp_path):
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    for f in (SAMPLES / "dask-sigkill").glob("*.log"):
        (sub / f.name).write_bytes(f.read_bytes())
    r = _sigkill_report([tmp_path])
    # With the scheduler's log beside the workers': w1's second process ended as the cluster closed, and w2
    # (no nanny: nothing names the signal) just stopped (sample_logs/dask-sigkill/expected.json).
    assert_deaths(r.deaths, [("w1", 1, "sudden_exit", "sigkill"), ("w1", 2, "chose_to_exit", "shutdown"),
                             ("w2", 1, "unknown", "abrupt_end")])


def test_stdin_and_exit_codes(tmp_path):
    res = _kwdiag("explain", "-", "--format", "json", stdin=SIGKILL_W1.read_bytes())
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert_deaths(doc["deaths"], CLEAN)
    res = _kwdiag("explain", str(tmp_path / "missing.log"))
    assert res.returncode == 2
    assert b"Traceback" not in res.stderr and b"no such file or directory" in res.stderr
    res = _kwdiag("explain", str(SIGKILL_W1), "--format", "nope")
    assert res.returncode == 2 and b"Traceback" not in res.stderr


def test_kwdiag_jsonl_with_bad_lines(tmp_path):
    lines = [
        {"v": 1, "ts": 100.0, "source": "worker", "kind": "worker-start", "worker": "w9",
         "fields": {"address": "tcp://h:1", "incarnation": 1}},
        {"v": 1, "ts": 101.0, "source": "nanny", "kind": "worker-exit", "worker": "w9",
         "fields": {"pid": 7, "incarnation": 1, "exitcode": -11, "signal": 11, "signal_name": "SIGSEGV",
                    "caused_by": None, "stderr_tail": ["Fatal Python error: Segmentation fault", "", "x"]}},
    ]
    p = tmp_path / "nanny-w9.jsonl"
    p.write_text(json.dumps(lines[0]) + "\n" + '{"v": 1, "ts": "soon"}\n' + json.dumps(lines[1]) + "\n"
                 + '{"v": 2, "ts": 1, "source": "x", "kind": "y"}\n')
    r = _sigkill_report([p])
    assert [(d.worker, d.cause, d.detail) for d in r.deaths] == [("w9", "sudden_exit", "segfault")]
    assert r.deaths[0].confidence > 0.9  # the exit status and the faulthandler dump in its stderr tail agree
    assert any("could not be decoded" in x.message for x in r.problems)
    assert r.runtimes == ("kwdiag",)


def test_parse_prefix_layouts():
    ts, logger, level, msg = parse_prefix("2026-11-21 10:56:35,201 - distributed.nanny - INFO - hello")
    assert logger == "distributed.nanny" and level == "info" and msg == "hello" and ts is not None
    ts2, *_ = parse_prefix("2026-11-21T10:56:35.201Z some k8s line")
    assert ts2 is not None and abs(ts2 % 1 - 0.201) < 1e-6
    assert parse_prefix("  File \"x.py\", line 1")[0] is None


KERNEL_OOM = ("[Sat Nov 21 10:56:57 2026] Memory cgroup out of memory: Killed process {pid} (python3) "
              "total-vm:2812340kB, anon-rss:1987420kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4100kB")
OTHER_OOM = "[Sat Nov 21 10:56:57 2026] Out of memory: Killed process 1 (postgres) total-vm:1kB, anon-rss:1kB"


def _sigkill_pid() -> int:
    line = next(x for x in SIGKILL_W1.read_text().splitlines() if "killed by signal 9" in x)
    return int(line.split("Worker process ")[1].split()[0])


def test_kernel_oom_killer_beside_dask_logs_is_matched_by_pid(tmp_path):
    # kernel line format as printed by Linux (dmesg -T), see docs/rules.md
    dmesg = tmp_path / "dmesg.txt"
    dmesg.write_text(OTHER_OOM + "\n" + KERNEL_OOM.format(pid=_sigkill_pid()) + "\n")
    r = _sigkill_report([SIGKILL_W1, SAMPLES / "dask-sigkill" / "scheduler.log", dmesg])
    d = next(d for d in r.deaths if d.worker == "w1" and d.incarnation == 1)
    assert (d.cause, d.detail) == ("sudden_exit", "oom_killer") and d.confidence > 0.9
    assert [e.line for e in d.evidence if e.file == str(dmesg)] == [2]
    # the postgres kill names a process that is not a worker: it explains nothing
    assert all(x.detail != "oom_killer" for x in r.deaths if x is not d)


def test_kubernetes_status_without_time_or_pid_attaches_only_when_one_death_fits(tmp_path):
    pod = tmp_path / "describe-pod.txt"
    pod.write_text("    Last State:     Terminated\n      Reason:       OOMKilled\n      Exit Code:    137\n")
    r = _sigkill_report([SIGKILL_W1, pod])
    d = next(d for d in r.deaths if d.incarnation == 1)
    assert (d.cause, d.detail) == ("sudden_exit", "oom_killer")
    two = _sigkill_report([SAMPLES / "dask-killedworker", pod])  # two SIGKILL deaths: cannot tell which
    assert [d.detail for d in two.deaths if d.failure] == ["sigkill", "sigkill"]


from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

_REAL_LINES = [l for l in SIGKILL_W1.read_bytes().splitlines(keepends=True)]


@settings(max_examples=60, deadline=None, derandomize=True, database=None,   # the same inputs on every CI run
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.one_of(st.binary(max_size=300), st.sampled_from(_REAL_LINES),
                          st.sampled_from([b'{"v":1,"ts":1,"source":"nanny","kind":"worker-exit","fields":[]}\n',
                                           b'{"v": 1, "ts": 1e400}\n', b"\r\n", b"\x1b]0;x\x07\n"])), max_size=40))
def test_any_bytes_are_read_without_raising(tmp_path_factory, chunks):
    p = tmp_path_factory.mktemp("fuzz") / "x.log"
    p.write_bytes(b"".join(chunks))
    r = analyze([str(p)], rules=RULES)
    for d in r.deaths:
        assert 0.0 <= d.confidence <= 1.0
        for e in d.evidence:
            assert "\x1b" not in e.text and "\x07" not in e.text


# ---------------------------------------------------------------- the folded scan
def _lines_found(finder, data: bytes) -> list[int]:
    from kwdiag.readers.scan import _feed

    got: list[int] = []
    _feed(data, 0, finder.starts(data, 0, len(data)), lambda lineno, line, prev: got.append(lineno))
    return got


def test_the_folded_scan_finds_the_lines_the_prefilter_regex_finds_on_every_sample_and_corpus_log():
    """``FoldedFinder`` searches bytes whose literals' first bytes were folded into one, then checks each line it
    finds with the prefilter itself: it must find exactly the lines the prefilter regex finds."""
    from kwdiag.readers.scan import FoldedFinder, RegexFinder

    folded, plain = FoldedFinder(RULES.prefilter, RULES.anchors), RegexFinder(RULES.prefilter)
    found = 0
    for path in sorted(SAMPLES.rglob("*.log")):
        data = path.read_bytes()
        want = _lines_found(plain, data)
        assert _lines_found(folded, data) == want, path
        found += len(want)
    assert found > 10_000


def test_the_folded_scan_passes_no_line_the_fold_alone_matches_and_misses_no_anchor_behind_one():
    """Lines made to match only once folded (each literal's first byte swapped for another literal's first byte),
    and such a near-miss just before a real literal in the same line: the first passes no line, the second finds
    the line the literal is in; either way the lines are the prefilter regex's."""
    from kwdiag.readers.scan import FoldedFinder, RegexFinder

    firsts = sorted({a[0] for a in RULES.anchors})
    lines = []
    for anchor in RULES.anchors:
        other = next(b for b in firsts if b != anchor[0])
        fake = bytes([other]) + anchor[1:]
        if RULES.prefilter.search(fake) is None:
            lines.append(b"2026-11-21 09:53:19,534 - distributed.worker - INFO - " + fake)
            lines.append(b"x " + fake[:-1] + b" " + anchor + b" y")
    assert len(lines) > 100
    data = b"\n".join(lines) + b"\n"
    want = _lines_found(RegexFinder(RULES.prefilter), data)
    assert want == list(range(1, len(lines), 2))   # (numbered from 0 here) the second line of each pair
    assert _lines_found(FoldedFinder(RULES.prefilter, RULES.anchors), data) == want


# ---------------------------------------------------------------- grep as the prefilter of large files
def _gnu_grep_here() -> bool:
    from kwdiag.readers.grepfind import _gnu_grep

    return _gnu_grep() is not None


def _both_ways(path, monkeypatch):
    """The candidate lines and counts of one scan with grep finding the literals and one with the regex."""
    from kwdiag.readers import scan as scanner

    monkeypatch.setattr(scanner, "GREP_MIN", 0)
    with_grep, with_regex = [], []
    a = scanner.scan(str(path), RULES.prefilter, lambda *x: with_grep.append(x), RULES.anchors)
    b = scanner.scan(str(path), RULES.prefilter, lambda *x: with_regex.append(x), None)
    return (with_grep, (a.lines, a.bytes, a.long_lines, a.first_long_line)), \
        (with_regex, (b.lines, b.bytes, b.long_lines, b.first_long_line))


@pytest.mark.skipif(not _gnu_grep_here(), reason="no GNU grep on this machine (the regex scan is then the only one)")
def test_grep_finds_the_same_candidate_lines_as_the_regex_on_every_sample_and_corpus_log(monkeypatch):
    logs = [p for p in sorted(SAMPLES.rglob("*.log")) if p.stat().st_size and b"\0" not in p.read_bytes()[:65536]]
    assert len(logs) > 300
    found = 0
    for path in logs:
        grep_way, regex_way = _both_ways(path, monkeypatch)
        assert grep_way == regex_way, path
        found += len(grep_way[0])
    assert found > 1000


@pytest.mark.skipif(not _gnu_grep_here(), reason="no GNU grep on this machine (the regex scan is then the only one)")
def test_grep_and_the_regex_agree_on_awkward_bytes_long_lines_and_block_edges(tmp_path, monkeypatch):
    from kwdiag.readers.scan import BLOCK, MAX_LINE

    hit = SIGKILL_W1.read_bytes().splitlines(keepends=True)
    death = next(x for x in hit if b"killed by signal 9" in x)
    p = tmp_path / "awkward.log"
    with open(p, "wb") as f:
        f.write(b"caf\xc3\xa9 \xff\xfe not utf-8\r\n" + death.replace(b"\n", b"\r\n"))
        f.write(b"y" * (BLOCK - 40 - f.tell()) + b"\n")
        f.write(death)                                          # across the first block's end
        f.write(b"z" * (MAX_LINE + 10) + death.rstrip(b"\n"))  # a literal in the unread part of a long line
        f.write(b"\n" + death + b"x" * (3 * MAX_LINE) + b"\n")  # a long line right after a hit
        f.write(b"tail " + death.rstrip(b"\n"))                 # a last line without its newline
    grep_way, regex_way = _both_ways(p, monkeypatch)
    assert grep_way == regex_way
    assert len(grep_way[0]) == 5 and grep_way[1][2] == 3        # five candidate lines; three lines over MAX_LINE


def test_the_folded_scan_and_the_regex_agree_through_blocks_long_lines_and_awkward_bytes(tmp_path, monkeypatch):
    """The whole scan (blocks, a line cut by a block's end, lines over MAX_LINE, a last line without its newline,
    invalid UTF-8, CRLF) read folded and by the regex: the same candidate lines and counts, on the awkward file of
    the test above and on every sample and corpus log."""
    from kwdiag.readers import scan as scanner

    monkeypatch.setattr(scanner, "GREP_MIN", 1 << 62)
    monkeypatch.setattr(scanner, "FOLD_MIN", 0)
    hit = SIGKILL_W1.read_bytes().splitlines(keepends=True)
    death = next(x for x in hit if b"killed by signal 9" in x)
    awkward = tmp_path / "awkward.log"
    with open(awkward, "wb") as f:
        f.write(b"caf\xc3\xa9 \xff\xfe not utf-8\r\n" + death.replace(b"\n", b"\r\n"))
        f.write(b"y" * (scanner.BLOCK - 40 - f.tell()) + b"\n")
        f.write(death)
        f.write(b"z" * (scanner.MAX_LINE + 10) + death.rstrip(b"\n"))
        f.write(b"\n" + death + b"x" * (3 * scanner.MAX_LINE) + b"\n")
        f.write(b"tail " + death.rstrip(b"\n"))
    logs = [awkward] + [p for p in sorted(SAMPLES.rglob("*.log")) if p.stat().st_size
                        and b"\0" not in p.read_bytes()[:65536]]
    found = {}
    for path in logs:
        folded, plain = [], []
        a = scanner.scan(str(path), RULES.prefilter, lambda *x: folded.append(x), RULES.anchors)
        b = scanner.scan(str(path), RULES.prefilter, lambda *x: plain.append(x), None)
        assert (folded, a.lines, a.long_lines) == (plain, b.lines, b.long_lines), path
        found[path] = len(plain)
    assert found[awkward] == 5 and sum(found.values()) > 10_000


def test_without_grep_a_large_file_is_still_read(tmp_path, monkeypatch):
    """KWDIAG_NO_GREP (or no GNU grep): the regex scan reads it, with the same answer."""
    from kwdiag.readers import scan as scanner

    monkeypatch.setattr(scanner, "GREP_MIN", 0)
    monkeypatch.setenv("KWDIAG_NO_GREP", "1")
    from kwdiag.readers.grepfind import grep_offsets

    assert grep_offsets(str(SIGKILL_W1), RULES.anchors) is None
    r = _sigkill_report([SIGKILL_W1])
    assert_deaths(r.deaths, CLEAN)


# ---------------------------------------------------------------- JSON log records (python-json-logger and kin)
JSON_SAMPLE = Path(__file__).resolve().parent.parent / "sample_logs" / "dask-json-logging"


def _deaths_and_errors(folder) -> tuple[list, int]:
    report = analyze([str(folder)], rules=load_rules())
    return sorted((d.worker, d.incarnation, d.cause, d.detail) for d in report.deaths), len(report.task_errors)


@pytest.mark.parametrize("shape", ["reversed-fields", "ecs-names", "epoch-created"])
def test_json_log_records_mean_the_same_whatever_their_fields(tmp_path, shape):
    """The real JSON logs of sample_logs/dask-json-logging (Dask's logging config with python-json-logger), with
    each record's fields in reverse order, or under the names ECS shippers use (``@timestamp``, ``log.level``,
    ``log.logger``), or with the time as epoch seconds: the same deaths and task errors as the logs as written."""
    import calendar
    import time as time_module

    want = _deaths_and_errors(JSON_SAMPLE)
    assert want[0] and want[1] == 1, want  # the sample itself: a SIGKILL, two shutdowns, one task error
    for log in JSON_SAMPLE.glob("*.log"):
        out = []
        for line in log.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                out.append(line)   # a line a process printed without the formatter (a traceback, a print)
                continue
            if shape == "reversed-fields":
                record = dict(reversed(list(record.items())))
            elif shape == "ecs-names":
                record = {"@timestamp": record["asctime"].replace(" ", "T").replace(",", "."),
                          "log": {"level": record["levelname"].lower(), "logger": record["name"]},
                          "message": record["message"]}
            else:
                stamp, ms = record.pop("asctime").split(",")
                record["created"] = calendar.timegm(time_module.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000
            out.append(json.dumps(record))
        (tmp_path / log.name).write_text("\n".join(out) + "\n")
    assert _deaths_and_errors(tmp_path) == want


# ---------------------------------------------------------------- collectors' prefixes
@pytest.mark.parametrize("line,who,ts", [
    ("worker-1    | 2026-11-26 22:57:49,916 - distributed.worker - INFO - x", "worker-1", None),
    ("[pod/dask-worker-2-5c7d9f8b6-x2k4q/worker] 2026-11-26T22:57:26.739800214Z 2026-11-26 22:57:26,739 - "
     "distributed.worker - INFO - y", "pod/dask-worker-2-5c7d9f8b6-x2k4q/worker", None),
    ("2026-11-26T22:57:49+0000 node-1 dask[21384]: Fatal Python error: Segmentation fault", "node-1 dask[21384]",
     1795733869.0),
    ("2026-11-26T23:57:49.250000+01:00 node-1 dask[7]: 2026-11-26 22:57:49,916 - distributed.nanny - INFO - z",
     "node-1 dask[7]", 1795733869.25),
    ("2026-11-26 22:57:49,916 - distributed.worker - INFO - no collector", None, None),
])
def test_a_collectors_prefix_names_the_process(line, who, ts):
    from kwdiag.readers.shapes import unwrap_from

    text, got_ts, got_who = unwrap_from(line)
    assert got_who == who and got_ts == ts
    assert not text.startswith(("worker-1", "[pod/", "2026-11-26T"))


def test_dasks_plain_layout_skips_the_wrappers_with_the_same_answer():
    """A line in Dask's default layout is returned as it is without trying each collector's wrapper (most lines
    of a saved log): the answer must be the one trying them gives, on every real line of the samples and the
    corpus (and the fast path must be taken for most of them, or it spares nothing)."""
    from kwdiag.readers.shapes import _PLAIN_DASK, _unwrapped, unwrap_from

    plain = 0
    for path in sorted(SAMPLES.rglob("*.log")) + sorted(SAMPLES.rglob("*.txt")):
        for line in path.read_text(errors="replace").splitlines():
            assert unwrap_from(line) == _unwrapped(line), (path, line)
            plain += bool(_PLAIN_DASK.match(line))
    assert plain > 20_000


def test_a_start_that_fails_after_the_nanny_restarts_is_the_next_process(tmp_path):
    """A nanny (distributed 2.x) whose worker failed to start, restarted it, and saw the new process fail too:
    two processes, each a start failure, from lines that name neither (Dask 2.30.1's own wording, as the
    corpus's preload case printed it). The second failure after 'Restarting worker' is not the first's."""
    failed = ("distributed.nanny - ERROR - Failed while trying to start worker process: "
              "preload dask_setup failed on purpose")
    (tmp_path / "nanny.log").write_text("\n".join([
        failed, "distributed.nanny - WARNING - Restarting worker", failed]) + "\n")
    assert_deaths(analyze([str(tmp_path / "nanny.log")]).deaths, [
        (ANY, 1, "unrecoverable_exception", "startup_failure"), (ANY, 2, "unrecoverable_exception", "startup_failure")])


# ---------------------------------------------------------------- the lines before a removal
def test_the_connection_lines_before_a_removal_are_read_however_the_file_is_scanned(tmp_path, monkeypatch):
    """The prefilter does not look for the scheduler's connection lines (a long-running scheduler prints millions);
    the reader reads the NEAR_REMOVAL lines before each removal instead, each line once. That must give the same
    events whichever way the file is scanned: a block boundary anywhere (the line before a removal at the end of
    the block before), GNU grep finding the candidates, a parallel scan whose range starts anywhere. A real
    retirement log (two connection lines, each right before a removal), three times over."""
    from kwdiag.kinds import CONNECTION, NEAR_REMOVAL
    from kwdiag.readers import scan as scanner
    from kwdiag.readers.text import read_events

    case = SAMPLES / "corpus/cases/2026.8.0/047-retire-cli-nonanny-random-mid/scheduler.log"
    lines = case.read_text().splitlines() * 3
    path = tmp_path / "scheduler.log"
    path.write_text("\n".join(lines) + "\n")
    # what the spec says is read: a connection line at most NEAR_REMOVAL lines before a removal, not read already
    removals = [n for n, line in enumerate(lines, 1) if "Remove worker" in line]
    want, done = [], 0
    for r in removals:
        want += [n for n in range(max(done + 1, r - NEAR_REMOVAL), r)
                 if "has been closed." in lines[n - 1] or "'close-stream'" in lines[n - 1]]
        done = r
    assert len(want) == 6 and len(removals) == 9

    def connection_lines() -> list[int]:
        events, _, problems = read_events([str(path)], RULES)
        assert problems == []
        return sorted(e.origin.line for e in events if e.kind in CONNECTION)

    assert connection_lines() == want
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    for n in range(2, 36):   # a block ending after each line of the first copy
        monkeypatch.setattr(scanner, "BLOCK", starts[n - 1])
        assert connection_lines() == want, n
    monkeypatch.undo()
    if _gnu_grep_here():
        monkeypatch.setattr(scanner, "GREP_MIN", 0)
        assert connection_lines() == want
        monkeypatch.undo()
    monkeypatch.setenv("KWDIAG_NO_GREP", "1")
    monkeypatch.setenv("KWDIAG_JOBS", "2")
    monkeypatch.setattr(scanner, "PARALLEL_MIN", 1)
    for n in sorted({r - d for r in removals[:3] for d in range(NEAR_REMOVAL + 1)}):   # ranges cut near a removal
        monkeypatch.setattr(scanner, "_boundaries", lambda path, size, jobs, cut=starts[n - 1]: [0, cut, size])
        assert connection_lines() == want, n


def test_the_lines_before_a_removal_are_read_past_a_long_line_and_numbered_right(tmp_path, monkeypatch):
    """A line longer than the scanner keeps (MAX_LINE) between a connection line and the removal: the lines
    before the removal are still found, whether the long line crosses a block end or not, and in a parallel scan
    whose range starts at the removal; every line keeps its number (a long line that began inside a block and
    crossed its end was once counted twice). Small blocks and MAX_LINE stand in for 4 MiB and 1 MiB; the long
    line is a real line's text repeated."""
    from kwdiag.kinds import CONNECTION
    from kwdiag.readers import scan as scanner
    from kwdiag.readers.text import read_events

    case = SAMPLES / "corpus/cases/2026.8.0/047-retire-cli-nonanny-random-mid/scheduler.log"
    real = case.read_text().splitlines()
    long_line = real[0] * 40   # ~4 KB
    lines = []
    for line in real * 2:
        if "Remove worker" in line and lines and "has been closed." in lines[-1]:
            lines.append(long_line)
        lines.append(line)
    path = tmp_path / "scheduler.log"
    path.write_text("\n".join(lines) + "\n")
    removals = [n for n, line in enumerate(lines, 1) if "Remove worker" in line]
    want_connections = [n for n, line in enumerate(lines, 1) if "has been closed." in line
                        and any(0 < r - n <= 3 for r in removals)]
    assert len(want_connections) == 4

    def seen() -> tuple[list[int], list[int]]:
        events, _, _ = read_events([str(path)], RULES)
        return (sorted(e.origin.line for e in events if e.kind in CONNECTION),
                sorted(e.origin.line for e in events if e.kind == "worker-removed"))

    assert seen() == (want_connections, removals)
    monkeypatch.setattr(scanner, "MAX_LINE", 1024)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    long_at = [n for n, line in enumerate(lines, 1) if line == long_line]
    for n in long_at:   # blocks ending inside the long line, at its start, and just after it
        for block in (starts[n - 1] + 700, starts[n - 1] - 300, starts[n - 1], starts[n] + 10):
            monkeypatch.setattr(scanner, "BLOCK", block)
            assert seen() == (want_connections, removals), (n, block)
    monkeypatch.setattr(scanner, "BLOCK", 4 << 20)
    monkeypatch.setenv("KWDIAG_NO_GREP", "1")
    monkeypatch.setenv("KWDIAG_JOBS", "2")
    monkeypatch.setattr(scanner, "PARALLEL_MIN", 1)
    monkeypatch.setattr(scanner, "SEED", 512)   # the seed must reach back past the long line
    for n in long_at:
        monkeypatch.setattr(scanner, "_boundaries", lambda path, size, jobs, cut=starts[n]: [0, cut, size])
        assert seen() == (want_connections, removals), n


def test_a_log_stored_inside_a_json_string_reads_as_the_log(tmp_path):
    """A platform that stores a container's output as a JSON string's content ({"error": "..."}) pastes with
    every quote escaped: a traceback frame reads 'File \\"/.../dask/cli.py\\", line 209, in run_cli'. The
    prefilter reads raw bytes, so it must look for a keyword's escaped quotes too; the deaths are those of the
    log itself (a real worker log whose start failed on a missing preload module)."""
    log = SAMPLES / "corpus/cases/2026.8.0/026-nopreload-cli-nn-fixed-start/w1.log"
    (tmp_path / "plain").mkdir()
    (tmp_path / "escaped").mkdir()
    (tmp_path / "plain" / "w1.log").write_text(log.read_text())
    (tmp_path / "escaped" / "w1.log").write_text(log.read_text().replace('"', '\\"'))
    plain = [(d.cause, d.detail, d.rules) for d in analyze([str(tmp_path / "plain")], rules=RULES).deaths]
    assert plain and plain[0][:2] == ("unrecoverable_exception", "missing_module")
    assert [(d.cause, d.detail, d.rules) for d in analyze([str(tmp_path / "escaped")], rules=RULES).deaths] == plain


# ---------------------------------------------------------------- printed Python values (a notebook's output)
NOTEBOOK_SAMPLE = Path(__file__).resolve().parent.parent / "sample_logs" / "dask-notebook-logs" / "pprint_worker_logs.txt"


def test_a_pretty_printed_value_gives_back_its_log_lines_whole_and_where_they_start():
    """pprint cuts each long string into adjacent literals over several lines: joined again, each log line is the
    string Dask returned, at the line its first literal is on; the level strings of the tuples are not lines."""
    import ast

    from kwdiag.readers import pyrepr

    text = NOTEBOOK_SAMPLE.read_text()
    value = ast.literal_eval(text)
    held = pyrepr.log_lines(text)
    assert [v.text for v in held] == [msg for lines in value.values() for _, msg in lines]
    assert {v.key for v in held} == set(value)
    physical = text.splitlines()
    assert all(v.text[:23] in physical[v.lineno - 1] for v in held)   # its time stamp opens that line's literal


def test_a_printed_value_cut_anywhere_keeps_the_lines_before_the_cut():
    from kwdiag.readers import pyrepr

    text = NOTEBOOK_SAMPLE.read_text()
    whole = [v.text for v in pyrepr.log_lines(text)]
    for cut in range(0, len(text), 97):
        part = pyrepr.log_lines(text[:cut]) or []
        texts = [v.text for v in part]
        # every line but the last (its literal may be cut) is one of the whole value's, in order
        assert texts[:-1] == whole[: max(0, len(texts) - 1)], cut


def test_a_printed_value_after_the_words_or_the_code_that_printed_it_is_read(tmp_path):
    """What users paste around the value: a sentence of theirs, the notebook cell's "In [N]:" line, the value, and
    the next cells (the same call run again: its nannies' lines are the same lines, counted once). The same four
    deaths as the value alone, each evidence line the paste's line its literal starts on."""
    from kwdiag.pipeline import analyze

    text = NOTEBOOK_SAMPLE.read_text()
    alone = sorted((d.worker, d.cause, d.detail) for d in analyze([str(NOTEBOOK_SAMPLE)], rules=RULES).deaths)
    assert len(alone) == 4
    lead = "Here is what the workers logged before the job failed:\n\nIn [12]: pprint(client.get_worker_logs(nanny=True))\n"
    again = "\nIn [13]: len(client.scheduler_info()['workers'])\nOut[13]: 2\n\nIn [14]: client.get_worker_logs(nanny=True)\n"
    for paste in (lead + text, lead + text + again + "Out[14]: \n" + text):
        (tmp_path / "paste.txt").write_text(paste)
        deaths = analyze([str(tmp_path / "paste.txt")], rules=RULES).deaths
        assert sorted((d.worker, d.cause, d.detail) for d in deaths) == alone
        physical = paste.splitlines()
        for e in (e for d in deaths for e in d.evidence):
            assert e.text[:40].strip("'") in physical[e.line - 1], (e.line, e.text)


def test_what_is_not_a_printed_value_is_read_as_before():
    from kwdiag.readers import pyrepr

    json_line = '{"asctime": "2026-11-21 10:00:00,000", "name": "distributed.nanny", "levelname": "INFO", "message": "x"}'
    bracketed = "[2026-11-27 10:00:00,000] distributed.nanny - INFO - Worker process 7 was killed by signal 9"
    assert not pyrepr.looks_like_value(json_line + "\n")
    assert not pyrepr.looks_like_value(bracketed + "\n")
    assert pyrepr.log_lines("[1, 2, 'three']\n") is None
    assert pyrepr.log_lines("{'a': 'b'}") is None


def test_printed_values_in_pastes_and_what_only_looks_like_one(tmp_path):
    """A deep '[' is not a crash; kubectl --prefix logs are not taken for a value; a value in a markdown fence or
    after IPython's Out[N]: is read; two processes' identical stamped lines under their own keys stay two (real
    lines of two `dask worker` logs of one corpus run, as get_worker_logs(n=3) returns them)."""
    import pprint
    import re as _re

    from kwdiag.pipeline import analyze
    from kwdiag.readers import pyrepr

    pyrepr.looks_like_value("[" * 5000 + "\n")   # no RecursionError
    kube = Path(__file__).resolve().parent.parent / "sample_logs/corpus/cases/2.30.1/096-segv-cli-nn-random-mid-kubectl/w2.log"
    assert not pyrepr.looks_like_value(kube.read_text()[:4096])
    text = NOTEBOOK_SAMPLE.read_text()
    for wrapped in ("```python\n" + text + "```\n", "Out[5]: \n" + text):
        (tmp_path / "v.txt").write_text(wrapped)
        assert len(analyze([str(tmp_path / "v.txt")], rules=RULES).deaths) == 4
    case = Path(__file__).resolve().parent.parent / "sample_logs/corpus/cases/2025.9.1/069-killedworker-cli-nn-random-mid"
    value = {}
    for f in ("w0.log", "w2.log"):
        lines = [x for x in (case / f).read_text().splitlines() if "distributed.nanny" in x]
        value[_re.search(r"Start Nanny at: '([^']+)'", lines[0]).group(1)] = tuple(
            (_re.search(r" - ([A-Z]+) - ", x).group(1), x) for x in reversed(lines))[:3]
    (tmp_path / "kill.txt").write_text(pprint.pformat(value) + "\n")
    assert sorted((d.cause, d.detail) for d in analyze([str(tmp_path / "kill.txt")], rules=RULES).deaths) == \
        [("unknown", "close_timeout")] * 2


MIXED_SAMPLES = [Path(__file__).resolve().parent.parent / "sample_logs" / d / "cell_output.txt"
                 for d in ("dask-notebook-mixed", "dask-notebook-mixed-pprint")]


@pytest.mark.parametrize("cell", MIXED_SAMPLES, ids=["print", "pprint"])
def test_a_cells_output_of_log_lines_and_a_printed_value_reads_each_as_what_it_is(cell, tmp_path):
    """A notebook cell's real output (``make.py`` of dask-notebook-mixed): the cluster's stderr lines, then the
    printed ``get_worker_logs()``. The value is read as a value (its lines had been read one by one: their
    literals made up deaths), the stderr lines as lines, and a stderr line the value holds too once; the cell's
    lines may come after the value too (the next cell's), and the same deaths come out with one line more after."""
    from kwdiag.pipeline import analyze
    from kwdiag.readers import pyrepr
    from kwdiag.readers.text import read_events

    text = cell.read_text()
    spans = pyrepr.values_among_lines(text)
    assert [s.first for s in spans] == [next(i for i, x in enumerate(text.splitlines(), 1) if x.startswith("{"))]
    events, _, _ = read_events([str(cell)], RULES)
    restarts = [e for e in events if e.kind == "worker-restarting"]
    assert len(restarts) == 4 == len({e.ts for e in restarts})   # the 4 stderr lines are the value's 4 lines
    want = sorted(("sudden_exit", "sigkill", f"process {p}") for p in set(re.findall(r"Worker process (\d+) was", text)))
    assert len(want) == 4
    got = sorted((d.cause, d.detail, d.worker) for d in analyze([str(cell)], rules=RULES).deaths)
    assert got == want
    # the next cell's stderr: a line read after the value (a real line of another run's nanny, another process);
    # before it all, what the cell printed first (a list that only looks like a value of log lines)
    later = next(x for x in (SAMPLES / "dask-sigkill" / "w1.log").read_text().splitlines() if "killed by signal" in x)
    (tmp_path / "cell.txt").write_text("['die-1', 'die-2']\n(1, 'x')\n" + text + "\n" + later + "\n")
    deaths = analyze([str(tmp_path / "cell.txt")], rules=RULES).deaths
    assert sorted((d.cause, d.detail, d.worker) for d in deaths) == sorted(got + [("sudden_exit", "sigkill", "process 3536")])
    physical = (tmp_path / "cell.txt").read_text().splitlines()
    last = next(d for d in deaths if d.worker == "process 3536").evidence
    assert [e.line for e in last] == [len(physical)]
    for e in (e for d in deaths for e in d.evidence):   # every evidence line is the text's line its literal starts on
        assert e.text[:23] in physical[e.line - 1], (e.line, e.text)


def test_a_log_whose_lines_only_look_like_values_is_read_line_by_line_and_not_tokenized():
    """Bracketed time stamps, kwdiag's JSON events, JSON logging records and a dict printed by a task: none holds a
    log line in a literal; the check that looks for values costs a few finds over bytes."""
    from kwdiag.readers import pyrepr

    bracketed = "[2026-11-27 10:00:00,000] distributed.nanny - INFO - Worker process 7 was killed by signal 9\n" * 1000
    assert pyrepr.values_among_lines(bracketed) is None
    assert not pyrepr.may_hold_values(bracketed.encode())
    jsonl = (SAMPLES / "kwdiag-graceful" / "scheduler.jsonl").read_bytes()
    assert b'"20' in jsonl and not pyrepr.may_hold_values(jsonl)
    record = '{"asctime": "2026-11-21 10:00:00,000", "name": "distributed.nanny", "message": "x"}\n'
    assert pyrepr.values_among_lines("2026-11-21 10:00:00,000 - distributed.nanny - INFO - x\n" + record) is None
    assert pyrepr.values_among_lines("{'rows': 3, 'when': '2026-11-21 10:00'}\n") is None


NOTEBOOK_IPYNB = Path(__file__).resolve().parent.parent / "sample_logs" / "dask-notebook-ipynb" / "executed.ipynb"


def test_a_jupyter_notebook_is_read_as_its_cells_outputs_each_line_shown_where_the_file_holds_it():
    """A real notebook executed by a Jupyter kernel (``make.py`` of dask-notebook-ipynb): the cells' stderr (the
    nannies' WARNING lines), the KilledWorker error and IPython's repr of ``get_worker_logs()``. Each output line
    maps to the ``.ipynb`` line holding it as a JSON string; a stderr line the value holds too is read once, and
    still dates the KilledWorker traceback after it (was: 13 deaths, 9 of them made up, read as a JSON file)."""
    from kwdiag.readers import notebook
    from kwdiag.readers.text import read_events

    data = NOTEBOOK_IPYNB.read_bytes()
    text, where = notebook.notebook_text(data)
    physical = data.decode().splitlines()
    assert len(text.splitlines()) == len(where)
    for line, at in zip(text.splitlines(), where):
        if line.strip():
            stored = re.sub(r"\x1b\[[0-9;]*m", "", json.loads(physical[at - 1].strip().rstrip(",")))
            assert line[:30] in stored, (line, at)
    events, _, _ = read_events([str(NOTEBOOK_IPYNB)], RULES)
    assert len([e for e in events if e.kind == "worker-restarting"]) == 4
    killed = [e for e in events if e.kind == "killed-worker"]
    assert len(killed) == 1 and not killed[0].get("ts_unknown") and killed[0].get("deaths") == 4
    assert notebook.notebook_text(b'{"cells": 5}') is None and notebook.notebook_text(b"{not json") is None


def test_a_cells_value_shown_again_leading_empty_entries_and_a_dump_after_it(tmp_path):
    """Three shapes a review found misread, all from real lines: the cell's value printed and then shown again as
    ``Out[N]:`` (the second holds no new line, and is still a value, not log lines); a pretty-printed value whose first
    keys hold no line (healthy workers' empty tuples at WARNING level: its first log line is many lines down); and a
    worker's faulthandler dump after the cell's output (the dump is found at the file's own line)."""
    import ast
    import pprint

    from kwdiag.pipeline import analyze

    def deaths(text: str) -> list:
        (tmp_path / "cell.txt").write_text(text)
        return sorted((d.cause, d.detail, d.worker) for d in analyze([str(tmp_path / "cell.txt")], rules=RULES).deaths)

    cell = MIXED_SAMPLES[0].read_text()
    value = next(x for x in cell.splitlines() if x.startswith("{"))
    assert deaths(cell + "Out[4]: " + value + "\n") == deaths(cell)
    pretty = MIXED_SAMPLES[1].read_text()
    assert deaths(pretty + pretty[pretty.index("{"):]) == deaths(pretty)

    logs = ast.literal_eval(NOTEBOOK_SAMPLE.read_text())
    padded = {f"tcp://10.0.0.{i}:4000": () for i in range(6)} | logs
    assert deaths(pprint.pformat(padded) + "\n") == deaths(NOTEBOOK_SAMPLE.read_text())
    stderr = next(msg for lines in logs.values() for _, msg in lines if "Restarting worker" in msg)   # its own stderr
    assert deaths(stderr + "\n" + pprint.pformat(padded) + "\n") == deaths(NOTEBOOK_SAMPLE.read_text())

    w1 = (SAMPLES / "dask-segfault" / "w1.log").read_text()
    alone = [d for d in analyze([str(SAMPLES / "dask-segfault" / "w1.log")], rules=RULES).deaths if d.stack]
    (tmp_path / "after.txt").write_text(pretty + w1)
    after = [d for d in analyze([str(tmp_path / "after.txt")], rules=RULES).deaths if d.detail == "segfault"]
    assert alone and after and len(after[0].stack) == len(alone[0].stack) > 0


def test_a_notebook_a_printed_value_and_a_cells_output_read_the_same_gzipped(tmp_path):
    """A notebook, ``get_worker_logs()`` printed, and a cell's output with the value among the cluster's lines, each
    saved compressed (a name without ``.gz``: gzip is known by its first bytes): the same deaths and evidence lines
    as the files themselves. A gzipped log that holds no value is still scanned as a log."""
    import gzip

    from kwdiag.pipeline import analyze

    def read(path: Path) -> list:
        report = analyze([str(path)], rules=RULES)
        return sorted((d.worker, d.cause, d.detail, tuple(e.line for e in d.evidence)) for d in report.deaths)

    for plain in (NOTEBOOK_IPYNB, NOTEBOOK_SAMPLE, *MIXED_SAMPLES, SIGKILL_W1):
        packed = tmp_path / (plain.parent.name + "-" + plain.stem)
        packed.write_bytes(gzip.compress(plain.read_bytes()))
        want = read(plain)
        assert want and read(packed) == want, plain
