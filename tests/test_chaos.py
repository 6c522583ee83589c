"""A shorter chaos soak (bench/chaos_soak.py): real faults at random while a dependency graph runs.

Every result must be right, every injected fault must be found in the diagnosis with the right cause,
and no death may appear that nobody injected. The seed is fixed so CI sees the same mix of faults.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_chaos_soak_short(tmp_path, monkeypatch):
    monkeypatch.setenv("KWDIAG_SOAK_TASK_MS", "60")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("chaos_soak", BENCH / "chaos_soak.py")
    chaos_soak = importlib.util.module_from_spec(spec)
    sys.modules["chaos_soak"] = chaos_soak  # task functions pickle by reference to this module
    spec.loader.exec_module(chaos_soak)
    every_kind = ["sigkill", "memory", "sigterm", "stop-short", "stop-long"]
    # Ten faults, two of each kind, then the job is left to finish: a run that never ends proves nothing.
    # A 5 s time-to-live: a healthy worker stalled by a loaded CI box must not be taken for a stopped one.
    result = chaos_soak.soak(n_tasks=2000, seed=7, every=1.5, log_dir=str(tmp_path / "soak"), kinds=every_kind,
                             max_faults=10, ttl=5.0)
    print(result)  # shown with -s: the figures of this run
    assert result["wrong_results"] == 0
    assert result["tasks"] >= 1990
    assert set(result["by_kind"]) == set(every_kind), result["by_kind"]   # each kind really injected
    assert result["misdiagnosed"] == [], result["misdiagnosed"]
    assert result["diagnosed"] == result["faults"]
    assert result["uninjected_deaths"] == [], result["uninjected_deaths"]
