"""kwdiag where Dask users already are: a live cluster, a notebook, the ``KilledWorker`` traceback.

Covers: ``explain(client)`` — fetch what the cluster remembers (``kwdiag.dask.collect``) into a folder, explain
it, and return a ``LiveReport`` whose ``str()`` is the terminal report and whose ``_repr_html_`` shows the
HTML report inline in a notebook (in a frame of its own, so a dark notebook theme leaves it readable);
``recording(client)`` — install kwdiag's scheduler, nanny and worker plugins on a running cluster (no worker
is restarted), remove them on exit, and give a ``KilledWorker`` raised inside the block kwdiag's verdict
on the deaths counted against its task as an exception note (PEP 678), so the traceback the user already
sees says why; ``connect`` — a client for ``kwdiag explain --dask-scheduler``, with one clear error when the
scheduler does not answer or needs TLS credentials.

Does not cover: what the plugins record (``scheduler``, ``nanny``, ``worker`` modules) or how deaths are
decided (``kwdiag.pipeline``). Without the plugins, a report says only what Dask's in-memory logs allow.
"""

from __future__ import annotations

import contextlib
import html
import os
import tempfile
import time
from typing import Any, Iterator

from kwdiag.dask.collect import collect

PLUGIN_WAIT = 30.0   # seconds to wait for the nanny and worker plugins to be installed everywhere


class LiveReport:
    """What ``explain(client)`` returns: the analysis ``report``, the ``folder`` it was read from (kept, so the
    postmortem can be repeated: ``kwdiag explain FOLDER``), and what was collected (``collected``)."""

    def __init__(self, report: Any, folder: str, collected: dict):
        self.report = report
        self.folder = folder
        self.collected = collected

    @property
    def deaths(self) -> tuple:
        return self.report.deaths

    @property
    def recorded(self) -> bool:
        """Whether kwdiag's plugins ran on the cluster (exit codes, signals, executing tasks, memory samples)."""
        return bool(self.collected.get("kwdiag_plugins"))

    def _without_plugins(self) -> str | None:
        if self.recorded or not any(d.cause == "unknown" for d in self.report.deaths):
            return None
        return ("Dask's in-memory logs do not say why some workers died. Run the work inside "
                "`with kwdiag.dask.recording(client):` and kwdiag's plugins record each death's exit code or "
                "signal, executing task and memory.")

    def __str__(self) -> str:
        from kwdiag.report.terminal import render_plain

        text = render_plain(self.report)
        extra = self._without_plugins()
        return text + (f"\n{extra}\n" if extra else "") + f"Collected into {self.folder}\n"

    def __repr__(self) -> str:
        failures = sum(1 for d in self.report.deaths if d.failure)
        return f"<kwdiag LiveReport: {len(self.report.deaths)} deaths ({failures} need attention), {self.folder}>"

    def _repr_html_(self) -> str:
        from kwdiag.report.html import render_html

        page = render_html(self.report, title="kwdiag: why did my workers die?")
        extra = self._without_plugins()
        if extra:
            page = page.replace('<h2>', f'<p class="fix">{html.escape(extra)}</p><h2>', 1)
        # A frame of its own: the page's light styles stay whole whatever the notebook's theme, and the
        # notebook's styles cannot reach into it. srcdoc needs the page escaped as an attribute value.
        return (f'<iframe title="kwdiag report" srcdoc="{html.escape(page, quote=True)}" '
                'style="width:100%;height:720px;border:1px solid #ced4da;border-radius:6px;background:#fff" '
                'sandbox></iframe>')


def explain(client: Any, folder: str | None = None) -> LiveReport:
    """Explain the deaths a live Dask cluster remembers: its scheduler's, workers' and nannies' logs, its
    events and (where they run) the kwdiag plugins' records, saved into ``folder`` (default: a new folder
    ``kwdiag-dask-YYYYmmdd-HHMMSS`` here)."""
    from kwdiag.pipeline import analyze

    folder = folder or _new_folder()
    _settle(client)
    collected = collect(client, folder)
    report = analyze([os.path.join(folder, name) for name in collected["files"] if name != "dask-events.json"])
    return LiveReport(report, folder, collected)


SETTLE_WAIT = 15.0   # seconds to wait for workers a nanny is restarting (their nanny's log comes with them)


def _settle(client: Any) -> None:
    """Wait (a little) for the workers that nannies are restarting: right after a ``KilledWorker`` the
    cluster's workers are coming back, and Dask asks only registered workers' nannies for their logs."""
    cluster = getattr(client, "cluster", None)
    expected = len(getattr(cluster, "workers", {}) or {}) if cluster is not None else 0
    deadline, last, since = time.monotonic() + SETTLE_WAIT, -1, time.monotonic()
    while time.monotonic() < deadline:
        try:
            n = len(client.scheduler_info().get("workers", {}))
        except Exception:
            return
        if expected and n >= expected:
            return
        if n != last:
            last, since = n, time.monotonic()
        elif not expected and time.monotonic() - since > 1.0:
            return   # unchanged for a second: nothing more is coming back
        time.sleep(0.1)


def _new_folder() -> str:
    base = f"kwdiag-dask-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        os.makedirs(base)
        return os.path.abspath(base)
    except FileExistsError:
        return tempfile.mkdtemp(prefix=base + "-", dir=".")
    except OSError:   # a read-only working directory (some notebook servers)
        return tempfile.mkdtemp(prefix="kwdiag-dask-")


@contextlib.contextmanager
def recording(client: Any, run_dir: str | None = None) -> Iterator[None]:
    """Record every worker death of the cluster ``client`` is connected to while the block runs, as
    ``performance_report`` is used; a ``KilledWorker`` raised in the block gets kwdiag's verdict as a note."""
    from distributed import KilledWorker

    from kwdiag.dask import register, unregister

    register(client, run_dir)
    _wait_for_plugins(client)
    try:
        yield
    except KilledWorker as exc:
        note = _note_for(client, exc)
        if note:
            exc.add_note(note)
        raise
    finally:
        with contextlib.suppress(Exception):
            unregister(client)


def _wait_for_plugins(client: Any) -> None:
    """Until every nanny and worker runs its kwdiag plugin (the scheduler plugin installs them)."""
    from kwdiag.dask import NannyRecorder, WorkerRecorder

    def installed(dask_worker: Any, name: str) -> bool:
        return name in getattr(dask_worker, "plugins", {})

    deadline = time.monotonic() + PLUGIN_WAIT
    while time.monotonic() < deadline:
        try:
            workers = client.run(installed, name=WorkerRecorder.name, on_error="ignore")
            nannies = client.run(installed, name=NannyRecorder.name, nanny=True, on_error="ignore")
        except Exception:
            return   # a cluster that cannot be asked: the plugins arrive when they arrive
        if all(workers.values()) and all(v for v in nannies.values() if isinstance(v, bool)):
            return
        time.sleep(0.1)


def _note_for(client: Any, exc: Any) -> str | None:
    from kwdiag.report.note import killed_worker_note

    task = getattr(exc, "task", None) or (exc.args[0] if exc.args else None)
    if task is None:
        return None
    try:
        live = explain(client)
    except Exception as problem:   # the note is a help: never let it hide the KilledWorker itself
        return f"kwdiag could not explain the deaths: {type(problem).__name__}: {problem}"
    return killed_worker_note(live.report, str(task), where=live.folder)


def connect(address: str | None = None, scheduler_file: str | None = None, *, tls_ca_file: str | None = None,
            tls_cert: str | None = None, tls_key: str | None = None, timeout: str = "10s") -> Any:
    """A client of the Dask scheduler at ``address`` (or in ``scheduler_file``), for ``kwdiag explain``; a
    ``KwdiagError`` (exit 3) saying why when it cannot connect."""
    from kwdiag.errors import RUNTIME, USAGE, KwdiagError

    try:
        from distributed import Client
        from distributed.security import Security
    except ImportError:
        raise KwdiagError("--dask-scheduler needs Dask: pip install 'kwdiag[dask]'", USAGE) from None
    security = None
    if tls_ca_file or tls_cert or tls_key:
        security = Security(tls_ca_file=tls_ca_file, tls_client_cert=tls_cert, tls_client_key=tls_key,
                            require_encryption=True)
    elif address and address.startswith("tls://"):
        raise KwdiagError(f"the Dask scheduler at {address} speaks TLS: give --tls-ca-file, --tls-cert and "
                          "--tls-key", RUNTIME)
    target = address if address else None
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # a version warning about this client is not the user's question
            return Client(target, scheduler_file=scheduler_file, security=security, timeout=timeout,
                          set_as_default=False, name="kwdiag-explain")
    except Exception as exc:
        where = address or f"the scheduler file {scheduler_file}"
        raise KwdiagError(f"cannot reach the Dask scheduler at {where}: {type(exc).__name__}: {exc}", RUNTIME) \
            from None
