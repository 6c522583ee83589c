"""kwdiag's embedded task runtime: scheduler, nanny and worker processes with a Dask-compatible client.

``from kwdiag.runtime import Client, LocalCluster, KilledWorker`` — then use it as Dask's: the names here
are Dask's Futures API (``as_completed``, ``wait``, ``fire_and_forget``, ``get_client``, ``secede``, ...;
docs/runtime.md has the table of what is supported and how it differs). Every process records its
lifecycle as JSONL events (``docs/events.md``) in its log directory.
"""

from kwdiag.runtime.client import Client, Future, default_client
from kwdiag.runtime.cluster import LocalCluster
from kwdiag.runtime.comm import CommClosedError, Security
from kwdiag.runtime.exceptions import (CancelledError, FutureCancelledError, KilledWorker, ScatteredDataLost,
                                       VersionMismatchError, VersionMismatchWarning)
from kwdiag.runtime.futures import (ALL_COMPLETED, FIRST_COMPLETED, as_completed, fire_and_forget, futures_of,
                                    wait)
from kwdiag.runtime.worker_context import get_client, get_worker, rejoin, secede, worker_client

__all__ = ["Client", "Future", "LocalCluster", "KilledWorker", "ScatteredDataLost", "FutureCancelledError",
           "CancelledError", "VersionMismatchError", "VersionMismatchWarning", "CommClosedError", "Security",
           "as_completed", "wait", "fire_and_forget", "futures_of", "ALL_COMPLETED", "FIRST_COMPLETED",
           "get_client", "get_worker", "secede", "rejoin", "worker_client", "default_client"]
