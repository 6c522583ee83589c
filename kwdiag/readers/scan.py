"""Read one input as raw bytes in blocks and hand over only the lines a rule could care about.

Covers: opening a file or stdin, transparent gzip (by magic bytes, so ``.gz`` naming does not
matter), refusing binary input (NUL bytes in the first block), lines longer than ``MAX_LINE``
(only their first ``MAX_LINE`` bytes are read; memory stays bounded), truncated gzip (what was
decompressed is kept), and the prefilter: one literal regex over each block finds candidate
lines without a Python loop over every line. Memory is one block plus one line, whatever the
file size.

Does not cover: parsing the candidate lines (``kwdiag.readers.text``).
"""

from __future__ import annotations

import gzip
import sys
import zlib
from dataclasses import dataclass, field
from typing import Callable

BLOCK = 4 << 20
MAX_LINE = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"


class InputUnreadable(Exception):
    """The whole input cannot be read (binary, not accessible)."""


@dataclass
class ScanStats:
    bytes: int = 0
    lines: int = 0
    long_lines: int = 0
    first_long_line: int | None = None
    truncated: str | None = None  # why the input ended early (truncated gzip, read error)
    head: bytes = b""
    gzip: bool = False
    notes: list[str] = field(default_factory=list)


def _open(path: str | None):
    if path is None:
        return sys.stdin.buffer, False
    return open(path, "rb"), True


# on_line(lineno, line_bytes, block, line_start) ; the block lets the caller look back
LineHandler = Callable[[int, bytes, bytes, int], None]


def scan(path: str | None, prefilter, on_line: LineHandler) -> ScanStats:
    """Feed every prefilter-matching line of ``path`` (None = stdin) to ``on_line``."""
    stats = ScanStats()
    raw, close = _open(path)
    try:
        head = raw.read(BLOCK)
        stream = None
        if head[:2] == GZIP_MAGIC:
            stats.gzip = True
            stream = _GzipChain(head, raw)
            try:
                head = stream.read(BLOCK)
            except (OSError, EOFError, zlib.error) as exc:
                raise InputUnreadable(f"not a readable gzip file ({exc})") from None
        if b"\x00" in head[:65536]:
            raise InputUnreadable("binary data (NUL bytes), not a text log")
        stats.head = head[:65536]
        _scan_blocks(head, stream or raw, prefilter, on_line, stats)
    finally:
        if close:
            raw.close()
    return stats


class _GzipChain:
    """Decompress a gzip stream whose first bytes were already read."""

    def __init__(self, head: bytes, raw):
        import io

        class _Rest(io.RawIOBase):
            def __init__(self, first, rest):
                self.first, self.rest = first, rest

            def readable(self):
                return True

            def readinto(self, b):
                if self.first:
                    n = min(len(b), len(self.first))
                    b[:n] = self.first[:n]
                    self.first = self.first[n:]
                    return n
                data = self.rest.read(len(b))
                b[: len(data)] = data
                return len(data)

        self.gz = gzip.GzipFile(fileobj=io.BufferedReader(_Rest(head, raw), BLOCK))

    def read(self, n: int) -> bytes:
        return self.gz.read(n)


def _scan_blocks(first: bytes, stream, prefilter, on_line: LineHandler, stats: ScanStats) -> None:
    finditer = prefilter.finditer
    carry = b""
    lineno = 1  # number of the first line in the next body
    skipping = False  # inside an over-long line: drop bytes up to its newline
    chunk = first
    while True:
        if not chunk:
            if carry and not skipping:
                body = carry + b"\n"
                _feed(body, lineno, finditer, on_line)
                stats.lines += 1
            break
        stats.bytes += len(chunk)
        if skipping:
            nl = chunk.find(b"\n")
            if nl == -1:
                chunk = _read(stream, stats)
                continue
            chunk = chunk[nl + 1:]
            skipping = False
            lineno += 1
            stats.lines += 1
            stats.bytes -= len(chunk)  # counted again below
            continue
        buf = carry + chunk if carry else chunk
        cut = buf.rfind(b"\n")
        if cut == -1:
            if len(buf) > MAX_LINE:
                stats.long_lines += 1
                if stats.first_long_line is None:
                    stats.first_long_line = lineno
                _feed(buf[:MAX_LINE] + b"\n", lineno, finditer, on_line)
                carry = b""
                skipping = True
            else:
                carry = buf
            chunk = _read(stream, stats)
            continue
        body = buf[: cut + 1]
        carry = buf[cut + 1:]
        if len(carry) > MAX_LINE:  # a very long last line of this block: keep bounded
            stats.long_lines += 1
            if stats.first_long_line is None:
                stats.first_long_line = lineno + body.count(b"\n")
            carry = carry[:MAX_LINE]
            n = _feed(body + carry + b"\n", lineno, finditer, on_line)
            lineno += n
            stats.lines += n
            carry = b""
            skipping = True
            chunk = _read(stream, stats)
            continue
        n = _feed(body, lineno, finditer, on_line)
        lineno += n
        stats.lines += n
        chunk = _read(stream, stats)


def _read(stream, stats: ScanStats) -> bytes:
    try:
        return stream.read(BLOCK)
    except (OSError, EOFError, zlib.error) as exc:
        stats.truncated = f"input ends early ({exc}); the lines before that were read"
        return b""


def _feed(body: bytes, lineno: int, finditer, on_line: LineHandler) -> int:
    """Call ``on_line`` for each line of ``body`` with a prefilter hit; return the body's line count.

    Lines longer than ``MAX_LINE`` inside the body are cut to ``MAX_LINE``.
    """
    count = body.count
    find = body.find
    rfind = body.rfind
    done_to = -1
    counted_to = 0
    for m in finditer(body):
        s = m.start()
        if s <= done_to:
            continue
        ls = rfind(b"\n", 0, s) + 1
        le = find(b"\n", s)
        lineno += count(b"\n", counted_to, ls)
        counted_to = ls
        line = body[ls:le] if le - ls <= MAX_LINE else body[ls: ls + MAX_LINE]
        on_line(lineno, line, body, ls)
        done_to = le
    return count(b"\n")
