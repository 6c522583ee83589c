"""docs/accuracy.md is the figures of the committed cases, not figures from some earlier day.

The page is generated (``python sample_logs/evaluate.py --write-doc docs/accuracy.md``); a rule change that
moves any figure, or a case added to the corpus or the pastes, must come with the regenerated page.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sample_logs"))
from evaluate import accuracy_page, load_cases  # noqa: E402

from kwdiag.engine import load_rules  # noqa: E402


def test_the_accuracy_page_holds_the_current_figures():
    want = accuracy_page(load_cases(), load_rules())
    have = (ROOT / "docs" / "accuracy.md").read_text(encoding="utf-8")
    assert have == want, "docs/accuracy.md is stale: python sample_logs/evaluate.py --write-doc docs/accuracy.md"


def test_the_page_shows_the_grep_baseline_and_every_version():
    page = (ROOT / "docs" / "accuracy.md").read_text(encoding="utf-8")
    versions = {p.parent.parent.name for p in (ROOT / "sample_logs" / "corpus" / "cases").glob("*/*/labels.json")}
    for v in versions:
        assert f"| dask {v} |" in page, v
    assert "grep right" in page and "held out" in page
