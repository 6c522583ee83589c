"""Close reasons: the words a worker, its nanny or the scheduler give for an end, in the groups verdicts rest on.

One list each, read by the rules (a field condition ``reason = "@cluster-close"`` names a group here; see
docs/rules.md) and by the fact layer (``kwdiag.analysis.facts``), so a rule and a fact cannot disagree on
what a reason means. kwdiag's runtime writes the same words (docs/events.md); Dask's are its close reasons
and stimulus prefixes, as its log lines give them.

Does not cover: the verdict a reason leads to (the rules) or when an end counts as part of a close (the
fact layer's windows).
"""

from __future__ import annotations

# The whole cluster is going away: alone enough to call an end part of the close.
CLUSTER_CLOSE = frozenset({"scheduler-close", "cluster-close", "parent-died"})
# The nanny went and took its worker with it (Dask's "nanny-close", kwdiag's exit record "shutdown"): part of
# the cluster's close only when the worker's end was orderly, since a nanny also closes after its worker crashed.
NANNY_WENT = frozenset({"nanny-close", "shutdown"})
# The worker lost its scheduler and closed: something failed under it; it did not choose to go.
SCHEDULER_LOST = frozenset({"scheduler-lost", "worker-handle-scheduler-connection-broken"})
# The process failed to start (Dask's nanny); Dask also says "failure-to-start-<exception>".
START_FAILED = frozenset({"nanny-start-failed", "nanny-instantiate-failed"})
START_FAILED_PREFIX = "failure-to-start"
# Said by a close nobody chose: the generic reason of a bare Worker.close(), a nanny's graceful close
# following its worker out.
UNCHOSEN = frozenset({"worker-close", "nanny-close-gracefully"})
# How a scheduler's removal says the worker left for a reason of its own (recorded first-hand: kwdiag's
# scheduler, or kwdiag's plugin on Dask's).
OWN_REMOVALS = frozenset({"retired", "lifetime"})

# The groups a rule can name with "@name".
NAMED: dict[str, frozenset[str]] = {
    "cluster-close": CLUSTER_CLOSE,
    "nanny-went": NANNY_WENT,
    "scheduler-lost": SCHEDULER_LOST,
    "start-failed": START_FAILED,
    "own-removals": OWN_REMOVALS,
}


def chosen(reason: object) -> bool:
    """A close reason that says the worker chose to go (not that something failed under it, nor a close
    nobody chose)."""
    return isinstance(reason, str) and reason not in SCHEDULER_LOST | START_FAILED | UNCHOSEN \
        and not reason.startswith(START_FAILED_PREFIX)
