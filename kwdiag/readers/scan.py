"""Read one input as raw bytes in blocks and hand over only the lines a rule could care about.

Covers: opening a file or stdin, transparent gzip (by magic bytes, so ``.gz`` naming does not
matter), refusing binary input (NUL bytes in the first block), lines longer than ``MAX_LINE``
(only their first ``MAX_LINE`` bytes are read; memory stays bounded), truncated gzip (what was
decompressed is kept), gzip bombs (decompression is bounded: at most one block of output at a
time, and a stream that expands more than ``MAX_GZIP_RATIO`` times past ``GZIP_RATIO_AFTER`` bytes
is stopped and reported), and the prefilter: one literal regex over each block finds candidate
lines without a Python loop over every line. Memory is one block plus one line, whatever the
file size.

Does not cover: parsing the candidate lines (``kwdiag.readers.text``).
"""

from __future__ import annotations

import functools
import io
import os
import re
import sys
import zlib
from dataclasses import field
from typing import Callable

from kwdiag.records import record

BLOCK = 4 << 20
MAX_LINE = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"
MAX_GZIP_RATIO = 200  # real logs compress 5-50x; zeros or newlines compress ~1000x (a gzip bomb)
GZIP_RATIO_AFTER = 64 << 20  # the ratio is only checked once this much was decompressed


class GzipBomb(EOFError):
    """A gzip stream that expands far more than any log does."""


class InputUnreadable(Exception):
    """The whole input cannot be read (binary, not accessible)."""


@record
class ScanStats:
    bytes: int = 0
    lines: int = 0
    long_lines: int = 0
    first_long_line: int | None = None
    truncated: str | None = None  # why the input ended early (truncated gzip, read error)
    head: bytes = b""
    gzip: bool = False
    notes: list[str] = field(default_factory=list)
    on_block: Callable[[int], None] | None = None  # told the bytes read so far after each block (progress)
    printed_value: bool = False  # read as a printed Python value (``kwdiag.readers.pyrepr``), not line by line


def _open(path: str | None):
    if path is None:
        return sys.stdin.buffer, False
    return open(path, "rb"), True


# on_line(lineno, line_bytes, previous_timestamped_line_or_None)
LineHandler = Callable[[int, bytes, "bytes | None"], None]


# A plain file this large has its prefilter literals found by the system's grep when it can (it scans ~6x
# faster than Python's re here); smaller ones are not worth a process.
GREP_MIN = 16 << 20
# A plain file this large is scanned folded (``FoldedFinder``): building the folded trie costs ~8 ms, what the fold
# saves on ~2 MB, and a first answer on a small log should not wait for it.
FOLD_MIN = 2 << 20


class Lookback:
    """The lines just before the candidate line being handed over, for a handler that finds it needs them
    (the reader, at a removal: the connection lines the prefilter does not look for, ``engine.deferred_keywords``).

    ``lines(n)`` (``n`` at most ``depth``, the most the handler asks for: a parallel scan's workers find that many
    for every hit) is valid only during an ``on_line`` call: up to ``n`` lines before that line, oldest first, as
    ``(lineno, line, previous timestamped line or None)`` like ``on_line``'s arguments. They come from the block
    being read and the one before it (a block ends at a line's end; after an over-long line, the one before is
    that line cut to ``MAX_LINE`` with the block before it), so a line's predecessors are found unless they lie
    more than a block back, which no short line needs.
    """

    __slots__ = ("depth", "at", "previous", "given")

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.at: tuple[bytes, int, int] | None = None  # (body, start of the line in it, its line number)
        self.previous: bytes | None = None   # the body before the current one: whole lines, ending at a newline
        self.given: list | None = None   # lines found beforehand (a parallel scan's worker found them)

    def lines(self, n: int) -> list[tuple[int, bytes, bytes | None]]:
        if self.given is not None:
            return self.given[-n:] if n else []
        if self.at is None:
            return []
        body, start, lineno = self.at
        out: list[tuple[int, bytes, bytes | None]] = []
        switched = False
        while len(out) < n:
            if start <= 0:
                if switched or not self.previous:
                    break
                body, start, switched = self.previous, len(self.previous), True
            end = start - 1   # the newline that ends the line before
            ls = body.rfind(b"\n", 0, end) + 1
            line = body[ls:end] if end - ls <= MAX_LINE else body[ls: ls + MAX_LINE]
            prev = None if TS_START.match(line) else _previous_stamped(body, ls)
            out.append((lineno - len(out) - 1, line, prev))
            start = ls
        out.reverse()
        return out


def scan(path: str | None, prefilter, on_line: LineHandler, literals: list[bytes] | None = None,
         on_block: Callable[[int], None] | None = None, lookback: Lookback | None = None) -> ScanStats:
    """Feed every prefilter-matching line of ``path`` (None = stdin) to ``on_line``. ``literals``: the prefilter's
    alternatives, which grep can look for in a large plain file (the same lines come out either way).
    ``on_block``: told the bytes read so far after each block (a parallel scan tells once, at its end).
    ``lookback``: kept up to date so that ``on_line`` can ask for the lines before its line (``Lookback``)."""
    stats = ScanStats(on_block=on_block)
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
        size = 0
        if stream is None and path is not None and not stats.gzip:
            try:
                size = os.fstat(raw.fileno()).st_size
            except OSError:
                size = 0
            if size >= GREP_MIN and literals and os.path.isfile(path):
                from kwdiag.readers.grepfind import grep_offsets   # here: a small log never needs it (subprocess)

                offsets = grep_offsets(path, literals)
                if offsets is not None:
                    _scan_blocks(head, raw, OffsetFinder(offsets), on_line, stats, lookback)
                    return stats
            if size >= PARALLEL_MIN and os.path.isfile(path) and \
                    _scan_parallel(path, size, prefilter, on_line, stats, lookback, literals):
                return stats
        big = stream is None and path is not None and size >= FOLD_MIN
        _scan_blocks(head, stream or raw, finder(prefilter, literals if big else None), on_line, stats, lookback)
    finally:
        if close:
            raw.close()
    return stats


class _GzipChain:
    """Decompress a gzip stream (several members allowed) whose first bytes were already read.

    A truncated or corrupt stream keeps everything decompressed before the damage and then
    raises ``EOFError``/``zlib.error`` once, which the scanner reports.
    """

    def __init__(self, head: bytes, raw):
        self.raw = raw
        self.pending = head
        self.d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.done = False
        self.error: Exception | None = None
        self.consumed = 0  # compressed bytes decompressed so far
        self.produced = 0  # bytes they expanded to

    def read(self, n: int) -> bytes:
        out = []
        size = 0
        while size < n and not self.done:
            data = self.pending or self.raw.read(1 << 20)
            self.pending = b""
            if not data:
                self.done = True
                if not self.d.eof:
                    self.error = EOFError("compressed file ended before the end-of-stream marker was reached")
                break
            try:
                # max_length: never more than what was asked for in memory, however well ``data`` compresses
                chunk = self.d.decompress(data, n - size)
            except zlib.error as exc:
                self.done = True
                self.error = exc
                break
            self.pending = self.d.unconsumed_tail
            self.consumed += len(data) - len(self.pending) - len(self.d.unused_data)
            if chunk:
                out.append(chunk)
                size += len(chunk)
                self.produced += len(chunk)
                if self.produced > GZIP_RATIO_AFTER and self.produced > MAX_GZIP_RATIO * max(self.consumed, 1):
                    self.done = True
                    self.error = GzipBomb(
                        f"decompression stopped after {self.produced >> 20} MiB: the data expands more than "
                        f"{MAX_GZIP_RATIO}x, which no log does (a gzip bomb?)")
                    break
            if self.d.eof:
                rest = self.d.unused_data
                self.d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                if rest.lstrip(b"\x00"):
                    self.pending = rest
                elif not rest:
                    nxt = self.raw.read(1 << 20)
                    if not nxt:
                        self.done = True
                        break
                    self.pending = nxt
                else:
                    self.done = True
        if out:
            return b"".join(out)
        if self.error is not None:
            err, self.error = self.error, None
            raise err
        return b""


TS_START = re.compile(rb"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
LOOKBACK = 256 << 10


def _scan_blocks(first: bytes, stream, finder, on_line: LineHandler, stats: ScanStats,
                 lookback: Lookback | None = None) -> None:
    """The prefilter's loop over large blocks of a file: find candidate lines (``finder``: the regex over the
    bytes, or the offsets grep found), hand each (and the lines a block's end cut in two) to ``on_line`` with
    its line number. Over 60 lines on purpose: the hot loop keeps its state in locals (the carry-over of a cut
    line, the line count, the file offset); split into functions, that state would be passed or looked up
    again for every candidate line."""
    starts = finder.starts
    carry = b""
    lineno = 1  # number of the first line in the next body
    skipping = False  # inside an over-long line: drop bytes up to its newline
    chunk = first
    pos = 0  # file offset of chunk
    while True:
        if not chunk:
            if carry and not skipping:
                body = carry + b"\n"
                _feed(body, lineno, starts(body, pos - len(carry), len(carry)), on_line, lookback)
                stats.lines += 1
            break
        stats.bytes += len(chunk)
        if stats.on_block is not None:
            stats.on_block(stats.bytes)
        if skipping:
            nl = chunk.find(b"\n")
            if nl == -1:
                pos += len(chunk)
                chunk = _read(stream, stats)
                continue
            pos += nl + 1
            chunk = chunk[nl + 1:]
            skipping = False
            lineno += 1
            stats.lines += 1
            stats.bytes -= len(chunk)  # counted again below
            if not chunk:  # the long line ended with this block: read on (an empty chunk means the end)
                chunk = _read(stream, stats)
            continue
        buf = carry + chunk if carry else chunk
        buf_start = pos - len(carry)
        pos += len(chunk)
        cut = buf.rfind(b"\n")
        if cut == -1:
            if len(buf) > MAX_LINE:
                stats.long_lines += 1
                if stats.first_long_line is None:
                    stats.first_long_line = lineno
                body = buf[:MAX_LINE] + b"\n"
                _feed(body, lineno, starts(body, buf_start, MAX_LINE), on_line, lookback)
                carry = b""
                skipping = True
                if lookback is not None:   # the lines after the long one see it (cut) and the body before it
                    lookback.previous = (lookback.previous or b"") + body
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
            _count_long(body, lineno, stats)
            whole = body + carry + b"\n"
            # the long line is counted where its newline is found (as when it starts a block): not here too
            n = _feed(whole, lineno, starts(whole, buf_start, len(whole) - 1), on_line, lookback) - 1
            lineno += n
            stats.lines += n
            carry = b""
            skipping = True
            if lookback is not None:
                lookback.previous = whole
            chunk = _read(stream, stats)
            continue
        _count_long(body, lineno, stats)
        n = _feed(body, lineno, starts(body, buf_start, len(body)), on_line, lookback)
        lineno += n
        stats.lines += n
        if lookback is not None:
            lookback.previous = body
        chunk = _read(stream, stats)


class RegexFinder:
    """Candidate positions from the prefilter regex run over each body (the file offset is not needed)."""

    def __init__(self, prefilter):
        self.finditer = prefilter.finditer

    def starts(self, body: bytes, body_start: int, mapped: int):
        return (m.start() for m in self.finditer(body, 0, mapped))


def finder(prefilter, literals: list[bytes] | None):
    """The finder of the prefilter's lines: ``FoldedFinder`` when its literals are known, else ``RegexFinder``."""
    return FoldedFinder(prefilter, literals) if literals else RegexFinder(prefilter)


class FoldedFinder:
    """``RegexFinder``'s lines, found about twice as fast: one position in each line of a body that holds a literal.

    Python's ``re`` looks for an alternation by trying it at every position whose byte may start one of its
    literals (16 different bytes for the built-in rules): ~120 MB/s on a scheduler's log. A pattern that starts
    with one literal byte is looked for with a tight loop over that byte instead. So each body is copied with those
    first bytes folded into one (``bytes.translate``, ~900 MB/s) and searched for the literals folded the same way
    (~250 MB/s in all on the same log). A folded match is a line that may hold a literal (two bytes the fold made
    equal can pass a line that holds none), so each such line is searched once more with the prefilter itself:
    the same lines come out as from ``RegexFinder``, one position each (the first literal in the line), which is
    all ``_feed`` takes of a line."""

    def __init__(self, prefilter, literals: list[bytes]):
        self.search, self.match = prefilter.search, prefilter.match
        self.table, self.folded = _folded(tuple(literals))

    def starts(self, body: bytes, body_start: int, mapped: int):
        search, match, find = self.search, self.match, body.find
        done_to = -1
        for m in self.folded.finditer(body.translate(self.table), 0, mapped):
            s = m.start()
            if s <= done_to:
                continue
            if match(body, s, mapped) is not None:   # most often the literal itself
                yield s
                continue
            # Not a literal here. A literal later in the line may be (none before: the fold would have found it
            # first); the line is searched once.
            le = find(b"\n", s, mapped)
            done_to = le = mapped if le < 0 else le
            real = search(body, s, le)
            if real is not None:
                yield real.start()


@functools.lru_cache(maxsize=8)
def _folded(literals: tuple[bytes, ...]) -> tuple[bytes, re.Pattern]:
    """The table folding the literals' first bytes into one byte (NUL: a text log has none, so few lines pass
    that hold no literal), and the trie of the literals folded by it."""
    from kwdiag.engine import trie_pattern   # the prefilter's own construction

    table = bytearray(range(256))
    for first in {lit[0] for lit in literals}:
        table[first] = 0
    table = bytes(table)
    return table, re.compile(trie_pattern(sorted({lit.translate(table) for lit in literals})))


class OffsetFinder:
    """Candidate positions from match offsets found beforehand in the whole file (``kwdiag.readers.grepfind``),
    in file order: each body takes those that fall in its first ``mapped`` bytes (the bytes that are the
    file's, 1:1); offsets in bytes the scan skipped (the rest of an over-long line) are dropped."""

    def __init__(self, offsets):
        self.offsets = offsets
        self.i = 0

    def starts(self, body: bytes, body_start: int, mapped: int) -> list[int]:
        offsets, i, n = self.offsets, self.i, len(self.offsets)
        while i < n and offsets[i] < body_start:
            i += 1
        out = []
        end = body_start + mapped
        while i < n and offsets[i] < end:
            out.append(offsets[i] - body_start)
            i += 1
        self.i = i
        return out


def _count_long(body: bytes, lineno: int, stats: ScanStats) -> None:
    """Count the complete lines of ``body`` longer than ``MAX_LINE`` (``_feed`` cuts them).

    Such a line covers at least one whole aligned window of ``MAX_LINE // 2`` bytes without a
    newline, so a handful of ``find`` calls per block rule them out; only a hit is measured.
    """
    if len(body) <= MAX_LINE:
        return
    half = max(1, MAX_LINE // 2)
    done = 0
    for s in range(0, len(body) - half + 1, half):
        if s < done or body.find(b"\n", s, s + half) != -1:
            continue
        ls = body.rfind(b"\n", 0, s) + 1
        le = body.find(b"\n", s)
        if le == -1:
            le = len(body)
        done = le
        if le - ls > MAX_LINE:
            stats.long_lines += 1
            if stats.first_long_line is None:
                stats.first_long_line = lineno + body.count(b"\n", 0, ls)


def _read(stream, stats: ScanStats) -> bytes:
    try:
        return stream.read(BLOCK)
    except (OSError, EOFError, zlib.error) as exc:
        stats.truncated = f"input ends early ({exc}); the lines before that were read"
        return b""


def _previous_stamped(body: bytes, ls: int) -> bytes | None:
    """The nearest earlier line of ``body`` that starts with a timestamp (a traceback's record)."""
    lo = max(0, ls - LOOKBACK)
    end = ls - 1
    for _ in range(2000):
        if end <= lo:
            return None
        p = body.rfind(b"\n", lo, end) + 1
        if TS_START.match(body, p):
            return body[p: body.find(b"\n", p)]
        if p <= lo:
            return None
        end = p - 1
    return None


def _feed(body: bytes, lineno: int, starts, on_line: LineHandler, lookback: Lookback | None = None) -> int:
    """Call ``on_line`` for each line of ``body`` holding one of the candidate positions ``starts`` (ascending);
    return the body's line count. ``lookback`` is pointed at each line before its call.

    Lines longer than ``MAX_LINE`` inside the body are cut to ``MAX_LINE``.
    """
    count = body.count
    find = body.find
    rfind = body.rfind
    done_to = -1
    counted_to = 0
    for s in starts:
        if s <= done_to:
            continue
        ls = rfind(b"\n", 0, s) + 1
        le = find(b"\n", s)
        lineno += count(b"\n", counted_to, ls)
        counted_to = ls
        line = body[ls:le] if le - ls <= MAX_LINE else body[ls: ls + MAX_LINE]
        prev = None if TS_START.match(line) else _previous_stamped(body, ls)
        if lookback is not None:
            lookback.at = (body, ls, lineno)
        on_line(lineno, line, prev)
        done_to = le
    return count(b"\n")


def scan_bytes(data: bytes, prefilter, on_line: LineHandler, lookback: Lookback | None = None,
               rest=None, on_block: Callable[[int], None] | None = None) -> ScanStats:
    """``scan`` of an input already read into memory (stdin, read ahead to see what it holds), then of ``rest``
    (the stream those bytes came from, when it was not read to its end)."""
    stats = ScanStats(on_block=on_block)
    stream = io.BytesIO(data) if rest is None else _Then(data, rest)
    head = stream.read(BLOCK)
    if b"\x00" in head[:65536]:
        raise InputUnreadable("binary data (NUL bytes), not a text log")
    stats.head = head[:65536]
    _scan_blocks(head, stream, RegexFinder(prefilter), on_line, stats, lookback)
    return stats


class _Then:
    """The bytes already read, then the rest of their stream."""

    def __init__(self, first: bytes, rest) -> None:
        self.first, self.rest = io.BytesIO(first), rest

    def read(self, n: int = -1) -> bytes:
        return self.first.read(n) or self.rest.read(n)


# ---------------------------------------------------------------- parallel scan of large plain files
PARALLEL_MIN = 64 << 20  # below this one process is as fast


def _jobs(size: int) -> int:
    env = os.environ.get("KWDIAG_JOBS")
    if env and env.isdigit():
        return max(1, int(env))
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8, size // PARALLEL_MIN))


def _boundaries(path: str, size: int, n: int) -> list[int] | None:
    cuts = [0]
    with open(path, "rb") as f:
        for k in range(1, n):
            f.seek(size * k // n)
            probe = f.read(MAX_LINE)
            nl = probe.find(b"\n")
            if nl == -1:
                return None
            cut = size * k // n + nl + 1
            if cut <= cuts[-1]:
                return None
            cuts.append(cut)
    cuts.append(size)
    return cuts


class _Range:
    def __init__(self, f, end: int):
        self.f, self.left = f, end - f.tell()

    def read(self, n: int) -> bytes:
        if self.left <= 0:
            return b""
        data = self.f.read(min(n, self.left))
        self.left -= len(data)
        return data


SEED = 64 << 10  # how far before its range a parallel scan's worker reads, for the lines before its first hits


def _scan_range(path: str, start: int, end: int, pattern: bytes, before: int, literals: list[bytes] | None = None):
    """One worker's part of a parallel scan: its hits, each with the ``before`` lines before it (``Lookback``:
    the worker cannot know which hit the reader will ask about), and its counts."""
    prefilter = re.compile(pattern)
    hits: list = []
    stats = ScanStats()
    lookback = Lookback(before) if before else None
    with open(path, "rb") as f:
        if lookback is not None and start > 0:
            lookback.previous = _lines_before(f, start, before)
        f.seek(start)
        rng = _Range(f, end)
        if lookback is None:
            on_hit = lambda *a: hits.append((*a, None))   # noqa: E731
        else:
            on_hit = lambda *a: hits.append((*a, lookback.lines(before)))   # noqa: E731
        _scan_blocks(rng.read(BLOCK), rng, finder(prefilter, literals), on_hit, stats, lookback)
    return hits, stats.lines, stats.bytes, stats.long_lines, stats.first_long_line


def _lines_before(f, start: int, n: int) -> bytes:
    """The whole lines of ``f`` just before offset ``start`` (a line's start): at least ``n`` of them, read back
    from ``SEED`` bytes on and further while fewer are found, but never more than ``n + 1`` lines of ``MAX_LINE``."""
    back = SEED
    while True:
        lo = max(0, start - back)
        f.seek(lo)
        seed = f.read(start - lo)
        if lo == 0 or seed.count(b"\n") > n or back >= (n + 1) * MAX_LINE:
            cut = seed.find(b"\n")
            return seed if lo == 0 else seed[cut + 1:] if cut != -1 else b""
        back *= 4


def _scan_parallel(path: str, size: int, prefilter, on_line: LineHandler, stats: ScanStats,
                   lookback: Lookback | None = None, literals: list[bytes] | None = None) -> bool:
    """Scan ``path`` in ``_jobs`` processes, replaying hits in file order. False if not possible."""
    n = _jobs(size)
    if n < 2:
        return False
    cuts = _boundaries(path, size, n)
    if cuts is None:
        return False
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    try:
        ctx = multiprocessing.get_context("fork")
    except ValueError:  # pragma: no cover - no fork on this platform
        return False
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as ex:
        before = lookback.depth if lookback is not None else 0
        futures = [ex.submit(_scan_range, path, cuts[i], cuts[i + 1], prefilter.pattern, before, literals)
                   for i in range(n)]
        base = 0
        for fut in futures:
            hits, lines, nbytes, long_lines, first_long = fut.result()
            for lineno, line, prev, earlier in hits:
                if lookback is not None:
                    lookback.given = [(base + ln, text, p) for ln, text, p in earlier]
                on_line(base + lineno, line, prev)
            if long_lines:
                stats.long_lines += long_lines
                if stats.first_long_line is None:
                    stats.first_long_line = base + first_long
            base += lines
            stats.lines += lines
            stats.bytes += nbytes
    if lookback is not None:
        lookback.given = None
    return True
