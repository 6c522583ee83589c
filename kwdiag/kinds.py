"""Event kinds: every ``kind`` kwdiag reads or writes, what it means, and the groups the stages test against.

Covers: ``KINDS``, one entry per kebab-case kind with a one-line meaning, whoever emits it: kwdiag's
runtime and the kwdiag.dask plugins (JSONL, docs/events.md), the rules that turn Dask's, Python's and the
environment's text lines into events (``[event] kind`` in ``rules/``), and the fact layer
(``kwdiag.analysis.facts``, ``fact-*``); and the named groups (frozensets) that the readers, the timeline,
the classifier and the runner test a kind against, each built only from registered kinds (``_group``
raises at import on an unknown one), so a typo is an import error instead of a silently empty test.
tests/test_kinds.py keeps this in step with the emitters and with docs/events.md.

Does not cover: an event's fields (docs/events.md), what a kind means for a verdict (the rules), the
timeline's slot of each end kind (``kwdiag.timeline.model.SLOT_OF_KIND``, checked against ``END``
here), or close reasons (``kwdiag.reasons``). Standard library only: any stage may import it.
"""

from __future__ import annotations

from typing import Mapping, TypeVar

KINDS: dict[str, str] = {
    # ---- any kwdiag process (runtime)
    "process-start": "a kwdiag process started (its role, package versions, config)",
    "auth-refused": "a peer failed the shared-secret handshake; nothing it sent was unpickled",
    "bad-frame": "a peer sent a malformed or oversized frame; that connection was closed",
    "events-lost": "events could not be written to this file (disk full, file deleted); they went to stderr only",
    # ---- the scheduler (runtime, kwdiag.dask's scheduler plugin; Dask's text through rules)
    "scheduler-start": "the scheduler started",
    "scheduler-close": "the scheduler is closing (its reason, when known)",
    "worker-registered": "the scheduler registered a worker process",
    "worker-removed": "the scheduler removed a worker (how, whether it expected to, what was lost)",
    "heartbeat-missed": "the scheduler heard no heartbeat from a worker within its TTL",
    "killed-worker": "a task was given up on after it was running on too many dying workers (KilledWorker)",
    "scattered-lost": "scattered data was lost with its last holder",
    "task-erred": "a task raised an exception: not a worker death",
    "versions-mismatch": "package versions differ between the scheduler and a worker or client",
    "restart": "the client asked every worker to restart",
    "retire-request": "the scheduler was asked to retire workers (Dask's text)",
    "close-request": "the scheduler closed or restarted workers on request (Dask's text)",
    "comm-close-stream": "a peer said goodbye on its connection to the scheduler (Dask's text)",
    "comm-closed": "a connection to the scheduler closed without a goodbye (Dask's text)",
    "journal-replayed": "this scheduler replayed its predecessor's unclosed journal",
    "scheduler-recovered": "this scheduler took over the work of a predecessor that ended without closing",
    "journal-set-aside": "a journal of another cluster, or one that could not be read, was moved aside",
    "journal-error": "appending to the journal failed; the scheduler goes on",
    "journal-restored": "a complete journal was written again after a journal-error",
    # ---- the nanny (runtime, kwdiag.dask's nanny plugin; Dask's text through rules)
    "nanny-start": "a nanny started",
    "nanny-close": "a nanny closed",
    "worker-spawn": "the nanny started a worker process (kwdiag's runtime only)",
    "worker-exit": "a worker process exited: its status or signal (kwdiag: the whole exit record)",
    "nanny-memory-terminate": "the nanny is terminating its worker for memory",
    "nanny-memory-escalate": "the worker did not stop on SIGTERM after a memory kill, so the nanny killed it (Dask's text)",
    "nanny-closing": "the nanny is asking its worker to close (Dask's text)",
    "nanny-kill-after-close": "the nanny killed a worker that did not finish closing in time (Dask's text)",
    "nanny-unregister": "the nanny unregisters its worker after an exit it did not ask for (Dask's text)",
    "nanny-start-timeout": "the nanny killed a worker process that did not start in time (Dask's text)",
    "worker-restarting": "the nanny is restarting its worker (Dask's text)",
    "worker-reaped": "a worker process was terminated as the process that started it exited (Dask's text)",
    "restart-backoff": "deaths came too fast; the nanny waits before the next start",
    # ---- the worker (runtime, kwdiag.dask's worker plugin; Dask's and Python's text through rules)
    "worker-start": "a worker process (incarnation) started",
    "worker-name": "the worker's name, as its start-up lines give it (Dask's text)",
    "worker-info": "a start-up detail of the worker, such as its memory limit (Dask's text)",
    "worker-waiting": "the worker is waiting for the scheduler (Dask's text)",
    "worker-connected": "the worker says it registered with the scheduler (Dask's text)",
    "worker-closing": "the worker is closing (its reason, when stated)",
    "worker-closed": "the worker's close finished (Dask's text)",
    "worker-end": "the last line of a worker that ended on purpose (Dask's \"End worker\")",
    "worker-fatal": "an unrecoverable exception in the worker process itself (not in a task)",
    "worker-startup-failed": "the worker process failed to start (Dask's text)",
    "worker-refused": "the scheduler refused a worker's registration: another worker holds its name (Dask's text)",
    "signal-received": "the dask command received a signal (Dask's text)",
    "memory-pressure": "the worker paused at high memory (Dask's text)",
    "scheduler-lost": "the connection to the scheduler broke (worker or client)",
    "reconnected": "the connection to the scheduler came back (worker or client)",
    "tasks-executing": "the tasks running in the worker's threads now (kwdiag.dask's worker plugin)",
    "exception": "a Python exception in a worker's text log (traceback or error line)",
    "fatal-signal": "a faulthandler dump or a shell's, the C library's or the kernel's report of a crash (segfault, abort, kill)",
    "peer-protocol-mismatch": "a peer sent a message this Dask version cannot take (Dask's text)",
    # ---- the client (runtime)
    "client-start": "a client connected to the scheduler",
    # ---- the environment (kernel, Kubernetes, SLURM, YARN text through rules)
    "kernel-oom-kill": "the kernel's OOM killer killed a process",
    "k8s-status": "Kubernetes reports a container's end (OOMKilled, evicted, an exit code)",
    "slurm-oom": "SLURM detected an OOM kill in the job step",
    "slurm-time-limit": "SLURM cancelled the job at its time limit",
    "slurm-cancel": "SLURM cancelled the job for another reason (scancel, preemption, a node failure)",
    "yarn-kill": "YARN killed a container for exceeding its memory",
    # ---- the fact layer (kwdiag.analysis.facts: derived, never in a log)
    "fact-cluster-closed": "the whole cluster was being closed and this worker ended in an orderly way",
    "fact-close-requested": "the scheduler asked this worker to go (retire, close, restart)",
    "fact-vanished": "the scheduler lost the worker and nothing says it left on purpose or crashed",
    "fact-never-registered": "the process failed while starting, before it registered",
    "fact-died-of-exception": "a registered worker's process died of an exception of its own",
    "fact-gave-up-waiting": "it waited for the scheduler, never registered, and closed in an orderly way",
    "fact-silent-exit": "the process ended itself with a non-zero status and no traceback",
    "fact-restarted": "the nanny restarted it after an exit it did not ask for, and nothing says why",
    "fact-no-evidence": "nothing at all says why it ended",
    "fact-counted-death": "the scheduler counted a death against a task it gave up on that no line of the input shows",
}


def _group(*kinds: str) -> frozenset[str]:
    """A named group of registered kinds; an unregistered one (a typo) fails at import."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"kwdiag.kinds: unregistered event kind(s) {', '.join(map(repr, unknown))}")
    return frozenset(kinds)


_V = TypeVar("_V")


def keyed(group: frozenset[str], table: Mapping[str, _V]) -> dict[str, _V]:
    """``table`` as a dict, checked to have exactly ``group``'s kinds as keys (a table per kind that a
    stage keeps, such as the timeline's slot of each end kind)."""
    missing, extra = group - set(table), set(table) - group
    if missing or extra:
        raise ValueError(f"kwdiag.kinds: table keys differ from the group: missing {sorted(missing)}, "
                         f"extra {sorted(extra)}")
    return dict(table)


# ---------------------------------------------------------------- a process's start
# A process began: the timeline's start time of an incarnation (its earliest such line).
START = _group("worker-start", "worker-spawn", "worker-registered")
# The worker is known to have registered with the scheduler (the scheduler's line or the worker's own).
REGISTERED = _group("worker-registered", "worker-connected")
# Start and registration lines together: the classifier keeps them with a death whenever they came.
# Wider than START on purpose: "worker-connected" (the worker's "Registered to") shows the process was
# up, but it is written after the start, so it does not date the start.
START_LIKE = START | REGISTERED

# ---------------------------------------------------------------- a process's end
# Evidence that a process ended or is being ended. The timeline keeps the slot each fills
# (``kwdiag.timeline.model.SLOT_OF_KIND``, built with ``keyed(END, ...)``): slots are the timeline's
# vocabulary (which repeat, which stand alone, which follow an exit), so the mapping stays with the rules
# about slots; the membership lives here, with every other group.
END = _group("worker-exit", "nanny-memory-terminate", "nanny-memory-escalate", "worker-restarting",
             "nanny-unregister", "worker-removed", "heartbeat-missed", "worker-closing", "nanny-closing",
             "worker-closed", "worker-end", "worker-fatal", "worker-startup-failed", "nanny-kill-after-close",
             "fatal-signal", "worker-reaped", "nanny-start-timeout", "worker-refused",
             # the environment's word on a process
             "kernel-oom-kill", "k8s-status", "slurm-oom", "slurm-time-limit", "slurm-cancel",
             "yarn-kill")
# A worker died, for `kwdiag run`'s live view: the lines that make it look for news at once.
DEATH = _group("worker-exit", "worker-removed", "worker-fatal")
# Lifecycle lines the classifier keeps with a death whenever they came (not only near its end), and
# shows even when no rule reads them.
LIFECYCLE = _group("worker-exit", "worker-removed", "worker-closing", "worker-end", "worker-closed",
                   "worker-fatal", "heartbeat-missed", "nanny-memory-terminate", "nanny-closing",
                   "signal-received", "versions-mismatch", "worker-restarting", "nanny-unregister",
                   "worker-startup-failed", "nanny-kill-after-close", "fatal-signal", "worker-refused")
# Lines the classifier shows as context, never as evidence.
QUIET = _group("worker-registered", "worker-name", "worker-info", "worker-start", "worker-spawn", "worker-waiting",
               "worker-connected")
# A file's lines that name no process but tell of an end (a signal to the process several workers share,
# "End worker"): the classifier joins them to a death in that file.
CONTEXT = _group("signal-received", "worker-end", "worker-closed", "nanny-closing")
# Python exceptions of a worker process: a traceback in its text, kwdiag's fatal record, a failed start
# (``kwdiag.analysis.facts.EXCEPTION_KINDS`` spells the same set).
EXCEPTION = _group("exception", "worker-fatal", "worker-startup-failed")

# ---------------------------------------------------------------- cluster-wide
# A task raised: the timeline's task errors (not deaths).
TASK_ERROR = _group("task-erred")
# Facts in kwdiag's logs that are not deaths but change how to read them (``kwdiag.analysis.notes``).
NOTE = _group("scheduler-recovered", "journal-replayed", "journal-set-aside", "journal-error", "events-lost")

# ---------------------------------------------------------------- who a line is about
# The scheduler's lines that follow one worker process from its registration to its removal.
SCHEDULER_VIEW = _group("worker-registered", "worker-removed", "heartbeat-missed")
# Lines about a worker that only its name identifies (the scheduler's version check of a worker).
NAMED = _group("versions-mismatch")
# Lines a nanny (or any server) writes about itself, not about its worker process.
NOT_ABOUT_THE_WORKER = _group("nanny-start", "nanny-close", "restart-backoff", "process-start", "scheduler-start")

# The scheduler's word on a connection (a goodbye read, a connection gone). It tells how a worker left only
# when it comes at most NEAR_REMOVAL lines before the scheduler's removal of that worker, in the same file;
# the reader keeps one only then (a long-running scheduler prints one per client session: millions).
CONNECTION = _group("comm-close-stream", "comm-closed")
NEAR_REMOVAL = 3

# ---------------------------------------------------------------- readers
# What a kwdiag text log says that its JSONL events already carry: every lifecycle and end line (the
# nanny's exit record keeps the worker's stderr tail, faulthandler dumps and tracebacks included).
DUPLICATED_BY_EVENTS = _group(
    "worker-start", "worker-name", "worker-registered", "worker-removed", "worker-exit", "worker-closing",
    "worker-end", "worker-closed", "nanny-memory-terminate", "heartbeat-missed", "killed-worker", "task-erred",
    "versions-mismatch", "scheduler-close", "signal-received", "worker-restarting", "worker-info",
    "memory-pressure", "nanny-kill-after-close", "worker-connected", "nanny-unregister", "nanny-closing",
    "nanny-memory-escalate", "fatal-signal", "worker-fatal", "worker-startup-failed", "exception")
