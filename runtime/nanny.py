"""The nanny: a separate process that starts its worker, watches it, and records how it died.

Covers: spawning the worker process (a fresh interpreter), relaying and keeping the tail of
its stderr, sampling the memory of its whole process tree (psutil) and terminating it past
``memory_terminate_fraction`` of its limit, noticing its exit at once and recording it as a
``worker-exit`` event with the exit code or signal, the memory samples, the tasks that were
running and whether the nanny itself caused it; restarting it with back-off when deaths come
too fast; and the scheduler's requests to restart, kill or close.

Does not cover: running tasks or talking to the scheduler about them (the worker does), or
unpickling anything (the nanny never needs to).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import sys
import time
from typing import Any

import kwdiag.crashdump as crashdump
from kwdiag.runtime import versions as versions_mod
from kwdiag.runtime.comm import Credentials, Listener, Security
from kwdiag.runtime.core import EXIT_REFUSED, Stream, background, watch_control_pipe
from kwdiag.runtime.record import Recorder
from kwdiag.runtime.spawn import child_env, entry_command
from kwdiag.runtime.config import format_bytes

logger = logging.getLogger("kwdiag.nanny")

SAMPLES_KEPT_SECONDS = 30.0
STDERR_TAIL_LINES = 100  # the last lines the worker wrote to stderr
STDERR_LINE_KEPT = 1000  # characters of each


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class _LineProtocol(asyncio.Protocol):
    """Hands each whole line of a pipe (without its newline) to ``on_line``; at the end, the unterminated rest
    too (a worker cut off mid-line), then resolves ``closed``."""

    def __init__(self, on_line, closed: asyncio.Future):
        self.on_line = on_line
        self.closed = closed
        self.rest = b""

    def data_received(self, data: bytes) -> None:
        *lines, self.rest = (self.rest + data).split(b"\n")
        for line in lines:
            self.on_line(line)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            if self.rest:
                rest, self.rest = self.rest, b""
                self.on_line(rest)
        finally:  # whatever on_line does, the reader learns the pipe is closed
            if not self.closed.done():
                self.closed.set_result(None)


class TreeRss:
    """Resident memory of one worker process and all its descendants (the one psutil seam).

    Listing the descendants scans every process on the host (psutil reads each ``/proc/*/stat``), so it is
    redone once a second, not at every sample: with 32 local workers, 32 nannies each scanning every process
    ten times a second took a large share of a 2-core machine. A child started since the last listing is
    counted from the next one; the worker's own memory is read at every sample."""

    RELIST_SECONDS = 1.0

    def __init__(self, pid: int):
        import psutil

        self.psutil = psutil
        self.pid = pid
        self.proc: Any = None
        self.children: list = []
        self.listed_at = -1e9

    def __call__(self) -> int | None:
        """The total in bytes; None once the worker is gone."""
        psutil = self.psutil
        try:
            if self.proc is None:
                self.proc = psutil.Process(self.pid)
            total = self.proc.memory_info().rss
            now = time.monotonic()
            if now - self.listed_at >= self.RELIST_SECONDS:
                self.children = self.proc.children(recursive=True)
                self.listed_at = now
        except psutil.Error:
            return None
        for child in self.children:
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass
        return total


class Nanny:
    def __init__(self, *, name: str, scheduler_address: str, secret: bytes, config: dict, nthreads: int = 1,
                 memory_limit: int | None = None, log_dir: str | None = None, host: str = "127.0.0.1",
                 lifetime: float | None = None, preload: list[str] = (), worker_env: dict | None = None,
                 security: Security | None = None, scheduler_file: str | None = None):
        self.name = name
        # Given to each worker it starts, so that a worker started after the scheduler moved finds it.
        self.scheduler_file = scheduler_file
        self.security = security
        self.credentials = Credentials(secret, security)
        self.scheduler_address = scheduler_address
        self.secret = secret
        self.config = config
        self.nthreads = nthreads
        self.memory_limit = memory_limit
        self.log_dir = log_dir
        self.host = host
        self.lifetime = lifetime
        self.preload = list(preload)
        self.worker_env = worker_env or {}
        self.fraction = float(config["memory_terminate_fraction"])
        self.rec = Recorder("kwdiag.nanny", source="nanny", log_dir=log_dir, file_stem=f"nanny-{name}", worker=name)
        self.address = ""
        self.proc: asyncio.subprocess.Process | None = None
        self.incarnation = 0
        self.worker_address: str | None = None
        self.running: set[str] = set()
        self.leaving_reason: str | None = None   # the worker said it is leaving on purpose
        self.caused_by: str | None = None        # what the nanny did to end the current worker
        self.sent_signals: set[int] = set()      # signals the nanny sent the current worker
        self.samples: collections.deque = collections.deque()
        self.stderr_tail: collections.deque = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.crash_dump: list[str] = []   # the last faulthandler dump, whole (the tail may have cut it)
        self._dump_open = False
        self.started_at = 0.0
        self.deaths: collections.deque = collections.deque()
        self.closing: str | None = None
        self._exited: asyncio.Event | None = None
        self._done = asyncio.Event()
        self._io_tasks: list[asyncio.Task] = []
        self._respawn: asyncio.Task | None = None
        self.handlers = {"restart": self.handle_restart, "kill": self.handle_kill, "close": self.handle_close}

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        self._listener = Listener(self.credentials, self._on_comm, self.rec.refused)
        self.address = await self._listener.start(self.host, 0)
        self.rec.event("nanny-start", f"        Start Nanny at: {self.address!r}", address=self.address,
                       memory_limit=self.memory_limit, terminate_fraction=self.fraction, pid=os.getpid(),
                       versions=versions_mod.collect(self.config["versions_packages"]))
        await self.spawn()
        background(self._monitor_memory())

    async def _on_comm(self, comm) -> None:
        await Stream(comm, self.handlers, on_bad_frame=self.rec.bad_frame).run()

    async def spawn(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            return  # one worker per nanny, whatever raced to start another
        self.incarnation += 1
        self.running.clear()
        self.leaving_reason = None
        self.caused_by = None
        self.sent_signals = set()
        self.worker_address = None
        self.samples.clear()
        self.stderr_tail.clear()
        self.crash_dump, self._dump_open = [], False
        status_r, status_w = os.pipe()
        control_r, control_w = os.pipe()
        where = ["--scheduler", self.scheduler_address]  # the file, when there is one, says where it is now
        if self.scheduler_file:
            where += ["--scheduler-file", self.scheduler_file]
        cmd = entry_command(
            "worker-process", *where, "--name", self.name,
            "--nthreads", str(self.nthreads), "--host", self.host, "--nanny-address", self.address,
            "--incarnation", str(self.incarnation), "--status-fd", str(status_w), "--control-fd", str(control_r))
        if self.memory_limit:
            cmd += ["--memory-limit", str(self.memory_limit)]
        if self.log_dir:
            cmd += ["--log-dir", self.log_dir]
        if self.lifetime:
            cmd += ["--lifetime", str(self.lifetime)]
        for module in self.preload:
            cmd += ["--preload", module]
        if self.security:
            cmd += self.security.args()
        env = child_env({**self.worker_env, "KWDIAG_SECRET": self.secret.hex()})
        self.proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            pass_fds=(status_w, control_r), env=env)
        os.close(status_w)
        os.close(control_r)
        self._control = os.fdopen(control_w, "wb", buffering=0)
        self.started_at = time.monotonic()  # for the uptime: a wall-clock jump must not distort it
        self._exited = asyncio.Event()
        self.rec.event("worker-spawn", f"Started worker process {self.proc.pid} (incarnation {self.incarnation})",
                       pid=self.proc.pid, incarnation=self.incarnation)
        proc = self.proc
        self._io_tasks = [background(self._relay_stderr(proc)),
                          background(self._read_status(status_r))]
        background(self._wait_exit(proc))

    async def _relay_stderr(self, proc: asyncio.subprocess.Process) -> None:
        """Pass the worker's stderr through, keeping its last lines and its faulthandler dump. Read in chunks:
        ``readline`` raised on a line over 64 KiB, which ended this relay, and the worker then blocked on a full
        pipe at its next write."""
        out = sys.stderr.buffer
        rest = b""
        while True:
            data = await proc.stderr.read(1 << 16)
            if not data:
                if rest:
                    self._keep_stderr_line(rest)
                return
            out.write(data)
            out.flush()
            *lines, rest = (rest + data).split(b"\n")
            rest = rest[:STDERR_LINE_KEPT]   # an endless line: its start is enough
            for line in lines:
                self._keep_stderr_line(line)

    def _keep_stderr_line(self, line: bytes) -> None:
        text = line[:STDERR_LINE_KEPT].decode("utf-8", "replace").rstrip("\r")
        self.stderr_tail.append(text)
        if crashdump.is_fatal(text):
            self.crash_dump, self._dump_open = [text], True
        elif self._dump_open:
            if crashdump.is_dump_line(text) and len(self.crash_dump) < crashdump.MAX_LINES:
                self.crash_dump.append(text)
            else:
                self._dump_open = False   # the first line that is not the dump's ends it (a forked child's dump)

    async def _read_status(self, fd: int) -> None:
        """Read the worker's status lines until it closes its end. Chunks, not lines: a busy worker writes two
        lines a task, and a coroutine woken per line cost the nanny ~45 us of CPU a task (as much as the
        scheduler); a protocol takes whatever the pipe holds and applies every whole line in it."""
        loop = asyncio.get_running_loop()
        closed = loop.create_future()
        pipe = os.fdopen(fd, "rb", buffering=0)
        transport, _ = await loop.connect_read_pipe(lambda: _LineProtocol(self._on_status_line, closed), pipe)
        try:
            await closed
        finally:
            transport.close()

    def _on_status_line(self, line: bytes) -> None:
        kind, _, arg = line.decode("utf-8", "replace").partition(" ")
        if kind == "S":
            self.running.add(arg)
        elif kind == "F":
            self.running.discard(arg)
        elif kind == "R":
            self.running = set(filter(None, arg.split("\t")))
        elif kind == "C":
            self.leaving_reason = arg
        elif kind == "A":
            self.worker_address = arg

    async def _wait_exit(self, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        # Read what the worker said last before judging its exit.
        await asyncio.wait(self._io_tasks, timeout=1.0)
        try:
            self._control.close()
        except OSError:
            pass
        signum = -code if code < 0 else None
        leaving = self.leaving_reason
        # The nanny caused this exit only if the outcome is what it did: a signal it sent, or a clean exit
        # after it asked. A SIGSEGV that lands while the nanny is asking the worker to close is not its doing.
        nanny_was = self.caused_by
        if self.caused_by is not None and code != 0 and signum not in self.sent_signals:
            self.caused_by = None
        will_restart = self._should_restart(code, leaving)
        samples = [[round(t, 3), rss] for t, _, rss in self.samples]
        if signum:
            text = f"Worker process {proc.pid} was killed by signal {signum} ({signal_name(signum)})"
        else:
            text = f"Worker process {proc.pid} exited with status {code}"
        level = "info" if (code == 0 or self.caused_by in ("shutdown", "signal", "restart")) else "warning"
        self.rec.event("worker-exit", text, level=level, pid=proc.pid, incarnation=self.incarnation,
                       exitcode=code, signal=signum, signal_name=signal_name(signum) if signum else None,
                       caused_by=self.caused_by, nanny_was=nanny_was, leaving_reason=leaving,
                       nanny_close_reason=self.closing,
                       address=self.worker_address,
                       memory_limit=self.memory_limit, terminate_fraction=self.fraction,
                       peak_rss=max((s[1] for s in samples), default=None), memory_samples=samples,
                       running_tasks=sorted(self.running),
                       stderr_tail=crashdump.fit(self.stderr_tail, crashdump.TAIL_BYTES, keep_end=True),
                       **({"crash_dump": crashdump.fit(self.crash_dump, crashdump.DUMP_BYTES)} if self.crash_dump else {}),
                       uptime=round(time.monotonic() - self.started_at, 3), will_restart=will_restart)
        self._exited.set()
        if not will_restart:
            if not self.closing:
                why = {EXIT_REFUSED: "the scheduler refused the worker"}.get(code, f"the worker left ({leaving})")
                await self.close(f"nanny-close-gracefully: {why}", worker_already_gone=True)
            return
        if self.caused_by == "restart":
            return  # handle_restart spawns the next one itself
        logger.warning("Restarting worker (incarnation %d ended)", self.incarnation)
        self._respawn = background(self._respawn_after_backoff())

    async def _respawn_after_backoff(self) -> None:
        await self._backoff()
        if not self.closing:
            await self.spawn()

    def _cancel_respawn(self) -> None:
        """A restart or close supersedes a respawn that is waiting out its back-off."""
        if self._respawn is not None and not self._respawn.done():
            self._respawn.cancel()
        self._respawn = None

    def _should_restart(self, code: int, leaving: str | None) -> bool:
        if self.closing or code == EXIT_REFUSED:
            return False
        if self.caused_by in ("memory", "restart", "heartbeat-timeout", "kill"):
            return True
        if leaving and code == 0:
            return False  # it chose to exit: retirement, lifetime, a lost scheduler
        return True

    async def _backoff(self) -> None:
        now = time.monotonic()
        window = float(self.config["restart_backoff_window"])
        self.deaths.append(now)
        while self.deaths and now - self.deaths[0] > window:
            self.deaths.popleft()
        excess = len(self.deaths) - int(self.config["restart_backoff_after"])
        if excess < 0:
            return
        delay = min(float(self.config["restart_backoff_max"]), 0.5 * 2 ** excess)
        self.rec.event("restart-backoff", f"Worker died {len(self.deaths)} times in {window:.0f}s; waiting "
                       f"{delay:.1f}s before restarting it", level="warning", delay=delay,
                       recent_deaths=len(self.deaths))
        await asyncio.sleep(delay)

    # ---------------------------------------------------------------- memory
    async def _monitor_memory(self) -> None:
        interval = float(self.config["memory_monitor_interval"])
        measure: TreeRss | None = None
        while not self.closing:
            proc = self.proc
            if proc is not None and proc.returncode is None:
                if measure is None or measure.pid != proc.pid:   # a new incarnation: a new process to follow
                    measure = TreeRss(proc.pid)
                rss = measure()
                if rss is not None:
                    # Stamped with the wall clock (for people and charts), kept by the monotonic one: a clock
                    # set back must not keep samples forever, nor one set forward drop them all.
                    mono = time.monotonic()
                    self.samples.append((time.time(), mono, rss))
                    while self.samples and mono - self.samples[0][1] > SAMPLES_KEPT_SECONDS:
                        self.samples.popleft()
                    if (self.memory_limit and rss > self.fraction * self.memory_limit
                            and self.caused_by is None):
                        await self._terminate_for_memory(proc, rss)
            await asyncio.sleep(interval)

    async def _terminate_for_memory(self, proc: asyncio.subprocess.Process, rss: int) -> None:
        self.caused_by = "memory"
        self.rec.event("nanny-memory-terminate",
                       f"Worker {self.worker_address} (pid={proc.pid}) exceeded {self.fraction * 100:.0f}% memory "
                       f"budget ({format_bytes(rss)} of {format_bytes(self.memory_limit)}). Restarting...",
                       level="warning", pid=proc.pid, rss=rss, memory_limit=self.memory_limit,
                       terminate_fraction=self.fraction, running_tasks=sorted(self.running),
                       samples=[[round(t, 3), r] for t, _, r in list(self.samples)[-50:]])
        try:
            self.sent_signals.add(signal.SIGTERM)
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._exited.wait()), self.config["memory_kill_grace"])
        except asyncio.TimeoutError:
            logger.warning("Worker %s (pid=%d) is slow to accept SIGTERM; sending SIGKILL", self.worker_address,
                           proc.pid)
            try:
                self.sent_signals.add(signal.SIGKILL)
                proc.kill()
            except ProcessLookupError:
                pass

    # ---------------------------------------------------------------- requests and shutdown
    async def _kill_worker(self, caused_by: str, graceful: bool, reason: str) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is not None:
            # It died on its own just before: let its exit be recorded before whatever comes next (a close
            # that shuts the recorder, a restart that spawns the next one), or the death would be lost.
            try:
                await asyncio.wait_for(asyncio.shield(self._exited.wait()), 5.0)
            except asyncio.TimeoutError:
                pass
            return
        self.caused_by = caused_by
        if graceful:
            logger.info("Nanny asking worker to close. Reason: %s", reason)
            try:
                self._control.write(f"close {reason}\n".encode())
            except (OSError, ValueError):
                pass
            try:
                await asyncio.wait_for(asyncio.shield(self._exited.wait()), self.config["close_timeout"])
                return
            except asyncio.TimeoutError:
                logger.warning("Worker process still alive after %.1f seconds, killing",
                               self.config["close_timeout"])
        try:
            self.sent_signals.add(signal.SIGKILL)
            proc.kill()
        except ProcessLookupError:
            pass
        await self._exited.wait()

    async def handle_restart(self, stream: Stream, msg: dict) -> dict:
        reason = msg.get("reason") or "restart"
        logger.info("Nanny asked to restart its worker. Reason: %s", reason)
        self._cancel_respawn()
        await self._kill_worker("restart", graceful=False, reason=reason)
        self._cancel_respawn()  # a worker that died on its own just before has a respawn queued: this one replaces it
        if not self.closing:
            await self.spawn()
        return {"status": "ok", "pid": self.proc.pid if self.proc else None}

    async def handle_kill(self, stream: Stream, msg: dict) -> dict:
        reason = msg.get("reason") or "kill"
        logger.info("Nanny asked to kill its worker. Reason: %s", reason)
        await self._kill_worker(reason if reason == "heartbeat-timeout" else "kill", graceful=False, reason=reason)
        return {"status": "ok"}

    async def handle_close(self, stream: Stream, msg: dict) -> dict:
        asyncio.get_running_loop().call_soon(lambda: background(self.close(msg.get("reason") or "close")))
        return {"status": "ok"}

    async def close(self, reason: str, worker_already_gone: bool = False) -> None:
        if self.closing:
            return
        self.closing = reason
        self._cancel_respawn()
        logger.info("Closing Nanny at %r. Reason: %s", self.address, reason)
        if not worker_already_gone:
            # "shutdown" when the cluster closes; "signal" when someone signalled this nanny alone.
            caused_by = "signal" if reason.startswith("signal-") else "shutdown"
            await self._kill_worker(caused_by, graceful=True, reason=reason)
        self.rec.event("nanny-close", f"Nanny at {self.address!r} closed.", reason=reason)
        self.rec.close()
        self._listener.stop()
        self._done.set()


async def run_nanny(*, control_stdin: bool = False, **kwargs: Any) -> None:
    nanny = Nanny(**kwargs)
    loop = asyncio.get_running_loop()

    def on_signal(sig: int) -> None:
        logger.info("Received signal %s (%d)", signal_name(sig), sig)
        if nanny.closing:
            os._exit(128 + sig)
        background(nanny.close(f"signal-{sig}"))

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    if control_stdin:  # started by a LocalCluster: it closes us through stdin, and EOF means it is gone
        def on_command(command: str, argument: str) -> None:
            if command == "close":
                background(nanny.close(argument or "cluster-close"))
        background(watch_control_pipe(0, on_command, lambda: background(nanny.close("parent-died"))))
    await nanny.start()
    await nanny._done.wait()
