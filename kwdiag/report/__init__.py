"""Reporters: render a ``Report`` as terminal text (rich), JSON or Markdown.

Covers: ``render_terminal``, ``render_json``, ``render_markdown``. Log text is escaped everywhere:
control sequences are stripped and rich markup is never interpreted.

Does not cover: analysis (``kwdiag.analysis``).
"""

from kwdiag.report.jsonout import render_json
from kwdiag.report.markdown import render_markdown
from kwdiag.report.terminal import render_terminal

__all__ = ["render_json", "render_markdown", "render_terminal"]
