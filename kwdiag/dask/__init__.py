"""kwdiag on a real Dask cluster: plugins that record every worker death as kwdiag events.

Install with ``pip install 'kwdiag[dask]'``. Ways to load the plugins (docs/dask.md):

- as a preload module of the scheduler: ``dask scheduler --preload kwdiag.dask`` or the config key
  ``distributed.scheduler.preload`` (``DASK_DISTRIBUTED__SCHEDULER__PRELOAD=kwdiag.dask``): the scheduler
  plugin then has Dask install the nanny and worker plugins everywhere. Workers and nannies can load it
  too (``dask worker --preload kwdiag.dask --preload-nanny kwdiag.dask``, ``distributed.worker.preload``,
  ``distributed.nanny.preload``); ``dask_setup`` below installs the plugin that fits the server;
- from a client, on a cluster that is already running: ``kwdiag.dask.register(client)``;
- ``kwdiag run --dask job.py``, which starts a LocalCluster with them;
- ``with kwdiag.dask.recording(client):`` in a notebook, and ``kwdiag.dask.explain(client)`` for the answer.

Events go to ``$KWDIAG_RUN_DIR``, else the Dask config key ``kwdiag.run-dir``
(``DASK_KWDIAG__RUN_DIR``), else ``./kwdiag-dask``, in the format of docs/events.md, so ``kwdiag
explain``, ``kwdiag check`` and the HTML report read them as they read kwdiag's own runtime.

Does not cover: reading Dask's text logs (``kwdiag explain`` does that). Importing this package
imports ``distributed``; nothing else in kwdiag imports it.
"""

from __future__ import annotations

from typing import Any

from kwdiag.dask.live import LiveReport, explain, recording
from kwdiag.dask.nanny import NannyRecorder
from kwdiag.dask.scheduler import SchedulerRecorder, cluster_info
from kwdiag.dask.worker import WorkerRecorder

__all__ = ["NannyRecorder", "SchedulerRecorder", "WorkerRecorder", "cluster_info", "dask_setup", "register",
           "unregister", "explain", "recording", "LiveReport"]


def dask_setup(server: Any) -> Any:
    """Preload entry point: install the plugin that fits ``server`` (a Scheduler, Nanny or Worker)."""
    from distributed import Nanny, Scheduler, Worker

    if isinstance(server, Scheduler):
        # Preloads run before the scheduler starts its plugins, so start() is called for this one too.
        server.add_plugin(SchedulerRecorder(), name=SchedulerRecorder.name)
        return None
    if isinstance(server, Nanny):
        return server.plugin_add(NannyRecorder(), name=NannyRecorder.name)
    if isinstance(server, Worker):
        return server.plugin_add(WorkerRecorder(), name=WorkerRecorder.name)
    return None


def register(client: Any, run_dir: str | None = None) -> None:
    """Record the cluster ``client`` is connected to: the scheduler plugin, which has Dask install the nanny
    and worker plugins on every nanny and worker, present and future.

    ``run_dir``: where every process writes (an absolute path the cluster's hosts can write; default:
    each process's own ``$KWDIAG_RUN_DIR``/config/``./kwdiag-dask``). Needs Dask 2023.9.2 or later.
    """
    client.register_plugin(SchedulerRecorder(run_dir), name=SchedulerRecorder.name)


def unregister(client: Any) -> None:
    """Remove the plugins ``register`` added (what they wrote stays)."""
    for call in (lambda: client.unregister_worker_plugin(WorkerRecorder.name),
                 lambda: client.unregister_worker_plugin(NannyRecorder.name, nanny=True),
                 lambda: client.unregister_scheduler_plugin(SchedulerRecorder.name)):
        try:
            call()
        except Exception:  # already gone, or a worker that left meanwhile: nothing to undo there
            pass
