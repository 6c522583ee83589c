"""Every rule's own examples, the rule set's lint, and the engine's contract (timeouts, user rules)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from kwdiag.engine import (
    RuleSet,
    builtin_rules_dir,
    example_matches,
    lint_rules,
    load_rule_files,
    load_ruleset,
)

RULES, LOAD_ERRORS = load_rule_files([builtin_rules_dir()])
EXAMPLES = [(r.id, ex, True) for r in RULES for ex in r.examples_match] + \
           [(r.id, ex, False) for r in RULES for ex in r.examples_no_match]
BY_ID = {r.id: r for r in RULES}


def test_rules_load_without_errors():
    assert LOAD_ERRORS == []
    assert len(RULES) >= 40


def test_rule_set_is_lint_clean():
    assert lint_rules(RULES) == []


@pytest.mark.parametrize("rule_id,example,should_match", EXAMPLES,
                         ids=[f"{r}-{'match' if m else 'nomatch'}-{i}" for i, (r, _, m) in enumerate(EXAMPLES)])
def test_rule_example(rule_id, example, should_match):
    assert example_matches(BY_ID[rule_id], example) is should_match


def test_every_rule_lives_in_its_area_directory_named_by_id():
    for r in RULES:
        p = Path(r.path)
        assert p.stem == r.id
        assert p.parent.parent == builtin_rules_dir()


def _write_rule(tmp_path: Path, rid: str, body: str) -> Path:
    d = tmp_path / "mine"
    d.mkdir(exist_ok=True)
    p = d / f"{rid}.toml"
    p.write_text(textwrap.dedent(body))
    return d


GOOD = """
id = "my-rule"
title = "My rule"
why = "Because."
severity = "error"
[match]
keywords = ["BOOM"]
patterns = ['BOOM (?P<code>\\d+)']
[event]
kind = "exception"
source = "worker"
[verdict]
cause = "unrecoverable_exception"
detail = "boom"
weight = 0.7
[remediation]
dask = "Stop the boom."
[examples]
match = ["BOOM 12"]
no_match = ["boom 12"]
"""


def test_lint_catches_each_problem(tmp_path):
    bad = GOOD.replace('title = "My rule"', 'title = ""').replace('no_match = ["boom 12"]', 'no_match = ["BOOM 3"]')
    d = _write_rule(tmp_path, "my-rule", bad)
    _write_rule(tmp_path, "dask-nanny-sigkill", GOOD.replace('"my-rule"', '"dask-nanny-sigkill"'))
    (d / "broken.toml").write_text("id = 'broken'\n[match]\npatterns = ['(unclosed']\n")
    rules, errors = load_rule_files([builtin_rules_dir(), d])
    problems = "\n".join(lint_rules(rules, errors))
    assert "empty title" in problems
    assert "must not match but does" in problems
    assert "duplicate id" in problems
    assert "does not compile" in problems


def test_lint_requires_keywords_covering_the_pattern(tmp_path):
    d = _write_rule(tmp_path, "my-rule", GOOD.replace('keywords = ["BOOM"]', 'keywords = ["KABOOM"]'))
    rules, errors = load_rule_files([d])
    assert any("example does not match" in p for p in lint_rules(rules, errors))


def test_user_rules_are_used_beside_the_builtins(tmp_path):
    d = _write_rule(tmp_path, "my-rule", GOOD)
    rs, errors = load_ruleset([d])
    assert errors == []
    assert "my-rule" in rs.by_id and "dask-nanny-sigkill" in rs.by_id
    hits = rs.match_line("2026-01-01 00:00:00,000 - x - ERROR - BOOM 42")
    assert [(r.id, g) for r, g in hits] == [("my-rule", {"code": 42})]


def test_catastrophic_user_pattern_times_out_instead_of_hanging(tmp_path):
    body = GOOD.replace("patterns = ['BOOM (?P<code>\\\\d+)']", "patterns = ['BOOM (a+)+$']") \
        .replace('match = ["BOOM 12"]', 'match = ["BOOM aaa"]')
    d = _write_rule(tmp_path, "my-rule", body)
    rs, _ = load_ruleset([d])
    import time

    t = time.perf_counter()
    rs.match_line("BOOM " + "a" * 40 + "!")
    assert time.perf_counter() - t < 2.0


def test_prefilter_passes_every_match_example_but_the_deferred_connection_lines():
    """Every line rule's examples pass the prefilter, except the rules whose keywords it does not look for: the
    connection lines (``kinds.CONNECTION``), read only before a removal (``engine.deferred_keywords``)."""
    from kwdiag.kinds import CONNECTION

    rs = RuleSet(RULES)
    deferred = {r.id for r in RULES if r.is_line_rule and set(r.keywords) <= rs.deferred}
    assert deferred == {"dask-close-stream", "dask-connection-closed"}
    assert {BY_ID[i].emit_kind for i in deferred} <= CONNECTION
    for r in RULES:
        for ex in r.examples_match:
            if r.is_line_rule:
                assert bool(rs.prefilter.search(ex.encode())) == (r.id not in deferred), (r.id, ex)


def test_event_rules_read_kwdiag_events():
    rs = RuleSet(RULES)
    line = json.loads(BY_ID["kwdiag-exit-memory"].examples_match[0])
    assert [r.id for r in rs.match_event(line["kind"], line["fields"])] == ["kwdiag-exit-memory"]


def test_the_prefilter_trie_finds_the_lines_the_plain_alternation_finds():
    """The prefilter factors its anchors into a trie for speed; it must pass exactly the same lines."""
    import gzip

    from kwdiag.engine import RuleSet, trie_pattern

    ruleset = RuleSet(RULES)
    root = Path(__file__).resolve().parent.parent
    rx = re.compile(trie_pattern([b"abc", b"ab", b"abd", b"x", b"y{"]))
    assert [bool(rx.search(t)) for t in (b"zab", b"abd", b"a", b"xx", b"q", b"y{", b"y")] == \
        [True, True, False, True, False, True, False]
    plain = re.compile(b"|".join(re.escape(a) for a in ruleset.anchors))
    lines = 0
    for path in sorted((root / "sample_logs").rglob("*")):
        if path.suffix not in (".log", ".gz", ".jsonl", ".txt"):
            continue
        data = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
        for line in data.split(b"\n"):
            lines += 1
            assert bool(plain.search(line)) == bool(ruleset.prefilter.search(line)), (path, line[:200])
    assert lines > 50_000   # every sample and corpus log


# ---------------------------------------------------------------- the parsed-rules bundle
def test_the_shipped_rule_bundle_is_current():
    """``rules/bundle.json`` spares the TOML parse and the prefilter's construction at start: it must hold every
    built-in rule file as it is now (run ``python -m kwdiag.rulebundle`` after editing a rule)."""
    from kwdiag.rulebundle import build_bundle, read_bundle

    shipped, now = read_bundle(builtin_rules_dir()), build_bundle(builtin_rules_dir())
    assert json.dumps(shipped) == json.dumps(now)          # order too: a rule's fixes show in the order written


def test_an_edited_rule_is_read_from_its_toml_not_from_a_stale_bundle(tmp_path):
    import shutil

    from kwdiag.rulebundle import read_bundle, write_bundle

    folder = tmp_path / "rules"
    shutil.copytree(builtin_rules_dir(), folder, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    write_bundle(folder)
    bundle = read_bundle(folder)
    victim = folder / "kernel" / "kernel-oom-kill.toml"
    victim.write_text(victim.read_text().replace('title = "', 'title = "EDITED ', 1)
                      .replace('keywords = [', 'keywords = ["a keyword nobody bundled", ', 1))
    rules, errors = load_rule_files([folder], bundle=bundle["files"])
    assert errors == []
    by_id = {r.id: r for r in rules}
    assert by_id["kernel-oom-kill"].title.startswith("EDITED ")
    assert {r.id: r.title for r in rules if r.id != "kernel-oom-kill"} == \
        {r.id: r.title for r in RULES if r.id != "kernel-oom-kill"}
    # the bundle's prefilter was built for other keywords: it is not used, the new keyword reaches the prefilter
    ruleset = RuleSet(rules, bundle["prefilter"])
    assert ruleset.prefilter.search(b"... a keyword nobody bundled ...")
    assert RuleSet(RULES, bundle["prefilter"]).prefilter.pattern == RuleSet(RULES).prefilter.pattern
    # a broken file is an error whatever the bundle says
    victim.write_text("this is = = not toml")
    assert any("not valid TOML" in e for e in load_rule_files([folder], bundle=bundle["files"])[1])
    # and a bundle that is not a bundle is ignored, never trusted
    (folder / "bundle.json").write_text('{"format": 1, "files": ')
    assert read_bundle(folder) == {}


def test_lint_catches_a_dead_refinement_and_alternatives_of_a_known_cause(tmp_path):
    """A refinement of a detail no rule gives absorbs nothing (two such words lingered in 53 rules); only an
    unknown verdict names the classes its lines cannot tell apart."""
    bad = GOOD.replace('weight = 0.7', 'weight = 0.7\nrefines = ["sigkill", "no_such_detail", "sudden_exit/segfault", '
                                       '"version_mismatch/segfault", "rule:no-such-rule", "rule:dask-nanny-kill-after-close"]\nalternatives = ["sudden_exit/sigkill"]')
    d = _write_rule(tmp_path, "my-rule", bad)
    rules, errors = load_rule_files([builtin_rules_dir(), d])
    problems = [p for p in lint_rules(rules, errors) if "my-rule" in p]
    assert any("refines 'no_such_detail', a detail no rule gives" in p for p in problems), problems
    assert not any("refines 'sigkill'" in p or "refines 'sudden_exit/segfault'" in p for p in problems)
    assert any("refines 'version_mismatch/segfault', a verdict no rule gives" in p for p in problems), problems
    assert any("refines 'rule:no-such-rule', not another rule" in p for p in problems), problems
    assert not any("rule:dask-nanny-kill-after-close" in p for p in problems)
    assert any("only an unknown verdict has alternatives" in p for p in problems), problems
    unknown = GOOD.replace('cause = "unrecoverable_exception"', 'cause = "unknown"').replace(
        'weight = 0.7', 'weight = 0.7\nalternatives = ["sudden_exit/sigkill", "not_a_cause/x"]')
    (tmp_path / "u").mkdir()
    rules, errors = load_rule_files([_write_rule(tmp_path / "u", "my-rule", unknown)])
    assert [p for p in lint_rules(rules, errors) if "alternative" in p] == [
        f"{rules[0].path} (my-rule): alternative 'not_a_cause/x' is not cause/detail with a cause of "
        "chose_to_exit, unrecoverable_exception, nanny_memory_restart, sudden_exit, version_mismatch, unknown"]


def test_built_in_rules_match_alike_in_re_and_in_regex():
    """The built-in rules run in the standard ``re`` (no ``regex`` import, no timeout); the same patterns as a
    user's copy of them would run in ``regex``. Both must compile them and read every example alike."""
    import regex

    ruleset, errors = load_ruleset()
    assert not errors
    built_in = [r for r in ruleset.rules if r.patterns]
    assert built_in and all(r.trusted for r in built_in)
    checked = 0
    for rule in built_in:
        for pattern in rule.patterns:
            std, rx = re.compile(pattern), regex.compile(pattern)
            for example in rule.examples_match + rule.examples_no_match:
                a, b = std.search(example), rx.search(example)
                assert (a is None) == (b is None), (rule.id, pattern, example)
                assert a is None or a.groupdict() == b.groupdict(), (rule.id, pattern, example)
                checked += 1
    assert checked > 200


def test_a_megabyte_of_line_cannot_hang_a_built_in_rule():
    """Built-in patterns run in ``re`` without a timeout only on lines up to ``SAFE_LENGTH``: a lazy ``.+?...$``
    backtracks quadratically, and a stranger's log can hold lines of a megabyte (``re`` took 2.9 s on 20 KB of
    this line, so ~5 minutes on these 200 KB). Longer lines get ``regex`` and its timeout; a generous deadline."""
    import threading

    from kwdiag.engine import SAFE_LENGTH, RuleTimeouts

    ruleset, _ = load_ruleset()
    line = "Key:  x" + " " * 200_000 + "y"
    assert len(line) > SAFE_LENGTH
    timeouts, out = RuleTimeouts(), []
    worker = threading.Thread(target=lambda: out.append(ruleset.match_line(line, timeouts)), daemon=True)
    worker.start()
    worker.join(60)
    assert out, "matching one long line did not finish within 60 s"
    short = "Key:       div-1-0"     # and a line of the usual length still matches, through re
    assert [(r.id, g) for r, g in ruleset.match_line(short)] == [("dask-compute-failed-key", {"key": "div-1-0"})]


def test_the_first_lines_looked_up_keyword_by_keyword_get_the_rules_the_trie_gives(monkeypatch):
    """A run's first RuleSet.TRIE_AFTER candidate lines are looked up one keyword at a time (compiling the trie
    of every keyword would cost a small log more than its lines); both ways must give the same rules, on every
    line of the samples and the corpus that holds a keyword."""
    root = Path(__file__).resolve().parent.parent
    by_keyword, by_trie = RuleSet(RULES), RuleSet(RULES)
    monkeypatch.setattr(by_keyword, "_lines_before_trie", 10 ** 9)
    by_trie._build_keyword_finder()
    compared = 0
    for path in sorted((root / "sample_logs").rglob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            want = by_trie.candidates(line)
            assert by_keyword.candidates(line) == want, (path, line)
            compared += bool(want)
    assert compared > 15_000 and by_keyword._keyword_re is None
    fresh = RuleSet(RULES)
    for _ in range(RuleSet.TRIE_AFTER + 1):
        fresh.candidates("2026-11-21 09:53:19,534 - distributed.nanny - INFO - Closing Nanny at tcp://x")
    assert fresh._keyword_re is not None   # then the trie takes over


def test_the_prefilters_anchors_start_with_rare_bytes_and_pass_few_lines_without_a_keyword():
    """What a prefilter scan costs is how often its anchors' first bytes occur in a log (the regex engine tries
    the trie at each such position), and then the lines it passes that hold no keyword. On every sample and
    corpus log: the first bytes of the built-in anchors cover at most 6 % of the bytes (13.7 % when each keyword
    took its own rarest byte), and at most 10 % more lines pass than hold a keyword the prefilter looks for."""
    from collections import Counter

    from kwdiag.engine import prefilter_keywords

    root = Path(__file__).resolve().parent.parent
    data = b"\n".join(p.read_bytes() for p in sorted((root / "sample_logs").rglob("*.log")))
    counts = [0] * 256
    for byte, n in Counter(data).items():
        counts[byte] = n
    ruleset = RuleSet(RULES)
    firsts = {a[0] for a in ruleset.anchors}
    assert sum(counts[b] for b in firsts) / len(data) <= 0.06, bytes(sorted(firsts))
    keywords = [k.encode() for k in prefilter_keywords(RULES)]
    lines = data.split(b"\n")
    passed = sum(1 for line in lines if ruleset.prefilter.search(line))
    holding = sum(1 for line in lines if any(k in line for k in keywords))
    assert holding > 10_000 and passed <= 1.10 * holding, (passed, holding)


def test_an_empty_keyword_is_a_broken_rule_not_a_crash(tmp_path):
    """An empty keyword is in every line: the prefilter would pass everything, and its trie cannot hold one (an
    explain with such a user rule once hung, then raised IndexError). A load error with the file's name, and the
    CLI's one line and usage exit code."""
    import subprocess
    import sys

    d = _write_rule(tmp_path, "my-rule", GOOD.replace('keywords = ["BOOM"]', 'keywords = ["", "BOOM"]'))
    rules, errors = load_rule_files([d])
    assert rules == [] and len(errors) == 1 and "my-rule.toml" in errors[0] and "empty" in errors[0]
    log = tmp_path / "a.log"
    log.write_text("BOOM 12\n")
    r = subprocess.run([sys.executable, "-m", "kwdiag", "explain", "--rules", str(d), str(log)],
                       capture_output=True, text=True, timeout=60)
    from kwdiag.errors import USAGE

    assert r.returncode == USAGE and "Traceback" not in r.stderr and "empty" in r.stderr, r.stderr
