"""Turn candidate lines into ``Event``s: kwdiag JSONL lines, and text lines through the line rules.

Covers: timestamps of the layouts seen in real logs (Dask/kwdiag ``2026-11-21 09:53:19,534 - logger
- LEVEL - msg``, ISO 8601 prefixes as in ``kubectl logs --timestamps``, ``dmesg -T``), continuation
lines (tracebacks, faulthandler dumps) taking the time of the record they belong to, the per-file
worker context (the worker and incarnation address whose log this is, from ``Start worker at`` /
``Worker name`` lines), which runtime wrote a file, and input problems (``InputProblem``).

Does not cover: interpreting events (``kwdiag.timeline``). Dask's text timestamps are local time
without a zone; they are read in the local zone of the machine running ``kwdiag`` (set ``TZ`` to
the zone of the machine that wrote them).
"""

from __future__ import annotations

import bisect
import calendar
import dataclasses
import itertools
import json
import os
import re
import sys
import time
from collections import Counter
from dataclasses import field
from typing import Any, Callable, Iterable

from kwdiag.engine import MATCH_TIMEOUT, RuleSet, RuleTimeouts
from kwdiag.escape import clean
from kwdiag.events import Event, EventDecodeError, Origin, from_json_line
from kwdiag.kinds import CONNECTION, DUPLICATED_BY_EVENTS, END, NEAR_REMOVAL
from kwdiag.readers import jsonlog, notebook, pyrepr
from kwdiag.readers.dumps import attach_dumps
from kwdiag.readers.inputs import Input, InputProblem, expand_inputs
from kwdiag.readers.pyrepr import ValueLine
from kwdiag.readers.scan import MAX_LINE, InputUnreadable, Lookback, ScanStats, scan, scan_bytes
from kwdiag.readers.shapes import is_noise, unwrap, unwrap_from
from kwdiag.records import record

DASK_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:[,.](\d+))?(Z|[+-]\d\d:?\d\d)?\s+-\s+(\S+)\s+-\s+([A-Z]+)\s+-\s?(.*)$"
)
ISO_PREFIX = re.compile(r"^\[?(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:[,.](\d+))?(Z|[+-]\d\d:?\d\d)?\]?\s")
# In a custom ``logging`` format ("[%(asctime)s] %(levelname)-8s %(name)s: %(message)s" and the like) the level
# and Dask's logger follow the stamp in some order: found near the line's start.
CUSTOM_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
DASK_LOGGER = re.compile(rb"[\s\[(]distributed\.(?:worker|nanny|scheduler|core|dask_worker|comm)\b")
CUSTOM_LOGGER = re.compile(r"\b(distributed(?:\.\w+)*|kwdiag(?:\.\w+)*|tornado\.\w+)\b")
DMESG_T = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]")
IMPOSSIBLE_STAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")  # a stamp's shape (its value did not parse)
TS_MIN, TS_MAX = -1e10, 253402300800.0  # event times a calendar can show (years 1653 to 9999)
LEVELS = {"DEBUG": "debug", "INFO": "info", "WARNING": "warning", "ERROR": "error", "CRITICAL": "critical"}

_local_cache: dict[str, float] = {}


def _epoch(date: str, hms: str, frac: str | None, tz: str | None) -> float | None:
    """Seconds since the epoch of a stamp's parts; None for a stamp no clock shows (month 13, 25:61)."""
    try:
        return _epoch_of(date, hms, frac, tz)
    except (ValueError, OverflowError):
        return None


def _epoch_of(date: str, hms: str, frac: str | None, tz: str | None) -> float:
    key = date + hms + (tz or "")
    second = _second_cache.get(key)   # a busy log's lines share their seconds
    if second is None:
        second = _second_of(date, hms, tz)
        if len(_second_cache) > 100_000:
            _second_cache.clear()
        _second_cache[key] = second
    if frac:
        return second + int(frac[:6]) / 10 ** min(len(frac), 6)
    return second


_second_cache: dict[str, float] = {}


def _second_of(date: str, hms: str, tz: str | None) -> float:
    # Cached per hour (a time zone shifts its clock on the hour, never within one): a busy log has a new
    # second on nearly every line, and strptime + mktime per line were a third of reading a candidate line.
    key = date + hms[:2] + (tz or "")
    base = _local_cache.get(key)
    if base is None:
        st = time.strptime(date + " " + hms[:2], "%Y-%m-%d %H")
        if tz is None:
            base = time.mktime(st)
        else:
            base = float(calendar.timegm(st))
            if tz != "Z":
                sign = 1 if tz[0] == "+" else -1
                hh, mm = int(tz[1:3]), int(tz[-2:])
                base -= sign * (hh * 3600 + mm * 60)
        if len(_local_cache) > 100_000:
            _local_cache.clear()
        _local_cache[key] = base
    minutes, seconds = int(hms[3:5]), int(hms[6:8])
    if minutes > 59 or seconds > 61:
        raise ValueError(f"not a time of day: {hms}")
    return base + minutes * 60 + seconds


def parse_prefix(text: str) -> tuple[float | None, str | None, str | None, str]:
    """(ts, logger, level, message) of one text line; ts None when the line carries no time."""
    m = DASK_LINE.match(text)
    if m:
        d, hms, frac, tz, logger, level, msg = m.groups()
        return _epoch(d, hms, frac, tz), logger, LEVELS.get(level, "info"), msg
    m = ISO_PREFIX.match(text)
    if m:
        d, hms, frac, tz = m.groups()
        rest = text[m.end():]
        level, logger = CUSTOM_LEVEL.search(rest, 0, 40), CUSTOM_LOGGER.search(rest, 0, 80)
        return (_epoch(d, hms, frac, tz), logger.group(1) if logger else None,
                LEVELS[level.group(1)] if level else None, rest)
    m = DMESG_T.match(text)
    if m:
        try:
            return time.mktime(time.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")), None, None, text[m.end():].strip()
        except ValueError:
            pass
    return None, None, None, text


_SURROGATE_ESCAPE = re.compile(r"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}(?:\\u[dD][c-fC-F][0-9a-fA-F]{2})?|\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _logging_record(stripped: str) -> dict | None:
    """The JSON logging record a line starting with ``{`` is, or None (``kwdiag.readers.jsonlog``)."""
    return jsonlog.parse(_no_lone_surrogates(stripped) if "\\u" in stripped else stripped)


def _no_lone_surrogates(line: str) -> str:
    """A JSON line with every escaped lone surrogate (``\\ud800``) replaced by ``\\ufffd``: decoded, such a
    string could be read but never written (every output would fail to encode it)."""
    return _SURROGATE_ESCAPE.sub(lambda m: m.group() if len(m.group()) in (2, 12) else "\\ufffd", line)


@record
class FileResult:
    name: str
    events: list[Event] = field(default_factory=list)
    problems: list[InputProblem] = field(default_factory=list)
    runtime: str | None = None
    json_events: int = 0
    lines: int = 0
    bytes: int = 0


class _FileState:
    def __init__(self, name: str, rules: RuleSet, timeouts: RuleTimeouts):
        self.name = name
        self.rules = rules
        self.timeouts = timeouts
        self.events: list[Event] = []
        self.last_ts: float | None = None
        self.bad_utf8 = 0
        self.first_bad_utf8: int | None = None
        self.bad_json = 0
        self.first_bad_json: tuple[int, str] | None = None
        # Connection lines (kinds.CONNECTION) tell anything only when a removal follows within NEAR_REMOVAL lines
        # (a long-running scheduler prints one per client session: millions). The prefilter does not look for
        # them (engine.deferred_keywords); at a removal the reader reads the lines before it, once.
        self.lookback = Lookback(NEAR_REMOVAL)
        self._read_to = 0  # the lines up to this one were read for an earlier removal
        self._only: dict[int, bool] = {}  # id of a candidates tuple -> all its rules emit a connection line
        self.bad_times = 0  # lines stamped with a time no clock shows (month 13, 25:61)
        self.first_bad_time: int | None = None
        self.json_events = 0
        self.json_records = 0  # JSON logging records (not kwdiag events)
        # A log with printed values among its lines (``_read_mixed``): the number that orders a line of the log
        # among the values' lines (the line itself is still the one shown).
        self.renumber: Callable[[int], int] | None = None

    def on_line(self, lineno: int, raw: bytes, prev: bytes | None) -> None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", "replace")
            self.bad_utf8 += 1
            if self.first_bad_utf8 is None:
                self.first_bad_utf8 = lineno
        text = text.rstrip("\r")
        self.timeouts.where = (self.name, lineno)
        stripped = text.lstrip()
        if stripped.startswith("{") and '"v"' in stripped[:8]:
            if "\\u" in stripped:
                stripped = _no_lone_surrogates(stripped)
            try:
                ev = from_json_line(stripped, Origin(self.name, lineno))
            except EventDecodeError as exc:
                self.bad_json += 1
                if self.first_bad_json is None:
                    self.first_bad_json = (lineno, str(exc))
                return
            if not TS_MIN <= ev.ts < TS_MAX:
                self.bad_json += 1
                if self.first_bad_json is None:
                    self.first_bad_json = (lineno, "'ts' is not a time between 1653 and 9999")
                return
            self.json_events += 1
            self.events.append(ev)
            self.last_ts = ev.ts
            self.events.extend(events_from_tail(ev, self.rules, self.timeouts))
            return
        if stripped.startswith("{"):
            record = _logging_record(stripped)
            if record is not None:  # a JSON logging record: read the line (and traceback) it carries
                self.json_records += 1
                first, *rest = jsonlog.text_lines(record)
                self._line(lineno, first, prev)
                anchor = first.encode("utf-8", "replace")
                for line in rest:
                    self._line(lineno, line, anchor)
                return
        self._line(lineno, text, prev)

    def on_value(self, lines: list[ValueLine], numbers: list[int] | None = None) -> None:
        """The log lines of a printed Python value (``pyrepr``), in time order: each one's place in that order
        (or ``numbers``, one per line) orders its event, the line it was printed on is shown, its dict key (a
        worker's address, ``Scheduler``) says whose line it is. Every line is read, connection lines too (a value
        is small, and there is no scanner to read back from at a removal)."""
        self._read_to = 1 << 62
        for position, line in enumerate(lines, 1):
            self.timeouts.where = (self.name, line.lineno)
            number = position if numbers is None else numbers[position - 1]
            self._text_line(number, line.text, None, self.rules.candidates(line.text), line.key, line.lineno)

    def _line(self, lineno: int, text: str, prev: bytes | None) -> None:
        candidates = self.rules.candidates(text)
        if candidates and self._only_connection(candidates):
            return   # read only if a removal follows (_read_before); the prefilter passed it for another anchor
        self._text_line(lineno, text, prev, candidates)

    def _only_connection(self, candidates: tuple) -> bool:
        only = self._only.get(id(candidates))
        if only is None:
            only = self._only[id(candidates)] = all(r.emit_kind in CONNECTION for r in candidates)
        return only

    def _text_line(self, lineno: int, text: str, prev: bytes | None, candidates: tuple, key: str | None = None,
                   shown: int | None = None) -> None:
        if is_noise(text):
            return
        if shown is None and self.renumber is not None:
            lineno, shown = self.renumber(lineno), lineno
        origin = Origin(self.name, lineno, shown)
        unwrapped, wrapper_ts, who = unwrap_from(text)
        who = who or key
        if unwrapped != text:
            text, candidates = unwrapped, None  # the wrapper's prefix gone: look for the rules again
        ts, logger, level, msg = parse_prefix(text)
        if ts is None and IMPOSSIBLE_STAMP.match(text):
            self.bad_times += 1
            self.first_bad_time = self.first_bad_time or (shown or lineno)
        if ts is None:
            ts = wrapper_ts
        if ts is None:
            if prev is not None:
                ts = parse_prefix(unwrap(prev.decode("utf-8", "replace"))[0])[0]
            if ts is None:
                ts = self.last_ts
        else:
            self.last_ts = ts
        for rule, groups in self.rules.match_line(text, self.timeouts, candidates):
            self._emit(rule, groups, ts, level, clean(text), origin, who)

    def _emit(self, rule, groups: dict[str, Any], ts: float | None, level: str | None, text: str,
              origin: Origin, who: str | None = None) -> None:
        fields: dict[str, Any] = dict(rule.emit_fields)
        fields.update(groups)
        fields["rule"] = rule.id
        if who is not None:  # the collector's prefix: which process said it, in a file several share
            fields["stream"] = who
        # Whether the line speaks for the process whose log this is (the timeline attributes it within
        # the file) or names whom it is about itself (the scheduler's lines, the environment's).
        fields["ctx"] = rule.context
        worker = fields.pop("worker", None)
        if ts is None:
            fields["ts_unknown"] = True
        if rule.emit_kind == "worker-removed" and origin.at > self._read_to:
            self._read_before(origin.at)   # the file's own line numbers: the scanner's look-back counts in them
        self.events.append(Event(
            ts=ts if ts is not None else 0.0,
            source=rule.emit_source,
            kind=rule.emit_kind,
            worker=str(worker) if worker is not None else None,
            fields=fields,
            level=level or ("error" if rule.severity == "error" else "info"),
            message=text,
            origin=origin,
        ))

    def _read_before(self, removal_line: int) -> None:
        """Read the connection lines among the NEAR_REMOVAL lines before a removal (in order, before it), each
        once: lines an earlier removal already read are not read again."""
        earlier = [x for x in self.lookback.lines(NEAR_REMOVAL) if x[0] > self._read_to]
        self._read_to = removal_line
        last_ts, where = self.last_ts, self.timeouts.where
        for lineno, raw, prev in earlier:
            text = raw.decode("utf-8", "replace").rstrip("\r")
            stripped = text.lstrip()
            if stripped.startswith("{"):   # a JSON logging record: its message line (a kwdiag event is never one)
                record = _logging_record(stripped)
                if record is None:
                    continue
                text = jsonlog.text_lines(record)[0]
            candidates = self.rules.candidates(text)
            if candidates and self._only_connection(candidates):
                self.timeouts.where = (self.name, lineno)
                self._text_line(lineno, text, prev, None)
        self.last_ts, self.timeouts.where = last_ts, where


def events_from_tail(ev: Event, rules: RuleSet, timeouts: RuleTimeouts | None = None) -> list[Event]:
    """Evidence inside a kwdiag ``worker-exit`` event's ``stderr_tail`` (faulthandler dumps, tracebacks)."""
    tail = ev.fields.get("stderr_tail")
    if not tail:
        return []
    if isinstance(tail, str):
        tail = tail.splitlines()
    out = []
    for line in list(tail)[-200:]:
        if not isinstance(line, str):
            continue
        for rule, groups in rules.match_line(line[:MAX_LINE], timeouts):
            fields = dict(rule.emit_fields)
            fields.update(groups)
            fields.update(rule=rule.id, via="stderr_tail")
            fields.pop("worker", None)
            if ev.fields.get("pid") is not None:
                fields.setdefault("pid", ev.fields.get("pid"))
            if ev.fields.get("incarnation") is not None:
                fields.setdefault("incarnation", ev.fields.get("incarnation"))
            out.append(Event(ts=ev.ts, source=rule.emit_source, kind=rule.emit_kind, worker=ev.worker,
                             fields=fields, level="error", message=clean(line), host=ev.host, origin=ev.origin))
    return out


class Progress:
    """How far reading has got, for a progress display: bytes read of ``total`` (None when not known ahead: stdin,
    gzip), and the workers some end line was read about so far (a rough count of deaths, before analysis).
    ``finished`` is set, and ``events`` counted, for the last report: the reading is over and the analysis begins."""

    def __init__(self, total: int | None):
        self.total = total
        self.done = 0
        self.finished = False
        self.events = 0
        self._before = 0   # the bytes of the inputs already read
        self._ended: set = set()

    @property
    def workers_ended(self) -> int:
        return len(self._ended)

    def update(self, done_in_input: int, new_events: list[Event]) -> None:
        self.done = self._before + done_in_input
        for e in new_events:
            if e.kind in END:
                # A line that names no process (a nanny's `Restarting worker`) counts once per file: rough, but
                # never one per line, which counted each death three times over.
                self._ended.add(e.worker or e.get("address") or e.get("pid")
                                or (e.origin.file if e.origin is not None else None, "unnamed"))

    def next_input(self, nbytes: int) -> None:
        self._before += nbytes
        self.done = self._before


def _total_bytes(inputs: list[Input]) -> int | None:
    """The bytes the inputs hold, when every one is a plain file (a gzip's decompressed size is not known ahead)."""
    total = 0
    for inp in inputs:
        if inp.path is None:
            return None
        try:
            with open(inp.path, "rb") as f:
                if f.read(2) == b"\x1f\x8b":
                    return None
                total += os.fstat(f.fileno()).st_size
        except OSError:
            continue
    return total


def _runtime_of(head: bytes, json_events: int) -> str | None:
    # Dask's text layout, its JSON logging records, or a custom format naming Dask's loggers
    if b" - distributed." in head or b'"distributed.' in head or DASK_LOGGER.search(head):
        return "dask"
    if json_events or b" - kwdiag." in head:
        return "kwdiag"
    return None


def _reading_problems(name: str, stats, state: "_FileState", timeouts: RuleTimeouts) -> list[InputProblem]:
    """What went wrong while reading one input, as warnings and errors for the report (nothing raises)."""
    problems = []
    if stats.bytes == 0:
        problems.append(InputProblem(name, "empty input", "warning"))
    if stats.truncated:
        problems.append(InputProblem(name, stats.truncated))
    if stats.long_lines:
        problems.append(InputProblem(
            name, f"{stats.long_lines} line(s) longer than {MAX_LINE // (1 << 20)} MiB (first at line "
            f"{stats.first_long_line}); only their first {MAX_LINE // (1 << 20)} MiB were read", "warning"))
    try:
        stats.head.decode("utf-8")
        head_ok = True
    except UnicodeDecodeError as exc:
        head_ok = exc.start >= len(stats.head) - 4  # a character cut at the block end is fine
    if state.bad_utf8 or not head_ok:
        where = f" (first at line {state.first_bad_utf8})" if state.first_bad_utf8 else ""
        problems.append(InputProblem(name, f"invalid UTF-8{where}; undecodable bytes were replaced", "warning"))
    for (rid, file), (n, line, path) in timeouts.hits.items():
        if file == name:
            problems.append(InputProblem(
                name, f"rule {rid} ({path}): a pattern ran longer than the {MATCH_TIMEOUT:g} s match timeout on "
                f"{n} line(s) (first at line {line}) and counted as not matching there"
                + ("; the rule was switched off for the rest of this run" if timeouts.off(rid) else ""), "warning"))
    if state.bad_times:
        problems.append(InputProblem(
            name, f"{state.bad_times} line(s) stamped with a time no clock shows (first at line "
            f"{state.first_bad_time}); each took the time of the line before it", "warning"))
    if state.bad_json:
        ln, why = state.first_bad_json
        problems.append(InputProblem(
            name, f"{state.bad_json} line(s) look like kwdiag events but could not be decoded "
            f"(first at line {ln}: {why})", "warning"))
    return problems


def read_input(inp: Input, rules: RuleSet, timeouts: RuleTimeouts | None = None,
               on_block: Callable[[int, list[Event]], None] | None = None) -> FileResult:
    """Read one input; never raises for bad input (problems are returned instead).

    ``timeouts`` is shared by the inputs of one run (rules that keep timing out are switched off).
    """
    res = FileResult(inp.name)
    if timeouts is None:
        timeouts = RuleTimeouts()
    state = _FileState(inp.name, rules, timeouts)
    try:
        tell = None if on_block is None else (lambda done: on_block(done, state.events))
        stats = _read_printed_value(inp, state, tell)
        if stats is None:
            stats = scan(inp.path, rules.prefilter, state.on_line, rules.anchors, tell, state.lookback)
    except InputUnreadable as exc:
        res.problems.append(InputProblem(inp.name, str(exc)))
        return res
    except IsADirectoryError:
        res.problems.append(InputProblem(inp.name, "is a directory"))
        return res
    except PermissionError:
        res.problems.append(InputProblem(inp.name, "permission denied"))
        return res
    except OSError as exc:
        res.problems.append(InputProblem(inp.name, f"cannot read: {exc.strerror or exc}"))
        return res
    if inp.path is not None and not stats.gzip and not stats.printed_value:
        attach_dumps(inp.path, state.events)
    res.events = state.events
    res.lines, res.bytes = stats.lines, stats.bytes
    res.runtime = _runtime_of(stats.head, state.json_events)
    res.json_events = state.json_events
    res.problems += _reading_problems(inp.name, stats, state, timeouts)
    return res


VALUE_MAX = 16 << 20   # a printed Python value is read whole (a notebook's output); larger inputs are scanned
MIXED_MAX = 4 << 20    # a log this small is looked through for printed values among its lines (a cell's output)


def _read_printed_value(inp: Input, state: _FileState, tell: Callable[[int], None] | None = None
                        ) -> ScanStats | None:
    """Read ``inp`` as a printed Python value holding log lines (``kwdiag.readers.pyrepr``: what a notebook shows
    of ``client.get_worker_logs()``), each key's lines in time order (Dask gives them newest first), or as a small
    log with such values among its lines (``_read_mixed``); None, having consumed nothing of a file, when it is
    neither. Stdin is read ahead (up to ``MIXED_MAX``, or ``VALUE_MAX`` when it starts as a value); what holds
    no value is then scanned from memory, and the rest of the stream after it, like any other input."""
    if inp.path is None:
        peek = getattr(getattr(sys.stdin, "buffer", None), "peek", None)   # a pipe's or a file's; not a test's
        head = peek(4096)[:4096] if peek is not None else b""
    else:
        if not os.path.isfile(inp.path) or os.path.getsize(inp.path) > VALUE_MAX:
            return None
        with open(inp.path, "rb") as f:
            head = f.read(4096)
    if head[:2] == b"\x1f\x8b":
        return _read_gzipped_value(inp.path, state) if inp.path is not None else None
    a_notebook = notebook.looks_like_notebook(head)
    whole = not a_notebook and pyrepr.looks_like_value(head.decode("utf-8", "replace"))
    limit = VALUE_MAX if whole or a_notebook else MIXED_MAX
    if inp.path is None:
        data = sys.stdin.buffer.read(limit + 1)
        if len(data) > limit:   # more than is read whole: scanned as it comes
            return scan_bytes(data, state.rules.prefilter, state.on_line, state.lookback, sys.stdin.buffer, tell)
    elif os.path.getsize(inp.path) <= limit:
        with open(inp.path, "rb") as f:
            data = f.read()
    else:
        return None
    stats = _read_value_in(data, a_notebook, whole, state)
    if stats is None and inp.path is None:
        return scan_bytes(data, state.rules.prefilter, state.on_line, state.lookback, on_block=tell)
    return stats


def _read_value_in(data: bytes, a_notebook: bool, whole: bool, state: _FileState) -> ScanStats | None:
    """``data`` read as a notebook, a printed value or a log with values among its lines; None when it is none."""
    held = notebook.notebook_text(data) if a_notebook else None
    if held is not None:
        return _read_notebook(data, *held, state)
    lines = (_json_document_lines(data) or pyrepr.log_lines(data.decode("utf-8", "replace"))) if whole else None
    if lines is not None:
        state.on_value(_in_time_order(lines))
        return ScanStats(bytes=len(data), lines=data.count(b"\n") + (not data.endswith(b"\n")), head=data[:65536],
                         printed_value=True)
    return _read_mixed(data, state) if len(data) <= MIXED_MAX else None


def _json_document_lines(data: bytes) -> list[pyrepr.ValueLine] | None:
    """The lines of a whole JSON document of log records (``jsonlog.records_in``: a collector's export), each as
    a JSON line of it would be read, in time order (``gcloud logging read`` gives the newest first), each shown at
    the line of the file that holds its text; None when ``data`` is not such a document."""
    if data.lstrip()[:1] not in (b"[", b"{"):
        return None
    try:
        records = jsonlog.records_in(json.loads(data))
    except (ValueError, RecursionError):
        return None
    if not records:
        return None
    text = data.decode("utf-8", "replace")
    shown: list[int] = []   # the file's line holding each record's text, found after the last one, as JSON spells it
    at, lineno = 0, 1
    for entry in records:
        found = text.find(json.dumps(jsonlog.carried_text(entry), ensure_ascii=False)[1:-1], at)
        if found >= 0:
            lineno += text.count("\n", at, found)
            at = found
        shown.append(lineno)
    times = [jsonlog.record_time(r) for r in records]
    order = list(range(len(records)))
    if all(t is not None for t in times):
        if sum(b < a for a, b in zip(times, times[1:])) > sum(b > a for a, b in zip(times, times[1:])):
            order.reverse()   # newest first: turned round, so that records of one time keep the order they came in
        order.sort(key=lambda k: times[k])
    return [pyrepr.ValueLine(shown[k], None, line) for k in order for line in jsonlog.text_lines(records[k])]


def _read_gzipped_value(path: str, state: _FileState) -> ScanStats | None:
    """A gzip file holding a notebook, a printed value or a small log with values among its lines (a cell's output
    saved compressed): read as the same file uncompressed would be. None when it holds none of them (or is not
    readable as gzip): then it is scanned as any gzip file, from its start."""
    import gzip
    import zlib

    try:
        with gzip.open(path) as f:
            head = f.read(4096)
            a_notebook = notebook.looks_like_notebook(head)
            whole = not a_notebook and pyrepr.looks_like_value(head.decode("utf-8", "replace"))
            limit = VALUE_MAX if whole or a_notebook else MIXED_MAX
            data = head + f.read(limit + 1 - len(head))
    except (OSError, EOFError, zlib.error):
        return None
    if len(data) > limit or not (a_notebook or whole or pyrepr.may_hold_values(data)):
        return None
    stats = _read_value_in(data, a_notebook, whole, state)
    if stats is not None:
        stats.gzip = True
    return stats


def _read_mixed(data: bytes, state: _FileState) -> ScanStats | None:
    """A log with printed values of log lines among its lines: a notebook cell's output, the cluster's own lines
    (stderr) before and after what ``print(client.get_worker_logs())`` shows. The values are read as values (their
    keys say whose each line is), the rest line by line; None when no value holds a log line. One numbering orders
    both as things happened: a value's lines take as many numbers as the value has log lines, and the log's lines
    after it move on by the difference (distances between lines keep their meaning). A log line that a value holds
    too (the cluster printed it to stderr and kept it) is read once, from the value."""
    if not pyrepr.may_hold_values(data):
        return None
    spans = pyrepr.values_among_lines(data.decode("utf-8", "replace"))
    if spans is None:
        return None
    ordered = _in_time_order([v for span in spans for v in span.lines])
    firsts = [span.first for span in spans]
    counts = Counter(bisect.bisect_right(firsts, v.lineno) - 1 for v in ordered)
    shifts = list(itertools.accumulate((counts[k] - (span.last - span.first + 1) for k, span in enumerate(spans)),
                                       initial=0))
    numbers, given = [], Counter()
    for v in ordered:
        k = bisect.bisect_right(firsts, v.lineno) - 1
        numbers.append(spans[k].first + shifts[k] + given[k])
        given[k] += 1
    lasts = [span.last for span in spans]
    state.renumber = lambda lineno: lineno + shifts[bisect.bisect_left(lasts, lineno)]
    stats = scan_bytes(_without_values(data, spans), state.rules.prefilter, state.on_line, state.lookback)
    state.renumber = None
    state.on_value(ordered, numbers)
    stats.bytes, stats.head = len(data), data[:65536]
    return stats


def _read_notebook(data: bytes, text: str, where: list[int], state: _FileState) -> ScanStats:
    """A Jupyter notebook (``kwdiag.readers.notebook``): its cells' outputs read as a pasted cell's output would be
    (log lines, printed values among them), each event shown at the line of the ``.ipynb`` that holds its text."""
    body = text.encode("utf-8")
    if _read_mixed(body, state) is None:
        scan_bytes(body, state.rules.prefilter, state.on_line, state.lookback)
    for i, e in enumerate(state.events):
        at = e.origin.at if e.origin is not None else 0
        if 1 <= at <= len(where):
            state.events[i] = dataclasses.replace(e, origin=Origin(e.origin.file, e.origin.line, where[at - 1]))
    return ScanStats(bytes=len(data), lines=data.count(b"\n") + (not data.endswith(b"\n")), head=body[:65536],
                     printed_value=True)


def _without_values(data: bytes, spans: list[pyrepr.Span]) -> bytes:
    """``data`` with the values' lines emptied, and each log line a value holds too (as often as one key holds
    it) cut to its time stamp: the numbering of the lines stays, and so does the time of the lines after it."""
    per_key: dict[str | None, Counter] = {}
    for span in spans:
        for v in span.lines:
            per_key.setdefault(v.key, Counter())[v.text] += 1
    held: Counter = Counter()
    for counts in per_key.values():
        held |= counts
    lines = data.split(b"\n")
    for span in spans:
        lines[span.first - 1: span.last] = [b""] * (span.last - span.first + 1)
    for i, line in enumerate(lines):
        if line:
            text = line.rstrip(b"\r").decode("utf-8", "replace")
            if held[text] > 0:
                held[text] -= 1
                stamp = _STAMP_ONLY.match(line)   # kept: the time of the untimed lines after it (a traceback)
                lines[i] = stamp.group() if stamp else b""
    return b"\n".join(lines)


# A line's time stamp with the rest of Dask's prefix (logger, level): what dates the untimed lines after it.
_STAMP_ONLY = re.compile(rb"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d+)?\s+-\s+\S+\s+-\s+[A-Z]+\s+-\s")


def _in_time_order(lines: list[pyrepr.ValueLine]) -> list[pyrepr.ValueLine]:
    """Each key's lines oldest first: reversed where their times run backwards (Dask's ``get_logs`` is newest
    first; a value printed some other way, or without times, keeps its order); a key that repeats an earlier
    key's lines (the nannies of one process) adds only the lines not seen before."""
    by_key: dict[str | None, list[pyrepr.ValueLine]] = {}
    for line in lines:
        by_key.setdefault(line.key, []).append(line)
    # A logger's records are kept per process, so the nannies of one process (a LocalCluster's) each return all of
    # them: a key whose lines mostly came under an earlier key is that process's log again, and only its lines not
    # seen yet are new. Separate processes (`dask worker` commands) share some lines word for word (the same
    # message in the same millisecond): under a key of their own those are each process's.
    seen: set[str] = set()
    out: list[pyrepr.ValueLine] = []
    for key, group in list(by_key.items()):
        texts = [x.text for x in group]
        if seen and sum(t in seen for t in texts) * 2 > len(texts):
            group = by_key[key] = [x for x in group if x.text not in seen]
        seen.update(texts)
    for group in by_key.values():
        times = [t for t in (parse_prefix(x.text)[0] for x in group) if t is not None]
        down = sum(b < a for a, b in zip(times, times[1:]))
        up = sum(b > a for a, b in zip(times, times[1:]))
        out.extend(reversed(group) if down > up else group)
    return out


def read_events(paths: Iterable[str], rules: RuleSet, on_progress: "Callable[[Progress], None] | None" = None
                ) -> tuple[list[Event], list[FileResult], list[InputProblem]]:
    """Read every input; events of all files merged by time (stable: file order within a tie). ``on_progress`` is
    told, after each block read, how far the reading is (``Progress``)."""
    inputs, problems = expand_inputs(paths)
    results = []
    events: list[Event] = []
    timeouts = RuleTimeouts()
    progress = Progress(total=_total_bytes(inputs))
    for inp in inputs:
        seen = 0

        def tell(done: int, file_events: list[Event]) -> None:
            nonlocal seen
            progress.update(done, file_events[seen:])
            seen = len(file_events)
            on_progress(progress)

        r = read_input(inp, rules, timeouts, tell if on_progress is not None else None)
        if on_progress is not None:
            progress.update(r.bytes, r.events[seen:])   # the lines read after the last block's report
        progress.next_input(r.bytes)
        results.append(r)
        problems.extend(r.problems)
    # kwdiag writes every fact twice: JSONL events and the same prose on stderr. With the events at hand,
    # the prose files (kwdiag text logs without events) would only count the same evidence twice.
    have_events = any(r.json_events for r in results)
    for r in results:
        if have_events and r.runtime == "kwdiag" and not r.json_events:
            r.events = [e for e in r.events if e.kind not in DUPLICATED_BY_EVENTS]
        events.extend(r.events)
    events.sort(key=lambda e: e.ts)
    if on_progress is not None:
        progress.finished, progress.events = True, len(events)
        on_progress(progress)
    return events, results, problems
