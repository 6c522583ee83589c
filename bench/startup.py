"""Benchmark: time to a first answer. `kwdiag --help` and `kwdiag explain` on a one-line log, beside the
interpreter's own start (`python -c pass`) and the import of typer alone, medians of N runs.

The one-line log is a real line of sample_logs/dask-sigkill/w1.log (the nanny's "killed by signal 9").
Also prints where the time goes in one explain: imports (`-X importtime`, the largest), loading the rules,
analysing and rendering.

Usage: python bench/startup.py [--runs 15] [--venv PATH]
``--venv``: measure that virtual environment's kwdiag (its ``bin/python`` and ``bin/kwdiag`` script, run outside the
clone) instead of this interpreter's. Measure a non-editable install (``pip install .``), as users have it: an
editable one starts through pip's import hook, which costs ~10-15 ms of every start here (the bench says so).
Prints the figures; asserts no timing (run it by hand, not in the test suite).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_logs" / "dask-sigkill" / "w1.log"


# As a user's install runs: with bytecode written (a session with PYTHONDONTWRITEBYTECODE=1 would compile
# every module from source at every start, ~25 ms more).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def medians_ms(rows: list[tuple[str, list[str]]], runs: int, cwd: Path | str = ROOT) -> dict[str, float]:
    """Median wall time of each command, the commands taken in turn (round robin) so that a noisy moment on
    a shared machine falls on all of them alike; one unmeasured warm-up run each first."""
    times: dict[str, list[float]] = {name: [] for name, _ in rows}
    for name, cmd in rows:
        subprocess.run(cmd, capture_output=True, cwd=cwd, env=ENV)
    for _ in range(runs):
        for name, cmd in rows:
            t = time.perf_counter()
            subprocess.run(cmd, capture_output=True, cwd=cwd, env=ENV)
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) * 1000 for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--venv", help="the virtual environment whose kwdiag to measure (default: this interpreter's)")
    args = ap.parse_args()
    runs = args.runs
    line = next(x for x in SAMPLE.read_text().splitlines() if "killed by signal 9" in x)
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(line + "\n")
    py = str(Path(args.venv) / "bin" / "python") if args.venv else sys.executable
    kwdiag = [str(Path(args.venv) / "bin" / "kwdiag")] if args.venv else [py, "-m", "kwdiag"]
    cwd = tempfile.gettempdir() if args.venv else ROOT   # outside the clone: its kwdiag/ is not the install's
    rows = [
        ("python -c pass", [py, "-c", "pass"]),
        ("python -c 'import typer'", [py, "-c", "import typer"]),
        ("kwdiag --help", [*kwdiag, "--help"]),
        ("kwdiag explain one-line.log", [*kwdiag, "explain", f.name]),
    ]
    about = subprocess.run([py, "-c", "import importlib.metadata as m, kwdiag, sys; "
                            "print(m.version('typer'), kwdiag.__file__, any('__editable__' in p for p in "
                            "[*sys.path, *map(str, sys.meta_path)]))"],
                           capture_output=True, text=True, cwd=cwd, env=ENV).stdout.split()
    typer_version, where, editable = about[0], about[1], about[2] == "True"
    print(f"{'command':34} {'median ms':>10}   (runs: {runs}; typer {typer_version}; kwdiag from {where}"
          f"{', an EDITABLE install: pip import hook included' if editable else ''})")
    medians = medians_ms(rows, runs, cwd)
    for name, _ in rows:
        print(f"{name:34} {medians[name]:>10.0f}", flush=True)
    base = medians["python -c 'import typer'"]
    print(f"{'explain beyond importing typer':34} {medians['kwdiag explain one-line.log'] - base:>10.0f}")
    print("goals (issue 21): explain <= 120 ms, --help <= 80 ms")
    # where one explain spends its time
    r = subprocess.run([py, "-X", "importtime", "-m", "kwdiag", "explain", f.name], capture_output=True, text=True,
                       cwd=cwd, env=ENV)
    imports = []
    for row in r.stderr.splitlines():
        parts = row.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            imports.append((int(parts[1]), parts[2].rstrip()))
    print("\nlargest imports (cumulative µs):")
    for us, name in sorted(imports, reverse=True)[:8]:
        print(f"  {us:>8} {name}")
    phases = subprocess.run([py, "-c", f"""
import time
t0 = time.perf_counter()
from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze
from kwdiag.report.terminal import render_plain
t1 = time.perf_counter(); rules = load_rules(())
t2 = time.perf_counter(); report = analyze([{f.name!r}], rules=rules)
t3 = time.perf_counter(); render_plain(report)
t4 = time.perf_counter()
print(f"in-process: imports {{(t1-t0)*1e3:.0f}} ms, load rules {{(t2-t1)*1e3:.0f}} ms, "
      f"analyse {{(t3-t2)*1e3:.0f}} ms, render {{(t4-t3)*1e3:.0f}} ms")
"""], capture_output=True, text=True, cwd=cwd, env=ENV)
    print("\n" + phases.stdout.strip())
    Path(f.name).unlink()


if __name__ == "__main__":
    main()
