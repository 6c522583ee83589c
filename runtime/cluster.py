"""``LocalCluster``: a scheduler and N workers (with nannies by default) as local processes.

Covers: choosing the log directory (argument, ``KWDIAG_LOG_DIR``, else a fresh temporary
folder) and failing early if it cannot be written; starting the scheduler and workers as
separate processes that share a freshly generated secret (passed in the environment, never on
a command line), each with its stderr captured to ``<log_dir>/<name>.log``; waiting until the
workers have registered; scaling; and closing everything — also when the owning process
forgets to, or dies (children watch their parent). On close the scheduler file (it holds the
secret) is deleted, and a temporary log folder is removed unless a worker died in it (then a
log line names it).

Does not cover: talking to the cluster on a user's behalf (``Client`` does), or remote hosts.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import weakref
from typing import Any

from kwdiag.runtime import config as config_mod
from kwdiag.runtime.comm import CommClosedError, Credentials, Security, connect
from kwdiag.runtime.core import Stream, background
from kwdiag.runtime.identity import read_scheduler_file
from kwdiag.runtime.loopthread import LoopThread
from kwdiag.runtime.spawn import child_env, entry_command

logger = logging.getLogger("kwdiag.cluster")
_LIVE: "weakref.WeakSet[LocalCluster]" = weakref.WeakSet()


def _close_all_at_exit() -> None:
    for cluster in list(_LIVE):
        cluster.close()


atexit.register(_close_all_at_exit)


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


class LocalCluster:
    """Start a kwdiag cluster on this machine (Dask's ``LocalCluster`` arguments where they apply)."""

    def __init__(self, n_workers: int = 2, threads_per_worker: int = 1, memory_limit: Any = "auto",
                 nanny: bool = True, scheduler_kwargs: dict | None = None, log_dir: str | None = None,
                 host: str = "127.0.0.1", scheduler_port: int = 0, config: dict | None = None,
                 timeout: float = 30.0, env: dict | None = None, processes: bool = True,
                 security: Security | None = None):
        if not processes:
            raise ValueError("kwdiag's LocalCluster always runs workers as processes (processes=True)")
        overrides = {**(config or {}), **(scheduler_kwargs or {})}
        self.config = config_mod.load(overrides)  # validates the keys
        self._env_overrides = {f"KWDIAG_{k.replace('-', '_').upper()}": ",".join(v) if isinstance(v, list) else str(v)
                               for k, v in overrides.items()}
        self.n_threads = threads_per_worker
        self.nanny = nanny
        self.host = host
        self.timeout = timeout
        self.extra_env = dict(env or {})
        if memory_limit == "auto":
            import psutil
            memory_limit = psutil.virtual_memory().total // max(1, n_workers)
        self.memory_limit = config_mod.parse_bytes(memory_limit)
        # A folder of our own making is removed on a clean close (kept, and named, when a worker died).
        self._temporary_log_dir = not (log_dir or os.environ.get("KWDIAG_LOG_DIR"))
        self.log_dir = os.path.abspath(log_dir or os.environ.get("KWDIAG_LOG_DIR") or
                                       tempfile.mkdtemp(prefix="kwdiag-cluster-"))
        check_log_dir(self.log_dir)
        self.secret = secrets.token_bytes(32)
        self.security = security
        self.credentials = Credentials(self.secret, security)
        self.scheduler_file = os.path.join(self.log_dir, "scheduler.json")
        self.processes: dict[str, subprocess.Popen] = {}
        self._next_worker = 0
        self._closed = False
        self.scheduler_address = ""
        _LIVE.add(self)
        try:
            self._start_scheduler(scheduler_port)
            for _ in range(n_workers):
                self._start_worker()
            self.wait_for_workers(n_workers, timeout)
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- processes
    def _spawn(self, name: str, args: list[str], control: bool = False) -> subprocess.Popen:
        env = child_env({**self.extra_env, **self._env_overrides, "KWDIAG_SECRET": self.secret.hex(),
                         "PYTHONUNBUFFERED": "1"})
        env.pop("KWDIAG_SCHEDULER_FILE", None)
        log = open(os.path.join(self.log_dir, f"{name}.log"), "ab")
        try:
            proc = subprocess.Popen(entry_command(*args),
                                    stdin=subprocess.PIPE if control else subprocess.DEVNULL,
                                    stdout=log, stderr=log, env=env, start_new_session=True)
        finally:
            log.close()
        self.processes[name] = proc
        return proc

    def _start_scheduler(self, port: int) -> None:
        try:
            os.unlink(self.scheduler_file)
        except FileNotFoundError:
            pass
        proc = self._spawn("scheduler", ["scheduler", "--host", self.host, "--port", str(port), "--scheduler-file",
                                         self.scheduler_file, "--log-dir", self.log_dir,
                                         "--watch-parent", str(os.getpid()), *self._tls_args()])
        deadline = time.monotonic() + self.timeout
        while not os.path.exists(self.scheduler_file):
            if proc.poll() is not None:
                raise RuntimeError(f"the scheduler exited with status {proc.returncode} before it started:\n"
                                   + _tail(os.path.join(self.log_dir, "scheduler.log")))
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scheduler did not start within {self.timeout:g}s")
            time.sleep(0.01)
        self.scheduler_address, _ = read_scheduler_file(self.scheduler_file)

    def _tls_args(self) -> list[str]:
        return self.security.args() if self.security else []

    def _start_worker(self) -> str:
        name = f"worker-{self._next_worker}"
        self._next_worker += 1
        args = ["worker", "--scheduler-file", self.scheduler_file, "--name", name, "--nthreads", str(self.n_threads),
                "--host", self.host, "--log-dir", self.log_dir, "--control-stdin"]
        if self.memory_limit:
            args += ["--memory-limit", str(self.memory_limit)]
        if not self.nanny:
            args.append("--no-nanny")
        args += self._tls_args()
        self._spawn(name, args, control=True)
        return name

    # ---------------------------------------------------------------- talking to the scheduler
    def _scheduler_request(self, op: str, timeout: float = 10.0, **fields: Any) -> Any:
        async def request() -> Any:
            comm = await connect(self.scheduler_address, self.credentials, timeout=timeout)
            stream = Stream(comm, {})
            reader = background(stream.run())
            try:
                return await stream.request(op, timeout=timeout, **fields)
            finally:
                stream.close()
                reader.cancel()
        return LoopThread.get().run(request(), timeout + 5)

    def scheduler_info(self) -> dict:
        return self._scheduler_request("scheduler-info")

    def wait_for_workers(self, n: int, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            workers = self.scheduler_info()["workers"]
            if len(workers) >= n:
                return
            dead = [name for name, p in self.processes.items() if name != "scheduler" and p.poll() is not None]
            if time.monotonic() > deadline:
                detail = "".join(f"\n--- {name}.log ---\n{_tail(os.path.join(self.log_dir, name + '.log'))}"
                                 for name in dead)
                raise TimeoutError(f"only {len(workers)} of {n} workers registered within "
                                   f"{timeout or self.timeout:g}s{detail}")
            time.sleep(0.02)

    @property
    def workers(self) -> dict:
        """``{address: info}`` of the registered workers (info has ``name`` and ``pid``)."""
        return self.scheduler_info()["workers"]

    def scale(self, n: int) -> None:
        """Grow to ``n`` workers, or retire the newest ones down to ``n``."""
        current = [name for name, p in self.processes.items() if name != "scheduler" and p.poll() is None]
        if n > len(current):
            for _ in range(n - len(current)):
                self._start_worker()
            self.wait_for_workers(n)
        elif n < len(current):
            doomed = sorted(current, key=lambda s: int(s.rsplit("-", 1)[1]))[n:]
            self._scheduler_request("retire-workers", workers=doomed, timeout=60)
            for name in doomed:
                try:
                    self.processes[name].wait(self.timeout)
                except subprocess.TimeoutExpired:
                    self.processes[name].kill()

    # ---------------------------------------------------------------- closing
    def close(self, timeout: float = 15.0) -> None:
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        # Our workers hear it from us directly (the scheduler may not know a worker that is mid-restart);
        # the scheduler is told too, so it stops moving data around for workers that are leaving.
        for name, proc in self.processes.items():
            if name != "scheduler" and proc.stdin is not None:
                try:
                    proc.stdin.write(b"close cluster-close\n")
                    proc.stdin.close()
                except OSError:
                    pass
        scheduler = self.processes.get("scheduler")
        if scheduler is not None and scheduler.poll() is None and self.scheduler_address:
            try:
                self._scheduler_request("close-cluster", timeout=timeout)
            except (CommClosedError, OSError, TimeoutError, Exception):
                pass
        deadline = time.monotonic() + timeout
        for proc in self.processes.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.terminate()
        for proc in self.processes.values():
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._leave_no_litter()

    def _leave_no_litter(self) -> None:
        """The scheduler file holds the cluster's secret: it goes whatever happened. A temporary log folder
        goes too after a clean run; when a worker died it stays, and a log line says where and how to read it."""
        try:
            os.unlink(self.scheduler_file)
        except OSError:
            pass
        if not self._temporary_log_dir or not os.path.isdir(self.log_dir):
            return  # the user's folder, or one already gone (deleted under us): nothing of ours to tidy
        died = deaths_recorded(self.log_dir)
        if died:
            logger.warning("kwdiag: %d worker death(s) recorded; logs kept in %s (kwdiag explain %s says why)",
                           died, self.log_dir, self.log_dir)
        else:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalCluster({self.scheduler_address!r}, workers={len(self.processes) - 1}, log_dir={self.log_dir!r})"


MIN_FREE_BYTES = 16 * 2**20  # below this at start, events would soon be lost to a full disk


# A nanny's record of an exit it did not cause (or caused for memory or a missed heartbeat) is a death.
_DELIBERATE = {"shutdown", "signal", "restart"}


def deaths_recorded(log_dir: str) -> int:
    """How many worker deaths the nannies and workers of ``log_dir`` recorded (their JSONL events): exits
    the nanny did not cause on request, fatal errors, start-up failures. A clean close counts none."""
    from kwdiag.events import EventDecodeError, from_json_line

    count = 0
    try:
        names = os.listdir(log_dir)
    except OSError:
        return 0
    for name in names:
        if not name.endswith(".jsonl"):
            continue
        try:
            with open(os.path.join(log_dir, name), "rb") as f:
                for line in f:
                    if b'"worker-exit"' not in line and b'"worker-fatal"' not in line and b'"worker-startup' not in line:
                        continue
                    try:
                        e = from_json_line(line)
                    except EventDecodeError:
                        continue
                    if e.kind != "worker-exit" or (e.get("exitcode") != 0 and e.get("caused_by") not in _DELIBERATE):
                        count += 1
        except OSError:
            continue
    return count


def check_log_dir(path: str) -> None:
    """Fail at start, clearly, where events could not be recorded: unwritable, or a disk (nearly) full."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".kwdiag-write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("x")
        os.unlink(probe)
        free = shutil.disk_usage(path).free
    except OSError as exc:
        raise OSError(f"log directory {path} is not writable ({exc.strerror or exc}); worker deaths could not be "
                      "recorded. Pass log_dir= or set KWDIAG_LOG_DIR to a writable folder.") from None
    if free < MIN_FREE_BYTES:
        raise OSError(f"log directory {path} has only {free // 1024} KiB free (kwdiag needs at least "
                      f"{MIN_FREE_BYTES // 2**20} MiB to record events); free some space or choose another folder.")
