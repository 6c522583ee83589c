"""The verdicts a Dask maintainer would give for a corpus case, from what its script did and how it logged.

``expected_deaths(labels)`` turns ``labels.json`` (what ``sample_logs/corpus/generate.py`` did to each
worker) into the (cause, detail) list ``kwdiag explain`` must report. Draft: every labelled death as
labelled, plus a ``chose_to_exit/shutdown`` for each worker alive at the final close.
"""

from __future__ import annotations


def expected_deaths(labels: dict) -> list[tuple[str, str | None]]:
    out = [(d["cause"], d.get("detail")) for d in labels.get("deaths", [])]
    out += [("chose_to_exit", "shutdown") for _ in labels.get("closed_alive", [])]
    return out
