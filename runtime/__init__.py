"""kwdiag's embedded task runtime (placeholder while it is written)."""
