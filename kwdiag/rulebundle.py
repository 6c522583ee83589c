"""The built-in rules' parsed TOML, shipped as one JSON file beside them (``rules/bundle.json``).

Parsing the ~140 built-in rule files with ``tomllib`` costs about 30 ms, on every command: a third of the time
to a first answer on a small log. The bundle maps each rule file's path (relative to the rules folder) to a
hash of its bytes and its parsed table. Loading still reads every file (about 2 ms) and uses the bundle's table
only when the hash matches, so an edited or added rule is parsed from its TOML: a stale bundle costs time,
never a wrong rule. ``python -m kwdiag.rulebundle`` rewrites it; a test fails when it is not current.

Covers: reading and writing the bundle. Not covered: what a rule means (``kwdiag.engine``); user rule folders
(``--rules DIR``), which are always parsed from their TOML.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

try:   # the C module itself: importing hashlib loads OpenSSL (~3 ms of every start) for the same function
    from _blake2 import blake2b
except ImportError:
    from hashlib import blake2b

BUNDLE_NAME = "bundle.json"
FORMAT = 1


def digest(data: bytes) -> str:
    return blake2b(data, digest_size=16).hexdigest()


def read_bundle(rules_dir: Path) -> dict[str, Any]:
    """The bundle in ``rules_dir``: ``files`` maps a relative path to ``[digest, table]``; ``prefilter`` holds
    the prefilter built for those rules' keywords (``kwdiag.engine.prefilter_for``). Empty when it is absent
    or unreadable (then every file is parsed from its TOML, as before the bundle existed)."""
    try:
        with open(rules_dir / BUNDLE_NAME, "rb") as f:
            bundle = json.loads(f.read())
    except (OSError, ValueError):
        bundle = {}
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT or not isinstance(bundle.get("files"), dict):
        bundle = {}
    return bundle


def parse_rule_file(raw: bytes, relative: str, bundle: dict[str, list]) -> dict[str, Any]:
    """The table of one rule file: from the bundle when its bytes are the ones bundled, else from its TOML.

    Raises ``tomllib.TOMLDecodeError`` or ``UnicodeDecodeError`` for a file that is not valid TOML.
    """
    entry = bundle.get(relative)
    if entry is not None and entry[0] == digest(raw):
        return entry[1]
    import tomllib  # only on a bundle miss: the import is part of what the bundle spares

    return tomllib.loads(raw.decode("utf-8"))


def build_bundle(rules_dir: Path) -> dict[str, Any]:
    """The bundle for every ``*.toml`` under ``rules_dir`` (a file whose table JSON cannot carry, such as a
    TOML date, is left out: it is parsed from its TOML at load)."""
    from kwdiag.engine import load_rule_files, prefilter_anchors, prefilter_for, prefilter_keywords

    import tomllib

    files: dict[str, list] = {}
    for path in sorted(p for p in rules_dir.rglob("*.toml") if p.is_file()):
        raw = path.read_bytes()
        table = tomllib.loads(raw.decode("utf-8"))
        try:
            if json.loads(json.dumps(table)) != table:
                continue
        except (TypeError, ValueError):
            continue
        files[path.relative_to(rules_dir).as_posix()] = [digest(raw), table]
    rules, _ = load_rule_files([rules_dir], compile_now=False)
    keywords = prefilter_keywords(rules)
    anchors, pattern = prefilter_for(keywords)
    # the anchors ``RuleSet.candidates`` finds a line's keywords by (over every line rule's keywords)
    finder_keywords = sorted({k for r in rules if r.is_line_rule for k in r.keywords})
    prefilter = {"keywords": keywords, "anchors": [a.decode("latin-1") for a in anchors],
                 "pattern": pattern.decode("latin-1"), "finder_keywords": finder_keywords,
                 "finder_anchors": [a.decode() for a in prefilter_anchors(finder_keywords)]
                 if all(k.isascii() for k in finder_keywords) else None}
    return {"format": FORMAT, "files": files, "prefilter": prefilter}


def write_bundle(rules_dir: Path) -> Path:
    target = rules_dir / BUNDLE_NAME
    # key order kept: a rule's tables are ordered (its fixes are shown in the order written)
    text = json.dumps(build_bundle(rules_dir), separators=(",", ":"), ensure_ascii=False)
    target.write_text(text + "\n", encoding="utf-8")
    return target


if __name__ == "__main__":
    from kwdiag.engine import builtin_rules_dir

    written = write_bundle(builtin_rules_dir())
    print(f"wrote {written}")
