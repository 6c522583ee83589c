"""A task's traceback, rebuilt in the client as a real traceback object whose frames point into the task.

A worker sends a failed task's frames as ``[filename, lineno, function]`` triples (tracebacks cannot be
pickled). ``rebuild`` turns them into a chain of genuine ``traceback`` objects, one per frame, each raised
from code compiled with the frame's file name, line number and function name, so ``Future.traceback()``,
``traceback.print_tb`` and the traceback of a re-raised exception show where the task failed, as
Dask's do. Source lines appear when the file exists on the client's machine too.

Does not cover: local variables of the remote frames (there are none), or formatting (the standard
``traceback`` module does it).
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Iterable


class _Marker(Exception):
    pass


def _one_frame(filename: str, lineno: int, name: str) -> TracebackType | None:
    """A traceback entry of one frame at ``filename:lineno`` in a function called ``name``."""
    source = "\n" * max(0, int(lineno) - 1) + "raise __marker__"
    try:
        code = compile(source, str(filename) or "<unknown>", "exec")
        if name:
            code = code.replace(co_name=name)
        exec(code, {"__marker__": _Marker(), "__name__": "__remote__"})
    except _Marker:
        tb = sys.exc_info()[2]
        return tb.tb_next if tb is not None else None
    except Exception:   # a name or a file the compiler refuses: leave this frame out
        return None
    return None


def rebuild(frames: Iterable[Iterable]) -> TracebackType | None:
    """The traceback of ``frames`` (outermost first), or None when there are none."""
    head: TracebackType | None = None
    tail: TracebackType | None = None
    for frame in frames:
        try:
            filename, lineno, name = frame
        except (TypeError, ValueError):
            continue
        tb = _one_frame(filename, lineno, name)
        if tb is None:
            continue
        if tail is None:
            head = tb
        else:
            tail.tb_next = tb
        tail = tb
    return head
