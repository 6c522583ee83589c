"""Benchmark: `kwdiag explain` on large Dask-format logs, against `grep -cE` and a plain Python loop.

Two shapes, each of the given size:

* **quiet**: one log of ordinary noise (real lines from sample_logs/dask-*/ that no rule matches, replayed
  with increasing timestamps) with real worker-death sequences from the samples buried in it (each copy gets
  its own worker name and port);
* **lifecycle**: the logs of a long-running cluster (``bench/lifecycle_log.py``): a scheduler that serves
  client after client and starts and retires adaptive workers, three workers printing their connections,
  one of them SIGKILLed six times; every line a real one of the corpus. Most of its lines are ones the
  analyzer must read (rules match them), which the quiet shape never asks of it.

Then, per shape, times:

  * ``grep -cE`` with every rule keyword (the reference: how fast the bytes can be scanned), and
  * ``kwdiag explain --format json`` (wall time, peak RSS of the child), and checks every buried
    death is found.

Usage: python bench/explain_throughput.py [--size-mb 1024] [--shapes quiet,lifecycle] [--keep PATH]
Prints the figures; does not assert timings (run it by hand, not in the test suite).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_logs"
# death sequences to bury: (scenario, worker log, expected (cause, detail) of its first incarnation)
BURY = [
    ("dask-segfault", "w1.log", ("sudden_exit", "segfault")),
    ("dask-memory", "w1.log", ("nanny_memory_restart", "memory_limit")),
    ("dask-sigkill", "w1.log", ("sudden_exit", "sigkill")),
    ("dask-exit", "w2.log", ("unrecoverable_exception", "os_exit")),  # docs/death-classes.md: os._exit(1)
    ("dask-missing-module", "w1.log", ("unrecoverable_exception", "missing_module")),
]
TS = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}")


def noise_lines(rules) -> list[bytes]:
    out = []
    for f in sorted(SAMPLES.glob("dask-*/*.log")):
        for line in f.read_bytes().splitlines(keepends=True):
            if TS.match(line) and not rules.prefilter.search(line):
                out.append(line[23:])  # without the timestamp: re-stamped when written
    return out


def death_block(scenario: str, log: str, k: int) -> list[bytes]:
    """The worker log up to (and including) its first restart/close, renamed to worker bw<k>."""
    lines = (SAMPLES / scenario / log).read_bytes().splitlines(keepends=True)
    out = []
    for line in lines:
        line = re.sub(rb"Worker name:(\s+)w\d+", lambda m: b"Worker name:" + m.group(1) + f"bw{k}".encode(), line)
        line = re.sub(rb"127\.0\.0\.1:(\d+)", lambda m: f"10.9.{k}.1:{m.group(1).decode()}".encode(), line)
        out.append(line[23:] if TS.match(line) else line)
        if b"Restarting worker" in line or b"End worker" in line:
            break
    return out


def build(path: Path, size: int, rules) -> list[tuple[str, str, str]]:
    noise = noise_lines(rules)
    blocks = [(f"bw{k}", death_block(s, log, k), exp) for k, (s, log, exp) in enumerate(BURY)]
    every = size // (len(blocks) + 1)
    expected, t0 = [], 1_795_000_000.0
    written, n, nxt, bi = 0, 0, every, 0
    with open(path, "wb", buffering=1 << 22) as f:
        chunk = []
        while written < size:
            ts = t0 + n * 0.001
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)).encode() + f",{int(ts * 1000) % 1000:03d}".encode()
            if written >= nxt and bi < len(blocks):
                name, block, exp = blocks[bi]
                for line in block:
                    chunk.append(stamp + line if line.startswith(b" - ") else line)
                expected.append((name, *exp))
                bi += 1
                nxt += every
            line = stamp + noise[n % len(noise)]
            chunk.append(line)
            written += len(line)
            n += 1
            if len(chunk) >= 20000:
                f.write(b"".join(chunk))
                chunk = []
        f.write(b"".join(chunk))
    return expected


MEASURE = """
import resource, subprocess, sys, time
t = time.perf_counter()
p = subprocess.run(sys.argv[1:], capture_output=True)
dt = time.perf_counter() - t
sys.stdout.buffer.write(p.stdout)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
sys.stderr.write(f"{p.returncode} {dt} {peak}\\n")
"""


def measured(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """Wall time, peak RSS (the largest process of the run: kwdiag or its grep) and stdout of one command,
    in a fresh measuring process so that one run's peak does not hide the next one's."""
    p = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True, env=env)
    code, dt, peak = p.stderr.strip().splitlines()[-1].split()
    if int(code) not in (0, 1):
        print(p.stderr)
        raise SystemExit("kwdiag explain failed")
    return float(dt), float(peak), p.stdout


def plain_python_loop(paths: list[Path], size: int, rules) -> None:
    """The floor the issue compares against: a plain Python loop over the lines with one regex (the prefilter)."""
    t = time.perf_counter()
    search, hits = rules.prefilter.search, 0
    for path in paths:
        with open(path, "rb") as f:
            for line in f:
                if search(line):
                    hits += 1
    dt = time.perf_counter() - t
    print(f"  plain Python line loop, one regex: {dt:.2f}s = {size / dt / 1e6:.0f} MB/s, {hits} lines")


def _grep_anchor(paths: list[Path], size: int, rules) -> None:
    """grep -cE looking for what kwdiag's prefilter looks for: every line rule's keywords but the connection lines
    that are read only before a removal (``kwdiag.engine.deferred_keywords``), and kwdiag's JSONL events."""
    from kwdiag.engine import prefilter_keywords

    keywords = prefilter_keywords(rules.rules)
    if shutil.which("grep"):
        pattern = "|".join(re.escape(k).replace("\\ ", " ") for k in keywords)
        t = time.perf_counter()
        g = subprocess.run(["grep", "-cE", pattern, *map(str, paths)], capture_output=True, text=True)
        dt = time.perf_counter() - t
        hits = sum(int(x.rsplit(":", 1)[-1]) for x in g.stdout.split())
        print(f"  grep -cE ({len(keywords)} signatures, {len(rules.deferred)} deferred left out): {dt:.2f}s = "
              f"{size / dt / 1e6:.0f} MB/s, {hits} lines")


def _explain(target: Path, size: int, check) -> None:
    cmd = [sys.executable, "-P", "-m", "kwdiag", "explain", "--format", "json", str(target)]
    runs = [("auto (GNU grep finds the literals in a file over 16 MB)", {}),
            ("one Python process, no grep (KWDIAG_NO_GREP=1 KWDIAG_JOBS=1)", {"KWDIAG_NO_GREP": "1", "KWDIAG_JOBS": "1"})]
    for label, extra in runs:
        dt, peak, out = measured(cmd, dict(os.environ, **extra))
        doc = json.loads(out)
        verdict = check(doc["deaths"])
        print(f"  kwdiag explain, {label}: {dt:.2f}s = {size / dt / 1e6:.0f} MB/s, peak RSS {peak:.0f} MB, "
              f"{len(doc['deaths'])} deaths reported, {verdict}")


def quiet(size_mb: int, tmp: Path, keep: str | None, rules) -> None:
    path = Path(keep) if keep else tmp / "big.log"
    t = time.perf_counter()
    expected = build(path, size_mb << 20, rules)
    size = path.stat().st_size
    print(f"quiet: built {size / 1e6:.0f} MB with {len(expected)} buried deaths in {time.perf_counter() - t:.1f}s")
    _grep_anchor([path], size, rules)
    plain_python_loop([path], size, rules)

    def check(deaths) -> str:
        # By cause and detail: the noise is real lines of several workers replayed into one file, so a
        # death whose exit line names only a pid may not be tied to its worker's name (it is reported as
        # "process N"); what is measured here is that each buried death is found with its cause.
        got = [(d["cause"], d["detail"]) for d in deaths]
        missing = []
        for name, *exp in expected:
            if tuple(exp) in got:
                got.remove(tuple(exp))
            else:
                missing.append((name, *exp))
        if missing:
            raise SystemExit(f"MISSING: {missing}")
        return f"buried found {len(expected)}/{len(expected)}"

    _explain(path, size, check)


def lifecycle(size_mb: int, tmp: Path, keep: str | None, rules) -> None:
    from collections import Counter

    from lifecycle_log import SKELETON
    from lifecycle_log import build as build_lifecycle

    from kwdiag.pipeline import analyze

    folder = Path(keep) if keep else tmp / "cluster"
    t = time.perf_counter()
    adaptive = build_lifecycle(folder, size_mb << 20)
    expected = Counter((d.worker, d.cause, d.detail) for d in analyze([str(SKELETON)], rules=rules).deaths) + adaptive
    paths = sorted(folder.glob("*.log"))
    size = sum(p.stat().st_size for p in paths)
    lines = sum(p.read_bytes().count(b"\n") for p in paths)
    print(f"lifecycle: built {size / 1e6:.0f} MB, {lines:,} lines in {len(paths)} files, {sum(expected.values())} deaths "
          f"(the skeleton's {sum(expected.values()) - sum(adaptive.values())}, {sum(adaptive.values())} adaptive "
          f"retirements) in {time.perf_counter() - t:.1f}s")
    _grep_anchor(paths, size, rules)
    plain_python_loop(paths, size, rules)

    def check(deaths) -> str:
        got = Counter((d["worker"], d["cause"], d["detail"]) for d in deaths)
        if got != expected:
            raise SystemExit(f"WRONG DEATHS: missing {expected - got}, extra {got - expected}")
        return "every death found with its cause, none extra"

    _explain(folder, size, check)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--shapes", default="quiet,lifecycle")
    ap.add_argument("--keep", help="write the logs here and keep them (one shape)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from kwdiag.engine import load_rules

    rules = load_rules()
    tmp = Path(tempfile.mkdtemp(prefix="kwdiag-bench-"))
    try:
        for shape in args.shapes.split(","):
            {"quiet": quiet, "lifecycle": lifecycle}[shape](args.size_mb, tmp, args.keep, rules)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
