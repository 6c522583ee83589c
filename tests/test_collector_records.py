"""Logs stored by collectors that keep each raw line in a JSON record: Docker's json-file driver, Fluent Bit's
Kubernetes records, ``journalctl -o json``, Loki's ``logcli --output=jsonl`` and Google Cloud Logging; and
``kubectl logs --timestamps --prefix``, whose stamp stands before every line, a traceback's too.

Each test wraps the real lines of a sample scenario (Dask 2026.8, one file per process) the way the collector
stores them (the envelope is the collector's documented record; the lines inside are Dask's, byte for byte) and
asks for the same deaths as the files themselves give. The corpus holds real runs of two of these collectors
(``docker_json``, and ``journald_json`` from a real systemd-journald): ``tests/test_corpus.py``.
"""

from __future__ import annotations

import calendar
import json
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze
from kwdiag.readers import jsonlog

ROOT = Path(__file__).resolve().parent.parent
RULES = load_rules()
SCENARIOS = ["dask-sigkill", "dask-segfault", "dask-memory", "dask-exit", "dask-retire", "dask-killedworker",
             "dask-fail-hard"]
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d),(\d{3})")


def _lines(scenario: str) -> list[tuple[str, float, str]]:
    """(process, time, line) of every line of the scenario's process logs; a line without Dask's stamp (a
    traceback's) takes the time of the line before it, as a collector's arrival time would be (the scenario's first
    time in a file with no stamp at all: a client's traceback)."""
    paths = sorted((ROOT / "sample_logs" / scenario).glob("*.log"))
    stamps = [STAMP.match(x) for p in paths for x in p.read_text().splitlines()]
    start = min(time.mktime(time.strptime(f"{m[1]} {m[2]}", "%Y-%m-%d %H:%M:%S")) for m in stamps if m)
    out = []
    for path in paths:
        last = start
        for line in path.read_text().splitlines():
            m = STAMP.match(line)
            if m:
                last = time.mktime(time.strptime(f"{m[1]} {m[2]}", "%Y-%m-%d %H:%M:%S")) + int(m[3]) / 1000
            out.append((path.stem, last, line))
    return out


def _rfc3339(ts: float, digits: int = 9) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(round(ts % 1 * 1e6)) * 1000:09d}"[
        :digits + 1] + "Z"


def _merged(scenario: str) -> list[tuple[str, float, str]]:
    """Every process's lines in one stream, in time order (a collector's arrival order)."""
    return sorted(_lines(scenario), key=lambda x: x[1])


def _docker(scenario, tmp):
    for proc in {p for p, _, _ in _lines(scenario)}:
        with open(tmp / f"{proc}-json.log", "w") as f:
            for p, ts, line in _lines(scenario):
                if p == proc:
                    f.write(json.dumps({"log": line + "\n", "stream": "stderr", "time": _rfc3339(ts)},
                                       separators=(",", ":")) + "\n")


def _fluent_bit(scenario, tmp):
    with open(tmp / "fluent-bit.jsonl", "w") as f:
        for p, ts, line in _merged(scenario):
            f.write(json.dumps({"date": ts, "log": line + "\n", "stream": "stderr", "time": _rfc3339(ts),
                                "kubernetes": {"pod_name": f"dask-{p}-7f9c6d5b4-q2x8k", "namespace_name": "dask",
                                               "container_name": p}}) + "\n")


def _journal(scenario, tmp):
    pids = {}
    with open(tmp / "journal.json", "w") as f:
        for p, ts, line in _merged(scenario):
            pid = pids.setdefault(p, 4100 + len(pids))
            f.write(json.dumps({"__CURSOR": f"s=1;i={len(pids)}", "__REALTIME_TIMESTAMP": str(int(ts * 1e6)),
                                "__MONOTONIC_TIMESTAMP": "20019579046", "_HOSTNAME": "node-1", "PRIORITY": "6",
                                "SYSLOG_IDENTIFIER": "dask-scheduler" if p == "scheduler" else "dask-worker",
                                "MESSAGE": line, "_PID": str(pid), "_TRANSPORT": "stdout", "_COMM": "dask"}) + "\n")


def _loki(scenario, tmp):
    with open(tmp / "loki.jsonl", "w") as f:
        for p, ts, line in _merged(scenario):
            f.write(json.dumps({"labels": {"filename": f"/var/log/dask/{p}.log", "job": "dask"}, "line": line,
                                "timestamp": _rfc3339(ts)}) + "\n")


def _gcp(scenario, tmp):
    with open(tmp / "gcp.jsonl", "w") as f:
        for p, ts, line in _merged(scenario):
            f.write(json.dumps({"insertId": "x", "resource": {"type": "k8s_container", "labels": {
                "pod_name": f"dask-{p}-0", "container_name": "dask", "namespace_name": "dask"}},
                "textPayload": line, "timestamp": _rfc3339(ts, 6), "severity": "ERROR"}) + "\n")


def _kubectl(scenario, tmp):
    """Not JSON: ``kubectl logs --timestamps --prefix``, whose stamp stands before a traceback's lines too."""
    for proc in {p for p, _, _ in _lines(scenario)}:
        with open(tmp / f"{proc}.log", "w") as f:
            for p, ts, line in _lines(scenario):
                if p == proc:
                    f.write(f"[pod/dask-{p}-0/dask] {_rfc3339(ts)} {line}\n")


def _gcloud(scenario, tmp):
    """``gcloud logging read --format=json``: one pretty-printed list, the newest entry first."""
    entries = [{"insertId": f"id{i}", "resource": {"type": "k8s_container", "labels": {
        "pod_name": f"dask-{p}-0", "container_name": "dask"}}, "textPayload": line, "timestamp": _rfc3339(ts, 6)}
        for i, (p, ts, line) in enumerate(_merged(scenario))]
    (tmp / "gcloud.json").write_text(json.dumps(entries[::-1], indent=2) + "\n")


def _cloudwatch(scenario, tmp):
    """``aws logs get-log-events`` of each process's log stream: ``events`` with millisecond times."""
    for proc in {p for p, _, _ in _lines(scenario)}:
        events = [{"timestamp": int(ts * 1000), "message": line, "ingestionTime": int(ts * 1000) + 250}
                  for p, ts, line in _lines(scenario) if p == proc]
        (tmp / f"{proc}.json").write_text(json.dumps({"events": events, "nextForwardToken": "f/3",
                                                      "nextBackwardToken": "b/1"}, indent=4) + "\n")


COLLECTORS = {"kubectl --timestamps --prefix": _kubectl, "docker json-file": _docker, "fluent-bit kubernetes": _fluent_bit, "journalctl -o json": _journal,
              "loki logcli jsonl": _loki, "google cloud logging": _gcp, "gcloud logging read --format=json": _gcloud,
              "aws logs get-log-events": _cloudwatch}


def _deaths(paths) -> Counter:
    return Counter((d.cause, d.detail) for d in analyze([str(p) for p in paths], rules=RULES).deaths)


@pytest.mark.parametrize("collector", list(COLLECTORS))
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lines_a_collector_kept_in_json_records_give_the_deaths_of_the_files(scenario, collector, tmp_path):
    files = sorted((ROOT / "sample_logs" / scenario).glob("*.log"))
    want = _deaths(files)
    assert want, scenario
    COLLECTORS[collector](scenario, tmp_path)
    report = analyze([str(p) for p in tmp_path.iterdir()], rules=RULES)
    assert Counter((d.cause, d.detail) for d in report.deaths) == want
    # the evidence is the line the process printed, not the record around it
    for d in report.deaths:
        for ev in d.evidence:
            assert not ev.text.lstrip().startswith("{") and '"log":' not in ev.text, ev.text


def test_a_merged_export_tells_the_processes_apart_by_what_the_collector_names():
    """One journal export of the scheduler and two workers, each worker SIGKILLed at once by the same kind of line:
    the journal's pid (and a pod's name, a Loki file label) says which process said which line."""
    micros = calendar.timegm((2026, 11, 21, 10, 56, 57)) * 10**6 + 911000
    rec = {"MESSAGE": "2026-11-21 10:56:57,911 - distributed.nanny - INFO - Worker process 3536 was killed by signal 9",
           "__REALTIME_TIMESTAMP": str(micros), "_PID": "4242", "SYSLOG_IDENTIFIER": "dask-worker",
           "_HOSTNAME": "node-1"}
    assert jsonlog.text_lines(rec) == ["2026-11-21T10:56:57.911000+0000 node-1 dask-worker[4242]: 2026-11-21 "
                                       "10:56:57,911 - distributed.nanny - INFO - Worker process 3536 was killed by "
                                       "signal 9"]
    # journald names a nanny's worker process by its own pid; the stdout stream it inherited is its command's
    nanny, worker = dict(rec, _STREAM_ID="9b0b918b5e2a"), dict(rec, _PID="4250", _STREAM_ID="9b0b918b5e2a")
    assert jsonlog.text_lines(nanny)[0].split(": ", 1)[0] == jsonlog.text_lines(worker)[0].split(": ", 1)[0] == \
        "2026-11-21T10:56:57.911000+0000 node-1 dask-worker@9b0b918b5e2a"
    pod = {"log": "x\n", "time": "2026-11-21T10:56:57.911Z", "kubernetes": {"pod_name": "dask-w-0",
                                                                          "container_name": "worker"}}
    assert jsonlog.text_lines(pod) == ["[pod/dask-w-0/worker] 2026-11-21T10:56:57.911Z x"]
    loki = {"labels": {"filename": "/var/log/dask/w1.log", "job": "dask"}, "line": "x", "timestamp": "2026-11-21T10:56:57Z"}
    assert jsonlog.text_lines(loki) == ["w1.log | 2026-11-21T10:56:57Z x"]
    assert jsonlog.text_lines(dict(loki, labels={"instance": "10.0.0.7:8786"})) == ["10.0.0.7-8786 | 2026-11-21T10:56:57Z x"]


def test_a_logging_record_with_a_log_field_is_still_a_logging_record():
    """python-json-logger and ECS records keep their message; a field named ``log`` (ECS puts the logger there) or
    ``line`` (a line number) beside it is not the line."""
    ecs = {"@timestamp": "2026-11-21T10:56:57.911Z", "log": {"logger": "distributed.nanny", "level": "info"},
           "message": "Worker process 3536 was killed by signal 9"}
    assert jsonlog.text_lines(ecs) == ["2026-11-21T10:56:57.911Z - distributed.nanny - INFO - Worker process 3536 "
                                       "was killed by signal 9"]
    plain = {"message": "Restarting worker", "line": 12, "log": "ignored", "name": "distributed.nanny"}
    assert jsonlog.text_lines(plain) == ["distributed.nanny - INFO - Restarting worker"]
    assert jsonlog.parse('{"log": 3}') is None and jsonlog.parse('{"line": null}') is None


def test_a_journal_record_without_a_time_or_pid_is_still_read(tmp_path):
    """A record exported without __REALTIME_TIMESTAMP keeps its line as it is; one without _PID names its process
    by identifier alone."""
    line = "2026-11-21 10:56:57,911 - distributed.nanny - INFO - Worker process 3536 was killed by signal 9"
    assert jsonlog.text_lines({"MESSAGE": line, "_PID": "7"}) == [line]
    micros = str(calendar.timegm((2026, 11, 21, 10, 56, 57)) * 10**6)
    assert jsonlog.text_lines({"MESSAGE": "x", "__REALTIME_TIMESTAMP": micros, "SYSLOG_IDENTIFIER": "dask worker"}) \
        == ["2026-11-21T10:56:57.000000+0000 localhost dask-worker: x"]
    (tmp_path / "j.json").write_text(json.dumps({"MESSAGE": line, "_PID": "7"}) + "\n")
    assert _deaths([tmp_path / "j.json"]) == Counter({("sudden_exit", "sigkill"): 1})


def test_an_export_points_at_the_line_of_the_file_that_holds_each_line(tmp_path):
    """A pretty-printed export (newest first) is read in time order, and the evidence shows the line of the file
    where the record's text is; its other strings (times, labels) are not log lines: no warning about them."""
    _gcloud("dask-sigkill", tmp_path)
    report = analyze([str(tmp_path / "gcloud.json")], rules=RULES)
    assert not report.problems
    shown = (tmp_path / "gcloud.json").read_text().splitlines()
    for d in report.deaths:
        for ev in d.evidence:
            assert ev.text.split(" ", 2)[-1][:60] in shown[ev.line - 1], (ev.line, ev.text)


def test_an_export_on_one_line_is_read_as_a_document(tmp_path):
    """A compact export (``jq -c``, an API's answer): the whole array on one line (read as a value among lines)."""
    _gcloud("dask-sigkill", tmp_path)
    entries = json.loads((tmp_path / "gcloud.json").read_text())
    (tmp_path / "gcloud.json").write_text(json.dumps(entries) + "\n")
    report = analyze([str(tmp_path / "gcloud.json")], rules=RULES)
    assert not report.problems   # (read as a printed Python value, its times were lines with an impossible stamp)
    assert Counter((d.cause, d.detail) for d in report.deaths) == _deaths(
        sorted((ROOT / "sample_logs/dask-sigkill").glob("*.log")))


@pytest.mark.parametrize("document", ['[1, 2, 3]', '{"events": [{"ingestionTime": 5}]}', '{"a": "b"}',
                                      '[{"log": 3}]', '[[[[[["x"]]]]]]'])
def test_a_json_document_without_log_records_is_not_taken_for_one(document, tmp_path):
    from kwdiag.readers.text import _json_document_lines

    assert _json_document_lines(document.encode()) is None
    (tmp_path / "doc.json").write_text(document + "\n")
    assert analyze([str(tmp_path / "doc.json")], rules=RULES).deaths == ()


def test_a_shippers_event_of_several_lines_is_each_line_behind_the_same_time():
    """CloudWatch (awslogs with a multi-line pattern) or Filebeat's multiline joins a traceback into one event; a
    message with neither logger nor level beside it is the process's own text: each line is read as printed."""
    event = {"timestamp": 1795258795101, "message": "Traceback (most recent call last):\n  File \"x.py\", line 3, "
             "in f\nSystemExit: 3\n"}
    assert jsonlog.text_lines(event) == ["2026-11-21T10:59:55.101000Z Traceback (most recent call last):",
                                         '2026-11-21T10:59:55.101000Z   File "x.py", line 3, in f',
                                         "2026-11-21T10:59:55.101000Z SystemExit: 3"]
    # python-json-logger with only a time and the message: no logger or level to give, the time kept
    assert jsonlog.text_lines({"asctime": "2026-11-21 10:56:57,911", "message": "Restarting worker"}) == [
        "2026-11-21 10:56:57,911 Restarting worker"]
