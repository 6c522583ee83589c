"""CLI commands ``kwdiag run``, ``kwdiag runs`` and ``kwdiag demo``: thin shells over ``kwdiag.run``."""

from __future__ import annotations

from typing import List, Optional

import typer

# Everything after the job script belongs to the job, options included (as with `python job.py ...`).
_JOB_ARGS = {"allow_interspersed_args": False, "ignore_unknown_options": True}


def register(app: typer.Typer) -> None:
    """Register the run, runs and demo command(s). Over 60 lines on purpose: Typer reads each option from a
    parameter of the command function defined here, one option per parameter with its help; the bodies only
    parse options and call one function."""
    @app.command("run", context_settings=_JOB_ARGS)
    def run(
        job: List[str] = typer.Argument(..., metavar="JOB.py [ARGS]...", help="The job script and its arguments."),
        workers: Optional[int] = typer.Option(None, "--workers", "-n", help="Workers to start [default: 2]."),
        threads: Optional[int] = typer.Option(None, "--threads", help="Threads per worker [default: 1]."),
        memory_limit: Optional[str] = typer.Option(None, "--memory-limit", help="Per worker, e.g. 2GiB "
                                                   "[default: auto = memory / workers]."),
        no_nanny: bool = typer.Option(False, "--no-nanny", help="Run bare workers: nobody restarts them."),
        allowed_failures: Optional[int] = typer.Option(None, "--allowed-failures", help="Deaths a task may cause "
                                                       "before KilledWorker [default: 3]."),
        worker_ttl: Optional[str] = typer.Option(None, "--worker-ttl", help="Remove a silent worker after this "
                                                 "long [default: 5s]."),
        log_dir: Optional[str] = typer.Option(None, "--log-dir", help="The run directory [default: "
                                              "./kwdiag-runs/<timestamp>-<job>]."),
        timeout: Optional[str] = typer.Option(None, "--timeout", help="Stop the job after this long (exit 124)."),
        fail_on: Optional[List[str]] = typer.Option(None, "--fail-on", help="Exit non-zero when deaths of these "
                                                    "causes happened (cause, cause/detail, */detail)."),
        scheduler_file: Optional[str] = typer.Option(None, "--scheduler-file", help="Run on an existing cluster."),
        scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Run on an existing cluster at this "
                                                "address (secret from KWDIAG_SECRET)."),
        dask: bool = typer.Option(False, "--dask", help="Run on a real Dask cluster recorded by kwdiag's plugins "
                                  "(needs kwdiag[dask]); with --scheduler/--scheduler-file, an existing one."),
        rules_dirs: Optional[List[str]] = typer.Option(None, "--rules", help="Also your own rules."),
    ) -> None:
        """Run JOB.py on an embedded cluster (or a Dask one, --dask), watch it live, and end with the diagnosis
        of every worker death.

        Exit code: the job's own; 124 after --timeout; 130 when interrupted; 1 when --fail-on matched
        and the job itself succeeded.
        """
        from kwdiag.run.options import resolve
        from kwdiag.run.runner import run as run_job

        options = resolve({"workers": workers, "threads": threads, "memory_limit": memory_limit,
                           "nanny": False if no_nanny else None, "allowed_failures": allowed_failures,
                           "worker_ttl": worker_ttl, "log_dir": log_dir, "timeout": timeout, "fail_on": fail_on,
                           "scheduler_file": scheduler_file, "scheduler": scheduler, "dask": True if dask else None})
        raise typer.Exit(run_job(list(job), options, rules_dirs=tuple(rules_dirs or ())))

    @app.command("runs")
    def runs(runs_dir: str = typer.Argument("kwdiag-runs", help="Where runs are kept.")) -> None:
        """List past runs, one line each: when, job, exit code, time taken, verdict."""
        import time

        from kwdiag.escape import safe
        from kwdiag.run.rundir import list_runs

        found = list_runs(runs_dir)
        if not found:
            typer.echo(f"no runs in {runs_dir}")
            return
        jobs = [" ".join([str(m.get("job", "?")).rsplit("/", 1)[-1], *map(str, m.get("args") or [])]) for _, m in found]
        # the job column as wide as its longest entry (within 40: a longer one is cut, its end marked), so the
        # columns after it line up whatever the jobs are called
        width = min(max(24, *map(len, jobs)), 40)
        for (path, m), job in zip(found, jobs):
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.get("started") or 0))
            job = job if len(job) <= width else job[:width - 1] + "…"
            code = m.get("exit_code", "-")
            duration = f"{m['duration']:.1f}s" if isinstance(m.get("duration"), (int, float)) else m.get("status", "?")
            typer.echo(safe(f"{started}  {job:<{width}} exit {code!s:<4} {duration:>8}  "
                            f"{m.get('verdict', m.get('status'))}  {path}", 1000))

    @app.command("demo")
    def demo(
        log_dir: Optional[str] = typer.Option(None, "--log-dir", help="The run directory [default: "
                                              "./kwdiag-runs/<timestamp>-demo]."),
    ) -> None:
        """Lose workers in five real ways (clean exit, unrecoverable exception, memory, segfault, version
        mismatch) plus KilledWorker, and see each one diagnosed — in well under a minute."""
        import os
        import shutil
        import tempfile

        from kwdiag.run import demo_job
        from kwdiag.run.options import RunOptions
        from kwdiag.run.runner import run as run_job

        # Two "environments": the cluster's, and a colleague's with another version of a package that must match.
        sites = tempfile.mkdtemp(prefix="kwdiag-demo-")
        for version, folder in (("1.0", "cluster"), ("2.0", "other")):
            info = os.path.join(sites, folder, f"kwdiag_demo_env-{version}.dist-info")
            os.makedirs(info)
            with open(os.path.join(info, "METADATA"), "w") as f:
                f.write(f"Metadata-Version: 2.1\nName: kwdiag-demo-env\nVersion: {version}\n")
        package = {"versions_packages": ["kwdiag-demo-env"], "versions_required": ["kwdiag-demo-env"]}
        options = RunOptions(workers=3, threads=1, memory_limit="300MiB", allowed_failures=1, log_dir=log_dir,
                             runs_dir="kwdiag-runs", config=package,
                             env={"PYTHONPATH": os.path.join(sites, "cluster"),
                                  "KWDIAG_VERSIONS_PACKAGES": "kwdiag-demo-env"})
        try:
            code = run_job([demo_job.__file__, os.path.join(sites, "other")], options)
        finally:
            shutil.rmtree(sites, ignore_errors=True)
        raise typer.Exit(code)
