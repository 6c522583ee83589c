"""kwdiag's embedded task runtime: scheduler, nanny and worker processes with a Dask-compatible client.

``from kwdiag.runtime import Client, LocalCluster, KilledWorker`` — then use it as Dask's.
Every process records its lifecycle as JSONL events (``docs/events.md``) in its log directory.
"""

from kwdiag.runtime.client import Client, Future
from kwdiag.runtime.cluster import LocalCluster
from kwdiag.runtime.comm import CommClosedError, Security
from kwdiag.runtime.exceptions import (FutureCancelledError, KilledWorker, ScatteredDataLost, VersionMismatchError,
                                       VersionMismatchWarning)

__all__ = ["Client", "Future", "LocalCluster", "KilledWorker", "ScatteredDataLost", "FutureCancelledError",
           "VersionMismatchError", "VersionMismatchWarning", "CommClosedError", "Security"]
