"""Process entry points: ``python -m kwdiag.runtime.entry scheduler|nanny|worker|worker-process``.

Covers: parsing one process's arguments, reading the shared secret (``KWDIAG_SECRET`` hex or a
scheduler file — never a command-line argument, which other users can read in ``ps``), setting
up stderr logging, and running the process's event loop. Kept free of typer and rich so a
replacement worker starts fast; ``kwdiag scheduler`` / ``kwdiag worker`` call these functions.

Does not cover: choosing what to start (``runtime.cluster`` and the CLI do).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys

from kwdiag.runtime import config as config_mod
from kwdiag.runtime import identity
from kwdiag.runtime.identity import OtherClusterError, StartupError
from kwdiag.runtime.record import setup_logging


# Kept here too: callers import them from entry (the scheduler file is read by clients and clusters).
read_scheduler_file = identity.read_scheduler_file


def resolve_secret(explicit: bytes | None = None) -> bytes | None:
    return explicit or identity.env_secret()


def resolve_scheduler(address: str | None, scheduler_file: str | None) -> tuple[str, bytes]:
    return identity.worker_identity(address, scheduler_file)


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def start_scheduler(*, host: str, port: int, scheduler_file: str | None, log_dir: str | None,
                    config: dict, watch_parent: int | None = None, security=None, new_secret: bool = False) -> None:
    """Run a scheduler until it closes. Raises ``StartupError`` (no traceback) for what a user can fix."""
    from kwdiag.runtime.scheduler import run_scheduler

    secret, _ = identity.scheduler_secret(scheduler_file, new_secret)
    setup_logging()
    asyncio.run(run_scheduler(secret=secret, config=config, log_dir=log_dir, host=host, port=port,
                              scheduler_file=scheduler_file, watch_parent=watch_parent, security=security))


def start_worker(*, address: str | None, scheduler_file: str | None, nanny: bool, name: str | None,
                 nthreads: int, memory_limit: int | None, lifetime: float | None, host: str,
                 log_dir: str | None, config: dict, preload: list[str] = (), control_stdin: bool = False,
                 security=None) -> None:
    address, secret = resolve_scheduler(address, scheduler_file)
    name = name or default_name()
    setup_logging()
    if nanny:
        from kwdiag.runtime.nanny import run_nanny

        asyncio.run(run_nanny(name=name, scheduler_address=address, secret=secret, config=config, nthreads=nthreads,
                              memory_limit=memory_limit, log_dir=log_dir, host=host, lifetime=lifetime,
                              preload=list(preload), control_stdin=control_stdin, security=security,
                              scheduler_file=scheduler_file))
    else:
        from kwdiag.runtime.worker import run_worker

        asyncio.run(run_worker(name=name, scheduler_address=address, secret=secret, config=config,
                               nthreads=nthreads, memory_limit=memory_limit, log_dir=log_dir, host=host,
                               nanny_address=None, incarnation=1, lifetime=lifetime, status_fd=None,
                               control_fd=None, preload=list(preload), control_stdin=control_stdin,
                               security=security, scheduler_file=scheduler_file))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kwdiag.runtime.entry")
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("scheduler")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--scheduler-file")
    s.add_argument("--log-dir")
    s.add_argument("--watch-parent", type=int)
    s.add_argument("--new-secret", action="store_true")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    _tls_options(s)
    for role in ("worker", "worker-process"):
        w = sub.add_parser(role)
        w.add_argument("--scheduler", dest="address")
        w.add_argument("--scheduler-file")
        w.add_argument("--name")
        w.add_argument("--nthreads", type=int, default=1)
        w.add_argument("--memory-limit")
        w.add_argument("--lifetime")
        w.add_argument("--host", default="127.0.0.1")
        w.add_argument("--log-dir")
        w.add_argument("--preload", action="append", default=[])
        w.add_argument("--control-stdin", action="store_true", help="read 'close REASON' lines on stdin; EOF closes")
        w.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
        _tls_options(w)
        if role == "worker":
            w.add_argument("--no-nanny", action="store_true")
        else:
            w.add_argument("--nanny-address")
            w.add_argument("--incarnation", type=int, default=1)
            w.add_argument("--status-fd", type=int)
            w.add_argument("--control-fd", type=int)
    return parser


def _tls_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--tls-ca")


def _overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise StartupError(f"--set takes KEY=VALUE, not {pair!r}")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        config = config_mod.load(_overrides(args.set))
        from kwdiag.runtime.comm import Security

        security = Security.from_options(args.tls_cert, args.tls_key, args.tls_ca)
        if args.role == "scheduler":
            start_scheduler(host=args.host, port=args.port, scheduler_file=args.scheduler_file, log_dir=args.log_dir,
                            config=config, watch_parent=args.watch_parent, security=security,
                            new_secret=args.new_secret)
            return
        memory_limit = config_mod.parse_bytes(args.memory_limit)
        lifetime = config_mod.parse_timedelta(args.lifetime)
        if args.role == "worker":
            start_worker(address=args.address, scheduler_file=args.scheduler_file, nanny=not args.no_nanny,
                         name=args.name, nthreads=args.nthreads, memory_limit=memory_limit, lifetime=lifetime,
                         host=args.host, log_dir=args.log_dir, config=config, preload=args.preload,
                         control_stdin=args.control_stdin, security=security)
            return
        # worker-process: the child of a nanny
        from kwdiag.runtime.worker import run_worker

        try:
            address, secret = resolve_scheduler(args.address, args.scheduler_file)
        except OtherClusterError:
            raise
        except StartupError:
            if not (args.address and args.scheduler_file):
                raise
            # The file is gone or unreadable just now: start from the address the nanny last knew.
            address, secret = resolve_scheduler(args.address, None)
        setup_logging()
        asyncio.run(run_worker(name=args.name or default_name(), scheduler_address=address, secret=secret,
                               config=config, nthreads=args.nthreads, memory_limit=memory_limit,
                               log_dir=args.log_dir, host=args.host, nanny_address=args.nanny_address,
                               incarnation=args.incarnation, lifetime=lifetime, status_fd=args.status_fd,
                               control_fd=args.control_fd, preload=args.preload, security=security,
                               scheduler_file=args.scheduler_file))
    except OtherClusterError as exc:
        print(f"kwdiag: error: {exc}", file=sys.stderr)
        # A nanny's worker must not be restarted into a cluster it does not belong to (EX_CONFIG stops the nanny).
        from kwdiag.runtime.core import EXIT_REFUSED

        sys.exit(EXIT_REFUSED if args.role == "worker-process" else exc.exit_code)
    except StartupError as exc:
        print(f"kwdiag: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except ValueError as exc:
        print(f"kwdiag: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
