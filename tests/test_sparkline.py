"""Memory sparklines in the terminal report, and the memory trace the analyzer keeps per death.

Covers: scaling against the limit (a climb to the limit or the terminate line reaches ``█``), peak
and limit as text, resampling by bucket maximum (a spike survives), no line without samples, the
memory a real kwdiag run recorded (sample_logs/kwdiag-memory) reaching the plain report and the
JSON, and plain output free of escape sequences (also under NO_COLOR on a forced terminal).
Does not cover: the HTML charts (tests/test_html.py).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import jsonschema
import pytest

from kwdiag.analysis import MemoryTrace
from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze
from kwdiag.report.sparkline import BLOCKS, blocks, resample, sparkline
from kwdiag.units import format_bytes
from kwdiag.report.terminal import render_plain, render_terminal

ROOT = Path(__file__).resolve().parent.parent
RULES = load_rules()
MiB = 1024**2


def test_climb_to_the_limit_reaches_the_top_block():
    samples = tuple((float(i), v * MiB) for i, v in enumerate([10, 60, 120, 200, 260, 330, 380, 400]))
    line = sparkline(MemoryTrace(samples=samples, limit=400 * MiB, terminate_fraction=0.95, peak=400 * MiB))
    assert line.startswith("memory ▁▂▃▅▆")
    bars = line.split()[1]
    assert bars[-1] == "█" and bars[0] == "▁" and len(bars) == 8
    assert list(bars) == sorted(bars)  # a monotone climb stays monotone
    assert "peak 400 MiB of 400 MiB limit (terminate at 380 MiB)" in line
    assert "8 samples over 7.0s" in line


def test_scaled_against_the_limit_not_the_peak():
    # a worker that stayed at a quarter of its limit must not look full
    samples = tuple((float(i), 100 * MiB) for i in range(5))
    line = sparkline(MemoryTrace(samples=samples, limit=400 * MiB, peak=100 * MiB))
    assert line.split()[1] == "▃" * 5
    # without a limit, the peak is the top
    assert sparkline(MemoryTrace(samples=samples, peak=100 * MiB)).split()[1] == "█" * 5


def test_above_the_limit_stays_at_the_top_and_zero_at_the_bottom():
    assert blocks([0, 500 * MiB, -5], 400 * MiB) == "▁█▁"
    assert blocks([1.0], 0) == ""


def test_resample_keeps_a_short_spike():
    values = [1.0] * 300
    values[157] = 99.0
    out = resample(values, 40)
    assert len(out) == 40 and max(out) == 99.0 and out.count(99.0) == 1
    assert resample([1.0, 2.0], 40) == [1.0, 2.0]


def test_no_samples_no_line():
    assert sparkline(None) is None
    assert sparkline(MemoryTrace(limit=400 * MiB, readings=((1.0, 5.0),))) is None


@pytest.mark.parametrize("n,text", [(None, "?"), (12, "12 B"), (2048, "2 KiB"), (1.5 * 1024**3, "1.5 GiB"),
                                    (412 * MiB, "412 MiB")])
def test_fmt_bytes(n, text):
    assert format_bytes(n) == text


def _kwdiag_memory():
    return analyze([str(ROOT / "sample_logs" / "kwdiag-memory")], rules=RULES)


def test_real_nanny_samples_reach_the_death_and_the_report():
    report = _kwdiag_memory()
    d = next(d for d in report.deaths if d.cause == "nanny_memory_restart")
    src = [json.loads(x) for x in (ROOT / "sample_logs/kwdiag-memory/nanny-worker-0.jsonl").read_text().splitlines()]
    exit1 = next(e for e in src if e["kind"] == "worker-exit" and e["fields"]["incarnation"] == 1)
    assert [list(s) for s in d.memory.samples] == exit1["fields"]["memory_samples"]
    assert d.memory.limit == exit1["fields"]["memory_limit"] == 400 * MiB
    assert d.memory.terminate_fraction == 0.95
    assert d.memory.peak == exit1["fields"]["peak_rss"]
    text = render_plain(report, verbose=True)   # -v: every death with its own full sparkline
    flat = " ".join(text.split())   # the report wraps at 80 columns
    samples = exit1["fields"]["memory_samples"]
    span = samples[-1][0] - samples[0][0]
    # The figures come from the sample's own nanny record, so a regenerated sample keeps this test honest.
    line = (rf"memory [▁-█]{{{min(len(samples), 40)}}} peak {format_bytes(exit1['fields']['peak_rss'])} "
            rf"of 400 MiB limit \(terminate at 380 MiB\), {len(samples)} samples over {span:.1f}s")
    found = re.findall(line, flat)
    assert len(found) == 1, flat
    assert len(re.findall(r"memory [▁-█]+ peak [^,]+, \d+ samples?", flat)) == 2  # both exits carry samples
    assert found[0].split()[1].endswith("█")
    assert "\x1b" not in text
    doc = report.to_dict()
    mem = next(x for x in doc["deaths"] if x["cause"] == "nanny_memory_restart")["memory"]
    assert mem["samples"] == exit1["fields"]["memory_samples"] and mem["limit"] == 400 * MiB
    first = min(json.loads(x)["time"] for f in (ROOT / "sample_logs/kwdiag-memory").glob("*.jsonl")
                for x in f.read_text().splitlines() if x.strip())
    assert len(doc["incarnations"]) == 2 and doc["stats"]["first"].startswith(first[:19])


def test_json_with_memory_matches_the_schema():
    schema = json.loads((ROOT / "docs" / "explain.schema.json").read_text())
    for name in ("kwdiag-memory", "dask-memory", "kwdiag-segfault-killedworker"):
        doc = json.loads(json.dumps(analyze([str(ROOT / "sample_logs" / name)], rules=RULES).to_dict()))
        jsonschema.validate(doc, schema)
        assert any(d["memory"] for d in doc["deaths"]) and doc["incarnations"]


def test_junk_samples_are_dropped():
    from kwdiag.analysis.memory import memory_trace
    from kwdiag.events import Event

    e = Event(ts=10.0, source="nanny", kind="worker-exit", worker="w",
              fields={"memory_samples": [[1, 5], [2, float("inf")], [3, float("nan")], ["x", 1], [4, -1], [5],
                                         [6, True], [7, 9]], "memory_limit": "1e999", "peak_rss": None})
    m = memory_trace([e])
    assert m.samples == ((1.0, 5.0), (7.0, 9.0)) and m.peak == 9.0 and m.limit is None
    assert memory_trace([Event(ts=1.0, source="worker", kind="worker-start", worker="w")]) is None


def test_dask_text_logs_have_readings_not_samples():
    report = analyze([str(ROOT / "sample_logs" / "dask-memory")], rules=RULES)
    d = next(d for d in report.deaths if d.cause == "nanny_memory_restart")
    assert d.memory.samples == ()
    assert [round(v / MiB, 2) for _, v in d.memory.readings] == [248.09]  # "Process memory: 248.09 MiB"
    assert round(d.memory.limit / MiB, 2) == 286.10 and d.memory.terminate_fraction == 0.95
    assert "memory ▁" not in render_plain(report)  # no sparkline from a single reading


def test_no_color_terminal_keeps_the_sparkline_without_colour(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    buf = io.StringIO()
    render_terminal(_kwdiag_memory(), buf, force_terminal=True)
    out = buf.getvalue()
    assert re.search(r"memory [▁-█]+ peak 391 MiB", re.sub(r"\x1b\[[0-9;]*m", "", out))
    assert not re.search(r"\x1b\[(?:\d+;)*3[0-7]m", out)
    assert set(BLOCKS) & set(out)
