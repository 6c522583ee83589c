"""Write each fact rule's pipeline examples: the shortest real corpus fragments that still give its verdict.

A fact rule (``rules/facts/``) matches an event the fact layer derives, so an example that is that event
only proves ``kind == kind``. Its examples must be log text run through the whole pipeline (readers →
timeline → facts → vote). This script finds, for each fact rule, corpus deaths it decided (preferring
different Dask versions), and trims each case's logs to the shortest stretch of each file for which ``kwdiag explain`` still reports a death with the same cause and detail and names the rule. The
lines are kept verbatim, in order and contiguous, with their files' names: a real fragment of a real log,
as a user pastes it, never text written here. It rewrites the ``[[examples.pipeline]]`` tables at the end of each fact rule's TOML;
``tests/test_facts.py`` runs them.

Run by hand (about a minute), then ``python -m kwdiag.rulebundle``:

    python sample_logs/corpus/fact_examples.py [--per-rule 2]
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kwdiag.engine import load_rules  # noqa: E402
from kwdiag.pipeline import analyze  # noqa: E402

RULES = load_rules()
CASES = ROOT / "sample_logs" / "corpus" / "cases"
FACTS = ROOT / "rules" / "facts"
MARK = "\n# Pipeline examples: written by sample_logs/corpus/fact_examples.py; do not edit by hand.\n"
# Facts whose case is the scheduler's log alone (the corpus always has the workers' too).
ONLY_FILES = {"fact-vanished-scheduler-only": ("scheduler.log",)}
# Facts whose case is a paste of some lines only (the corpus's cases hold every line): the lines that hold this.
ONLY_LINES = {"fact-counted-death": "marked as failed because"}


def version(name: str) -> tuple[int, ...]:
    return tuple(int(p) for p in name.split("."))


def read_lines(path: Path) -> list[str]:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return raw.decode("utf-8", "replace").splitlines()


def case_lines(case: Path, only: tuple[str, ...] | None, holding: str | None = None) -> list[tuple[str, str]]:
    out = []
    for f in sorted(case.iterdir()):
        if not f.name.endswith((".log", ".log.gz")):
            continue
        name = f.name.removesuffix(".gz")
        if only is None or name in only:
            out += [(name, line) for line in read_lines(f) if holding is None or holding in line]
    return out


def verdicts(lines: list[tuple[str, str]]) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(worker, cause, detail, rules) of every death ``kwdiag explain`` finds in ``lines``."""
    files: dict[str, list[str]] = defaultdict(list)
    for name, line in lines:
        files[name].append(line)
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            Path(tmp, name).write_text("\n".join(text) + "\n")
        report = analyze([tmp], rules=RULES)
    return [(d.worker, d.cause, d.detail, d.rules) for d in report.deaths]


def gives(lines, rule_id: str, cause: str, detail: str) -> bool:
    return any(c == cause and dt == detail and rule_id in rs for _, c, dt, rs in verdicts(lines))


def trim(lines: list[tuple[str, str]], keep) -> list[tuple[str, str]]:
    """The shortest contiguous stretch of each file (a whole file dropped where it can be) for which ``keep``
    still holds: what a user pastes is a stretch of a log, so the example is one, not scattered lines."""
    files: dict[str, list[str]] = defaultdict(list)
    for name, line in lines:
        files[name].append(line)

    def joined(parts):
        return [(n, line) for n, ls in parts.items() for line in ls]

    for name in list(files):
        without = {n: ls for n, ls in files.items() if n != name}
        if without and keep(joined(without)):
            files = without
    for name in list(files):
        for from_end in (False, True):
            step = max(1, len(files[name]) // 2)
            while step >= 1:
                ls = files[name]
                cut = ls[:-step] if from_end else ls[step:]
                if cut and keep(joined({**files, name: cut})):
                    files[name] = cut
                else:
                    step //= 2
    return joined(files)


def candidates() -> dict[str, list[tuple[Path, str, str, str]]]:
    """Per fact rule, the corpus deaths it took part in: (case, worker, cause, detail, it decided)."""
    found: dict[str, list] = defaultdict(list)
    for case in sorted(p.parent for p in CASES.glob("*/*/labels.json")):
        for rule_id, files in ONLY_FILES.items():
            for w, c, d, rs in verdicts(case_lines(case, files)):
                if rs and rs[0] == rule_id:
                    found[rule_id].append((case, w, c, d, True))
        for rule_id, text in ONLY_LINES.items():
            for w, c, d, rs in verdicts(case_lines(case, None, text)):
                if rs and rs[0] == rule_id:
                    found[rule_id].append((case, w, c, d, True))
        for w, c, d, rs in verdicts(case_lines(case, None)):
            for r in rs:
                if r.startswith("fact-"):
                    found[r].append((case, w, c, d, rs[0] == r))
    return found


def toml_block(examples: list[dict]) -> str:
    out = [MARK]
    for ex in examples:
        out.append("[[examples.pipeline]]")
        out.append(f'from = "{ex["from"]}"')
        out.append(f'expect = {{ worker = "{ex["worker"]}", cause = "{ex["cause"]}", detail = "{ex["detail"]}" }}')
        out.append("[examples.pipeline.files]")
        for name, text in ex["files"].items():
            assert "'''" not in text
            out.append(f"\"{name}\" = '''\n{text}\n'''")
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-rule", type=int, default=2)
    args = ap.parse_args()
    found = candidates()
    for toml in sorted(FACTS.glob("fact-*.toml")):
        rule_id = toml.stem
        pool = found.get(rule_id, [])
        # the deaths it decided first; the newest Dask, then the oldest, then the rest
        newest_first = sorted({x[0].parent.name for x in pool}, key=version, reverse=True)
        order = newest_first[:1] + newest_first[-1:] + newest_first[1:-1]
        pool = sorted(pool, key=lambda x: (not x[4], order.index(x[0].parent.name), str(x[0])))
        chosen, versions = [], set()
        for entry in pool:
            case, worker, cause, detail, _ = entry
            if case.parent.name in versions or len(chosen) >= args.per_rule:
                continue
            lines = case_lines(case, ONLY_FILES.get(rule_id), ONLY_LINES.get(rule_id))
            kept = trim(lines, lambda ls: gives(ls, rule_id, cause, detail))
            if not gives(kept, rule_id, cause, detail):
                continue
            got = next(w for w, c, d, rs in verdicts(kept) if c == cause and d == detail and rule_id in rs)
            files: dict[str, list[str]] = defaultdict(list)
            for name, line in kept:
                files[name].append(line)
            chosen.append({"from": f"{case.relative_to(ROOT).as_posix()} (Dask {case.parent.name})",
                           "worker": got, "cause": cause, "detail": detail,
                           "files": {n: "\n".join(t) for n, t in files.items()}})
            versions.add(case.parent.name)
            print(f"{rule_id}: {case.parent.name}/{case.name} {worker} -> {len(lines)} lines kept {len(kept)}")
        if not chosen:
            print(f"{rule_id}: NO corpus death decided by it", file=sys.stderr)
            continue
        text = toml.read_text()
        text = text.split(MARK)[0].rstrip("\n") + "\n"
        toml.write_text(text + toml_block(chosen))


if __name__ == "__main__":
    main()
