"""Benchmark: how `kwdiag explain` grows with the number of deaths, in every output format.

Builds one Dask-format log of N worker incarnations, each killed by SIGKILL and restarted by its nanny:
the real lines of sample_logs/dask-sigkill/w1.log from the worker's start to its nanny's "Restarting
worker", replayed once per incarnation with its own worker name, address, pid and time (nothing here is
written by hand). Then, per N, times in a child process (wall time, peak RSS):

  * ``kwdiag explain --format json|text|markdown`` and ``--html`` (the reports), and
  * ``kwdiag check --format sarif|junit`` (the CI formats),

checks that every incarnation is found as a sudden_exit/sigkill death, and prints time per death, so a
cost that grows faster than the deaths shows as a rising column. A ``grep -c`` over the same log is the
anchor (how fast the bytes alone can be read).

``--kernel``: also a kernel log beside it with each incarnation's OOM kill (the real line of
sample_logs/pastes/distributed-6110, its pid replaced by each incarnation's), so every death is a
sudden_exit/oom_killer joined to its kernel line by pid (a cost per death that grows with the environment's lines
shows here: each death's look for its kernel lines was once a pass over all of them).

Usage: python bench/explain_scale.py [--sizes 1000,4000,16000] [--formats json,text] [--repeat 3] [--kernel]
Prints the figures; asserts no timing (run it by hand, not in the test suite).
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_logs" / "dask-sigkill" / "w1.log"
KERNEL_SAMPLE = ROOT / "sample_logs" / "pastes" / "distributed-6110" / "paste.txt"
TS = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}")
FORMATS = {
    "json": ["explain", "--format", "json"],
    "text": ["explain"],
    "markdown": ["explain", "--format", "markdown"],
    "html": ["explain", "--format", "json", "--html", "{tmp}/page.html"],
    "sarif": ["check", "--format", "sarif"],
    "junit": ["check", "--format", "junit"],
}


def incarnation_block() -> list[bytes]:
    """The sample worker's lines from its start to its nanny's restart, timestamps cut off."""
    out, started = [], False
    for line in SAMPLE.read_bytes().splitlines(keepends=True):
        started = started or b"Start worker at" in line or b"Start Nanny at" in line
        if started:
            out.append(line[23:] if TS.match(line) else line)
        if b"Restarting worker" in line:
            break
    return out


def build(path: Path, n: int) -> None:
    block = incarnation_block()
    t0 = 1_795_000_000.0
    with open(path, "wb", buffering=1 << 22) as f:
        for k in range(n):
            host, port, pid = f"10.{k // 65000 % 250}.{k // 250 % 260 % 256}.{k % 250 + 1}", 20000 + k % 40000, 100000 + k
            for i, line in enumerate(block):
                ts = t0 + k * 0.05 + i * 0.001
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)).encode() + b",%03d" % (int(ts * 1000) % 1000)
                line = re.sub(rb"\d+\.\d+\.\d+\.\d+:\d+", f"{host}:{port}".encode(), line)
                line = re.sub(rb"Worker name:(\s+)\S+", lambda m: b"Worker name:" + m.group(1) + f"sw{k}".encode(), line)
                line = re.sub(rb"Worker process \d+", f"Worker process {pid}".encode(), line)
                f.write(stamp + line if line.startswith(b" - ") else line)


def build_kernel_log(path: Path, n: int) -> None:
    """The kernel's OOM kill of each incarnation's pid (``build`` gives incarnation k the pid 100000 + k)."""
    line = next(x for x in KERNEL_SAMPLE.read_text().splitlines() if "Killed process" in x)
    pid = re.search(r"Killed process (\d+)", line).group(1)
    with open(path, "w") as f:
        for k in range(n):
            f.write(line.replace(f"Killed process {pid}", f"Killed process {100000 + k}") + "\n")


def timed(args: list[str], log: Path, tmp: str) -> tuple[float, float, bytes]:
    """Wall seconds, peak RSS (MB) of the child, its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    cmd = [sys.executable, "-m", "kwdiag", *[a.format(tmp=tmp) for a in args], str(log)]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, env={"TZ": "UTC", "PATH": "/usr/bin:/bin", "KWDIAG_JOBS": "1"},
                       cwd=ROOT)
    wall = time.perf_counter() - t
    if r.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.decode()[-2000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024, r.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,4000,16000,64000,100000")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--repeat", type=int, default=1, help="runs per figure (the median is printed)")
    ap.add_argument("--kernel", action="store_true", help="a kernel log of each incarnation's OOM kill beside it")
    a = ap.parse_args()
    want = ("sudden_exit", "oom_killer") if a.kernel else ("sudden_exit", "sigkill")
    sizes = [int(x) for x in a.sizes.split(",")]
    formats = a.formats.split(",")
    print(f"{'deaths':>8} {'MB':>6} {'grep s':>7} " + " ".join(f"{f + ' s':>10} {'µs/death':>8}" for f in formats)
          + "   peak MB (json)")
    with tempfile.TemporaryDirectory(prefix="kwdiag-scale-") as tmp:
        logs = Path(tmp) / "logs"
        logs.mkdir()
        log = logs / "scale.log"
        for n in sizes:
            build(log, n)
            if a.kernel:
                build_kernel_log(logs / "kern.dmesg", n)
            mb = sum(p.stat().st_size for p in logs.iterdir()) / 1e6
            t = time.perf_counter()
            subprocess.run(["grep", "-c", "killed by signal", str(log)], capture_output=True)
            grep_s = time.perf_counter() - t
            cells, peak_json = [], 0.0
            for fmt in formats:
                runs = []
                for _ in range(a.repeat):
                    wall, peak, out = timed(FORMATS[fmt], logs if a.kernel else log, tmp)
                    runs.append(wall)
                    if fmt == "json":
                        peak_json = peak
                        deaths = json.loads(out)["deaths"]
                        found = sum(1 for d in deaths if (d["cause"], d["detail"]) == want)
                        if found != n:
                            print(f"  warning: {found} of {n} {'/'.join(want)} deaths found", file=sys.stderr)
                med = statistics.median(runs)
                cells.append(f"{med:>10.2f} {med / n * 1e6:>8.0f}")
            print(f"{n:>8} {mb:>6.1f} {grep_s:>7.3f} " + " ".join(cells) + f"   {peak_json:.0f}", flush=True)


if __name__ == "__main__":
    main()
