"""Shorter chaos soaks (bench/chaos_soak.py, bench/scheduler_chaos.py): real faults while a dependency graph runs.

Every result must be right, every injected fault must be found in the diagnosis with the right cause,
and no death may appear that nobody injected. The seed is fixed so CI sees the same mix of faults.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _bench(name: str, monkeypatch):
    monkeypatch.setenv("KWDIAG_SOAK_TASK_MS", "60")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # task functions pickle by reference to this module
    spec.loader.exec_module(module)
    return module


def test_chaos_soak_short(tmp_path, monkeypatch):
    chaos_soak = _bench("chaos_soak", monkeypatch)
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


def test_scheduler_chaos_short(tmp_path, monkeypatch):
    """The multi-host form (kwdiag scheduler / kwdiag worker processes): the scheduler SIGKILLed and started
    again twice, workers partitioned, killed and terminated, the client's connection broken."""
    scheduler_chaos = _bench("scheduler_chaos", monkeypatch)
    script = ["scheduler-kill", "stop-long", "client-disconnect", "sigkill", "scheduler-kill", "stop-short",
              "sigterm", "client-disconnect"]
    # A 5 s time-to-live, as in the soak above: a loaded CI box must not make a healthy worker look stopped.
    result = scheduler_chaos.soak(n_tasks=2000, script=script, every=1.0, ttl=5.0, log_dir=str(tmp_path / "soak"))
    print(scheduler_chaos.report(result))  # shown with -s: the figures of this run
    assert result["wrong_results"] == 0 and result["lost"] == 0
    assert result["faults"] == len(script) and result["restarts"] == 2
    assert result["misdiagnosed"] == [] and result["diagnosed"] == result["faults"]
    assert result["uninjected_deaths"] == [] and result["refused"] == 0
    assert result["recomputed"] == [0, 0] and result["reexecuted"] == [0, 0], result
    assert len(result["first_finished"]) == 2
