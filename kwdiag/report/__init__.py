"""Reporters: render a ``Report`` as terminal text (rich), JSON or Markdown.

Covers: ``render_terminal``, ``render_json``, ``render_markdown``. Log text is escaped everywhere:
control sequences are stripped and rich markup is never interpreted.

Does not cover: analysis (``kwdiag.analysis``).
"""

from typing import Any

__all__ = ["render_json", "render_markdown", "render_terminal"]


def __getattr__(name: str) -> Any:
    """Each reporter is imported when it is first asked for: a run renders one format."""
    if name == "render_json":
        from kwdiag.report.jsonout import render_json
        return render_json
    if name == "render_markdown":
        from kwdiag.report.markdown import render_markdown
        return render_markdown
    if name == "render_terminal":
        from kwdiag.report.terminal import render_terminal
        return render_terminal
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
