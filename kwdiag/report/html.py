"""``kwdiag explain --html PATH``: the report as one self-contained HTML page with charts.

Covers: a page with inline CSS and inline SVG generated here (no JavaScript, no fonts, images or
anything else fetched: a ``Content-Security-Policy`` of ``default-src 'none'`` says so to the
browser): the verdict, what to do (one fix per group of deaths, ``kwdiag.analysis.groups``), a table
of the groups, a **timeline** (one row per worker, at most ``MAX_ROWS``: those with the most failures;
a bar per incarnation from its start to its end, each death marked and coloured by cause, KilledWorker
tasks as numbered vertical lines, their labels in lanes so they never overlap and named in a list, the
deaths counted against them ringed, a legend), **memory charts** (per worker, one panel per death whose
memory the logs show: the nanny's RSS samples as a line, single readings from log lines as dots, the
memory limit and the terminate line at limit × terminate fraction, the death), then each group with the
lines that prove it, its fix and its deaths, KilledWorker blame, task errors, cluster notes and input
problems.
Every piece of log text goes through ``report.text.safe`` (control sequences stripped) and then
``html.escape`` (quotes too), in element text and attribute values alike.

Does not cover: analysis (``kwdiag.analysis``), interactive zoom or live data, or memory the logs do
not contain (Dask text logs state only the limit and a few warnings: the page says so).
"""

from __future__ import annotations

import math

from kwdiag.analysis.groups import DeathGroup, group_deaths
from kwdiag.analysis.model import Death, MemoryTrace, Report
from kwdiag.escape import html as esc
from kwdiag.units import format_bytes
from kwdiag.report.text import BLAME, conf, crash_frames, hint_for, proof, when, who

CAUSE_COLOURS = {
    "nanny_memory_restart": "#e8590c",
    "sudden_exit": "#c92a2a",
    "unrecoverable_exception": "#862e9c",
    "version_mismatch": "#1971c2",
    "unknown": "#868e96",
    "chose_to_exit": "#2f9e44",
}
ALIVE = "#ced4da"
RSS = "#1c7ed6"
LIMIT = "#c92a2a"
TERMINATE = "#f08c00"

TL_WIDTH, TL_LEFT, TL_RIGHT, TL_TOP, TL_ROW = 1100, 170, 30, 74, 30
MAX_PANELS = 8  # per worker: the last deaths; a worker restarted all day would otherwise make a huge page
MEM_WIDTH, MEM_HEIGHT, MEM_LEFT, MEM_RIGHT, MEM_TOP, MEM_BOTTOM = 520, 230, 70, 16, 14, 34

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1160px;
 color:#212529;background:#fff;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #dee2e6}
h3{font-size:15px;margin:16px 0 6px}
.verdict{font-weight:600;padding:8px 12px;border-radius:6px;background:#fff5f5;border:1px solid #ffc9c9}
.verdict.ok{background:#ebfbee;border-color:#b2f2bb}
.meta{color:#495057;font-size:13px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #dee2e6;padding:3px 8px;text-align:left;
 vertical-align:top}th{background:#f1f3f5}
.badge{display:inline-block;padding:0 6px;border-radius:4px;color:#fff;font-size:12px;font-weight:600}
.legend{display:flex;flex-wrap:wrap;gap:14px;margin:6px 0;font-size:13px}
.legend span.sw{display:inline-block;width:14px;height:14px;border-radius:3px;vertical-align:-2px;margin-right:4px}
svg{display:block;background:#fff}svg text{font:12px system-ui,sans-serif;fill:#343a40}
svg text.small{font-size:11px;fill:#495057}
.panels{display:flex;flex-wrap:wrap;gap:12px}
figure{margin:0;border:1px solid #dee2e6;border-radius:6px;padding:6px;width:520px}
figcaption{font-size:13px;margin:0 0 4px}
.note{color:#868e96;font-style:italic}
.death{border:1px solid #dee2e6;border-left:6px solid #868e96;border-radius:6px;padding:6px 12px;margin:10px 0}
.ev{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-all;
 background:#f8f9fa;padding:6px 8px;border-radius:4px;margin:4px 0}
.ev .loc{color:#1971c2}
.fix{background:#e7f5ff;padding:4px 8px;border-radius:4px;margin:4px 0}
.spark{font-family:ui-monospace,monospace}
.kw-list{font-size:13px;columns:2;margin:4px 0}
svg text.kw-label{font-size:11px;font-weight:600}
details{margin:4px 0}summary{cursor:pointer;color:#495057}
svg.chart{max-width:100%;height:auto}.scroll{overflow-x:auto}
li .fixtext{color:#1864ab}
@media (max-width:600px){body{margin:12px auto;padding:0 10px}td,th{padding:2px 4px;font-size:12px}}
"""



def _colour(cause: str) -> str:
    return CAUSE_COLOURS.get(cause, CAUSE_COLOURS["unknown"])


def nice_step(span: float, target: int = 6) -> float:
    """A round tick step (1, 2, 5 × 10^k) giving about ``target`` ticks over ``span``."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


# An axis never gets more ticks than this, whatever values a log holds (an infinite or absurd reading).
MAX_TICKS = 40


def _tick_count(span: float, step: float) -> int:
    """How many ticks 0, step, 2·step, ... fit in ``span`` (none when it is negative, at most ``MAX_TICKS``)."""
    if span < 0:
        return 0
    if not (math.isfinite(span) and math.isfinite(step)) or step <= 0:
        return 1
    return max(1, min(MAX_TICKS, int(span / step + 1e-9) + 1))


def fmt_dur(sec: float) -> str:
    """A signed duration for axis labels: ``0s``, ``+1.5s``, ``-40s``, ``+2m30s``, ``+1h05m``."""
    sign = "-" if sec < -1e-9 else ("+" if sec > 1e-9 else "")
    s = abs(sec)
    if s < 1e-9:
        return "0s"
    if s < 60:
        return f"{sign}{s:.3g}s"
    if s < 3600:
        m, r = divmod(round(s), 60)
        return f"{sign}{m}m" + (f"{r:02d}s" if r else "")
    h, r = divmod(round(s) // 60, 60)
    return f"{sign}{h}h{r:02d}m"


def _f(x: float) -> str:
    return f"{x:.1f}"


# ---------------------------------------------------------------- timeline


def timeline_svg(report: Report) -> str:
    """The timeline: a row per worker, a bar per incarnation, deaths coloured by cause, KilledWorker marks."""
    spans = list(report.incarnations)
    if not spans:
        return '<p class="note">No worker incarnations in these logs.</p>'
    times = _times(report, spans)
    if not times:  # a paste without timestamps: nothing to place on a time axis
        return '<p class="note">These logs carry no timestamps, so there is no timeline to draw.</p>'
    t0, t1 = min(times), max(times)
    if t1 - t0 < 1e-3:
        t1 = t0 + 1.0
    plot_w = TL_WIDTH - TL_LEFT - TL_RIGHT
    workers, hidden_workers = _rows(report, spans)
    by_worker: dict[str, list] = {w: [] for w in workers}
    for s in spans:
        if s.worker in by_worker:
            by_worker[s.worker].append(s)
    height = TL_TOP + TL_ROW * len(workers) + 34

    def x(t: float) -> float:
        return TL_LEFT + (t - t0) / (t1 - t0) * plot_w

    deaths = {(d.worker, d.incarnation): (i, d) for i, d in enumerate(report.deaths)}
    counted = {(d.worker, d.incarnation) for k in report.killed_workers for d in k.deaths}
    marks: list[str] = []  # drawn last, above every bar and line
    out = [f'<svg id="timeline" class="chart" width="{TL_WIDTH}" height="{height}" '
           f'viewBox="0 0 {TL_WIDTH} {height}" role="img" aria-label="worker timeline">']
    out += _axis(t0, t1, x, height)
    for row, w in enumerate(workers):
        y = TL_TOP + row * TL_ROW
        out.append(f'<g class="worker-row" data-worker="{esc(w, 200)}">')
        if row % 2:
            out.append(f'<rect x="0" y="{y - 4}" width="{TL_WIDTH}" height="{TL_ROW}" fill="#f8f9fa"/>')
        out.append(f'<text x="{TL_LEFT - 8}" y="{y + TL_ROW / 2 + 1}" text-anchor="end">'
                   f'<title>{esc(w, 300)}</title>{esc(w, 22)}</text>')
        for s in by_worker[w]:
            out.append(_bar(s, y, x, t0, t1, deaths.get((s.worker, s.incarnation)), counted, marks))
        out.append('</g>')
    for n, kw, lane in _kw_lanes(report, x):
        xx = x(kw.at)
        ly = TL_TOP - 14 - KW_LANE * lane
        out.append(f'<g class="killed-worker"><line x1="{_f(xx)}" y1="{ly + 4}" x2="{_f(xx)}" '
                   f'y2="{height - 30}" stroke="#212529" stroke-width="2" stroke-dasharray="5 3"/>'
                   f'<text class="kw-label" x="{_f(xx + 3)}" y="{ly}">'
                   f'<title>{esc(f"KilledWorker: {kw.task} at {when(kw.at, utc=True)}", 600)}</title>K{n}</text></g>')
    out.append('<g class="deaths">' + "".join(marks) + '</g></svg>')
    if hidden_workers:
        out.append(f'<p class="note" id="rows-not-drawn">{hidden_workers} more worker(s) not drawn: the '
                   f'{MAX_ROWS} drawn are those with the most deaths (every death is in the groups below and in '
                   f'the JSON report).</p>')
    out.append(_kw_list(report))
    return "".join(out)


def _axis(t0: float, t1: float, x, height: float) -> list[str]:
    """Time since the first event: a few round ticks with grid lines."""
    out = []
    step = nice_step(t1 - t0)
    for k in range(_tick_count(t1 - t0, step)):
        xx = x(t0 + k * step)
        out.append(f'<line x1="{_f(xx)}" y1="{TL_TOP - 6}" x2="{_f(xx)}" y2="{height - 30}" stroke="#e9ecef"/>')
        out.append(f'<text class="small" x="{_f(xx)}" y="{height - 14}" text-anchor="middle">'
                   f'{esc(fmt_dur(k * step))}</text>')
    out.append(f'<text class="small" x="{TL_LEFT}" y="14">time since {esc(when(t0, utc=True))}</text>')
    return out


def _times(report: Report, spans) -> list[float]:
    """Every known time the chart must span: incarnations, deaths, KilledWorkers, the input's range."""
    times = [t for s in spans for t in (s.started, s.ended) if t is not None]
    times += [d.at for d in report.deaths if d.at is not None]
    times += [k.at for k in report.killed_workers if k.at is not None]
    times += [t for t in (report.first_ts, report.last_ts) if t is not None]
    return times


def _bar(s, y: float, x, t0: float, t1: float, hit, counted: set, marks: list[str]) -> str:
    """One incarnation's bar; its death's marker (and ring, if a KilledWorker counted it) go to ``marks``,
    drawn last so no bar covers them."""
    start = s.started if s.started is not None else t0
    end = s.ended if s.ended is not None else t1
    x0, x1 = x(start), max(x(end), x(start) + 2)
    d = hit[1] if hit else None
    fill = _colour(d.cause) if d else ALIVE
    state = (f"{d.cause}/{d.detail} at {when(d.at, utc=True)}" if d else
             ("ended" if s.ended is not None else "alive when the logs end"))
    tip = f"{s.worker} #{s.incarnation} ({s.address or 'no address'}): {when(s.started, utc=True)} to {state}"
    bar = (f'<rect class="incarnation" data-incarnation="{s.incarnation}" x="{_f(x0)}" y="{y + 5}" '
           f'width="{_f(x1 - x0)}" height="{TL_ROW - 14}" rx="3" fill="{fill}" fill-opacity="0.35" '
           f'stroke="{fill}"><title>{esc(tip, 600)}</title></rect>')
    if d is None:
        return bar
    cx, cy = x1, y + TL_ROW / 2 - 2
    if (d.worker, d.incarnation) in counted:
        marks.append(f'<circle class="kw-counted" cx="{_f(cx)}" cy="{_f(cy)}" r="10" fill="none" '
                     f'stroke="#212529" stroke-width="2"/>')
    pts = f"{_f(cx)},{_f(cy - 7)} {_f(cx + 7)},{_f(cy)} {_f(cx)},{_f(cy + 7)} {_f(cx - 7)},{_f(cy)}"
    tip = f"{d.worker} #{d.incarnation}: {d.cause}/{d.detail} at {when(d.at, utc=True)}, confidence {conf(d.confidence)}"
    marks.append(f'<a href="#death-{hit[0]}"><polygon class="death-marker" data-cause="{esc(d.cause)}" '
                 f'data-worker="{esc(d.worker, 200)}" points="{pts}" fill="{_colour(d.cause)}" stroke="#fff" '
                 f'stroke-width="1"><title>{esc(tip, 600)}</title></polygon></a>')
    return bar


MAX_ROWS = 60  # workers drawn on the timeline; a thousand-worker cluster gets a summary, not a mile of rows


def _rows(report: Report, spans) -> tuple[list[str], int]:
    """The workers to draw, in order of appearance: all, or the ``MAX_ROWS`` with the most failures (then
    the most deaths); and how many were left out."""
    workers = list(dict.fromkeys(s.worker for s in spans))
    if len(workers) <= MAX_ROWS:
        return workers, 0
    fails: dict[str, int] = {}
    deaths: dict[str, int] = {}
    for d in report.deaths:
        deaths[d.worker] = deaths.get(d.worker, 0) + 1
        fails[d.worker] = fails.get(d.worker, 0) + d.failure
    keep = set(sorted(workers, key=lambda w: (-fails.get(w, 0), -deaths.get(w, 0)))[:MAX_ROWS])
    return [w for w in workers if w in keep], len(workers) - MAX_ROWS


KW_LANE = 14  # px between lanes of KilledWorker labels above the plot
KW_LANES = 3
KW_LABEL_WIDTH = 34  # px a "K12" label takes, with a gap


def _kw_lanes(report: Report, x) -> list[tuple[int, object, int]]:
    """``(number, KilledWorker, lane)`` for each KilledWorker with a time: labels are short numbers ("K3"),
    named in the list under the chart, and a label that would overlap the one before it in its lane goes
    to the next lane up; past ``KW_LANES`` lanes the lane with the most room is reused (the list still
    names every one)."""
    placed: list[tuple[int, object, int]] = []
    ends = [float("-inf")] * KW_LANES
    timed = [k for k in report.killed_workers if k.at is not None]
    for n, kw in enumerate(sorted(timed, key=lambda k: k.at), 1):
        start = x(kw.at)
        lane = next((i for i in range(KW_LANES) if ends[i] <= start), min(range(KW_LANES), key=lambda i: ends[i]))
        ends[lane] = start + KW_LABEL_WIDTH
        placed.append((n, kw, lane))
    return placed


def _kw_list(report: Report) -> str:
    timed = sorted((k for k in report.killed_workers if k.at is not None), key=lambda k: k.at)
    if not timed:
        return ""
    items = "".join(f"<li>K{n}: task <code>{esc(k.task, 200)}</code> at {esc(when(k.at, utc=True))}</li>"
                    for n, k in enumerate(timed, 1))
    return f'<ol class="kw-list" id="kw-list">{items}</ol>'


def _legend(report: Report) -> str:
    causes = list(dict.fromkeys(d.cause for d in report.deaths))
    items = [f'<span><span class="sw" style="background:{_colour(c)}"></span>{esc(c)}</span>' for c in causes]
    if any(s.ended is None for s in report.incarnations):
        items.append(f'<span><span class="sw" style="background:{ALIVE}"></span>alive when the logs end</span>')
    if report.killed_workers:
        items.append('<span><span class="sw" style="border:2px solid #212529;border-radius:50%;width:10px;'
                     'height:10px"></span>death counted against a KilledWorker task (dashed line: the scheduler '
                     'gave up)</span>')
    return '<div class="legend">' + "".join(items) + "</div>"


# ---------------------------------------------------------------- memory


def _byte_ticks(top: float) -> tuple[float, list[float]]:
    unit = 1024**3 if top >= 2 * 1024**3 else 1024**2 if top >= 2 * 1024**2 else 1024 if top >= 2048 else 1
    step = nice_step(top / unit, 5) * unit
    return step, [k * step for k in range(_tick_count(top, step))]


def memory_svg(d: Death, top: float) -> str:
    """One death's memory panel: RSS samples, readings, limit and terminate lines, the death.
    Over 60 lines on purpose: one SVG drawn in order (axes, limit and terminate lines, samples, readings, the death), every part on the same scales; split, the scales would be passed around to each piece.
    """
    m = d.memory or MemoryTrace()
    pw, ph = MEM_WIDTH - MEM_LEFT - MEM_RIGHT, MEM_HEIGHT - MEM_TOP - MEM_BOTTOM
    ts = [t for t, _ in m.samples] + [t for t, _ in m.readings] + ([d.at] if d.at is not None else [])
    ref = d.at if d.at is not None else (max(ts) if ts else 0.0)
    lo, hi = (min(ts), max(ts)) if ts else (ref - 1.0, ref)
    if hi - lo < 0.2:
        lo, hi = lo - 0.5, hi + 0.1
    hi += (hi - lo) * 0.03

    def x(t: float) -> float:
        return MEM_LEFT + (t - lo) / (hi - lo) * pw

    def y(v: float) -> float:
        return MEM_TOP + ph - min(v, top) / top * ph

    out = [f'<svg class="chart memory-chart" data-worker="{esc(d.worker, 200)}" data-incarnation="{d.incarnation}" '
           f'data-samples="{len(m.samples)}" data-readings="{len(m.readings)}" width="{MEM_WIDTH}" '
           f'height="{MEM_HEIGHT}" viewBox="0 0 {MEM_WIDTH} {MEM_HEIGHT}" role="img" '
           f'aria-label="memory of {esc(d.worker, 200)} incarnation {d.incarnation}">']
    _, ticks = _byte_ticks(top)
    for v in ticks:
        out.append(f'<line x1="{MEM_LEFT}" y1="{_f(y(v))}" x2="{MEM_LEFT + pw}" y2="{_f(y(v))}" stroke="#e9ecef"/>'
                   f'<text class="small" x="{MEM_LEFT - 6}" y="{_f(y(v) + 4)}" text-anchor="end">'
                   f'{esc(format_bytes(v) if v else "0")}</text>')
    step = nice_step(hi - lo, 5)
    first = math.ceil((lo - ref) / step)
    for k in range(first, first + _tick_count(hi - (ref + first * step), step)):
        xx = x(ref + k * step)
        out.append(f'<line x1="{_f(xx)}" y1="{MEM_TOP + ph}" x2="{_f(xx)}" y2="{MEM_TOP + ph + 4}" stroke="#868e96"/>'
                   f'<text class="small" x="{_f(xx)}" y="{MEM_TOP + ph + 16}" text-anchor="middle">'
                   f'{esc(fmt_dur(k * step))}</text>')
    out.append(f'<text class="small" x="{MEM_LEFT + pw}" y="{MEM_HEIGHT - 3}" text-anchor="end">'
               f'time relative to the {"death" if d.at is not None else "last sample"}</text>')
    out.append(f'<rect x="{MEM_LEFT}" y="{MEM_TOP}" width="{pw}" height="{ph}" fill="none" stroke="#adb5bd"/>')
    if m.limit:
        yy = y(m.limit)
        out.append(f'<line class="limit" x1="{MEM_LEFT}" y1="{_f(yy)}" x2="{MEM_LEFT + pw}" y2="{_f(yy)}" '
                   f'stroke="{LIMIT}" stroke-width="1.5" stroke-dasharray="6 3"/>'
                   f'<text class="small" x="{MEM_LEFT + 4}" y="{_f(yy - 4)}" style="fill:{LIMIT}">'
                   f'limit {esc(format_bytes(m.limit))}</text>')
    if m.terminate_at:
        yy = y(m.terminate_at)
        out.append(f'<line class="terminate" x1="{MEM_LEFT}" y1="{_f(yy)}" x2="{MEM_LEFT + pw}" y2="{_f(yy)}" '
                   f'stroke="{TERMINATE}" stroke-width="1.5" stroke-dasharray="2 3"/>'
                   f'<text class="small" x="{MEM_LEFT + 4}" y="{_f(yy + 13)}" style="fill:{TERMINATE}">'
                   f'terminate {esc(format_bytes(m.terminate_at))} ({m.terminate_fraction:.0%})</text>')
    if m.samples:
        pts = " ".join(f"{_f(x(t))},{_f(y(v))}" for t, v in m.samples)
        base = MEM_TOP + ph
        first, last = m.samples[0][0], m.samples[-1][0]
        out.append(f'<polygon class="rss-area" points="{_f(x(first))},{base} {pts} {_f(x(last))},{base}" '
                   f'fill="{RSS}" fill-opacity="0.12"/>')
        out.append(f'<polyline class="rss" points="{pts}" fill="none" stroke="{RSS}" stroke-width="2" '
                   f'stroke-linejoin="round"><title>RSS, {len(m.samples)} samples by the nanny</title></polyline>')
        if len(m.samples) <= 80:
            for t, v in m.samples:
                out.append(f'<circle class="sample" cx="{_f(x(t))}" cy="{_f(y(v))}" r="2.5" fill="{RSS}">'
                           f'<title>{esc(format_bytes(v))} at {esc(fmt_dur(t - ref))}</title></circle>')
    for t, v in m.readings:
        out.append(f'<circle class="reading" cx="{_f(x(t))}" cy="{_f(y(v))}" r="4.5" fill="#fff" stroke="{RSS}" '
                   f'stroke-width="2"><title>{esc(format_bytes(v))} stated by a log line at {esc(fmt_dur(t - ref))}'
                   f'</title></circle>')
    if d.at is not None:
        xx, c = x(d.at), _colour(d.cause)
        out.append(f'<line class="death-line" x1="{_f(xx)}" y1="{MEM_TOP}" x2="{_f(xx)}" y2="{MEM_TOP + ph}" '
                   f'stroke="{c}" stroke-width="2"><title>{esc(f"{d.cause}/{d.detail}")}</title></line>'
                   f'<text class="small" x="{_f(xx - 4)}" y="{MEM_TOP + ph - 6}" text-anchor="end" style="fill:{c}">'
                   f'{esc(d.detail, 30)}</text>')
        if not m.samples and d.cause == "nanny_memory_restart" and m.terminate_at:
            # the nanny said memory crossed the terminate line here, without saying how far
            yy = y(m.terminate_at)
            out.append(f'<polygon class="crossed" points="{_f(xx)},{_f(yy - 7)} {_f(xx + 7)},{_f(yy)} '
                       f'{_f(xx)},{_f(yy + 7)} {_f(xx - 7)},{_f(yy)}" fill="{c}"><title>the nanny reported memory '
                       f'above the terminate line here</title></polygon>')
    if not m.samples:
        out.append(f'<text class="small" x="{MEM_LEFT + pw / 2}" y="{MEM_TOP + ph / 2}" text-anchor="middle">'
                   f'no memory samples in these logs</text>')
    out.append('</svg>')
    return "".join(out)


def charted(d: Death) -> bool:
    """Whether ``d`` gets a memory chart: the logs show its memory (samples, readings) or that it crossed
    the nanny's terminate line. A limit alone is listed as text, not drawn as an empty chart."""
    m = d.memory
    return m is not None and bool(m.samples or m.readings or (d.cause == "nanny_memory_restart" and m.terminate_at))


def memory_section(report: Report) -> str:
    """Per worker, a panel for each charted death; failures whose logs state only a limit, as a list."""
    by_worker: dict[str, list[tuple[int, Death]]] = {}
    limit_only = []
    for i, d in enumerate(report.deaths):
        if charted(d):
            by_worker.setdefault(d.worker, []).append((i, d))
        elif d.failure and d.memory is not None and d.memory.limit:
            limit_only.append((i, d))
    out = []
    if not any(d.memory is not None and d.memory.samples for d in report.deaths):
        out.append('<p class="note" id="no-samples">No memory samples in these logs: kwdiag\'s nanny records them in '
                   'the run directory\'s JSONL files (<code>worker-exit</code> events); Dask text logs state only '
                   'the limit and a few warnings.' + (' The charts show what the lines state.' if by_worker else '')
                   + '</p>')
    for w, ds in by_worker.items():
        top = max([v for _, d in ds for v in (d.memory.limit, d.memory.peak, d.memory.terminate_at)
                   if v and math.isfinite(v)] or [1.0])
        top *= 1.08
        out.append(f'<section class="memory-worker" data-worker="{esc(w, 200)}"><h3>{esc(w)}</h3>')
        if len(ds) > MAX_PANELS:
            out.append(f'<p class="note">{len(ds) - MAX_PANELS} earlier death(s) of this worker not drawn; the '
                       f'last {MAX_PANELS} are.</p>')
            ds = ds[-MAX_PANELS:]
        out.append('<div class="panels">')
        for i, d in ds:
            m = d.memory
            bits = [f"peak {format_bytes(m.peak)}" if m.peak else None,
                    f"limit {format_bytes(m.limit)}" if m.limit else None,
                    f"{len(m.samples)} sample{'s' if len(m.samples) != 1 else ''}" if m.samples else "no samples",
                    f"{len(m.readings)} reading(s) from log lines" if m.readings else None]
            cap = (f'<a href="#death-{i}">#{d.incarnation}</a> <span class="badge" '
                   f'style="background:{_colour(d.cause)}">{esc(d.cause)}/{esc(d.detail, 60)}</span> '
                   + esc(", ".join(b for b in bits if b)))
            out.append(f'<figure><figcaption>{cap}</figcaption>{memory_svg(d, top)}</figure>')
        out.append('</div></section>')
    if limit_only:
        out.append('<p>Deaths whose logs state only the memory limit:</p><ul class="memory-known">')
        out.extend(f'<li><a href="#death-{i}">{esc(d.worker)} #{d.incarnation}</a> {esc(d.cause)}/{esc(d.detail)}: '
                   f'limit {esc(format_bytes(d.memory.limit))}, no samples or readings</li>' for i, d in limit_only)
        out.append('</ul>')
    return "".join(out)


# ---------------------------------------------------------------- text sections


MAX_GROUP_ROWS = 200  # deaths listed per group; the JSON report keeps every one


def _group_card(g: DeathGroup, index: dict[int, int], report: Report) -> str:
    """One group: what happened, to whom, the lines that prove it, its fix, and its deaths (each with an
    anchor the timeline's markers link to)."""
    d = g.deaths[0]
    c = _colour(g.cause)
    out = [f'<div class="death group" id="group-{g.id}" style="border-left-color:{c}">'
           f'<h3>[{g.id}] {len(g.deaths)}× <span class="badge" style="background:{c}">{esc(g.cause)}</span> '
           f'{esc(g.detail)}</h3>']
    if d.summary:
        out.append(f"<p>{esc(d.summary)}</p>")
    if d.alternatives:
        out.append("<p>Could be " + ", ".join(f"<code>{esc(a)}</code>" for a in d.alternatives)
                   + ": the lines cannot tell which.</p>")
    out.append(f'<p class="meta">{esc(who(g.deaths, 8), 400)}' + (f"; task {esc(g.task, 120)}" if g.task else "")
               + "</p>")
    if d.stack:
        frames, _ = crash_frames(d.stack, brief=True)
        out.append("<p>crashed in " + " ← ".join("…" if f is None else f"<code>{esc(str(f), 200)}</code>"
                                                 for f in frames) + "</p>")
    if g.cause != "chose_to_exit":
        proving = proof(d)
        if proving:
            out.append('<div class="ev">' + "\n".join(
                f'<span class="loc">{esc(e.file, 200)}:{e.line}</span>: {esc(e.text, 600)}' for e in proving) + "</div>")
        hint = hint_for(d.hints, report.runtimes)
        if hint is not None:
            out.append(f'<div class="fix"><b>fix ({esc(hint.runtime)})</b>: {esc(hint.text, 1000)}</div>')
    rows = []
    for x in g.deaths[:MAX_GROUP_ROWS]:
        rows.append(f'<tr id="death-{index[id(x)]}"><td>{esc(x.worker, 60)}</td><td>{x.incarnation}</td>'
                    f'<td>{esc(when(x.at))}</td><td>{conf(x.confidence)}</td><td>{x.pid or ""}</td>'
                    f'<td>{esc(", ".join(x.running[:3]), 200)}</td></tr>')
    more = (f'<p class="note">{len(g.deaths) - MAX_GROUP_ROWS} more in the JSON report.</p>'
            if len(g.deaths) > MAX_GROUP_ROWS else "")
    out.append(f'<details><summary>every death in this group ({len(g.deaths)})</summary><div class="scroll"><table>'
               f'<tr><th>worker</th><th>#</th><th>ended</th><th>confidence</th><th>pid</th><th>running</th></tr>'
               f'{"".join(rows)}</table></div>{more}</details></div>')
    return "".join(out)


def render_html(report: Report, title: str = "kwdiag explain") -> str:
    """The whole page as one string."""
    groups = group_deaths(report.deaths)
    parts = _head(report, title) + _summary(report, groups)
    parts += ['<h2>Timeline</h2>', _legend(report), timeline_svg(report), '<h2>Memory</h2>', memory_section(report)]
    if report.deaths:
        parts.append('<h2>Deaths by cause</h2>')
        index = {id(d): i for i, d in enumerate(report.deaths)}
        parts.extend(_group_card(g, index, report) for g in groups)
    parts += _killed_worker_cards(report) + _lists(report)
    parts.append('<p class="meta">Made by kwdiag explain. This page loads nothing from anywhere.</p></body></html>')
    return "\n".join(parts) + "\n"


def _head(report: Report, title: str) -> list[str]:
    fails = bool(report.failures or report.killed_workers or report.task_errors)
    return ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
            f"<h1>{esc(title)}</h1>",
            f'<p class="meta">{len(report.files)} file(s), {report.events} events, '
            f'{esc(", ".join(report.runtimes) or "unknown")} logs, from {esc(when(report.first_ts, utc=True))} to '
            f'{esc(when(report.last_ts, utc=True))}</p>',
            f'<p class="verdict{"" if fails else " ok"}" id="verdict">{esc(report.verdict(), 2000)}</p>']


def _summary(report: Report, groups: list[DeathGroup]) -> list[str]:
    """What to do (one fix per group) and the table of groups."""
    parts = []
    todo = [(g, hint_for(g.deaths[0].hints, report.runtimes)) for g in groups if g.cause != "chose_to_exit"]
    todo = [(g, h) for g, h in todo if h is not None]
    if todo:
        parts.append('<h2>What to do</h2><ul id="what-to-do">')
        parts.extend(f'<li><a href="#group-{g.id}">[{g.id}]</a> <b>{len(g.deaths)}× {esc(g.label)}</b>'
                     + (f" (task <code>{esc(g.task, 120)}</code>)" if g.task else "")
                     + f': <span class="fixtext">{esc(h.text, 1000)}</span></li>' for g, h in todo)
        parts.append("</ul>")
    if groups:
        rows = "".join(
            f'<tr><td><a href="#group-{g.id}">{g.id}</a></td><td>{len(g.deaths)}</td><td><span class="badge" '
            f'style="background:{_colour(g.cause)}">{esc(g.cause)}</span></td><td>{esc(g.detail, 60)}</td>'
            f'<td>{esc(g.task or "", 80)}</td><td>{esc(who(g.deaths, 8), 300)}</td></tr>' for g in groups)
        parts.append('<div class="scroll"><table id="groups"><tr><th>group</th><th>deaths</th><th>cause</th>'
                     '<th>detail</th><th>task</th><th>workers</th></tr>' + rows + "</table></div>")
    return parts


def _killed_worker_cards(report: Report) -> list[str]:
    if not report.killed_workers:
        return []
    parts = ['<h2>KilledWorker</h2>']
    for k in report.killed_workers:
        parts.append(f'<div class="death" style="border-left-color:#212529"><h3>task {esc(k.task, 200)}: '
                     f'{esc(BLAME[k.fair])}</h3><ul>')
        parts.extend(f"<li>counted: {esc(d.worker)} #{d.incarnation} at {esc(when(d.at))}: "
                     f"{esc(d.cause)}/{esc(d.detail)}</li>" for d in k.deaths)
        parts.extend(f"<li>{esc(r, 400)}</li>" for r in k.reasons)
        parts.append("</ul>")
        if k.evidence:
            parts.append('<div class="ev">' + "\n".join(
                f'<span class="loc">{esc(e.file, 200)}:{e.line}</span>: {esc(e.text, 600)}'
                for e in k.evidence[:6]) + "</div>")
        parts.extend(f'<div class="fix"><b>fix ({esc(h.runtime)})</b>: {esc(h.text, 1000)}</div>' for h in k.hints)
        parts.append("</div>")
    return parts


def _lists(report: Report) -> list[str]:
    """Task errors, cluster notes and input problems."""
    parts = []
    if report.task_errors:
        parts.append(f'<h2>Task errors (a task raised; no worker died): {len(report.task_errors)}</h2><ul>')
        for t in report.task_errors[:50]:
            ev = t.evidence[0] if t.evidence else None
            where = f' <span class="meta">({esc(ev.file, 200)}:{ev.line})</span>' if ev else ""
            parts.append(f"<li><code>{esc(t.task or '?', 120)}</code>: {esc(t.exception or '?', 120)}{where}</li>")
        parts.append("</ul>")
    if report.notes:
        parts.append(f"<h2>Cluster notes (not worker deaths): {len(report.notes)}</h2><ul>")
        for n in report.notes[:50]:
            ev = n.evidence[0] if n.evidence else None
            where = f' <span class="meta">({esc(ev.file, 200)}:{ev.line})</span>' if ev else ""
            parts.append(f"<li><b>{esc(n.title, 200)}</b>: {esc(n.text, 600)}{where}</li>")
        parts.append("</ul>")
    if report.problems:
        parts.append("<h2>Input problems</h2><ul>")
        parts.extend(f"<li>{esc(p.level)}: {esc(p.path, 200)}: {esc(p.message, 400)}</li>" for p in report.problems)
        parts.append("</ul>")
    return parts
