"""One registry of event kinds (kwdiag.kinds): every kind anyone emits is in it, every kind in it is emitted
and documented, and every kind the code tests against is spelled as registered. Pure: reads files, starts
nothing, imports only kwdiag.kinds."""

import ast
import pathlib
import re
import tomllib

import pytest

from kwdiag import kinds
from kwdiag.kinds import KINDS

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Who writes events: kwdiag's runtime and the kwdiag.dask plugins (calls of these methods), the rules (their
# [event] kind), the fact layer (its _fact calls).
EMITTING_CODE = ("runtime", "kwdiag/dask")
EMIT_CALLS = {"event", "_event", "emit"}
FACTS = ROOT / "kwdiag" / "analysis" / "facts.py"
# Kinds that only a reader synthesizes (no rule, runtime or fact emits them), each with why. None today:
# the text reader writes only the kinds of its rules, and the JSONL reader only what the files say.
SYNTHESIZED_ONLY: dict[str, str] = {}
# Calls that take a literal set of kinds (the timeline's lookups of nearby lines).
KIND_SET_CALLS = {"lines_before", "context_between", "cluster_lines"}


def _py_files(*dirs: str) -> list[pathlib.Path]:
    out = []
    for d in dirs:
        for path in sorted((ROOT / d).rglob("*.py")):
            rel = path.relative_to(ROOT).parts
            if rel[0] == "kwdiag" and len(rel) > 1 and rel[1] in ("runtime", "rules"):
                continue  # symlinks to runtime/ and rules/, scanned under their own names
            out.append(path)
    return out


def _where(path: pathlib.Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{node.lineno}"


def _add(found: dict[str, list[str]], kind: str, where: str) -> None:
    found.setdefault(kind, []).append(where)


def _rules() -> list[tuple[pathlib.Path, dict]]:
    return [(p, tomllib.loads(p.read_text())) for p in sorted((ROOT / "rules").rglob("*.toml"))]


def rule_emitted_kinds() -> dict[str, list[str]]:
    """kind -> the rules whose [event] turns a text line into an event of that kind."""
    found: dict[str, list[str]] = {}
    for path, rule in _rules():
        kind = rule.get("event", {}).get("kind")
        if kind is not None:
            _add(found, kind, str(path.relative_to(ROOT)))
    return found


def rule_read_kinds() -> dict[str, list[str]]:
    """kind -> the event rules that read events of that kind ([match] kind, a string or a list)."""
    found: dict[str, list[str]] = {}
    for path, rule in _rules():
        kind = rule.get("match", {}).get("kind")
        for k in kind if isinstance(kind, list) else [kind] if kind is not None else []:
            _add(found, k, str(path.relative_to(ROOT)))
    return found


def _str_const(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def code_emitted_kinds(paths: list[pathlib.Path]) -> dict[str, list[str]]:
    """kind -> where: ``x.event("kind", ...)``, ``self._event("kind", ...)``, ``writer.emit("kind", ...)``, a
    ``kind="..."`` keyword, and a module constant ``..._KIND = "..."`` (kwdiag.dask writes ``tasks-executing``
    lines by hand from one)."""
    found: dict[str, list[str]] = {}
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
                if name in EMIT_CALLS and node.args and (kind := _str_const(node.args[0])) is not None:
                    _add(found, kind, _where(path, node))
                for kw in node.keywords:
                    if kw.arg == "kind" and (kind := _str_const(kw.value)) is not None:
                        _add(found, kind, _where(path, node))
        for node in tree.body:
            if isinstance(node, ast.Assign) and (kind := _str_const(node.value)) is not None and any(
                    isinstance(t, ast.Name) and t.id.endswith("_KIND") for t in node.targets):
                _add(found, kind, _where(path, node))
    return found


def fact_kinds() -> dict[str, list[str]]:
    """kind -> where the fact layer derives it (``_fact("fact-...", ...)``)."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(FACTS.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_fact" \
                and node.args and (kind := _str_const(node.args[0])) is not None:
            _add(found, kind, _where(FACTS, node))
    return found


def _strings(node: ast.AST) -> list[str]:
    if (s := _str_const(node)) is not None:
        return [s]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for elt in node.elts for s in _strings(elt)]
    return []


def _is_kind(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "kind"


def kinds_tested_in(tree: ast.AST, where) -> dict[str, list[str]]:
    """kind -> where code tests an event's kind against a literal: ``e.kind == "..."``, ``e.kind in ("...",
    ...)`` (either side), and a literal set of kinds given to the timeline's lookups."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_kind(s) for s in sides):
                for side in sides:
                    for s in _strings(side):
                        _add(found, s, where(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in KIND_SET_CALLS:
            for arg in node.args:
                if isinstance(arg, (ast.Set, ast.Constant)):
                    for s in _strings(arg):
                        _add(found, s, where(node))
    return found


def kinds_the_code_tests() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in _py_files("kwdiag", "runtime"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for kind, wheres in kinds_tested_in(tree, lambda n, p=path: _where(p, n)).items():
            found.setdefault(kind, []).extend(wheres)
    return found


def _emitted() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for part in (rule_emitted_kinds(), code_emitted_kinds(_py_files(*EMITTING_CODE)), fact_kinds()):
        for kind, wheres in part.items():
            found.setdefault(kind, []).extend(wheres)
    return found


def _unregistered(found: dict[str, list[str]]) -> list[str]:
    return [f"{kind!r} ({', '.join(wheres[:3])})" for kind, wheres in sorted(found.items()) if kind not in KINDS]


# ---------------------------------------------------------------- (a) every emitted kind is registered
def test_the_extractors_see_every_way_of_emitting():
    code = code_emitted_kinds(_py_files(*EMITTING_CODE))
    assert "worker-registered" in code   # runtime/scheduler_state.py: self._event(...), applied from an Outbox
    assert "events-lost" in code         # runtime/record.py: writer.emit(...)
    assert "tasks-executing" in code     # kwdiag/dask/_common.py: EXECUTING_KIND, written by hand
    assert "worker-exit" in rule_emitted_kinds()
    assert "fact-no-evidence" in fact_kinds()


def test_every_kind_a_rule_emits_is_registered():
    assert not _unregistered(rule_emitted_kinds())


def test_every_kind_a_rule_reads_is_registered():
    assert not _unregistered(rule_read_kinds())


def test_every_kind_the_runtime_and_kwdiag_dask_emit_is_registered():
    assert not _unregistered(code_emitted_kinds(_py_files(*EMITTING_CODE)))


def test_every_fact_the_fact_layer_derives_is_registered():
    assert not _unregistered(fact_kinds())


# ---------------------------------------------------------------- (b) documented
def test_every_registered_kind_is_documented():
    doc = (ROOT / "docs" / "events.md").read_text()
    assert not [k for k in KINDS if f"`{k}`" not in doc]


# ---------------------------------------------------------------- (c) none dead
def test_every_registered_kind_is_emitted_by_someone():
    emitted = _emitted()
    assert not [k for k in KINDS if k not in emitted and k not in SYNTHESIZED_ONLY]
    assert not [k for k in SYNTHESIZED_ONLY if k not in KINDS or k in emitted]


# ---------------------------------------------------------------- (d) what the code tests against
def test_every_kind_the_code_tests_against_is_registered():
    found = kinds_the_code_tests()
    assert "worker-removed" in found and "comm-close-stream" in found  # the scan sees comparisons and lookups
    assert not _unregistered(found)


def test_a_typo_in_a_kind_test_is_seen():
    tree = ast.parse('if e.kind == "worker-exti" or "nanny-closing" in (x.kind,) or x.kind in ("a-b", y):\n'
                     '    tl.lines_before(e, {"comm-closd"})\n')
    found = kinds_tested_in(tree, lambda n: str(n.lineno))
    assert {"worker-exti", "a-b", "comm-closd"} <= set(found)


# ---------------------------------------------------------------- the groups
def test_groups_are_frozensets_of_registered_kinds():
    groups = {name: g for name, g in vars(kinds).items() if name.isupper() and isinstance(g, frozenset)}
    assert {"START", "REGISTERED", "START_LIKE", "END", "DEATH", "LIFECYCLE", "QUIET", "CONTEXT", "EXCEPTION",
            "TASK_ERROR", "NOTE", "SCHEDULER_VIEW", "NAMED", "NOT_ABOUT_THE_WORKER", "DUPLICATED_BY_EVENTS"} <= set(groups)
    assert not {name: g - KINDS.keys() for name, g in groups.items() if g - KINDS.keys()}


def test_start_like_is_start_and_registration():
    """Two groups on purpose: the timeline dates a start by START; the classifier keeps START_LIKE lines, which
    also include the worker's own "Registered to" (written after the start)."""
    assert kinds.START_LIKE == kinds.START | kinds.REGISTERED
    assert kinds.START_LIKE - kinds.START == {"worker-connected"}


def test_a_group_or_table_naming_an_unregistered_kind_fails():
    with pytest.raises(ValueError, match="worker-exti"):
        kinds._group("worker-exit", "worker-exti")
    with pytest.raises(ValueError, match="missing"):
        kinds.keyed(kinds.DEATH, {"worker-exit": 1})


def test_every_meaning_is_one_line():
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", k) for k in KINDS)
    assert all(m and "\n" not in m for m in KINDS.values())
