"""Run one job on a kwdiag cluster, watch it, and end with the diagnosis: the body of ``kwdiag run``.

Covers: creating the run directory and manifest; starting the cluster (``backend``: kwdiag's embedded
``LocalCluster`` or, with ``--dask``, a Dask one, every process writing its events and stderr there,
or an existing cluster); running the job as its
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
import textwrap
import threading
import time
from collections import Counter
from typing import Any

from kwdiag.analysis.growing import GrowingAnalysis
from kwdiag.errors import FINDINGS, INTERRUPTED, RUNTIME, TIMEOUT, USAGE, KwdiagError, signalled
from kwdiag.kinds import DEATH
from kwdiag.report.text import death_line
from kwdiag.run import rundir
from kwdiag.run.options import RunOptions
from kwdiag.run.tail import EventTail
from kwdiag.run.view import ClusterState, make_view
from kwdiag.runtime.spawn import script_command

POLL = 0.25            # seconds between looks at the cluster
ANNOUNCE_WAIT = 2.0    # how long a death waits for its nanny's record before it is announced anyway
JOB_GRACE = 10.0       # after SIGINT/SIGTERM, before the job is killed


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
    """Turns the events the cluster writes into one line per death, with its cause, as they happen: one analysis
    that grows with the run (``kwdiag.analysis.growing``), each death announced once."""

    def __init__(self, rules):
        self.analysis = GrowingAnalysis(rules)
        self.announced: set[tuple[str, int]] = set()
        self.first_seen: dict[tuple[str, int], float] = {}
        self.recorded_pids: set[int] = set()  # the processes whose nanny's exit record has arrived

    def add(self, events: list) -> None:
        self.analysis.add(events)
        self.recorded_pids.update(e.get("pid") for e in events if e.kind == "worker-exit")

    def waiting(self) -> bool:
        """A death was seen but not announced yet (it waits for its nanny's record)."""
        return bool(self.first_seen.keys() - self.announced)

    def lines(self, *, final: bool = False) -> list[str]:
        out = []
        now = time.monotonic()
        for d in self.analysis.deaths():
            key = (d.worker, d.incarnation)
            if key in self.announced:
                continue
            self.first_seen.setdefault(key, now)
            waited = now - self.first_seen[key]
            # With a nanny, its worker-exit record (signal, memory) settles the cause: wait for it briefly.
            if not final and d.pid not in self.recorded_pids and waited < ANNOUNCE_WAIT:
                continue
            if d.cause == "chose_to_exit" and d.detail == "shutdown":
                continue  # the end of the run, not news
            self.announced.add(key)
            out.append(death_line(d))
        return out


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


def _manifest(job_argv: list[str], options: RunOptions, started: float, runtime: str) -> dict[str, Any]:
    # the command line as typed (its options too), when this process is that command; else what it amounts to
    typed = sys.argv[1:]
    command = (["kwdiag", *typed] if typed[:1] == ["run"] and typed[len(typed) - len(job_argv):] == job_argv
               else ["kwdiag", "run", *job_argv])
    return {"command": command, "job": os.path.abspath(job_argv[0]), "args": job_argv[1:],
            "cwd": os.getcwd(), "started": started, "status": "starting", "runtime": runtime,
            "options": {k: v for k, v in vars(options).items() if k != "env"},
            "versions": rundir.versions(dask=runtime == "dask")}


class _Watch:
    """The job's run: its process, its output, the live view, and what was seen of the cluster."""

    def __init__(self, backend, view, run_dir: str, announcer: DeathAnnouncer, started: float):
        # ``started``: time.monotonic() when the run began (the live view's elapsed time)
        self.backend = backend
        self.view = view
        self.run_dir = run_dir
        self.announcer = announcer
        self.started = started
        self.tail = EventTail(run_dir)
        self.state: ClusterState | None = None
        self.restarts: dict[str, int] = {}
        self.timed_out = self.interrupted = False
        self.job: subprocess.Popen | None = None

    def start_job(self, job_argv: list[str]) -> list[threading.Thread]:
        self.job = subprocess.Popen(script_command(*job_argv), env=self.backend.job_env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
        tees = [threading.Thread(target=_tee, args=(pipe, os.path.join(self.run_dir, f"job.{name}"), self.view,
                                                    name), daemon=True)
                for pipe, name in ((self.job.stdout, "stdout"), (self.job.stderr, "stderr"))]
        for t in tees:
            t.start()
        return tees

    def look(self) -> None:
        """One look at the cluster: announce new deaths, refresh the view."""
        # Analysis is re-run only when a death may have happened (or one awaits its nanny's record),
        # not for every event: a busy run writes many events that are not about deaths.
        new = self.tail.poll()
        self.announcer.add(new)
        if any(e.kind in DEATH for e in new) or self.announcer.waiting():
            for line in self.announcer.lines():
                self.view.death(line)
        self.refresh()

    def refresh(self) -> None:
        info = self.backend.info()
        for w in info.get("workers", {}).values():
            name = str(w.get("name"))
            self.restarts[name] = max(self.restarts.get(name, 0), int(w.get("incarnation") or 1) - 1)
        self.state = ClusterState.from_info(info, time.monotonic() - self.started, len(self.announcer.announced),
                                            self.restarts)
        self.view.update(self.state)

    def loop(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.job.poll() is None:
            try:
                time.sleep(POLL)
                self.look()
                if deadline is not None and time.monotonic() > deadline and not self.timed_out:
                    self.timed_out = True
                    self.view.say(f"the job ran past --timeout {timeout:g}s; stopping it")
                    _stop_job(self.job, signal.SIGTERM)
            except KeyboardInterrupt:
                self.interrupted = True
                self.view.say("interrupted: stopping the job and the cluster")
                _stop_job(self.job, signal.SIGINT)
            except Exception as exc:  # the monitor must never take the job down with it
                if self.job.poll() is None:
                    self.view.say(f"monitoring hiccup: {type(exc).__name__}: {exc}")

    def final_announcements(self) -> None:
        try:
            self.announcer.add(self.tail.poll())
            for line in self.announcer.lines(final=True):
                self.view.death(line)
        except Exception:
            pass


def _watch_job(job_argv: list[str], options: RunOptions, backend, view, watch: _Watch) -> None:
    try:
        view.start()
        tees = watch.start_job(job_argv)
        watch.loop(options.timeout)
        for t in tees:
            t.join(5)
        try:
            watch.refresh()
        except Exception:
            pass
    except KeyboardInterrupt:
        watch.interrupted = True
        if watch.job is not None:
            _stop_job(watch.job, signal.SIGINT)
    finally:
        try:
            backend.close()
        except KeyboardInterrupt:  # a second Ctrl-C while closing: the diagnosis still comes
            pass
        watch.final_announcements()
        view.stop(watch.state)


def _exit_code(watch: _Watch, job_code: int | None, failing: list) -> int:
    if watch.interrupted:
        code = INTERRUPTED
    elif watch.timed_out:
        code = TIMEOUT
    elif job_code is None:
        code = RUNTIME
    elif job_code < 0:
        code = signalled(-job_code)
    else:
        code = job_code
    return FINDINGS if failing and code == 0 else code


def run(job_argv: list[str], options: RunOptions, *, rules_dirs: tuple[str, ...] = ()) -> int:
    """Run the job; return the exit code ``kwdiag run`` should end with."""
    from kwdiag.engine import load_rules
    from kwdiag.check.policy import parse_selector, split_items
    from kwdiag.run.backend import make_backend

    script = job_argv[0]
    if script.startswith("-") and not os.path.isfile(script):
        # run passes everything after its own options to the job, so a misspelled option lands here
        raise KwdiagError(f"no such option: {script} (see `kwdiag run --help`)", USAGE)
    if not os.path.isfile(script):
        raise KwdiagError(f"no such job script: {script}", USAGE)
    fail_on = [parse_selector(item, "--fail-on") for item in split_items(options.fail_on)]
    rules = load_rules(rules_dirs)
    job_name = os.path.splitext(os.path.basename(script))[0]
    run_dir = rundir.create(options.runs_dir, job_name, options.log_dir)
    started = time.time()           # a timestamp for the manifest; durations use the monotonic clock
    started_mono = time.monotonic()
    backend = make_backend(options, run_dir, os.path.dirname(os.path.abspath(script)))
    manifest = _manifest(job_argv, options, started, backend.runtime)
    rundir.write_manifest(run_dir, manifest)
    backend.start()
    manifest.update(status="running", scheduler=backend.scheduler_address)
    rundir.write_manifest(run_dir, manifest)
    view = make_view(" ".join(job_argv), run_dir)
    watch = _Watch(backend, view, run_dir, DeathAnnouncer(rules), started_mono)
    _watch_job(job_argv, options, backend, view, watch)
    return _finish(watch, run_dir, rules, fail_on, manifest, started_mono)


def _finish(watch: _Watch, run_dir: str, rules, fail_on: list, manifest: dict[str, Any], started_mono: float) -> int:
    """The diagnosis of the run directory, the manifest's outcome, the summary line; the exit code."""
    from kwdiag.pipeline import analyze
    from kwdiag.report.terminal import render_terminal

    job_code = watch.job.returncode if watch.job is not None else None
    report = analyze([run_dir], rules=rules)
    sys.stderr.write("\n")
    render_terminal(report, sys.stderr)
    ended = time.time()
    duration = time.monotonic() - started_mono
    by_cause = Counter(f"{d.cause}/{d.detail}" for d in report.deaths)
    failing = [d for d in report.deaths if any(sel.matches(d) for sel in fail_on)]
    code = _exit_code(watch, job_code, failing)
    state, timed_out, interrupted = watch.state, watch.timed_out, watch.interrupted
    tasks = {"submitted": state.submitted, "finished": state.finished, "erred": state.erred} if state else {}
    manifest.update(status="interrupted" if interrupted else "timed-out" if timed_out else "finished",
                    ended=ended, duration=round(duration, 3), job_exit_code=job_code, exit_code=code,
                    verdict=report.verdict(), deaths_by_cause=dict(by_cause), tasks=tasks,
                    fail_on_matched=[f"{d.worker}#{d.incarnation} {d.cause}/{d.detail}" for d in failing])
    rundir.write_manifest(run_dir, manifest)
    summary = [f"job exit code {job_code if job_code is not None else '-'}"
               + (" (timed out)" if timed_out else " (interrupted)" if interrupted else ""),
               f"tasks {tasks.get('finished', 0)} run, {tasks.get('erred', 0)} failed" if tasks else "tasks unknown",
               # the causes are the report's, just above; here only how many (the manifest keeps them all)
               f"deaths {len(report.deaths)}" + (f" ({len(report.failures)} need attention)" if report.failures else ""),
               f"{duration:.1f}s"]
    sys.stderr.write(f"Run: {'; '.join(summary)}\nRun directory: {run_dir}\n")
    notes = _run_notes(watch.backend.runtime, tasks, report, _job_stderr(run_dir))
    if notes:
        manifest.update(notes=notes)
        rundir.write_manifest(run_dir, manifest)
        for note in notes:
            sys.stderr.write(textwrap.fill(note, width=80, subsequent_indent="  ", break_on_hyphens=False) + "\n")
    if failing:
        sys.stderr.write(f"--fail-on matched {len(failing)} death(s): exit code {code}\n")
    sys.stderr.flush()
    return code


def _run_notes(runtime: str, tasks: dict[str, int], report, job_stderr: str) -> list[str]:
    """Notes for a job that did not use the cluster kwdiag started (its workers ran no task), so the deaths kwdiag
    watched are not the job's: it imported ``Client`` from ``dask.distributed`` (an embedded run), or made a cluster
    of its own under ``--dask``; and Dask's refusal of cluster arguments to ``Client()`` under ``--dask``."""
    notes = []
    if runtime == "dask" and not tasks.get("submitted") and "ValueError: Unexpected keyword arguments: [" in job_stderr:
        notes.append("Note: Dask's Client refused the job's cluster arguments (ValueError: Unexpected keyword "
                     "arguments): under `kwdiag run --dask` the job's Client() joins the Dask cluster kwdiag started "
                     "(DASK_SCHEDULER_ADDRESS is set), and Dask takes no LocalCluster arguments such as n_workers "
                     "then. Call Client() without them and give the cluster's shape to kwdiag run (--workers, "
                     "--threads, --memory-limit).")
    elif not tasks or tasks.get("submitted"):
        pass   # (no task counts: the cluster was not reachable at the end, so nothing is known)
    elif runtime == "kwdiag" and "dask" in report.runtimes:
        notes.append("Note: the job ran no task on kwdiag's cluster, and Dask's lines are in its output: it ran on "
                     "a Dask cluster of its own (Client from dask.distributed). Import Client from kwdiag.runtime "
                     "instead (the rest of the Dask code stays), or run it with `kwdiag run --dask`, which starts a "
                     "Dask cluster for the job's Client() to join and keeps every process's log at INFO.")
    elif runtime == "kwdiag":
        notes.append("Note: the job ran no task on kwdiag's cluster. If it uses Dask, its Client (from "
                     "dask.distributed) started a cluster of its own, whose workers kwdiag does not watch and whose "
                     "LocalCluster logs only warnings: import Client from kwdiag.runtime instead, or run it with "
                     "`kwdiag run --dask`.")
    else:
        notes.append("Note: the job ran no task on the Dask cluster kwdiag started: it made a cluster of its own "
                     "(a LocalCluster, or Client() with cluster arguments), whose deaths are read only from the lines "
                     "it printed, at the level it logs (a LocalCluster: warnings only). Let its Client() take no "
                     "arguments, so that it joins kwdiag's cluster, and give the cluster's shape to kwdiag run "
                     "(--workers, --threads, --memory-limit).")
    return notes


def _job_stderr(run_dir: str) -> str:
    """The job's own stderr as kept in the run directory (its last 256 KiB), or "" when there is none."""
    try:
        with open(os.path.join(run_dir, "job.stderr"), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - (256 << 10)))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
