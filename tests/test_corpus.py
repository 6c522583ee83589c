"""kwdiag explain on the committed corpus of real Dask logs (every version, every shape), and on fragments.

The corpus (``sample_logs/corpus/cases/<version>/<case>/``) was made by ``sample_logs/corpus/generate.py``
running real Dask clusters and really killing, crashing, starving and retiring their workers; each case's
``labels.json`` says what was done. ``sample_logs/corpus_expect.py`` turns that into what the logs can
show (a LocalCluster at WARNING level cannot show a SIGKILL). A wrong cause fails the test.

Each death is also explained from a **fragment**: only the lines its fault produced (the time window of
the fault, every file), timestamps stripped, as a user would paste them: the death must still be found
with its cause, and nothing may be claimed that the fragment does not show.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze

SAMPLES = Path(__file__).resolve().parent.parent / "sample_logs"
sys.path.insert(0, str(SAMPLES))
from corpus_expect import expected_deaths  # noqa: E402
from evaluate import score_case  # noqa: E402

CASES = sorted(p.parent for p in (SAMPLES / "corpus" / "cases").glob("*/*/labels.json"))
RULES = load_rules()
DASK_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:[,.](\d+))?\s+-\s+")
FRAGMENT_BEFORE, FRAGMENT_AFTER = 1.0, 4.0  # seconds around the fault: its own lines, not the final close


def _labels(case: Path) -> dict:
    return json.loads((case / "labels.json").read_text())


def test_the_corpus_covers_versions_and_shapes():
    versions = {c.parent.name for c in CASES}
    assert len(versions) >= 5, versions
    shapes = {(_labels(c)["factors"]["launch"], _labels(c)["factors"]["nanny"]) for c in CASES}
    assert {("cli", "nanny"), ("cli", "no-nanny"), ("local_warning", "nanny"), ("local_info", "nanny")} <= shapes


# Cases where kwdiag's verdict differs from what was done and the logs do hold a clue it does not read yet.
# Each is measured as wrong by evaluate.py as well; a fix turns the xfail into a failure (strict), so the
# entry must then go.
# None now. The last one, 2021.11.2/032 (a LocalCluster whose worker class raises in __init__, at INFO level:
# the second start's failure went to the first failed process, whose nanny had already reported its exit), was
# fixed 2026-11-27 by reading "Failed to initialize Worker" as a line a process prints once.
KNOWN_WRONG: set[str] = set()


def _case_id(c: Path) -> str:
    return f"{c.parent.name}/{c.name}"


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason="known wrong"))
                                  if _case_id(c) in KNOWN_WRONG else c for c in CASES],
                         ids=[_case_id(c) for c in CASES])
def test_corpus_case(case: Path):
    labels = _labels(case)
    report = analyze([str(case)], rules=RULES)
    assert not report.input_errors, report.input_errors
    got = [(d.cause, d.detail) for d in report.deaths]
    want = expected_deaths(labels, case)
    s = score_case(want, got)
    wrong = {k: n for k, n in s.confusion.items() if k[0] != k[1] and "(missed)" not in k and "(none)" not in k}
    detail = "\n" + "\n".join(f"  {d.worker}#{d.incarnation} {d.cause}/{d.detail} {d.rules}" for d in report.deaths)
    assert not wrong, f"wrong causes {wrong}; expected {sorted(Counter(want).items(), key=str)}{detail}"
    # the final close races a worker that is restarting (end) or still starting (start): it is, or is not, counted alive
    shutdown_race = labels["factors"].get("timing") in ("end", "start")
    gaps = Counter(e for e, _ in want) - Counter(c for c, _ in got), Counter(c for c, _ in got) - Counter(e for e, _ in want)
    for gap in gaps:
        if shutdown_race and set(gap) <= {"chose_to_exit"} and sum(gap.values()) <= 1:
            continue
        assert not gap, f"missed or extra deaths {dict(gap)}; expected {sorted(Counter(want).items(), key=str)}{detail}"
    assert all(d.rules for d in report.deaths), "every verdict names its rule"


def _lines(path: Path) -> list[str]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return raw.decode("utf-8", "replace").splitlines()


def _fragments(case: Path, t0: float, t1: float, into: Path) -> list[str]:
    """For each file of ``case``, the lines stamped within [t0, t1] (and the untimed lines that follow
    them: tracebacks) without their timestamps, written to ``into``; the paths written. A file with no
    timestamped line at all (a traceback the command died of) is all the death's own and is kept whole."""
    paths = []
    for f in sorted(p for p in case.iterdir() if p.name != "labels.json" and p.is_file()):
        out, keep = [], False
        lines = _lines(f)
        if lines and not any(DASK_STAMP.match(line) for line in lines):
            out, lines = lines, []  # no time at all (a traceback the command died of): all of it is its own
        for line in lines:
            m = DASK_STAMP.match(line)
            if m:
                ts = time.mktime(time.strptime(m.group(1).replace("T", " "), "%Y-%m-%d %H:%M:%S"))
                ts += int(m.group(2)[:6]) / 10 ** min(len(m.group(2)), 6) if m.group(2) else 0.0
                keep = t0 <= ts <= t1
                if keep:
                    out.append(line[m.end():])
            elif keep:
                out.append(line)
        if out:
            p = into / (f.name.removesuffix(".gz") + ".txt")
            p.write_text("\n".join(out) + "\n")
            paths.append(str(p))
    return paths


FRAGMENTS = []
for _case in CASES:
    _l = _labels(_case)
    for _i, _d in enumerate(_l.get("deaths", [])):
        # Cut by Dask's own timestamps at the line start: the default text layout only (the collector cases'
        # JSON records and prefixed lines are read whole by test_corpus_case).
        if (_d.get("t_before") and _l["factors"].get("launch") != "local_warning"
                and _l.get("parameters", {}).get("collector", "text") == "text"):
            FRAGMENTS.append((_case, _i))


@pytest.mark.parametrize("case,index", [pytest.param(c, i, marks=pytest.mark.xfail(strict=True, reason="known wrong"))
                                        if _case_id(c) in KNOWN_WRONG else (c, i) for c, i in FRAGMENTS],
                         ids=[f"{_case_id(c)}#{i}" for c, i in FRAGMENTS])
def test_a_deaths_own_lines_alone_give_its_cause(case: Path, index: int, tmp_path):
    labels = _labels(case)
    d = labels["deaths"][index]
    from corpus_expect import _restarted, _version, _visible, fail_hard_printed

    seen = _visible(d["cause"], d.get("detail"), labels["factors"], _version(labels), _restarted(d, labels),
                    fail_hard_printed(case))
    if seen is None:
        pytest.skip("the logs cannot show this death")
    after = FRAGMENT_AFTER + (float(labels.get("parameters", {}).get("worker_ttl", 0)) if
                              d["detail"] == "heartbeat_timeout" else 0.0)
    paths = _fragments(case, d["t_before"] - FRAGMENT_BEFORE, (d.get("t_after") or d["t_before"]) + after, tmp_path)
    if not paths:
        # Dask before 2022.3.0 logs without timestamps: the death's lines cannot be told by time, and the
        # whole case is already a paste without timestamps.
        pytest.skip("these logs carry no timestamps")
    report = analyze(paths, rules=RULES)
    text = "".join(Path(p).read_text() for p in paths)
    causes = Counter(x.cause for x in report.deaths)
    assert causes[seen[0]] >= 1, f"{seen} not found in the fragment: {dict(causes)}\n{text[:3000]}"
    others = set(causes) - {seen[0], "chose_to_exit", "unknown"}
    assert not others, f"the fragment shows {seen} but kwdiag also claims {others}\n{text[:3000]}"
