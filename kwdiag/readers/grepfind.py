"""Find the prefilter's literals in a large plain file with the system's GNU grep, as byte offsets.

Why: the prefilter is one alternation of ~90 literals; Python's ``re`` scans it at ~100 MB/s on real Dask noise,
GNU grep's fixed-string matcher at ~650 MB/s on this machine. For a large plain file the scanner asks grep where
the literals are (``grep -F -o -b``: the offset of every match) and then reads the file itself as before, taking
its candidate lines at those offsets: the same lines come out as with the regex (a test compares them on every
sample and corpus log), and everything else (line numbers, over-long lines, the lines before a traceback) stays
the scanner's.

Covers: finding GNU grep, running it over one file, reading the offsets. Returns None whenever grep cannot be
used: none installed, not GNU (other greps' ``-b`` differ), it failed (a line too long for its capped memory),
or the file has so many candidates that
grep's output would outgrow the saving (then nearly every line is a candidate anyway). The caller then scans
with the regex. ``KWDIAG_NO_GREP=1`` turns it off.

Does not cover: gzip or stdin input (grep reads plain files only here), what a candidate line means.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from array import array

MAX_MATCHES = 2_000_000  # about 16 MB of offsets; past this the regex scan is as good
# grep holds a whole line in memory: a 300 MB line would cost 300 MB. Its address space is capped, so such a
# file makes grep fail (then the regex scan, which reads at most MAX_LINE of a line, takes over).
GREP_ADDRESS_SPACE = 256 << 20


def _cap_memory() -> None:  # runs in the child between fork and exec
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (GREP_ADDRESS_SPACE, GREP_ADDRESS_SPACE))

_grep: list[str | None] = []  # the GNU grep found on PATH, looked up once per process


def _gnu_grep() -> str | None:
    if not _grep:
        exe = shutil.which("grep")
        found = None
        if exe is not None:
            try:
                out = subprocess.run([exe, "--version"], capture_output=True, timeout=10).stdout
                found = exe if out.startswith(b"grep (GNU grep)") else None
            except (OSError, subprocess.SubprocessError):
                found = None
        _grep.append(found)
    return _grep[0]


def grep_offsets(path: str, literals: list[bytes]) -> array | None:
    """The byte offset of every occurrence grep reports of any of ``literals`` in ``path`` (ascending), or None
    when grep cannot be used (see the module docstring)."""
    if os.environ.get("KWDIAG_NO_GREP") or not literals or any(b"\n" in x or not x for x in literals):
        return None
    exe = _gnu_grep()
    if exe is None:
        return None
    with tempfile.NamedTemporaryFile(prefix="kwdiag-literals-", suffix=".txt") as patterns:
        patterns.write(b"\n".join(literals) + b"\n")
        patterns.flush()
        env = {**os.environ, "LC_ALL": "C"}  # bytes, not characters: the same matches as the regex over bytes
        try:
            proc = subprocess.Popen([exe, "-F", "-o", "-b", "-a", "-f", patterns.name, "--", path],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                    preexec_fn=_cap_memory)
        except OSError:
            return None
        offsets = array("q")
        try:
            for line in proc.stdout:  # b"<offset>:<the literal>\n"
                offsets.append(int(line[: line.index(b":")]))
                if len(offsets) > MAX_MATCHES:
                    proc.kill()
                    return None
        except ValueError:  # not grep's usual output
            proc.kill()
            return None
        finally:
            proc.stdout.close()
            code = proc.wait()
    if code not in (0, 1):  # 1: no match at all
        return None
    return offsets
