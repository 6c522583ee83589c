"""Where a worker crashed: the crashing thread's stack in a faulthandler dump. Pure.

Covers: the dump Python's faulthandler writes to stderr when a process dies of SIGSEGV, SIGABRT, SIGBUS,
SIGFPE or SIGILL (``Fatal Python error: Segmentation fault``, then ``Current thread 0x... (most recent call
first):``, or ``Stack (most recent call first):`` with one thread, then one ``File "PATH", line N in FUNC`` per
frame), as kwdiag's nannies keep it (``crash_dump`` and ``stderr_tail`` of a ``worker-exit`` event: the embedded
runtime's, and ``kwdiag run --dask``'s plugins'). Each frame says whether its file is the job's own, an installed
package's or the standard library's; ``user_frame`` picks the one a fix names: the innermost of the job's own
code, else of a package.

The lines under a ``Fatal Python error`` of a Dask text log come from ``kwdiag.readers.dumps``.

Does not cover: C-level stacks (``gdb``, core dumps), or Python tracebacks of exceptions (``Traceback (most
recent call last):``, which the rules read as exceptions). A function that Dask's client pickled from a job
script with cloudpickle 3 runs as code whose file is ``<dynamic-code>``: its frame keeps its name and line, not
its file (kwdiag's client keeps the file).
"""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple

from kwdiag import crashdump

MAX_FRAMES = 20
_CURRENT = re.compile(r"^(?:Current thread 0x[0-9a-fA-F]+|Stack) \(most recent call first\):\s*$")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+|\?\?\?) in (?P<function>\S.*?)\s*$')
# Paths of code the user did not write: the standard library and installed packages.
# the standard library's folder: /usr/lib/python3.11/, /usr/lib64/python3.11/, /usr/lib/pypy3.10/, and on
# Windows C:/Python311/Lib/ (outside site-packages, which is looked for first)
_STDLIB = re.compile(r"/lib(?:64)?/(?:python|pypy)\d+\.\d+t?/|^[A-Za-z]:/(?:.*/)?Lib/")


class Frame(NamedTuple):
    """One call of the crashing thread: its function, file (shortened below ``site-packages`` or the standard
    library's folder), line, and where the file is: ``own`` (neither of those: the job's code), ``package``
    (an installed package) or ``stdlib``."""

    function: str
    file: str
    line: int
    origin: str = "own"

    @property
    def library(self) -> bool:
        return self.origin != "own"

    def __str__(self) -> str:
        """``function (file:line)``, an absolute path of the task's own code cut to its last two parts (the
        JSON keeps it whole): enough to find it, short enough for a report line."""
        file = self.file
        if not self.library and (file.startswith("/") or file[1:3] in (":\\", ":/")):
            file = "/".join(file.replace("\\", "/").rstrip("/").split("/")[-2:])
        return f"{self.function} ({file}:{self.line})"

    def to_dict(self) -> dict:
        return {"function": self.function, "file": self.file, "line": self.line, "origin": self.origin}


def crash_stack(lines: Iterable[str]) -> tuple[Frame, ...]:
    """The crashing thread's frames in the last faulthandler dump among ``lines``, innermost first (as the
    dump lists them); empty when there is none or it shows no Python frame. A tail that lost the dump's first
    line to its length still has the crashing thread's block (``Current thread ...``): it is read then."""
    lines = [str(x) for x in lines]
    fatal = max((i for i, x in enumerate(lines) if crashdump.is_fatal(x)), default=-1)
    if fatal >= 0:
        start = next((i for i in range(fatal + 1, len(lines)) if _CURRENT.match(lines[i])), None)
    else:
        start = max((i for i, x in enumerate(lines) if x.startswith("Current thread 0x") and _CURRENT.match(x)),
                    default=None)
    if start is None:
        return ()
    frames = []
    for line in lines[start + 1:]:
        m = _FRAME.match(line)
        if m is None:
            break
        if len(frames) < MAX_FRAMES:
            frames.append(_frame(m["function"], m["file"], int(m["line"]) if m["line"].isdigit() else 0))
    return tuple(frames)


def user_frame(stack: Iterable[Frame]) -> Frame | None:
    """The frame a fix names: the innermost of the job's own code, else of an installed package (a library the
    job calls, or the job's own code installed as one), else None. The standard library's frames are where
    the crash surfaced (``ctypes.string_at``), not what led to it."""
    stack = list(stack)
    return next((f for f in stack if f.origin == "own"), None) or next((f for f in stack if f.origin == "package"),
                                                                        None)


def named_frame(stack: Iterable[Frame]) -> Frame | None:
    """The frame a fix and an announcement name: ``user_frame``, else the innermost (None for no frames)."""
    stack = list(stack)
    return user_frame(stack) or (stack[0] if stack else None)


def _frame(function: str, path: str, line: int) -> Frame:
    """``/.../site-packages/dask/dataframe/core.py`` -> ``dask/dataframe/core.py`` (a package's frame); the
    standard library's ``/.../lib/python3.11/ctypes/__init__.py`` -> ``ctypes/__init__.py``; kwdiag's own files
    (a ``kwdiag/`` folder; judged by the path alone, so a report reads the same on every machine) are a
    package's; a pseudo-file (``<string>``, ``<frozen runpy>``) is
    the interpreter's, except the job's code run from stdin or pickled by value (``<stdin>``,
    ``<dynamic-code>``); other paths (the job's own code) as they are."""
    if path.startswith("<"):
        return Frame(function, path, line, "own" if path in _OWN_PSEUDO else "stdlib")
    unix = path.replace("\\", "/")
    cut = max((unix.rfind(m) + len(m) for m in ("/site-packages/", "/dist-packages/") if m in unix), default=-1)
    if 0 <= cut < len(path):
        return Frame(function, path[cut:], line, "package")
    kwdiag_at = unix.rfind("/kwdiag/")
    if kwdiag_at >= 0:   # kwdiag's own code, wherever it is installed (its runtime runs every task)
        return Frame(function, path[kwdiag_at + 1:], line, "package")
    stdlib = [m.end() for m in _STDLIB.finditer(unix)]
    if stdlib and stdlib[-1] < len(path):
        return Frame(function, path[stdlib[-1]:], line, "stdlib")
    return Frame(function, path, line, "own")


_OWN_PSEUDO = ("<stdin>", "<dynamic-code>")
