"""A task's traceback, rebuilt in the client as a real traceback object whose frames point into the task.

A worker sends a failed task's frames as ``[filename, lineno, function]`` triples (tracebacks cannot be
pickled). ``rebuild`` turns them into a chain of genuine ``traceback`` objects, so ``Future.traceback()``,
``traceback.print_tb`` and the traceback of a re-raised exception show where the task failed, as Dask's
do. Source lines appear when the file exists on the client's machine too.

Each frame is the suspended frame of a tiny generator compiled with the remote file name and function
name: a suspended generator's frame has no ``f_back``, so a rebuilt traceback holds nothing of the
client's own call stack (a frame made by ``exec`` would keep its caller's frames, and with them the
caller's futures, alive until the garbage collector ran).

Does not cover: local variables of the remote frames (there are none), or formatting (the standard
``traceback`` module does it).
"""

from __future__ import annotations

import functools
from types import FrameType, TracebackType
from typing import Generator, Iterable

_SOURCE = "def _frame():\n    yield __import__('sys')._getframe()\n"


@functools.lru_cache(maxsize=1024)
def _frame(filename: str, name: str) -> tuple[FrameType, Generator] | None:
    """A frame of code from ``filename`` named ``name``, with no caller (and the suspended generator it is
    the frame of)."""
    try:
        code = compile(_SOURCE, filename or "<unknown>", "exec")
        namespace: dict = {"__name__": "__remote__"}
        exec(code, namespace)
        maker = namespace["_frame"]
        if name:
            maker.__code__ = maker.__code__.replace(co_name=name, co_qualname=name)
        generator = maker()
        return next(generator), generator
    except Exception:   # a file name the compiler refuses: leave this frame out
        return None


def rebuild(frames: Iterable[Iterable]) -> TracebackType | None:
    """The traceback of ``frames`` (outermost first), or None when there are none."""
    tb: TracebackType | None = None
    for frame in reversed(list(frames)):
        try:
            filename, lineno, name = frame
            lineno = int(lineno)
        except (TypeError, ValueError):
            continue
        made = _frame(str(filename), str(name or ""))
        if made is not None:
            # tb_lasti -1: no instruction, so the traceback module takes the line from tb_lineno
            tb = TracebackType(tb, made[0], -1, max(lineno, 1))
    return tb
