#!/usr/bin/env python3
"""Generate the corpus of REAL Dask worker-death logs, labelled from what the script did.

    python sample_logs/corpus/generate.py --version 2026.8.0 [--cases 3,17,sigkill] [--list] [--force]

For each case of the pairwise plan (plan.py) this creates the version's virtual environment if
needed (venvs.py, under ~/.cache/kwdiag-corpus/), then runs runner.py in it under
``flock /tmp/heavy.lock`` (one real cluster at a time on this machine) and writes
``cases/<version>/<case-id>/``: the log files exactly as Dask, Python and the OS printed them
(gzipped only when over 64 KB) and labels.json. A case whose labels.json exists is skipped
unless --force. Nothing here or in runner.py writes a line into a log.
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import plan as planmod  # noqa: E402
import venvs  # noqa: E402

CASES = HERE / "cases"
GZIP_OVER = 64 * 1024
LOCK = "/tmp/heavy.lock"
TTL = "3s"
# version-mismatch partner: a worker from this venv joins the version's scheduler
OTHER = {
    "2.9.3": "2.30.1", "2.30.1": "2021.11.2", "2021.11.2": "2.30.1", "2022.6.1": "2022.12.1", "2022.12.1": "2024.12.1", "2023.6.1": "2024.12.1",
    "2024.4.2": "2026.8.0", "2024.12.1": "2026.8.0", "2025.9.1": "2026.8.0", "2026.8.0": "2024.12.1",
}

HELPERS = {
    "corpus_preload_raises.py": '''"""A worker preload whose dask_setup raises."""


def dask_setup(worker):
    raise RuntimeError("preload dask_setup failed on purpose")
''',
    "corpus_worker_class.py": '''"""A worker class whose __init__ raises."""
from distributed import Worker


class FailingInitWorker(Worker):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("worker class __init__ failed on purpose")
''',
}


class Locker:
    """The machine-wide heavy-job lock: the same flock(2) lock that `flock /tmp/heavy.lock CMD` takes.

    Held while cases run one after another, and given up between cases once it has been held for
    `hold` seconds, so that other heavy jobs get their turn (0: give it up after every case)."""

    def __init__(self, hold: float = 60.0):
        self.hold, self.f, self.since = hold, None, None

    def acquire(self):
        if self.f is None:
            self.f = open(LOCK, "a")
            fcntl.flock(self.f, fcntl.LOCK_EX)
            self.since = time.time()

    def done_one(self):
        if self.f is not None and time.time() - self.since >= self.hold:
            self.release()

    def release(self):
        if self.f is not None:
            fcntl.flock(self.f, fcntl.LOCK_UN)
            self.f.close()
            self.f = None


LOCKER = Locker()


def case_env(case: dict) -> dict:
    env = {}
    if case["death"] == "heartbeat_timeout":
        env["DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL"] = TTL
    if case["death"] == "killed_worker":
        env["DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES"] = str(case["allowed_failures"])
    return env


def store_log(src: Path, dst_dir: Path) -> str:
    data = src.read_bytes()
    if len(data) > GZIP_OVER:
        out = dst_dir / (src.name + ".gz")
        with gzip.GzipFile(filename=src.name, mode="wb", fileobj=open(out, "wb"), mtime=0) as g:
            g.write(data)
        return out.name
    out = dst_dir / src.name
    out.write_bytes(data)
    return out.name


def run_case(version: str, case: dict, force: bool, timeout: float) -> str:
    dest = CASES / version / case["id"]
    if (dest / "labels.json").exists() and not force:
        return "%s skip (labels.json exists)" % case["id"]
    py = venvs.ensure(version, log=lambda s: print(s, flush=True))
    json_logger = None
    if case.get("collector") == "journald_json" and not os.path.exists("/run/systemd/journal/stdout"):
        return "%s not run: no systemd-journald (start /lib/systemd/systemd-journald as root first)" % case["id"]
    if case.get("collector") == "json":   # the formatter Dask's logging config names (pip picks one for its Python)
        probe = [str(py), "-c", "import pythonjsonlogger, importlib.metadata as m; print(m.version('python-json-logger'))"]
        if subprocess.run(probe, capture_output=True).returncode:
            subprocess.run([str(py), "-m", "pip", "--disable-pip-version-check", "-q", "install",
                            "python-json-logger"], check=True)
        json_logger = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
    work = venvs.CACHE / "work" / version / case["id"]
    if work.exists():
        shutil.rmtree(work)
    logdir = work / "logs"
    logdir.mkdir(parents=True)
    for name, text in HELPERS.items():
        (work / name).write_text(text)
    env_extra = case_env(case)
    spec = {"case": case, "version": version, "workdir": str(work), "logdir": str(logdir),
            "result": str(work / "result.json"), "env": env_extra}
    other_pins = None
    if case["death"] == "version_mismatch":
        ov = OTHER[version]
        opy = venvs.ensure(ov, log=lambda s: print(s, flush=True))
        other_pins = venvs.pins(ov)
        spec["other"] = {"version": ov, "python": str(opy), "python_version": other_pins.get("python")}
    (work / "spec.json").write_text(json.dumps(spec, indent=1))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DASK_") and k not in ("PYTHONFAULTHANDLER", "PYTHONPATH", "PYTHONHOME",
                                                       "VIRTUAL_ENV", "PYTHONWARNINGS")}
    env.update(env_extra)
    env["PYTHONPATH"] = str(work)
    # every process's scratch space (worker-space, locks) inside the case's work dir
    env["DASK_TEMPORARY_DIRECTORY"] = str(work / "tmp")
    errname = "client.log" if case["launch"] == "cli" else "cluster.log"
    t0 = time.time()
    # the machine-wide heavy-job lock (the same flock(2) lock `flock /tmp/heavy.lock CMD` takes), held
    # for exactly one case: the timeout counts from when the lock is ours, not from the wait for it
    with open(work / "runner.out", "wb") as out, open(logdir / errname, "wb") as err:
        LOCKER.acquire()
        try:
            p = subprocess.Popen([str(py), str(HERE / "runner.py"), str(work / "spec.json")],
                                 stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=str(work),
                                 start_new_session=True)
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                return "%s FAIL timeout after %.0f s (see %s)" % (case["id"], timeout, work)
            finally:
                # nothing the case started may outlive it (LocalCluster children, dask CLI processes)
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        finally:
            LOCKER.done_one()
    took = time.time() - t0
    try:
        res = json.loads((work / "result.json").read_text())
    except Exception:
        return "%s FAIL no result (rc %s, see %s)" % (case["id"], p.returncode, work)
    if not res.get("ok"):
        return "%s FAIL runner error (see %s/runner.out)" % (case["id"], work)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    files = [store_log(f, dest) for f in sorted([*logdir.glob("*.log"), *logdir.glob("*.jsonl")])]
    pins = venvs.pins(version)
    factors = {k: case[k] for k in planmod.FACTORS}
    extra = {k: v for k, v in case.items() if k not in planmod.FACTORS and k != "id"}
    labels = {
        "version": version,
        "python": pins.get("python"),
        "pins": {"requested": venvs.requested_pins(version), "installed": pins},
        "case": case["id"],
        "factors": factors,
        "parameters": dict(extra, **({"env": env_extra} if env_extra else {})),
        "deaths": res["deaths"],
        "closed_alive": res["closed_alive"],
        "killed_workers": res["killed_workers"],
        "task_errors": res["task_errors"],
        "notes": " ".join(res["notes"]),
        "facts": res.get("facts", {}),
        "t_close": res.get("t_close"),
        "files": files,
        "runtime_s": res.get("runner_s"),
    }
    if json_logger:
        labels["pins"]["python-json-logger"] = json_logger
    if other_pins:
        labels["pins"]["other_worker"] = dict(other_pins, version=spec["other"]["version"],
                                              requested=venvs.requested_pins(spec["other"]["version"]))
    (dest / "labels.json").write_text(json.dumps(labels, indent=1) + "\n")
    ds = ", ".join("%s:%s/%s" % (d["worker"], d["cause"], d["detail"]) for d in res["deaths"]) or "no death"
    return "%s ok %.1fs (%.1fs with lock wait) deaths=[%s] closed_alive=%s" % (case["id"], res.get("runner_s") or 0, took, ds, res["closed_alive"])


def select(cases, spec):
    if not spec:
        return cases
    want = [s.strip() for s in spec.split(",") if s.strip()]
    out = []
    for c in cases:
        for w in want:
            if w.isdigit() and int(c["id"].split("-")[0]) == int(w) or (not w.isdigit() and w in c["id"]):
                out.append(c)
                break
    return out


def main(argv=None):
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", required=True, help="a distributed version, or several separated by commas")
    ap.add_argument("--cases", help="case numbers or id substrings, separated by commas (default: all)")
    ap.add_argument("--list", action="store_true", help="print the plan and exit")
    ap.add_argument("--force", action="store_true", help="re-run cases whose labels.json exists")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per case (default 300)")
    ap.add_argument("--lock-hold", type=float, default=60.0,
                    help="keep the heavy-job lock across consecutive cases for up to this many seconds (default 60)")
    ap.add_argument("--stop-after", type=float, default=0.0,
                    help="start no new case after this many seconds (0: no limit); rerun later to resume")
    a = ap.parse_args(argv)
    LOCKER.hold = a.lock_hold
    t_all = time.time()
    for version in a.version.split(","):
        if version not in venvs.VERSIONS:
            ap.error("unknown version %s (known: %s)" % (version, ", ".join(venvs.VERSIONS)))
        cases = select(planmod.plan(version), a.cases)
        if a.list:
            for c in cases:
                print(version, c["id"])
            continue
        t0 = time.time()
        for c in cases:
            if a.stop_after and time.time() - t_all > a.stop_after:
                print("stopping: --stop-after %.0f s reached; rerun to resume" % a.stop_after, flush=True)
                break
            print(run_case(version, c, a.force, a.timeout), flush=True)
        LOCKER.release()
        print("%s: %d cases in %.0f s" % (version, len(cases), time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
