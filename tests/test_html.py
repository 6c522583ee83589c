"""``kwdiag explain --html``: a self-contained page whose charts a real browser draws.

Covers: the page has no scripts, no external references and a CSP that forbids loading anything;
hostile log text (``<script>``, an attribute-breaking ``"><img onerror=...>``, in evidence, task
names and worker names) appears as text, in the markup and in a real browser; the timeline (a bar
per incarnation, a marker per death coloured by cause, KilledWorker lines and rings) and the memory
charts (one polyline point per nanny sample, limit and terminate lines) are laid out with non-zero
size by headless Chromium (Debian's ``chromium``; skipped with a reason when it is not installed);
the ``--html`` CLI option and its usage error.

How the browser check works: the page itself has no JavaScript. The test writes a copy with the
CSP removed and a probe script appended that measures the drawn SVG (``getBBox``,
``points.numberOfItems``, computed colours, ``elementFromPoint``) and writes the figures into the
DOM; ``chromium --dump-dom`` prints the DOM after scripts ran. Without the CSP the same copy also
proves the escaping alone keeps hostile text inert.

Does not cover: pixel-exact rendering (a screenshot is taken and checked to be a PNG of the
requested size; people look at it).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze
from kwdiag.report.html import CAUSE_COLOURS, charted, render_html

ROOT = Path(__file__).resolve().parent.parent
RULES = load_rules()
SCENARIOS = ["kwdiag-memory", "kwdiag-segfault-killedworker", "dask-memory", "dask-killedworker"]
XSS_SCRIPT = "<script>alert(1)</script><script>document.title='PWNED-S'</script>"
XSS_ATTR = "\"><img src=x onerror=\"document.title='PWNED-I'\">"
XSS_ATTR2 = "'><svg onload=alert(2)>"


def chromium() -> str | None:
    for c in (shutil.which("chromium"), "/usr/bin/chromium"):
        if c and Path(c).exists():
            return c
    return None


needs_chromium = pytest.mark.skipif(chromium() is None, reason="Debian's chromium is not installed "
                                    "(apt-get install chromium; .ci/run installs it)")


def run_chromium(url: str, *extra: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="kwdiag-chromium-") as profile:
        return subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}", *extra, url],
            capture_output=True, text=True, timeout=180)  # an alert() that got through blocks until this


# Measures what the browser drew; reports it base64-encoded inside <pre id="probe">.
PROBE = """<script>
(function () {
  function box(e) { var b = e.getBBox(); return [b.x, b.y, b.width, b.height]; }
  function all(sel) { return Array.prototype.slice.call(document.querySelectorAll(sel)); }
  var r = {title: document.title, scripts: document.scripts.length,
           imgs: document.getElementsByTagName('img').length,
           foreign: all('iframe,object,embed,link,[onerror],[onload],[onclick]').length,
           text: document.body.textContent};
  r.rows = all('#timeline g.worker-row').map(function (g) { return g.getAttribute('data-worker'); });
  r.bars = all('#timeline rect.incarnation').map(function (e) {
    return {worker: e.closest('g').getAttribute('data-worker'), inc: +e.getAttribute('data-incarnation'),
            box: box(e)}; });
  r.markers = all('#timeline polygon.death-marker').map(function (e) {
    var c = e.getBoundingClientRect();
    var hit = document.elementFromPoint(c.left + c.width / 2, c.top + c.height / 2);
    return {cause: e.getAttribute('data-cause'), box: box(e), fill: getComputedStyle(e).fill,
            visible: hit === e}; });
  r.kw_lines = all('#timeline g.killed-worker line').map(box);
  r.kw_rings = all('#timeline circle.kw-counted').map(box);
  r.kw_labels = all('#timeline text.kw-label').map(function (e) {
    var c = e.getBoundingClientRect(); return [c.left, c.top, c.width, c.height]; });
  r.charts = all('svg.memory-chart').map(function (s) {
    var c = s.getBoundingClientRect(), line = s.querySelector('polyline.rss');
    var lim = s.querySelector('line.limit'), term = s.querySelector('line.terminate');
    return {worker: s.getAttribute('data-worker'), inc: +s.getAttribute('data-incarnation'),
            samples: +s.getAttribute('data-samples'), size: [c.width, c.height],
            points: line ? line.points.numberOfItems : 0, line: line ? box(line) : null,
            length: line && line.points.numberOfItems > 1 ? line.getTotalLength() : 0,
            readings: s.querySelectorAll('circle.reading').length,
            limit: lim ? box(lim) : null, terminate: term ? box(term) : null}; });
  var pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = btoa(unescape(encodeURIComponent(JSON.stringify(r))));
  document.body.appendChild(pre);
})();
</script>"""


def probe(page: str, tmp_path: Path) -> dict:
    """Open ``page`` (CSP removed, probe appended) in headless Chromium; the probe's measurements."""
    page = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page, count=1)
    i = page.rindex("</body>")
    path = tmp_path / "probe.html"
    path.write_text(page[:i] + PROBE + page[i:], encoding="utf-8")
    r = run_chromium(path.as_uri(), "--window-size=1200,2400", "--dump-dom")
    m = re.search(r'<pre id="probe">([A-Za-z0-9+/=]+)</pre>', r.stdout)
    assert m, f"probe did not run: rc={r.returncode} stderr={r.stderr[-2000:]}"
    return json.loads(base64.b64decode(m.group(1)).decode("utf-8"))


class Tags(HTMLParser):
    """Every start tag with its attributes, and all text, as a browser's parser sees them."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def parse(page: str) -> Tags:
    p = Tags()
    p.feed(page)
    p.close()
    return p


def report_of(name: str):
    return analyze([str(ROOT / "sample_logs" / name)], rules=RULES)


def hostile_logs(tmp_path: Path) -> Path:
    """Real logs with hostile text in evidence, task names, a worker name and a Dask log line."""
    d = tmp_path / "logs"
    shutil.copytree(ROOT / "sample_logs" / "kwdiag-memory", d)
    bad_name = 'w0<b id="inj">' + XSS_ATTR2
    for f in d.glob("*.jsonl"):
        lines = []
        for line in f.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("worker") == "worker-0":
                ev["worker"] = bad_name
            fields = ev.get("fields") or {}
            if ev["kind"] == "nanny-memory-terminate":
                ev["message"] += " " + XSS_SCRIPT
            if ev["kind"] == "worker-exit" and fields.get("incarnation") == 1:
                fields["stderr_tail"] = list(fields.get("stderr_tail") or []) + [XSS_ATTR]
                ev["message"] += " " + XSS_ATTR
            if ev["kind"] == "killed-worker":
                fields["key"] = "hog-" + XSS_ATTR
            lines.append(json.dumps(ev))
        f.write_text("\n".join(lines) + "\n")
    dask = (ROOT / "sample_logs" / "dask-sigkill" / "w1.log").read_text().splitlines()
    dask.insert(16, "2026-11-21 10:56:35,201 - distributed.nanny - INFO - Worker process 3407 was killed by signal 9 "
                + XSS_SCRIPT + " " + XSS_ATTR + " see http://evil.invalid/x")
    (d / "w1.log").write_text("\n".join(dask) + "\n")
    return d


# ------------------------------------------------------------------ the markup


@pytest.mark.parametrize("name", SCENARIOS)
def test_page_is_self_contained(name):
    page = render_html(report_of(name))
    tags = parse(page)
    names = {t for t, _ in tags.tags}
    assert not names & {"script", "img", "iframe", "object", "embed", "link", "base", "form"}, names
    for tag, attrs in tags.tags:
        assert not [a for a in attrs if a.startswith("on")], (tag, attrs)
        assert "src" not in attrs, (tag, attrs)
        if "href" in attrs:
            assert attrs["href"].startswith("#"), (tag, attrs)
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page)
    assert "url(" not in page and "@import" not in page
    csp = next(a for t, a in tags.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    assert csp["content"].startswith("default-src 'none'")
    assert 'id="timeline"' in page


def test_hostile_log_text_is_escaped_in_the_markup(tmp_path):
    report = analyze([str(hostile_logs(tmp_path))], rules=RULES)
    page = render_html(report)
    tags = parse(page)
    names = [t for t, _ in tags.tags]
    assert "script" not in names and "img" not in names and "svg" in names
    assert not [t for t, a in tags.tags if any(k.startswith("on") for k in a)]
    assert not [t for t, a in tags.tags if t == "b" and a.get("id") == "inj"]
    text = "".join(tags.text)
    for payload in (XSS_SCRIPT, XSS_ATTR.strip(), 'w0<b id="inj">'):
        assert payload in text, payload  # shown, as text
    assert "http://evil.invalid/x" in text and 'href="http' not in page
    # attribute values hold the hostile worker name, quoted and escaped
    rows = [a["data-worker"] for t, a in tags.tags if t == "g" and "data-worker" in a]
    assert any(r.startswith('w0<b id="inj">') for r in rows), rows


# ------------------------------------------------------------------ a real browser


@needs_chromium
@pytest.mark.parametrize("name", SCENARIOS)
def test_chromium_draws_the_timeline_and_memory_charts(name, tmp_path):
    report = report_of(name)
    got = probe(render_html(report), tmp_path)
    assert got["scripts"] == 1 and got["imgs"] == 0 and got["foreign"] == 0  # only the probe
    # timeline: a row per worker, a bar per incarnation, a marker per death in its cause's colour
    assert sorted(got["rows"]) == sorted({s.worker for s in report.incarnations})
    assert sorted((b["worker"], b["inc"]) for b in got["bars"]) == sorted(
        (s.worker, s.incarnation) for s in report.incarnations)
    for b in got["bars"]:
        assert b["box"][2] >= 2 and b["box"][3] > 10, b
    assert sorted(m["cause"] for m in got["markers"]) == sorted(d.cause for d in report.deaths)
    for m in got["markers"]:
        hexc = CAUSE_COLOURS[m["cause"]]
        rgb = tuple(int(hexc[i:i + 2], 16) for i in (1, 3, 5))
        assert m["fill"] == "rgb({}, {}, {})".format(*rgb), m
        assert m["box"][2] > 10 and m["box"][3] > 10 and m["visible"], m
    kws = [k for k in report.killed_workers if k.at is not None]
    assert len(got["kw_lines"]) == len(kws)
    assert all(b[3] > 20 for b in got["kw_lines"])
    assert len(got["kw_rings"]) == len({(d.worker, d.incarnation) for k in report.killed_workers for d in k.deaths})
    # memory: one chart per death whose memory the logs show, every nanny sample plotted
    charts = {(c["worker"], c["inc"]): c for c in got["charts"]}
    for d in report.deaths:
        m = d.memory
        if not charted(d):
            assert (d.worker, d.incarnation) not in charts
            continue
        c = charts[(d.worker, d.incarnation)]
        assert c["size"][0] > 400 and c["size"][1] > 150, c
        assert c["samples"] == c["points"] == len(m.samples), c
        assert c["readings"] == len(m.readings)
        if len(m.samples) > 1:
            assert c["length"] > 50 and c["line"][2] > 50, c  # a visible line across the chart
        if m.limit:
            assert c["limit"] and c["limit"][2] > 300, c
        if m.terminate_at:
            assert c["terminate"] and c["terminate"][1] > c["limit"][1], c  # drawn below the limit
    assert len(charts) == sum(1 for d in report.deaths if charted(d))
    assert charts or name == "dask-killedworker"  # its logs state no memory values at all
    if name == "kwdiag-memory":
        big = charts[("worker-0", 1)]
        assert big["points"] == 8 and big["line"][3] > 100  # the climb spans most of the chart's height


@needs_chromium
def test_hostile_text_stays_inert_in_chromium(tmp_path):
    report = analyze([str(hostile_logs(tmp_path))], rules=RULES)
    got = probe(render_html(report), tmp_path)  # CSP removed: escaping alone must hold
    assert got["title"] == "kwdiag explain"
    assert got["scripts"] == 1 and got["imgs"] == 0 and got["foreign"] == 0
    assert XSS_SCRIPT in got["text"] and XSS_ATTR.strip() in got["text"]
    assert len(got["markers"]) == len(report.deaths) and got["charts"]


@needs_chromium
def test_cli_html_page_screenshot(tmp_path):
    out = tmp_path / "report.html"
    r = subprocess.run([sys.executable, "-m", "kwdiag", "explain", "sample_logs/kwdiag-memory", "--html", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("Verdict:")  # the text report is still printed
    png = tmp_path / "report.png"
    s = run_chromium(out.as_uri(), f"--screenshot={png}", "--window-size=1200,1600")
    assert png.exists(), s.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == (1200, 1600)
    assert len(data) > 30_000  # a blank page compresses to a few KiB


def test_cli_html_unwritable_is_a_usage_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "kwdiag", "explain", "sample_logs/dask-memory", "--html",
                        str(tmp_path / "no" / "such" / "dir" / "r.html")], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 2 and "cannot write" in r.stderr and "Traceback" not in r.stderr


def test_no_memory_samples_says_so_and_shows_what_is_known():
    page = render_html(report_of("dask-killedworker"))  # Dask: a limit and SIGKILLs, no memory values
    assert 'id="no-samples"' in page and "No memory samples in these logs" in page
    assert "memory-chart" not in page and "limit 12 GiB, no samples or readings" in page
    page = render_html(report_of("dask-memory"))  # one "Process memory" reading and the nanny's 95% line
    assert 'id="no-samples"' in page and page.count('class="chart memory-chart"') == 1
    assert 'class="reading"' in page and 'class="crossed"' in page
    assert 'id="no-samples"' not in render_html(report_of("kwdiag-memory"))


def test_a_worker_restarted_many_times_draws_its_last_deaths_only():
    from kwdiag.analysis import Death, IncarnationSpan, MemoryTrace, Report
    from kwdiag.report.html import MAX_PANELS

    deaths = tuple(Death(worker="w", incarnation=n, cause="nanny_memory_restart", detail="memory_limit",
                         confidence=0.9, at=100.0 * n + 1,
                         memory=MemoryTrace(samples=((100.0 * n, 1.0), (100.0 * n + 1, 9.0)), limit=10.0,
                                            terminate_fraction=0.95, peak=9.0)) for n in range(1, 13))
    spans = tuple(IncarnationSpan("w", n, 100.0 * n, 100.0 * n + 1) for n in range(1, 13))
    page = render_html(Report(deaths=deaths, incarnations=spans, first_ts=100.0, last_ts=1201.0))
    tags = parse(page)
    charts = [a for t, a in tags.tags if t == "svg" and "memory-chart" in a.get("class", "")]
    assert [int(a["data-incarnation"]) for a in charts] == list(range(13 - MAX_PANELS, 13))
    assert "4 earlier death(s) of this worker not drawn" in page
    assert len([a for t, a in tags.tags if t == "polygon" and a.get("class") == "death-marker"]) == 12


def test_absurd_memory_values_give_a_bounded_page(tmp_path):
    """A log that claims an infinite limit or a 1e308-byte RSS (a corrupt record) still renders, with axes of
    a few ticks: found by the fuzz test, whose page grew until the machine ran out of memory."""
    p = tmp_path / "events.jsonl"
    recs = [{"v": 1, "ts": 1795258595.0 + i, "source": "nanny", "kind": kind, "worker": "w1", "message": "",
             "fields": fields}
            for i, (kind, fields) in enumerate([
                ("worker-start", {"pid": 5, "incarnation": 1, "memory_limit": float("inf")}),
                ("nanny-memory-terminate", {"pid": 5, "incarnation": 1, "rss": 1e308, "limit": float("inf")}),
                ("worker-exit", {"pid": 5, "incarnation": 1, "signal": 15})])]
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    report = analyze([str(p)], rules=RULES)
    assert report.deaths, "the death is still found"
    page = render_html(report)
    assert page.count("<line") < 400, page.count("<line")


# ------------------------------------------------------------------ many deaths, crowded KilledWorkers
def _crowded_report(workers: int, deaths_each: int, killed: int):
    """A synthetic report (the analysis is tested elsewhere): ``workers`` workers each restarted
    ``deaths_each`` times over 100 s, and ``killed`` KilledWorker tasks within one second of each other."""
    from kwdiag.analysis import Death, IncarnationSpan, KilledWorkerBlame, Report

    deaths, spans = [], []
    for w in range(workers):
        for n in range(1, deaths_each + 1):
            at = 1000.0 + 100.0 * n / (deaths_each + 1) + w * 1e-3
            cause, detail = (("sudden_exit", "sigkill") if w % 3 else ("nanny_memory_restart", "memory_limit"))
            token = hashlib.md5(f"{w}-{n}".encode()).hexdigest()   # Dask's key: a name, a token, an index
            deaths.append(Death(worker=f"w{w:04d}", incarnation=n, cause=cause, detail=detail, confidence=0.9, at=at,
                                running=(f"('load-{token}', {n})",)))
            spans.append(IncarnationSpan(f"w{w:04d}", n, at - 100.0 / (deaths_each + 1), at))
    blames = tuple(KilledWorkerBlame(task=f"crowded-task-{k}", deaths=tuple(deaths[k:k + 2]), causes=("sudden_exit",),
                                     fair=True, reasons=(), at=1050.0 + 0.1 * k) for k in range(killed))
    return Report(deaths=tuple(deaths), incarnations=tuple(spans), killed_workers=blames, first_ts=1000.0,
                  last_ts=1100.0, runtimes=("dask",))


@needs_chromium
def test_killed_worker_labels_never_overlap_and_are_named_in_a_list(tmp_path):
    report = _crowded_report(workers=4, deaths_each=2, killed=7)
    page = render_html(report)
    got = probe(page, tmp_path)
    labels = got["kw_labels"]
    assert len(labels) == 7 and len(got["kw_lines"]) == 7
    overlapping = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1:]
                   if a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]]
    # three lanes hold the first labels apart; beyond that a lane is reused, so allow no overlap among 3
    assert not [p for p in overlapping if labels.index(p[0]) < 3 and labels.index(p[1]) < 3], overlapping
    assert page.count("<li>K") == 7 and "crowded-task-6" in page


def test_thousands_of_deaths_give_a_page_of_groups_not_of_deaths():
    from kwdiag.report.html import MAX_GROUP_ROWS, MAX_ROWS

    report = _crowded_report(workers=1000, deaths_each=3, killed=2)
    page = render_html(report)
    tags = parse(page)
    rows = [a for t, a in tags.tags if t == "g" and a.get("class") == "worker-row"]
    assert len(rows) == MAX_ROWS and "940 more worker(s) not drawn" in page
    groups = [a for t, a in tags.tags if t == "div" and "group" in a.get("class", "")]
    assert len(groups) == 2   # 3,000 deaths of two kinds (their tasks differ only by Dask's index: one family each)
    assert len([a for t, a in tags.tags if t == "tr" and a.get("id", "").startswith("death-")]) == 2 * MAX_GROUP_ROWS
    assert len(page) < 1_500_000, len(page)


@needs_chromium
@pytest.mark.parametrize("size", ["1280,900", "390,844"])
def test_the_demo_like_page_at_two_sizes(size, tmp_path):
    """Screenshots of a page with every kind of death, at a laptop's and a phone's width; kept under
    tests/data/screenshots/ by KWDIAG_UPDATE_SNAPSHOTS=1 for people to look at."""
    import os

    report = analyze([str(ROOT / "sample_logs" / n) for n in ("kwdiag-segfault-killedworker", "kwdiag-memory",
                                                                  "dask-version-mismatch")], rules=RULES)
    out = tmp_path / "page.html"
    out.write_text(render_html(report), encoding="utf-8")
    png = tmp_path / "page.png"
    s = run_chromium(out.as_uri(), f"--screenshot={png}", f"--window-size={size}", "--hide-scrollbars")
    assert png.exists(), s.stderr[-2000:]
    data = png.read_bytes()
    w, h = (int(x) for x in size.split(","))
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == (w, h)
    assert len(data) > 10_000
    if os.environ.get("KWDIAG_UPDATE_SNAPSHOTS"):
        keep = ROOT / "tests" / "data" / "screenshots"
        keep.mkdir(exist_ok=True)
        (keep / f"report-{w}x{h}.png").write_bytes(data)
