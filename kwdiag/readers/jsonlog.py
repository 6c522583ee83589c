"""JSON log records read as the text lines they carry. Pure.

Covers: one JSON object per line as logging's JSON formatters write them (python-json-logger, the usual
choice for ELK, Datadog and Loki; structlog's JSON renderer; ECS-style shippers): the message (``message``,
``msg``, ``event``), the logger (``name``, ``logger``, ``logger_name``, ``log.logger``), the level
(``levelname``, ``level``, ``log.level``, ``severity``), the time (logging's ``asctime``, ISO 8601
``timestamp`` / ``@timestamp`` / ``time`` / ``ts``, or epoch seconds ``created``), and a traceback
(``exc_info``, ``exc_text``, ``stack_info``, ``error.stack_trace``: a string with newlines or a list of
lines), in any field order. ``text_lines`` renders a record in Dask's text layout, ``TIME - LOGGER - LEVEL -
MESSAGE``, followed by its traceback's lines, so that the rules read a JSON log as they read Dask's own: one
record is one line's worth of evidence whatever its fields' order.

Also covers a collector's record around one raw line of a process's output, the line as the process printed it:
Docker's json-file driver and Fluentd / Fluent Bit (``log``, with ``time``; Fluent Bit's Kubernetes filter adds
``kubernetes.pod_name`` / ``container_name``), ``journalctl -o json`` (``MESSAGE``, ``__REALTIME_TIMESTAMP``,
``_HOSTNAME``, ``SYSLOG_IDENTIFIER``, and ``_STREAM_ID``, else ``_PID``), Loki's ``logcli --output=jsonl``
(``line``, ``timestamp``, ``labels``), Google Cloud Logging (``textPayload``, ``timestamp``, ``resource.labels``),
and a shipper's message with neither logger nor level beside it (CloudWatch, Filebeat). ``text_lines`` gives
such a line back in the text shape of the same collector's own text output (``journalctl -o short-iso``,
``kubectl logs --timestamps --prefix``, a compose-style ``name | `` prefix), which ``kwdiag.readers.shapes``
takes off: the collector's time is the line's when it has none of its own (a traceback's lines), and the
process it names is who said the line in a stream that merges several.

Does not cover: a raw line a collector split in parts (Docker cuts lines over 16 KiB; each part is read as a
line), a journal message that journald exports as an array of byte values (one that is not UTF-8 or holds control
characters: the prefilter, which reads the raw bytes, never sees its words), kwdiag's own JSONL events
(``kwdiag.events``), which carry their meaning in fields, or deciding that a line is JSON (the text reader tries
this only for a line that is a JSON object and not one of kwdiag's events).
"""

from __future__ import annotations

import calendar
import json
import time
from typing import Any

MESSAGE = ("message", "msg", "event")
LOGGER = ("name", "logger", "logger_name", "log.logger")
LEVEL = ("levelname", "level", "log.level", "severity")
TIME = ("asctime", "timestamp", "@timestamp", "time", "ts", "created")
TRACEBACK = ("exc_info", "exc_text", "stack_info", "error.stack_trace")
LEVELS = {"debug", "info", "warning", "warn", "error", "critical", "fatal"}


# Where a collector's record keeps the raw line (only when the record has no logging message of its own).
RAW_LINE = ("log", "line", "textPayload", "MESSAGE")
# Labels that name the process of a raw line (Loki's stream labels, Google Cloud Logging's resource labels),
# most particular first: several processes' lines merged into one export are told apart by them.
RAW_WHO = ("container", "container_name", "compose_service", "service_name", "filename", "instance", "job", "host",
           "hostname")


def parse(line: str) -> dict[str, Any] | None:
    """The record a line holds, or None when it is not a JSON object with a message or a collector's raw line."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    if not isinstance(_field(record, MESSAGE), str) and _raw_line(record) is None:
        return None
    return record


def records_in(document: Any) -> list[dict[str, Any]] | None:
    """The records of a whole JSON document that holds log records, or None: a list of them (``gcloud logging read
    --format=json``, a saved search's export), or the first list of them in an object (``aws logs get-log-events``'
    ``events``). A record is one ``parse`` would take; a list with none of them is not a log."""
    lists = [document] if isinstance(document, list) else [
        v for v in document.values() if isinstance(v, list)] if isinstance(document, dict) else []
    for items in lists:
        records = [x for x in items if isinstance(x, dict)
                   and (isinstance(_field(x, MESSAGE), str) or _raw_line(x) is not None)]
        if records:
            return records
    return None


def carried_text(record: dict[str, Any]) -> str:
    """The text a record carries (its message or its raw line) as the record holds it."""
    message = _field(record, MESSAGE)
    if isinstance(message, str):
        return message
    return next((record[k] for k in RAW_LINE if isinstance(record.get(k), str)), "")


def record_time(record: dict[str, Any]) -> float | None:
    """When a record says it was written (epoch seconds), for putting a newest-first export in time order."""
    for key in ("__REALTIME_TIMESTAMP", *TIME):
        value = record.get(key)
        if key == "__REALTIME_TIMESTAMP" and isinstance(value, str) and value.isdigit():
            return int(value) / 1e6
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value / 1000 if value > 1e11 else value   # milliseconds (CloudWatch)
        if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] in " T":
            try:
                base = calendar.timegm(time.strptime(value[:19].replace(" ", "T"), "%Y-%m-%dT%H:%M:%S"))
            except ValueError:
                return None
            frac = value[19:].lstrip(".,")
            digits = len(frac) - len(frac.lstrip("0123456789"))
            return base + (int(frac[:digits][:6]) / 10 ** min(digits, 6) if digits else 0.0)
    return None


def text_lines(record: dict[str, Any]) -> list[str]:
    """The record as Dask's text layout would print it: its line, then its traceback's lines; a collector's raw
    line in the shape of that collector's text output."""
    raw = _raw_lines(record)
    if raw is not None:
        return raw
    message = str(_field(record, MESSAGE))
    logger = _field(record, LOGGER)
    level = _field(record, LEVEL)
    level = str(level).upper() if isinstance(level, str) and level.lower() in LEVELS else "INFO"
    level = {"WARN": "WARNING", "FATAL": "CRITICAL"}.get(level, level)
    stamp = _stamp(_field(record, TIME))
    head, *rest = message.splitlines() or [""]
    prefix = f"{stamp} - " if stamp else ""
    out = [f"{prefix}{logger if isinstance(logger, str) and logger else '-'} - {level} - {head}", *rest]
    for key in TRACEBACK:
        tb = _field(record, (key,))
        if isinstance(tb, list):
            out += [str(x) for x in tb]
        elif isinstance(tb, str) and tb and tb not in ("None", "NoneType: None"):
            out += tb.splitlines()
    return out


def _field(record: dict[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        if name in record:
            return record[name]
        if "." in name:  # an ECS-style nested field: {"log": {"logger": ...}}
            outer, inner = name.split(".", 1)
            if isinstance(record.get(outer), dict) and inner in record[outer]:
                return record[outer][inner]
    return None


def _stamp(value: Any) -> str | None:
    """A time in a layout the text reader reads: logging's ``asctime`` and ISO 8601 as they are, epoch
    seconds as UTC."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if 1e11 < value < 253402300800000:   # milliseconds (CloudWatch, Loki's and Fluent Bit's own)
            value = value / 1000
        if not 0 < value < 253402300800:
            return None
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(value)) + f".{int(value % 1 * 1e6):06d}Z"
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] in " T":
        return value
    return None


def _raw_line(record: dict[str, Any]) -> str | None:
    """The raw line a collector's record carries (None if it is not such a record): a ``RAW_LINE`` field when the
    record has no logging message, or a message with neither logger nor level beside it (CloudWatch's awslogs,
    Filebeat and Vector ship the line so: it is the line as the process printed it, not a logging record's
    message)."""
    if isinstance(_field(record, MESSAGE), str):
        if _field(record, LOGGER) is not None or _field(record, LEVEL) is not None:
            return None
        return next(record[k] for k in MESSAGE if isinstance(record.get(k), str))
    return next((record[k] for k in RAW_LINE if isinstance(record.get(k), str)), None)


def _raw_lines(record: dict[str, Any]) -> list[str] | None:
    """A collector's record around a raw line, as the text that collector prints for it: each line (a shipper's
    multi-line event holds a traceback) behind the same time and process; None if it is not such a record."""
    raw = _raw_line(record)
    if raw is None:
        return None
    lines = raw.rstrip("\r\n").splitlines() or [""]
    if "MESSAGE" in record and raw is record["MESSAGE"]:
        head = _journal_head(record)
    else:
        stamp = _stamp(next((record[k] for k in (*TIME, "date") if k in record), None))
        head = f"{stamp} " if stamp else ""
        labels = _labels(record)
        pod = labels.get("pod_name") or labels.get("pod")
        container = labels.get("container_name") or labels.get("container") or "main"
        who = next((labels[k] for k in RAW_WHO if isinstance(labels.get(k), str) and labels[k]), None)
        if isinstance(pod, str) and pod:   # kubectl logs --timestamps --prefix
            head = f"[pod/{_name(pod)}/{_name(str(container))}] {head}"
        elif who is not None:              # docker compose logs: "name | line"
            head = f"{_name(who)} | {head}"
    return [head + line for line in lines]


def _journal_head(record: dict[str, Any]) -> str:
    """What ``journalctl -o short-iso-precise`` prints before a record's message (nothing without a time)."""
    try:
        micros = int(record.get("__REALTIME_TIMESTAMP") or record.get("_SOURCE_REALTIME_TIMESTAMP"))
    except (TypeError, ValueError):
        return ""
    if not 0 < micros < 253402300800 * 10**6:
        return ""
    ident = record.get("SYSLOG_IDENTIFIER") or record.get("_COMM") or "unknown"
    pid = record.get("_PID") or record.get("SYSLOG_PID")
    host = record.get("_HOSTNAME") or "localhost"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(micros // 10**6)) + f".{micros % 10**6:06d}+0000"
    stream = record.get("_STREAM_ID")
    if isinstance(stream, str) and stream:
        # One stdout connection, one command: a `dask worker`'s nanny and the worker processes it starts write to
        # the stream it inherited, and journald names each line by its writer's pid; the stream says whose they are.
        who = f"{_name(str(host))} {_name(str(ident))}@{_name(stream)[:12]}"
    else:
        who = f"{_name(str(host))} {_name(str(ident))}" + (f"[{int(pid)}]" if str(pid or "").isdigit() else "")
    return f"{stamp} {who}: "


def _labels(record: dict[str, Any]) -> dict[str, Any]:
    """The labels a collector put beside the line: Loki's ``labels``, Fluent Bit's ``kubernetes``, Google Cloud
    Logging's ``resource.labels`` and ``labels``, flattened (the first of a name wins)."""
    out: dict[str, Any] = {}
    resource = record.get("resource")
    for group in (record.get("labels"), record.get("kubernetes"),
                  resource.get("labels") if isinstance(resource, dict) else None):
        if isinstance(group, dict):
            for k, v in group.items():
                out.setdefault(k, v)
    return out


def _name(text: str) -> str:
    """A label as a name the text shapes read (a compose service's): a path's last part, starting with a letter or
    digit, no spaces or separators."""
    text = text.rstrip("/").rsplit("/", 1)[-1]
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in text).lstrip("._-")[:63]
    return name or "unnamed"
