"""CLI commands that start runtime processes by hand (multi-host use): ``kwdiag scheduler``, ``kwdiag worker``.

Covers: option parsing and validation, then a hand-off to ``kwdiag.runtime.entry``. The
runtime is imported inside the command bodies so ``kwdiag --help`` never pays for it.
"""

from __future__ import annotations

from typing import List, Optional

import typer

from kwdiag.errors import USAGE, KwdiagError


def _load_config(settings: list[str], **explicit: object) -> dict:
    from kwdiag.runtime import config as config_mod

    overrides: dict = {}
    for pair in settings:
        key, sep, value = pair.partition("=")
        if not sep:
            raise KwdiagError(f"--set takes KEY=VALUE, not {pair!r}", USAGE)
        overrides[key] = value
    overrides.update({k: v for k, v in explicit.items() if v is not None})
    try:
        return config_mod.load(overrides)
    except ValueError as exc:
        raise KwdiagError(str(exc), USAGE) from None


def _security(cert: Optional[str], key: Optional[str], ca: Optional[str]):
    from kwdiag.runtime.comm import Security

    try:
        return Security.from_options(cert, key, ca)
    except ValueError as exc:
        raise KwdiagError(str(exc), USAGE) from None


TLS_CERT = typer.Option(None, "--tls-cert", help="This process's TLS certificate (PEM): all connections use TLS.")
TLS_KEY = typer.Option(None, "--tls-key", help="The private key of --tls-cert.")
TLS_CA = typer.Option(None, "--tls-ca", help="The CA that signed the cluster's certificates; peers must present one.")


def register(app: typer.Typer) -> None:
    """Register the scheduler and worker command(s). Over 60 lines on purpose: Typer reads each option from a
    parameter of the command function defined here, one option per parameter with its help; the bodies only
    parse options and call one function."""
    @app.command("scheduler")
    def scheduler(
        host: str = typer.Option("127.0.0.1", help="Interface to listen on (loopback unless you say otherwise)."),
        port: int = typer.Option(8786, help="Port to listen on (0: any free port)."),
        scheduler_file: Optional[str] = typer.Option(None, help="Write the address and shared secret here (mode 0600); "
                                                     "an existing file's secret is kept, so a restarted scheduler "
                                                     "keeps its cluster. Optional when KWDIAG_SECRET is set."),
        new_secret: bool = typer.Option(False, "--new-secret", help="Start a new cluster: a new shared secret, "
                                                                     "even if the scheduler file holds one."),
        log_dir: str = typer.Option("kwdiag-logs", help="Run directory: the JSONL event log, and the journal a "
                                                         "scheduler started again on it replays."),
        allowed_failures: Optional[int] = typer.Option(None, help="Worker deaths a task may cause before KilledWorker."),
        worker_ttl: Optional[str] = typer.Option(None, help="Remove a worker silent for this long (e.g. 5s)."),
        set_: List[str] = typer.Option([], "--set", help="Any runtime setting, KEY=VALUE (see docs/runtime.md)."),
        tls_cert: Optional[str] = TLS_CERT, tls_key: Optional[str] = TLS_KEY, tls_ca: Optional[str] = TLS_CA,
    ) -> None:
        """Start a scheduler. Workers join with `kwdiag worker --scheduler-file F` (or ADDRESS and KWDIAG_SECRET).

        Started again with the same command after it died, it keeps its cluster's secret and replays its
        journal in --log-dir: workers and clients reconnect, and finished results are reused."""
        import os

        from kwdiag.runtime import entry

        config = _load_config(set_, allowed_failures=allowed_failures, worker_ttl=worker_ttl)
        security = _security(tls_cert, tls_key, tls_ca)
        if not scheduler_file and not os.environ.get("KWDIAG_SECRET"):
            raise KwdiagError("--scheduler-file is required unless KWDIAG_SECRET is set: it is how workers and "
                              "clients learn the address and the shared secret", USAGE)
        try:
            entry.start_scheduler(host=host, port=port, scheduler_file=scheduler_file, log_dir=log_dir,
                                  config=config, security=security, new_secret=new_secret)
        except entry.StartupError as exc:
            raise KwdiagError(str(exc), exc.exit_code) from None

    @app.command("worker")
    def worker(
        address: Optional[str] = typer.Argument(None, help="Scheduler address, tcp://host:port (the secret then "
                                                          "comes from KWDIAG_SECRET)."),
        scheduler_file: Optional[str] = typer.Option(None, help="The scheduler file written by `kwdiag scheduler`."),
        nanny: bool = typer.Option(True, "--nanny/--no-nanny", help="Run under a nanny that restarts the worker "
                                                                     "and enforces its memory limit."),
        memory_limit: Optional[str] = typer.Option(None, help="e.g. 2GiB; the nanny terminates the worker past "
                                                              "the terminate fraction of it."),
        nthreads: int = typer.Option(1, min=1, help="Threads that run tasks."),
        lifetime: Optional[str] = typer.Option(None, help="Leave gracefully after this long (e.g. 1h)."),
        name: Optional[str] = typer.Option(None, help="Stable worker name (default host-pid)."),
        host: str = typer.Option("127.0.0.1", help="Interface to listen on for peers."),
        log_dir: str = typer.Option("kwdiag-logs", help="Directory for the JSONL event log."),
        preload: List[str] = typer.Option([], help="Module to import at worker start (repeatable)."),
        set_: List[str] = typer.Option([], "--set", help="Any runtime setting, KEY=VALUE."),
        tls_cert: Optional[str] = TLS_CERT, tls_key: Optional[str] = TLS_KEY, tls_ca: Optional[str] = TLS_CA,
    ) -> None:
        """Start a worker (with a nanny unless --no-nanny) and join a scheduler."""
        from kwdiag.runtime import config as config_mod
        from kwdiag.runtime import entry

        config = _load_config(set_)
        security = _security(tls_cert, tls_key, tls_ca)
        try:
            limit = config_mod.parse_bytes(memory_limit)
            life = config_mod.parse_timedelta(lifetime)
        except ValueError as exc:
            raise KwdiagError(str(exc), USAGE) from None
        try:
            entry.start_worker(address=address, scheduler_file=scheduler_file, nanny=nanny, name=name,
                               nthreads=nthreads, memory_limit=limit, lifetime=life, host=host, log_dir=log_dir,
                               config=config, preload=preload, security=security)
        except entry.StartupError as exc:
            raise KwdiagError(str(exc), exc.exit_code) from None
