"""Seeing memory after a real death: a kwdiag LocalCluster worker climbs past its limit, the nanny
terminates it, and the sparkline and the HTML page (drawn by headless Chromium) show the climb.

Covers: the nanny's samples of a real process reaching ``Death.memory``, the sparkline reaching the
top block at the terminate line, and the page plotting every sample with the limit and terminate
lines and the KilledWorker mark. Does not cover: rendering details (tests/test_html.py,
tests/test_sparkline.py).
"""

from __future__ import annotations

import time

from test_html import chromium, probe  # the browser helpers of tests/test_html.py

from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze
from kwdiag.report.html import render_html
from kwdiag.report.sparkline import sparkline
from kwdiag.report.terminal import render_plain

MiB = 2**20


def climb(step_mb=8, limit_mb=750):
    chunks = []
    for _ in range(limit_mb // step_mb):  # 3x the test's limit, far below the box's RAM
        chunks.append(bytearray(step_mb * MiB))  # bytearray pages are touched: real RSS
        time.sleep(0.03)
    time.sleep(120)  # hold it: a nanny slowed by a loaded box still finds it over the line
    return len(chunks)


def _run(log_dir):
    from kwdiag.runtime import Client, KilledWorker, LocalCluster

    with LocalCluster(n_workers=1, memory_limit="250MiB", log_dir=log_dir,
                      scheduler_kwargs={"allowed_failures": 0}) as cluster, Client(cluster) as client:
        try:
            client.submit(climb, key="climb-task").result(timeout=60)
        except KilledWorker:
            pass
        else:
            raise AssertionError("the nanny did not terminate the worker")
    return analyze([str(log_dir)], rules=load_rules())


def test_a_real_climb_is_seen_in_the_sparkline_and_the_page(log_dir, tmp_path):
    report = _run(log_dir)
    d = next(d for d in report.deaths if d.cause == "nanny_memory_restart")
    m = d.memory
    assert m.limit == 250 * MiB and m.terminate_fraction and len(m.samples) >= 5
    values = [v for _, v in m.samples]
    assert values[-1] == max(values) >= m.terminate_at  # the sample that made the nanny act
    assert values[-1] > 3 * values[0]  # a climb, not a plateau
    line = sparkline(m)
    assert line.split()[1].endswith("█") and "of 250 MiB limit" in line
    assert line in " ".join(render_plain(report, verbose=True).split())   # -v: each death's own line (wrapped)
    page = render_html(report)
    assert 'class="killed-worker"' in page
    if chromium() is None:  # no browser here: the checks above still ran (tests/test_html.py says why it skips)
        return
    got = probe(page, tmp_path)
    chart = next(c for c in got["charts"] if (c["worker"], c["inc"]) == (d.worker, d.incarnation))
    assert chart["points"] == len(m.samples) and chart["line"][3] > 100
    assert chart["terminate"][1] > chart["limit"][1]
    assert len(got["kw_lines"]) == 1 and len(got["kw_rings"]) == 1
