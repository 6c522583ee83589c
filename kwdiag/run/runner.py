"""Run one job on a kwdiag cluster, watch it, and end with the diagnosis: the body of ``kwdiag run``.

Covers: creating the run directory and manifest; starting an embedded ``LocalCluster`` whose every
process writes its events and stderr there (or using an existing cluster); running the job as its
own process with its arguments, its ``Client()`` pointed at the cluster, and its stdout/stderr passed
through and kept (``job.stdout``, ``job.stderr``); announcing each worker death as it happens;
stopping on Ctrl-C, ``--timeout`` or a killed job and still leaving a complete run directory; then
``kwdiag explain``'s diagnosis of the run directory, a summary, and the exit code.

Does not cover: how things are shown (``view``), the analysis itself (``kwdiag.analysis``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from typing import Any

from kwdiag.errors import FINDINGS, INTERRUPTED, RUNTIME, USAGE, KwdiagError
from kwdiag.run import rundir
from kwdiag.run.options import RunOptions
from kwdiag.run.tail import EventTail
from kwdiag.run.view import ClusterState, make_view
from kwdiag.runtime.spawn import child_env, script_command

POLL = 0.25            # seconds between looks at the cluster
ANNOUNCE_WAIT = 2.0    # how long a death waits for its nanny's record before it is announced anyway
JOB_GRACE = 10.0       # after SIGINT/SIGTERM, before the job is killed
TIMEOUT_EXIT = 124     # as timeout(1)
DEATH_KINDS = {"worker-exit", "worker-removed", "worker-fatal"}


def _tee(pipe, sink_path: str, view, stream: str) -> None:
    """Copy the job's output to the terminal (through the view) and to the run directory, unchanged."""
    sink = None  # created on the first byte: an empty file would only be noise for the analyzer
    try:
        for chunk in iter(lambda: pipe.read1(65536) if hasattr(pipe, "read1") else pipe.read(65536), b""):
            if sink is None:
                sink = open(sink_path, "ab")
            sink.write(chunk)
            sink.flush()
            view.job_output(chunk, stream)
    finally:
        if sink is not None:
            sink.close()


class DeathAnnouncer:
    """Turns the events the cluster writes into one line per death, with its cause, as they happen."""

    def __init__(self, rules):
        self.rules = rules
        self.announced: set[tuple[str, int]] = set()
        self.first_seen: dict[tuple[str, int], float] = {}
        self.causes: Counter = Counter()

    def lines(self, events: list, *, final: bool = False) -> list[str]:
        from kwdiag.analysis import analyze_events

        report = analyze_events(events, self.rules)
        recorded_pids = {e.get("pid") for e in events if e.kind == "worker-exit"}
        out = []
        now = time.monotonic()
        for d in report.deaths:
            key = (d.worker, d.incarnation)
            if key in self.announced:
                continue
            self.first_seen.setdefault(key, now)
            waited = now - self.first_seen[key]
            # With a nanny, its worker-exit record (signal, memory) settles the cause: wait for it briefly.
            if not final and d.pid not in recorded_pids and waited < ANNOUNCE_WAIT:
                continue
            if d.cause == "chose_to_exit" and d.detail == "shutdown":
                continue  # the end of the run, not news
            self.announced.add(key)
            verb = "left" if d.cause == "chose_to_exit" else "died"
            running = f"; running {', '.join(d.running[:3])}" if getattr(d, "running", None) else ""
            out.append(f"worker {d.worker} #{d.incarnation} {verb}: {d.cause}/{d.detail} — {d.summary}{running}")
        return out


def _start_cluster(options: RunOptions, run_dir: str, job_dir: str):
    from kwdiag.runtime import LocalCluster

    scheduler_kwargs = {k: v for k, v in (("allowed_failures", options.allowed_failures),
                                          ("worker_ttl", options.worker_ttl)) if v is not None}
    # Workers import the job's own modules as the job does: its folder goes on their path, after ours.
    pythonpath = child_env(options.env, append_path=[job_dir])["PYTHONPATH"]
    try:
        return LocalCluster(n_workers=options.workers, threads_per_worker=options.threads,
                            memory_limit=options.memory_limit, nanny=options.nanny, log_dir=run_dir,
                            scheduler_kwargs=scheduler_kwargs, config=options.config,
                            env={**options.env, "PYTHONPATH": pythonpath})
    except ValueError as exc:
        raise KwdiagError(str(exc), USAGE) from None
    except (OSError, TimeoutError, RuntimeError) as exc:
        raise KwdiagError(f"the cluster could not start: {exc}", RUNTIME) from None


def _stop_job(job: subprocess.Popen, first: int) -> None:
    """Ask the job to stop with ``first`` (SIGINT/SIGTERM), then kill it after a grace period."""
    if job.poll() is not None:
        return
    try:
        job.send_signal(first)
        job.wait(JOB_GRACE)
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()
    except KeyboardInterrupt:  # a second Ctrl-C: no more waiting
        job.kill()
        job.wait()


def run(job_argv: list[str], options: RunOptions, *, rules_dirs: tuple[str, ...] = ()) -> int:
    """Run the job; return the exit code ``kwdiag run`` should end with."""
    from kwdiag.engine import load_rules
    from kwdiag.pipeline import analyze
    from kwdiag.check.policy import parse_selector, split_items

    script = job_argv[0]
    if not os.path.isfile(script):
        raise KwdiagError(f"no such job script: {script}", USAGE)
    fail_on = [parse_selector(item, "--fail-on") for item in split_items(options.fail_on)]
    rules = load_rules(rules_dirs)
    job_name = os.path.splitext(os.path.basename(script))[0]
    run_dir = rundir.create(options.runs_dir, job_name, options.log_dir)
    started = time.time()           # a timestamp for the manifest; durations use the monotonic clock
    started_mono = time.monotonic()
    manifest: dict[str, Any] = {
        "command": ["kwdiag", "run", *job_argv], "job": os.path.abspath(script), "args": job_argv[1:],
        "cwd": os.getcwd(), "started": started, "status": "starting",
        "options": {k: v for k, v in vars(options).items() if k != "env"},
        "versions": rundir.versions(),
    }
    rundir.write_manifest(run_dir, manifest)

    cluster = None
    env = child_env({**options.env, "KWDIAG_LOG_DIR": run_dir})
    if options.scheduler_file:
        env["KWDIAG_SCHEDULER_FILE"] = os.path.abspath(options.scheduler_file)
        target: Any = {"scheduler_file": options.scheduler_file}
    elif options.scheduler:  # the secret comes from KWDIAG_SECRET, for us and for the job
        env["KWDIAG_SCHEDULER_ADDRESS"] = options.scheduler
        env.pop("KWDIAG_SCHEDULER_FILE", None)
        target = {"address": options.scheduler}
    else:
        cluster = _start_cluster(options, run_dir, os.path.dirname(os.path.abspath(script)))
        env["KWDIAG_SCHEDULER_FILE"] = cluster.scheduler_file
        target = {"address": cluster}

    from kwdiag.runtime import Client

    view = make_view(" ".join(job_argv), run_dir)
    tail = EventTail(run_dir)
    announcer = DeathAnnouncer(rules)
    client = None
    state: ClusterState | None = None
    restarts: dict[str, int] = {}
    timed_out = interrupted = False
    job = None
    try:
        try:
            with warnings.catch_warnings():  # our observer's own environment is not the job's: no warning for it
                warnings.simplefilter("ignore")
                client = Client(**target)
        except Exception as exc:
            raise KwdiagError(f"cannot reach the scheduler: {exc}", RUNTIME) from None
        manifest.update(status="running", scheduler=client.scheduler_address)
        rundir.write_manifest(run_dir, manifest)
        view.start()
        job = subprocess.Popen(script_command(*job_argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        tees = [threading.Thread(target=_tee, args=(job.stdout, os.path.join(run_dir, "job.stdout"), view, "stdout"),
                                 daemon=True),
                threading.Thread(target=_tee, args=(job.stderr, os.path.join(run_dir, "job.stderr"), view, "stderr"),
                                 daemon=True)]
        for t in tees:
            t.start()
        deadline = None if options.timeout is None else time.monotonic() + options.timeout
        while job.poll() is None:
            try:
                time.sleep(POLL)
                # Analysis is re-run only when a death may have happened (or one awaits its nanny's record),
                # not for every event: a busy run writes many events that are not about deaths.
                new = tail.poll()
                if any(e.kind in DEATH_KINDS for e in new) or announcer.first_seen.keys() - announcer.announced:
                    for line in announcer.lines(tail.events):
                        view.death(line)
                info = client.scheduler_info()
                for w in info.get("workers", {}).values():
                    restarts[str(w.get("name"))] = max(restarts.get(str(w.get("name")), 0),
                                                       int(w.get("incarnation") or 1) - 1)
                state = ClusterState.from_info(info, time.monotonic() - started_mono, len(announcer.announced),
                                               restarts)
                view.update(state)
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    view.say(f"the job ran past --timeout {options.timeout:g}s; stopping it")
                    _stop_job(job, signal.SIGTERM)
            except KeyboardInterrupt:
                interrupted = True
                view.say("interrupted: stopping the job and the cluster")
                _stop_job(job, signal.SIGINT)
            except Exception as exc:  # the monitor must never take the job down with it
                if job.poll() is None:
                    view.say(f"monitoring hiccup: {type(exc).__name__}: {exc}")
        for t in tees:
            t.join(5)
        try:
            info = client.scheduler_info()
            state = ClusterState.from_info(info, time.monotonic() - started_mono, len(announcer.announced), restarts)
        except Exception:
            pass
    except KeyboardInterrupt:
        interrupted = True
        if job is not None:
            _stop_job(job, signal.SIGINT)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
            try:
                os.unlink(cluster.scheduler_file)  # the shared secret does not stay in the run directory
            except FileNotFoundError:
                pass
        tail.poll()
        try:
            for line in announcer.lines(tail.events, final=True):
                view.death(line)
        except Exception:
            pass
        view.stop(state)

    job_code = job.returncode if job is not None else None
    report = analyze([run_dir], rules=rules)
    from kwdiag.report.terminal import render_terminal

    sys.stderr.write("\n")
    render_terminal(report, sys.stderr)
    ended = time.time()
    duration = time.monotonic() - started_mono
    by_cause = Counter(f"{d.cause}/{d.detail}" for d in report.deaths)
    failing = [d for d in report.deaths if any(sel.matches(d) for sel in fail_on)]
    if interrupted:
        code = INTERRUPTED
    elif timed_out:
        code = TIMEOUT_EXIT
    elif job_code is None:
        code = RUNTIME
    elif job_code < 0:
        code = 128 - job_code
    else:
        code = job_code
    if failing and code == 0:
        code = FINDINGS
    tasks = {"submitted": state.submitted, "finished": state.finished, "erred": state.erred} if state else {}
    manifest.update(status="interrupted" if interrupted else "timed-out" if timed_out else "finished",
                    ended=ended, duration=round(duration, 3), job_exit_code=job_code, exit_code=code,
                    verdict=report.verdict(), deaths_by_cause=dict(by_cause), tasks=tasks,
                    fail_on_matched=[f"{d.worker}#{d.incarnation} {d.cause}/{d.detail}" for d in failing])
    rundir.write_manifest(run_dir, manifest)
    summary = [f"job exit code {job_code if job_code is not None else '-'}"
               + (" (timed out)" if timed_out else " (interrupted)" if interrupted else ""),
               f"tasks {tasks.get('finished', 0)} run, {tasks.get('erred', 0)} failed" if tasks else "tasks unknown",
               "deaths " + (", ".join(f"{n}× {c}" for c, n in by_cause.most_common()) or "none"),
               f"{duration:.1f}s"]
    sys.stderr.write(f"Run: {'; '.join(summary)}\nRun directory: {run_dir}\n")
    if failing:
        sys.stderr.write(f"--fail-on matched {len(failing)} death(s): exit code {code}\n")
    sys.stderr.flush()
    return code
