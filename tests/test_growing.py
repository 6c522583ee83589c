"""``kwdiag run``'s live analysis (kwdiag.analysis.growing) grows with the run and agrees with the full one.

The runs are the committed kwdiag run directories (real clusters' event files); their events are fed in the order
they were written, in slices as ``kwdiag run``'s monitor reads them, and after the last slice the growing analysis
must hold exactly the deaths the full analysis of the same events finds, with the same verdicts.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from kwdiag.analysis import analyze_events
from kwdiag.analysis.growing import GrowingAnalysis
from kwdiag.engine import load_rules
from kwdiag.events import Origin, from_json_line

SAMPLES = Path(__file__).resolve().parent.parent / "sample_logs"
RUNS = sorted(p for p in SAMPLES.glob("kwdiag-*") if any(p.glob("*.jsonl")))
RULES = load_rules()


def _events(run: Path) -> list:
    out = []
    for f in sorted(run.glob("*.jsonl")):
        for n, line in enumerate(f.read_bytes().splitlines(), 1):
            if line.strip():
                out.append(from_json_line(line, Origin(str(f), n)))
    return sorted(out, key=lambda e: e.ts)


def _verdicts(deaths) -> Counter:
    return Counter((d.worker, d.incarnation, d.cause, d.detail) for d in deaths)


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
@pytest.mark.parametrize("slices", [1, 7, 40])
def test_the_growing_analysis_ends_with_the_full_analysis_verdicts(run, slices):
    events = _events(run)
    growing = GrowingAnalysis(RULES)
    size = max(1, -(-len(events) // slices))
    for start in range(0, len(events), size):
        growing.add(events[start:start + size])
        growing.deaths()
    full = analyze_events(events, RULES)
    assert full.deaths, "a sample run with no death tests nothing"
    assert _verdicts(growing.deaths()) == _verdicts(full.deaths)


def test_only_the_workers_whose_lines_changed_are_classified_again():
    run = next(r for r in RUNS if r.name == "kwdiag-sigkill")
    events = _events(run)
    growing = GrowingAnalysis(RULES)
    growing.add(events)
    growing.deaths()
    before = growing.analyses
    worker = next(e.worker for e in reversed(events) if e.worker)
    growing.add([e for e in events if e.worker == worker][-1:])
    growing.deaths()
    assert growing.analyses == before + 1
    growing.deaths()  # nothing new: nothing classified
    assert growing.analyses == before + 1


def test_a_killedworker_count_read_beside_one_workers_lines_makes_no_phantom_death():
    """`kwdiag demo`'s real events (a run of 2026-11-27, tests/data/demo-run-events): two tasks end in KilledWorker
    after two deaths each, then a worker with a missing plugin and one from another environment die. Each worker's
    lines are classified with the cluster-wide ones, the two counts included; classified beside the plugin worker's
    lines alone, the counts showed four deaths no line shows ("unseen worker"), and the live view announced two as
    died. Replayed in time order, one event at a time as the run wrote them: no death is ever one only a count
    shows, and the run's deaths are the final analysis's."""
    data = Path(__file__).resolve().parent / "data" / "demo-run-events"
    events = sorted((from_json_line(x) for f in sorted(data.glob("*.jsonl")) for x in f.read_text().splitlines()
                     if x.strip()), key=lambda e: e.ts)
    assert len({e.get("key") for e in events if e.kind == "killed-worker"}) == 2
    growing = GrowingAnalysis(RULES)
    for e in events:
        growing.add([e])
        assert not any(d.worker.startswith("unseen") for d in growing.deaths()), e
    final = analyze_events(events, RULES).deaths
    assert sorted((d.worker, d.incarnation, d.cause, d.detail) for d in growing.deaths()) == sorted(
        (d.worker, d.incarnation, d.cause, d.detail) for d in final)
