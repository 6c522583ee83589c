"""CLI commands that start runtime processes: ``kwdiag scheduler`` and ``kwdiag worker``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
