"""The rule engine: load rule TOML files, lint them, and match them against log lines and events.

Covers: the ``Rule`` type (one file ``rules/<area>/<rule-id>.toml``), loading the built-in rules
plus user rule directories (``load_rules``), the lint behind ``kwdiag rules check``
(``lint_rules``), the cheap line prefilter (one combined literal regex over raw bytes, built from
every rule's ``keywords``), matching one text line (``RuleSet.match_line``) and one structured event
(``RuleSet.match_event``). A user's rules (``--rules DIR``) match with the ``regex`` module and a timeout per
line, so a catastrophic pattern cannot hang a run; the built-in rules are ours, tested against their examples
and the sample logs, and match with the standard ``re`` (faster here, and ``regex`` is then not imported at
all: ~10 ms of a small explain's start) on lines up to ``SAFE_LENGTH`` characters. A longer line (a stranger's
log can hold lines of a megabyte, on which a lazy ``.+?...$`` backtracks quadratically) goes through ``regex``
with the timeout for every rule.

Does not cover: reading files (``kwdiag.readers``), deciding which death a match belongs to
(``kwdiag.timeline``) or weighing matches into a verdict (``kwdiag.analysis.classify``).

Rule file format: see ``docs/rules.md``.
"""

from __future__ import annotations

import os
import re as _stdre
from dataclasses import field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from kwdiag.kinds import CONNECTION
from kwdiag.reasons import NAMED
from kwdiag.records import record

# The death-class vocabulary every verdict uses (docs/death-classes.md is the spec).
CAUSES = (
    "chose_to_exit",
    "unrecoverable_exception",
    "nanny_memory_restart",
    "sudden_exit",
    "version_mismatch",
    "unknown",
)
SEVERITIES = ("info", "warning", "error")

MATCH_TIMEOUT = 0.05  # seconds per pattern per line: a user's catastrophic pattern cannot hang us
SAFE_LENGTH = 4096  # longest text a built-in pattern reads with ``re`` (no timeout): quadratic stays ~ms
TIMEOUT_LIMIT = 5  # a rule whose patterns time out this often in one run is not tried again in that run
RUNTIMES = ("kwdiag", "dask", "coiled")
def builtin_rules_dir() -> Path:
    """Where the built-in rule files are: the ``kwdiag.rules`` package (the top-level rules/ folder, which the
    source tree links as kwdiag/rules and an install copies there)."""
    import kwdiag.rules as pkg

    return Path(pkg.__file__).resolve().parent


class RuleError(ValueError):
    """A rule file that cannot be loaded."""


@record(frozen=True)
class Verdict:
    cause: str
    detail: str
    weight: float
    refines: tuple[str, ...] = ()
    # For an ``unknown`` verdict: the classes (``cause/detail``) the lines cannot tell apart.
    alternatives: tuple[str, ...] = ()


@record
class Rule:
    id: str
    path: str
    area: str
    title: str
    why: str
    severity: str
    runtime: str  # which runtime's logs it reads: dask, kwdiag, any
    keywords: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    compiled: tuple[Any, ...] | None = None  # the patterns compiled, on first use for built-in rules
    event_kind: str | tuple[str, ...] | None = None  # event rule: match events of this kind (or these kinds)
    event_fields: Mapping[str, Any] = field(default_factory=dict)
    emit_kind: str | None = None  # line rule: the event a matching line becomes
    emit_source: str = "dask"
    emit_fields: Mapping[str, Any] = field(default_factory=dict)
    context: bool = True  # attribute the line to the worker whose log it is in
    verdict: Verdict | None = None
    remediation: Mapping[str, str] = field(default_factory=dict)
    references: tuple[str, ...] = ()
    examples_match: tuple[str, ...] = ()
    examples_no_match: tuple[str, ...] = ()
    trusted: bool = False  # a built-in rule: standard ``re``, no timeout (see the module's docstring)
    guarded: tuple[Any, ...] | None = None  # a built-in rule's patterns in ``regex``, for lines over SAFE_LENGTH

    @property
    def is_line_rule(self) -> bool:
        return bool(self.patterns)

    def match_line(self, text: str, on_timeout: Callable[["Rule"], None] | None = None) -> dict[str, Any] | None:
        """Named groups of the first pattern that matches ``text`` (may be empty), else None.

        A pattern that runs longer than ``MATCH_TIMEOUT`` counts as not matching; ``on_timeout(rule)``
        is told, so the caller can report it.
        """
        compiled = self.compiled if self.compiled is not None else self.compile()
        if self.trusted:
            if len(text) <= SAFE_LENGTH:
                for pat in compiled:
                    m = pat.search(text)
                    if m is not None:
                        return {k: _convert(v) for k, v in m.groupdict().items() if v is not None}
                return None
            if self.guarded is None:
                self.guarded = tuple(_regex().compile(p) for p in self.patterns)
            compiled = self.guarded
        for pat in compiled:
            try:
                m = pat.search(text, timeout=MATCH_TIMEOUT)
            except TimeoutError:
                if on_timeout is not None:
                    on_timeout(self)
                continue
            if m is not None:
                return {k: _convert(v) for k, v in m.groupdict().items() if v is not None}
        return None

    def compile(self) -> tuple[Any, ...]:
        """Compile the patterns (built-in rules wait until a line passes the prefilter for them: most never
        see one, and compiling all of them was a third of a small explain's time)."""
        compile_one = _stdre.compile if self.trusted else _regex().compile
        self.compiled = tuple(compile_one(p) for p in self.patterns)
        return self.compiled

    @property
    def event_kinds(self) -> tuple[str, ...]:
        k = self.event_kind
        return () if k is None else ((k,) if isinstance(k, str) else tuple(k))

    def match_event(self, kind: str, fields: Mapping[str, Any]) -> bool:
        if kind not in self.event_kinds:
            return False
        return all(_field_ok(fields.get(name), want) for name, want in self.event_fields.items())


def _convert(v: str) -> Any:
    if v.isdigit() and len(v) < 18:
        return int(v)
    return v


def _memo_key_part(v: Any) -> bool:
    """Whether a field value can be part of a memo key: hashable and short (a user rule's ``re:`` condition runs
    under the timed regex engine; on a short value a timeout is as unlikely on the first call as on a later one)."""
    return v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 512)


def _regex() -> Any:
    """The ``regex`` module, imported when a user's rule needs it."""
    import regex

    return regex


_FIELD_PATTERNS: dict[str, Any] = {}   # "re:..." condition -> compiled (``re`` for built-in rules' conditions)


def _field_ok(value: Any, want: Any) -> bool:
    """Field condition: a list is any-of; "~" absent/null; "*" present; ">N"/"<N" numeric; "re:PATTERN" a
    regular expression the (string) value must contain; else equal."""
    if isinstance(want, list):
        return any(_field_ok(value, w) for w in want)
    if isinstance(want, str) and want.startswith("re:"):
        if not isinstance(value, str):
            return False
        pat = _FIELD_PATTERNS.get(want)
        if pat is None:
            pat = _FIELD_PATTERNS[want] = _regex().compile(want[3:])
        if isinstance(pat, _stdre.Pattern):
            if len(value) <= SAFE_LENGTH:
                return pat.search(value) is not None
            pat = _regex().compile(want[3:])   # rare (a field of over 4 KiB): not worth a cache
        try:
            return pat.search(value, timeout=MATCH_TIMEOUT) is not None
        except TimeoutError:
            return False
    if want == "~":
        return value is None or value == ""
    if want == "*":
        return value is not None and value != ""
    if isinstance(want, str) and want[:1] in "<>" and len(want) > 1:
        try:
            n = float(want[1:])
        except ValueError:
            return False
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        return value > n if want[0] == ">" else value < n
    if isinstance(want, str) and isinstance(value, str):
        return value == want
    return value == want


def _as_tuple(v: Any) -> tuple:
    if v is None:
        return ()
    if isinstance(v, (list, tuple)):
        return tuple(v)
    return (v,)


def parse_rule(data: Mapping[str, Any], path: str, *, compile_now: bool = True, trusted: bool = False) -> Rule:
    """Build a ``Rule`` from a parsed TOML mapping; raise ``RuleError`` with the reason. ``compile_now``:
    compile the patterns here, so a broken one is an error at load (a user's rules); the built-in rules
    compile on first use (the test suite compiles and runs every one of them). ``trusted``: a built-in rule
    (standard ``re``, no timeout); otherwise ``regex`` with a timeout."""
    rid = data.get("id")
    if not isinstance(rid, str) or not rid:
        raise RuleError(f"{path}: missing 'id'")
    match = data.get("match") or {}
    event = data.get("event") or {}
    verdict = data.get("verdict")
    patterns = tuple(str(p) for p in _as_tuple(match.get("patterns")))
    fields = _named_groups(match.get("fields") or {}, path)
    compiled = _compile(patterns if compile_now else (), _conditions(fields), path, trusted)
    v = None
    if verdict:
        try:
            v = Verdict(cause=str(verdict["cause"]), detail=str(verdict["detail"]),
                        weight=float(verdict.get("weight", 0.5)), refines=tuple(_as_tuple(verdict.get("refines"))),
                        alternatives=tuple(str(a) for a in _as_tuple(verdict.get("alternatives"))))
        except KeyError as exc:
            raise RuleError(f"{path}: [verdict] needs {exc}") from None
    keywords = tuple(str(k) for k in _as_tuple(match.get("keywords")))
    if any(not k.strip() for k in keywords):
        # an empty keyword is in every line: the prefilter would pass everything (and its trie cannot hold one)
        raise RuleError(f"{path}: an empty [match] keyword (a keyword is literal text every matching line contains)")
    examples = data.get("examples") or {}
    area = Path(path).parent.name
    return Rule(
        id=rid,
        path=path,
        area=str(data.get("area", area)),
        title=str(data.get("title", "")),
        why=str(data.get("why", "")).strip(),
        severity=str(data.get("severity", "error")),
        runtime=str(data.get("runtime", "any")),
        keywords=keywords,
        patterns=patterns,
        compiled=tuple(compiled) if compile_now else None,
        event_kind=tuple(match["kind"]) if isinstance(match.get("kind"), list) else match.get("kind"),
        event_fields=fields,
        emit_kind=event.get("kind"),
        emit_source=str(event.get("source", "dask")),
        emit_fields=dict(event.get("fields") or {}),
        context=bool(event.get("context", True)),
        verdict=v,
        remediation={str(k): str(val).strip() for k, val in (data.get("remediation") or {}).items()},
        references=tuple(str(r) for r in _as_tuple(data.get("references"))),
        examples_match=tuple(str(e) for e in _as_tuple(examples.get("match"))),
        examples_no_match=tuple(str(e) for e in _as_tuple(examples.get("no_match"))),
        trusted=trusted,
    )


def _compile(patterns: tuple[str, ...], conditions: list[str], path: str, trusted: bool) -> list[Any]:
    """``patterns`` compiled; the ``re:`` field ``conditions`` compiled into ``_FIELD_PATTERNS``; RuleError names
    the one that does not compile."""
    engine = _stdre if trusted else _regex()
    compiled = []
    for p in patterns:
        try:
            compiled.append(engine.compile(p))
        except engine.error as exc:
            raise RuleError(f"{path}: pattern {p!r} does not compile: {exc}") from None
    for cond in conditions:
        if cond in _FIELD_PATTERNS:   # the same text as a condition compiled before (a built-in one's is safe)
            continue
        try:
            _FIELD_PATTERNS[cond] = engine.compile(cond[3:])
        except engine.error as exc:
            raise RuleError(f"{path}: field condition {cond!r} does not compile: {exc}") from None
    return compiled


def _named_groups(fields: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Field conditions with each ``"@name"`` replaced by the reasons of that group (``kwdiag.reasons``): a rule
    names the one list the fact layer reads too, instead of copying it."""
    out: dict[str, Any] = {}
    for name, want in fields.items():
        wants = want if isinstance(want, list) else [want]
        if not any(isinstance(w, str) and w.startswith("@") for w in wants):
            out[name] = want
            continue
        resolved: list[Any] = []
        for w in wants:
            if isinstance(w, str) and w.startswith("@"):
                if w[1:] not in NAMED:
                    raise RuleError(f"{path}: field condition {w!r} names no group of reasons "
                                    f"(known: {', '.join('@' + n for n in sorted(NAMED))})")
                resolved += sorted(NAMED[w[1:]])
            else:
                resolved.append(w)
        out[name] = resolved
    return out


def _conditions(fields: Mapping[str, Any]) -> list[str]:
    """The ``re:`` conditions among an event rule's field conditions."""
    out = []
    for want in fields.values():
        for w in want if isinstance(want, list) else [want]:
            if isinstance(w, str) and w.startswith("re:"):
                out.append(w)
    return out


def _rule_files(directory: Path) -> list[Path]:
    # os.walk rather than Path.rglob: the same files, in a third of the time (it runs at every start)
    found = []
    for folder, subfolders, names in os.walk(directory):
        subfolders[:] = [s for s in subfolders if s != "__pycache__"]
        found.extend(os.path.join(folder, n) for n in names if n.endswith(".toml"))
    return [Path(p) for p in sorted(found)]


def load_rule_files(dirs: Iterable[Path | str], *, compile_now: bool = True, trusted: bool = False,
                    bundle: Mapping[str, list] | None = None) -> tuple[list[Rule], list[str]]:
    """Load every ``*.toml`` under ``dirs``; return the rules and one error string per bad file.

    ``bundle`` (the built-in rules' ``files`` from ``kwdiag.rulebundle``): take a file's parsed table from it
    when the file is the one bundled, which spares the TOML parse.
    """
    from kwdiag.rulebundle import parse_rule_file

    rules: list[Rule] = []
    errors: list[str] = []
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            errors.append(f"{d}: not a directory of rules")
            continue
        for f in _rule_files(d):
            try:
                with open(f, "rb") as fh:
                    relative = str(f)[len(str(d)) + 1:].replace(os.sep, "/")  # _rule_files gives d/...
                    data = parse_rule_file(fh.read(), relative, bundle or {})
                rules.append(parse_rule(data, str(f), compile_now=compile_now, trusted=trusted))
            except RuleError as exc:
                errors.append(str(exc))
            except ValueError as exc:  # tomllib.TOMLDecodeError and UnicodeDecodeError (tomllib is imported lazily)
                errors.append(f"{f}: not valid TOML: {exc}")
            except OSError as exc:
                errors.append(f"{f}: cannot read: {exc.strerror or exc}")
    return rules, errors


def lint_rules(rules: list[Rule], load_errors: Iterable[str] = ()) -> list[str]:
    """Problems with a rule set: what ``kwdiag rules check`` prints. Empty means clean."""
    problems = list(load_errors)
    seen: dict[str, str] = {}
    for r in rules:
        where = f"{r.path} ({r.id})"
        if r.id in seen:
            problems.append(f"{where}: duplicate id, also in {seen[r.id]}")
        seen.setdefault(r.id, r.path)
        if Path(r.path).stem != r.id:
            problems.append(f"{where}: id must equal the file name ({Path(r.path).stem})")
        if not r.title.strip():
            problems.append(f"{where}: empty title")
        if not r.why.strip():
            problems.append(f"{where}: empty 'why'")
        if r.severity not in SEVERITIES:
            problems.append(f"{where}: severity {r.severity!r} is not one of {', '.join(SEVERITIES)}")
        if not r.patterns and not r.event_kind:
            problems.append(f"{where}: [match] needs 'patterns' (a line rule) or 'kind' (an event rule)")
        if r.patterns and not r.keywords:
            problems.append(f"{where}: a line rule needs [match] keywords (literal text every match contains)")
        if r.patterns and not r.emit_kind:
            problems.append(f"{where}: a line rule needs [event] kind")
        if not r.examples_match:
            problems.append(f"{where}: no examples that must match")
        if not r.examples_no_match:
            problems.append(f"{where}: no examples that must not match")
        if r.verdict is not None:
            if r.verdict.cause not in CAUSES:
                problems.append(f"{where}: verdict cause {r.verdict.cause!r} is not one of {', '.join(CAUSES)}")
            if not 0 < r.verdict.weight <= 1:
                problems.append(f"{where}: verdict weight must be in (0, 1]")
            if r.verdict.alternatives and r.verdict.cause != "unknown":
                problems.append(f"{where}: only an unknown verdict has alternatives (a known cause is one)")
            for alt in r.verdict.alternatives:
                if alt.partition("/")[0] not in CAUSES or not alt.partition("/")[2]:
                    problems.append(f"{where}: alternative {alt!r} is not cause/detail with a cause of "
                                    f"{', '.join(CAUSES)}")
            if r.severity != "info" and not any(v.strip() for v in r.remediation.values()):
                problems.append(f"{where}: a rule with a verdict needs a [remediation] text")
        for d in r.verdict.refines if r.verdict is not None else ():
            if d.startswith("rule:"):   # another rule's evidence
                if d[5:] not in {o.id for o in rules} or d[5:] == r.id:
                    problems.append(f"{where}: refines {d!r}, not another rule")
                continue
            cause, _, detail = d.rpartition("/")   # a detail, or cause/detail (that verdict only)
            if not any(_gives_detail(other, detail) and cause in ("", other.verdict.cause) for other in rules):
                problems.append(f"{where}: refines {d!r}, a {'verdict' if cause else 'detail'} no rule gives")
        for k, text in r.remediation.items():
            if k not in RUNTIMES:
                problems.append(f"{where}: remediation for unknown runtime {k!r} (use {', '.join(RUNTIMES)})")
            if not text.strip():
                problems.append(f"{where}: empty remediation for {k}")
        for ex in r.examples_match:
            if not example_matches(r, ex):
                problems.append(f"{where}: example does not match: {ex[:120]!r}")
        for ex in r.examples_no_match:
            if example_matches(r, ex):
                problems.append(f"{where}: example must not match but does: {ex[:120]!r}")
    return problems


def _gives_detail(rule: Rule, detail: str) -> bool:
    """Whether ``rule``'s verdict can give ``detail`` (a detail written with fields, ``signal_{signal}``, gives
    each value they can take)."""
    if rule.verdict is None:
        return False
    pattern = _stdre.escape(rule.verdict.detail)
    pattern = _stdre.sub(r"\\\{\w+\\\}", ".+", pattern) if "{" in rule.verdict.detail else pattern
    return _stdre.fullmatch(pattern, detail) is not None


def example_matches(rule: Rule, example: str) -> bool:
    """Whether ``example`` (a log line, or a kwdiag JSONL event line for event rules) matches ``rule``.

    For line rules this goes through the prefilter too, so a pattern whose keywords do not cover
    its matches is caught.
    """
    if rule.is_line_rule:
        if not any(k in example for k in rule.keywords):
            return False
        return rule.match_line(example) is not None
    from kwdiag.events import EventDecodeError, from_json_line

    try:
        ev = from_json_line(example)
    except EventDecodeError:
        return False
    return rule.match_event(ev.kind, ev.fields)


# How often each printable byte occurs in real logs, per 100,000 bytes (at least 1): every .log and .txt under
# sample_logs/ (Dask of every version, kwdiag, pastes; 5.9 MB), counted 2026-11-27. Only the order of magnitude
# matters: it ranks where an anchor may start.
BYTE_FREQUENCY = {
    32: 13380, 33: 1, 34: 611, 35: 18, 36: 1, 37: 8, 38: 1, 39: 218, 40: 191, 41: 187, 42: 37, 43: 40, 44: 965,
    45: 7981, 46: 2630, 47: 1694, 48: 3269, 49: 3530, 50: 3935, 51: 1688, 52: 1144, 53: 1098, 54: 1493, 55: 1076,
    56: 676, 57: 704, 58: 2669, 59: 18, 60: 39, 61: 71, 62: 47, 63: 1, 64: 1, 65: 28, 66: 38, 67: 144, 68: 26,
    69: 80, 70: 771, 71: 62, 72: 1, 73: 725, 74: 1, 75: 3, 76: 54, 77: 46, 78: 779, 79: 697, 80: 17, 81: 1,
    82: 260, 83: 216, 84: 157, 85: 7, 86: 3, 87: 160, 88: 1, 89: 1, 90: 35, 91: 102, 92: 24, 93: 102, 94: 692,
    95: 220, 96: 13, 97: 2251, 98: 1167, 99: 2279, 100: 2945, 101: 5156, 102: 358, 103: 720, 104: 766, 105: 3421,
    106: 31, 107: 1326, 108: 1524, 109: 845, 110: 2300, 111: 3015, 112: 1175, 113: 41, 114: 4183, 115: 2945,
    116: 4120, 117: 1563, 118: 225, 119: 935, 120: 143, 121: 527, 122: 9, 123: 38, 124: 78, 125: 38, 126: 1,
}
ANCHOR = 7  # bytes of a keyword an anchor keeps at least (the whole keyword when shorter)


def _frequency(byte: int) -> int:
    return BYTE_FREQUENCY.get(byte, 1 if byte > 127 else 20000)   # UTF-8 is rare in logs; control bytes never in rules


def prefilter_anchors(keywords: Iterable[str]) -> list[bytes]:
    """Literal anchors for the prefilter: for each keyword, its tail from one of its bytes on (at least ``ANCHOR``
    bytes, or the whole keyword).

    The stdlib regex engine skips the positions whose byte cannot start any alternative and tries the trie at
    the others, so what a scan costs is how often the anchors' *first bytes, all together,* occur in a log. The
    bytes anchors may start with are chosen as a weighted hitting set: as few and as rare bytes as let every
    keyword start an anchor with one of them (a greedy pick by keywords covered per frequency, then each byte
    dropped again where rarer ones can cover its keywords); each keyword's anchor is then its longest tail that
    starts with one of them. When each keyword took its own rarest byte, the built-in rules' anchors began with
    27 different bytes, 13.7 % of the sample logs' bytes; so, 16 bytes and 4.5 % (of the .log files), and the scan
    of a scheduler's log runs ~1.7x as fast. Every line holding a keyword holds its anchor, so nothing is lost; a
    line passed through by an anchor is then checked for the whole keywords.
    """
    words = sorted({k.encode() for k in keywords})
    starts = {w: {w[0]} if len(w) <= ANCHOR else {w[i] for i in range(len(w) - ANCHOR + 1)} for w in words}
    chosen = _cover(words, starts, set())
    for byte in sorted(chosen, key=_frequency, reverse=True):   # each byte again: can rarer ones do its work?
        rest = chosen - {byte}
        swapped = _cover([w for w in words if not starts[w] & rest], starts, rest, avoid=byte)
        if swapped is not None and sum(map(_frequency, swapped)) < sum(map(_frequency, chosen)):
            chosen = swapped
    anchors = set()
    for w in words:
        if len(w) <= ANCHOR:
            anchors.add(w)
        else:
            # the longest tail that starts with a chosen byte: those bytes are paid for, and a longer anchor
            # passes fewer lines that lack the keyword ("y\", line" of 'cli.py", line' would pass every frame)
            anchors.add(w[next(i for i in range(len(w) - ANCHOR + 1) if w[i] in chosen):])
    # an anchor that contains another is redundant: the shorter one finds the same lines
    out = [a for a in anchors if not any(o != a and o in a for o in anchors)]
    return sorted(out, key=lambda a: (-len(a), a))


def _cover(words: list[bytes], starts: Mapping[bytes, set[int]], chosen: set[int],
           avoid: int | None = None) -> set[int] | None:
    """``chosen`` and the bytes a greedy pick adds so that each of ``words`` may start an anchor with one of them
    (never ``avoid``); None when it cannot."""
    chosen, left = set(chosen), [w for w in words if not starts[w] & chosen]
    while left:
        counts: dict[int, int] = {}
        for w in left:
            for c in starts[w]:
                if c != avoid:
                    counts[c] = counts.get(c, 0) + 1
        if not counts:
            return None
        best = max(counts, key=lambda c: (counts[c] / _frequency(c), -c))
        chosen.add(best)
        left = [w for w in left if best not in starts[w]]
    return chosen


def trie_pattern(words: Iterable[bytes]) -> bytes:
    """One regular expression for a set of literals with their common prefixes factored out
    (``ab|ac`` becomes ``a(?:b|c)``). It finds the same lines as the plain alternation; the engine tries
    one branch per byte instead of every literal at every position that could start one: 2.3x the
    speed on 94 anchors over real Dask noise (40 -> 94 MB/s)."""
    return _trie(words, lambda c: _stdre.escape(bytes([c])), b"")


def _trie(words: Iterable, escape: Callable[[Any], Any], empty: Any) -> Any:
    """``trie_pattern`` for bytes (``escape`` of one byte value, ``empty`` b"") or text (of one character, "")."""
    def lit(t: str) -> Any:
        return t.encode() if isinstance(empty, bytes) else t

    trie: dict = {}
    for w in words:
        node = trie
        for c in w:
            node = node.setdefault(c, {})
        node[None] = {}

    def build(node: dict) -> Any:
        alts = [escape(c) + build(sub) for c, sub in sorted((k, v) for k, v in node.items() if k is not None)]
        if not alts:
            return empty
        body = alts[0] if len(alts) == 1 else lit("(?:") + lit("|").join(alts) + lit(")")
        # a literal that ends here while longer ones go on (a prefix of another): the rest is optional
        return lit("(?:") + body + lit(")?") if None in node else body

    return build(trie)


def deferred_keywords(rules: Iterable[Rule]) -> set[str]:
    """The line rules' keywords that only connection rules have (``kinds.CONNECTION``: the scheduler's
    ``Received 'close-stream'``): a line of one of them tells anything only when a removal follows within
    ``kinds.NEAR_REMOVAL`` lines, so the prefilter does not look for them (a long-running scheduler prints
    millions) and the reader reads the few lines before each removal instead (``kwdiag.readers.scan.Lookback``)."""
    line_rules = [r for r in rules if r.is_line_rule]
    connection = {k for r in line_rules if r.emit_kind in CONNECTION for k in r.keywords}
    return connection - {k for r in line_rules if r.emit_kind not in CONNECTION for k in r.keywords}


def prefilter_keywords(rules: Iterable[Rule]) -> list[str]:
    """What the prefilter looks for: every line rule's keywords but the deferred ones, and kwdiag's JSONL. A
    keyword with a quote is looked for with ``\\"`` too: the prefilter reads the raw bytes, and a line that was a
    JSON string's content keeps its quotes escaped until the reader takes them off (``readers.shapes``)."""
    rules = list(rules)
    keywords = {k for r in rules if r.is_line_rule for k in r.keywords} - deferred_keywords(rules)
    escaped = {k.replace('"', '\\"') for k in keywords if '"' in k}
    return sorted(keywords | escaped | {RuleSet.JSON_KEYWORD})


def prefilter_for(keywords: Iterable[str], cached: Mapping[str, Any] | None = None) -> tuple[list[bytes], bytes]:
    """The prefilter's anchors and trie pattern for ``keywords``; taken from ``cached`` (the rule bundle's, built
    for the built-in rules) when it was built for exactly these keywords, which spares ~7 ms at every start."""
    keywords = sorted(set(keywords))
    if cached and cached.get("keywords") == keywords:
        # bytes travel through JSON as latin-1 text: one character per byte, nothing lost
        return [a.encode("latin-1") for a in cached["anchors"]], cached["pattern"].encode("latin-1")
    anchors = prefilter_anchors(keywords)
    return anchors, trie_pattern(anchors)


class RuleSet:
    """Compiled rules ready to run: a bytes prefilter plus per-keyword dispatch."""

    JSON_KEYWORD = '{"v":'
    TRIE_AFTER = 1000  # candidate lines looked up keyword by keyword before the keyword trie is compiled

    def __init__(self, rules: list[Rule], prefilter_cache: Mapping[str, Any] | None = None):
        self.rules = list(rules)
        self.by_id = {r.id: r for r in self.rules}
        self.line_rules = [r for r in self.rules if r.is_line_rule]
        self.event_rules = [r for r in self.rules if r.event_kind]
        self.by_keyword: dict[str, list[Rule]] = {}
        for r in self.line_rules:
            for k in r.keywords:
                self.by_keyword.setdefault(k, []).append(r)
        self.deferred = deferred_keywords(self.line_rules)
        self.anchors, pattern = prefilter_for(prefilter_keywords(self.line_rules), prefilter_cache)
        # Literals over raw bytes (stdlib re: literals only, so no timeout is needed), as a trie.
        self.prefilter = _stdre.compile(pattern)
        self._keyword_re: Any = None  # built once TRIE_AFTER lines were looked up without it
        self._lines_before_trie = self.TRIE_AFTER
        self._prefixes: dict[str, tuple[str, ...]] = {}
        self._by_anchor = False   # the trie is over the keywords' anchors (then each keyword is checked whole)
        self._prefilter_cache = prefilter_cache
        self._rules_for: dict[frozenset[str], tuple[Rule, ...]] = {}
        self.events_by_kind: dict[str, list[Rule]] = {}
        for r in self.event_rules:
            for kind in r.event_kinds:
                self.events_by_kind.setdefault(kind, []).append(r)
        # The fields the event rules of each kind test: two events of a kind that agree on them match the same
        # rules, so ``match_event`` answers each such combination once (a log of 100,000 deaths repeats a few).
        self._tested = {k: tuple(sorted({n for r in rs for n in r.event_fields})) for k, rs in self.events_by_kind.items()}
        self._matched: dict[tuple, list[Rule]] = {}

    def match_line(self, text: str, timeouts: "RuleTimeouts | None" = None,
                   candidates: tuple[Rule, ...] | None = None) -> list[tuple[Rule, dict[str, Any]]]:
        """Every line rule that matches ``text`` with its named groups, in rule-id order.

        Only rules one of whose keywords occurs in the line are tried (``candidates``, found here unless the
        caller already has them for this text). With ``timeouts``, pattern timeouts are recorded there and a
        rule past ``TIMEOUT_LIMIT`` timeouts is skipped.
        """
        out = []
        for rule in self.candidates(text) if candidates is None else candidates:
            if timeouts is not None and timeouts.off(rule.id):
                continue
            groups = rule.match_line(text, timeouts.record if timeouts is not None else None)
            if groups is not None:
                out.append((rule, groups))
        return out

    def candidates(self, text: str) -> tuple[Rule, ...]:
        """The line rules one of whose keywords occurs in ``text``, in rule-id order.

        One search of a trie of every keyword per keyword occurrence (one ``in`` per keyword costs twice as
        much a line; only a run's first ``TRIE_AFTER`` lines use it, to spare compiling the trie). Keywords may
        overlap: after a match at ``p`` the next
        search starts at ``p + 1``, and the keywords that are prefixes of the one matched at ``p`` are there too.
        """
        if self._keyword_re is not None:
            search, prefixes = self._keyword_re.search, self._prefixes
            found: set[str] = set()
            m = search(text)
            while m is not None:
                found.update(prefixes[m.group()])
                m = search(text, m.start() + 1)
            if self._by_anchor:   # an anchor is part of a keyword: the line must hold the whole keyword
                found = {k for k in found if k in text}
        elif self._lines_before_trie > 0:
            # The first lines of a run are looked up one keyword at a time (~7 us a line where the trie takes
            # ~3.5): compiling the trie costs ~4 ms, more than a small log's lines all together.
            self._lines_before_trie -= 1
            found = {k for k in self.by_keyword if k in text}
        else:
            self._build_keyword_finder()
            return self.candidates(text)
        if not found:
            return ()
        key = frozenset(found)
        rules = self._rules_for.get(key)
        if rules is None:
            by_id = {r.id: r for k in key for r in self.by_keyword[k]}
            rules = self._rules_for[key] = tuple(by_id[i] for i in sorted(by_id))
        return rules

    def _build_keyword_finder(self) -> None:
        """The trie ``candidates`` searches a line with. Over the keywords' anchors (``prefilter_anchors``: each
        starts with one of a few rare characters), so the search tries the few positions holding one of those
        (6 us a Dask line with a trie of the whole keywords, whose first characters are common, ~1.5 so); each
        anchor found names the keywords it is part of, which are then looked for whole. Keywords beyond ASCII (a
        user's rule) are searched whole: an anchor is cut from a keyword's bytes."""
        words = sorted(self.by_keyword)
        if not all(w.isascii() for w in words):
            self._keyword_re = _stdre.compile(_trie(words, _stdre.escape, ""))
            self._prefixes = {w: tuple(p for p in words if w.startswith(p)) for w in words}
            self._by_anchor = False
            return
        cached = self._prefilter_cache or {}
        if cached.get("finder_keywords") == words:
            anchors = list(cached["finder_anchors"])
        else:
            anchors = [a.decode() for a in prefilter_anchors(words)]
        # Each keyword is looked for at one anchor it holds, its longest (a short anchor such as "Worker" is in
        # many keywords; looking for each of them wherever it occurs was a third of the lookup). The trie matches
        # the longest anchor at a position; those that are its prefixes are there too.
        holding: dict[str, list[str]] = {a: [] for a in anchors}
        for w in words:
            holding[max((a for a in anchors if a in w), key=len)].append(w)
        self._prefixes = {a: tuple(sorted({w for p in anchors if a.startswith(p) for w in holding[p]}))
                          for a in anchors}
        self._keyword_re = _stdre.compile(_trie(anchors, _stdre.escape, ""))
        self._by_anchor = True

    def match_event(self, kind: str, fields: Mapping[str, Any]) -> list[Rule]:
        """The event rules that read an event of ``kind`` with ``fields`` (a new list each call)."""
        rules = self.events_by_kind.get(kind)
        if not rules:
            return []
        values = tuple(fields.get(n) for n in self._tested[kind])
        if not all(_memo_key_part(v) for v in values):
            return [r for r in rules if r.match_event(kind, fields)]
        key = (kind, values, tuple(map(type, values)))   # True and 1 are equal keys, not equal values
        found = self._matched.get(key)
        if found is None:
            if len(self._matched) > 100_000:
                self._matched.clear()
            found = self._matched[key] = [r for r in rules if r.match_event(kind, fields)]
        return list(found)


class RuleTimeouts:
    """Which rules' patterns hit the match timeout in one run, and where (for the report).

    The reader sets ``where`` to ``(file, line)`` before matching a line; ``hits`` maps
    ``(rule id, file)`` to ``[count, first line, rule path]``. After ``limit`` timeouts in the run a
    rule is off, so a catastrophic pattern costs at most ``limit * MATCH_TIMEOUT`` seconds per pattern.
    """

    def __init__(self, limit: int = TIMEOUT_LIMIT):
        self.limit = limit
        self.where: tuple[str, int | None] = ("?", None)
        self.total: dict[str, int] = {}
        self.hits: dict[tuple[str, str], list] = {}

    def record(self, rule: Rule) -> None:
        self.total[rule.id] = self.total.get(rule.id, 0) + 1
        file, line = self.where
        self.hits.setdefault((rule.id, file), [0, line, rule.path])[0] += 1

    def off(self, rule_id: str) -> bool:
        return self.total.get(rule_id, 0) >= self.limit


def load_ruleset(extra_dirs: Iterable[Path | str] = ()) -> tuple[RuleSet, list[str]]:
    """The built-in rules plus the rules in ``extra_dirs`` (``--rules DIR``), and load errors.

    A user rule with the id of a built-in replaces it.
    """
    from kwdiag.rulebundle import read_bundle

    bundle = read_bundle(builtin_rules_dir())
    rules, errors = load_rule_files([builtin_rules_dir()], compile_now=False, trusted=True,
                                    bundle=bundle.get("files"))
    extra, extra_errors = load_rule_files(list(extra_dirs))
    ids = {r.id for r in extra}
    rules = [r for r in rules if r.id not in ids] + extra
    return RuleSet(rules, bundle.get("prefilter")), errors + extra_errors


def load_rules(rules_dirs: Iterable[Path | str] = ()) -> RuleSet:
    """The built-in rules plus ``rules_dirs``; raises ``KwdiagError`` (USAGE) if any rule file is broken."""
    from kwdiag.errors import USAGE, KwdiagError

    ruleset, errors = load_ruleset(list(rules_dirs))
    if errors:
        raise KwdiagError("cannot load rules: " + "; ".join(errors[:3]) + (" ..." if len(errors) > 3 else ""), USAGE)
    return ruleset
