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

Does not cover: kwdiag's own JSONL events (``kwdiag.events``), which carry their meaning in fields, or
deciding that a line is JSON (the text reader tries this only for a line that is a JSON object and not one
of kwdiag's events).
"""

from __future__ import annotations

import json
import time
from typing import Any

MESSAGE = ("message", "msg", "event")
LOGGER = ("name", "logger", "logger_name", "log.logger")
LEVEL = ("levelname", "level", "log.level", "severity")
TIME = ("asctime", "timestamp", "@timestamp", "time", "ts", "created")
TRACEBACK = ("exc_info", "exc_text", "stack_info", "error.stack_trace")
LEVELS = {"debug", "info", "warning", "warn", "error", "critical", "fatal"}


def parse(line: str) -> dict[str, Any] | None:
    """The record a line holds, or None when it is not a JSON object with a message."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(_field(record, MESSAGE), str):
        return None
    return record


def text_lines(record: dict[str, Any]) -> list[str]:
    """The record as Dask's text layout would print it: its line, then its traceback's lines."""
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
        if not 0 < value < 253402300800:
            return None
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(value)) + f".{int(value % 1 * 1e6):06d}Z"
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] in " T":
        return value
    return None
