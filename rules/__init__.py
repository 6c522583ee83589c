"""kwdiag's built-in diagnosis rules: one TOML file per rule under ``<area>/<rule-id>.toml``.

This package holds data only; the engine that loads and runs the rules lives in ``kwdiag``.
"""
