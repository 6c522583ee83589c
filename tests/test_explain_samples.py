"""Explain every ``sample_logs/<scenario>/`` that has an ``expected.json`` and compare.

``expected.json`` is written from what the scenario's driver DID to the workers, not from what the
analyzer says. Deaths are compared as a multiset of (worker, cause, detail) — never by timestamps —
where ``cause_in_logs`` / ``detail_in_logs`` / ``worker_in_logs`` (when present) are what the logs can show (a --no-nanny
SIGKILL leaves no trace of the signal: unknown/abrupt_end; LocalCluster at WARNING level never prints worker names). ``killed_workers`` compare by task, number of deaths and fairness.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze
from kwdiag.readers import jsonlog, pyrepr

SAMPLES = Path(__file__).resolve().parent.parent / "sample_logs"
SCENARIOS = sorted(p.parent for p in SAMPLES.glob("*/expected.json"))
RULES = None


def _rules():
    global RULES
    if RULES is None:
        RULES = load_rules()
    return RULES


def test_there_are_dask_samples():
    assert len([s for s in SCENARIOS if s.name.startswith("dask-")]) >= 10


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_sample_scenario(scenario: Path):
    expected = json.loads((scenario / "expected.json").read_text())
    report = analyze([str(scenario)], rules=_rules())
    assert not report.input_errors, report.input_errors
    want = Counter((d.get("worker_in_logs", d["worker"]), d.get("cause_in_logs", d["cause"]),
                    d.get("detail_in_logs", d["detail"])) for d in expected["deaths"])
    got = Counter((d.worker, d.cause, d.detail) for d in report.deaths)
    assert got == want, "\n" + "\n".join(
        f"{d.worker}#{d.incarnation} {d.cause}/{d.detail} {d.confidence} {d.rules}" for d in report.deaths)
    for d in report.deaths:
        assert d.evidence, f"{d.worker}#{d.incarnation} has no evidence"
        for e in d.evidence:
            assert e.line >= 1 and Path(e.file).exists()
        if d.failure and d.cause != "unknown":
            assert d.confidence >= 0.5, (d.worker, d.cause, d.detail, d.confidence)
            assert d.hints, f"{d.worker}#{d.incarnation} {d.cause}/{d.detail} has no fix"
    kws = sorted((k.task, len(k.deaths), k.fair) for k in report.killed_workers)
    want_kw = sorted((k["task"], k["deaths"], k["fair"]) for k in expected.get("killed_workers", []))
    assert kws == want_kw
    if "task_errors" in expected:
        assert len(report.task_errors) == expected["task_errors"]


def test_evidence_lines_are_the_lines_in_the_files():
    for scenario in SCENARIOS:
        report = analyze([str(scenario)], rules=_rules())
        for d in report.deaths:
            for e in d.evidence:
                if e.file.endswith(".jsonl"):  # structured events: the evidence text is the event's message
                    continue
                text = Path(e.file).read_text(encoding="utf-8", errors="replace")
                if e.file.endswith(".ipynb"):   # a notebook: the line holds the output's text as a JSON string
                    stored = json.loads(text.splitlines()[e.line - 1].strip().rstrip(","))
                    assert e.text[:23] in re.sub(r"\x1b\[[0-9;]*m", "", stored), (e.file, e.line, e.text)
                    continue
                held = pyrepr.log_lines(text) if pyrepr.looks_like_value(text[:4096]) else None
                if held is None:   # a log with printed values among its lines (a notebook cell's output)
                    held = [v for span in pyrepr.values_among_lines(text) or [] for v in span.lines]
                if any(v.lineno == e.line for v in held):
                    # a printed Python value: the evidence is a log line whose literal starts there
                    assert any(v.lineno == e.line and v.text.strip().startswith(e.text[:60].rstrip("…"))
                               for v in held), (e.file, e.line, e.text)
                    continue
                line = text.splitlines()[e.line - 1]
                record = jsonlog.parse(line)
                if record is not None:  # a JSON log record: the evidence is one of the lines it renders to
                    shown = [t.strip() for t in jsonlog.text_lines(record)]
                    assert any(t.startswith(e.text[:60].rstrip("…")) for t in shown), (e.file, e.line, e.text)
                    continue
                assert line.strip().startswith(e.text[:60].rstrip("…")), (e.file, e.line, e.text)


def test_the_schedulers_log_alone_tells_a_close_that_gave_no_reason(tmp_path):
    """Dask 2023.8.0 to 2024.8.0 log a close without a reason (``client.shutdown()``) as "Scheduler closing due to
    unknown reason..." (two words in the reason): the scheduler's log alone, as pasted, shows each worker removed in
    the cluster's close, with or without its time prefixes."""
    import re

    scheduler = SAMPLES / "dask-2024-client-shutdown" / "scheduler.log"
    text = scheduler.read_text()
    assert "Scheduler closing due to unknown reason..." in text
    want = [("w1", "chose_to_exit", "shutdown"), ("w2", "chose_to_exit", "shutdown")]
    assert sorted((d.worker, d.cause, d.detail) for d in analyze([str(scheduler)], rules=_rules()).deaths) == want
    pasted = tmp_path / "paste.txt"
    pasted.write_text(re.sub(r"(?m)^\d{4}-\d\d-\d\d [\d:,]+ - ", "", text))
    assert sorted((d.worker, d.cause, d.detail) for d in analyze([str(pasted)], rules=_rules()).deaths) == want


def test_a_restart_at_warning_level_names_a_requested_restart_among_its_readings():
    """`Restarting worker` is all a LocalCluster at WARNING prints of `client.restart()` (Dask 2022.4.2 and later
    print it for a requested restart as for a crash): unknown, and the requested restart is one of the readings
    named, with the way to tell them apart; the report never says the nanny did not ask for it."""
    report = analyze([str(SAMPLES / "dask-localcluster-restart")], rules=_rules())
    assert [(d.cause, d.detail) for d in report.deaths] == [("unknown", "restarted")] * 3
    for d in report.deaths:
        assert "chose_to_exit/restart" in d.alternatives and "sudden_exit/sigkill" in d.alternatives
        assert "did not ask" not in d.summary
        assert any("silence_logs=logging.INFO" in h.text for h in d.hints)
        assert not any("DASK_LOGGING__DISTRIBUTED" in h.text for h in d.hints)
