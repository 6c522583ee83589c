"""The verdicts a Dask maintainer would give for a corpus case, from what its script did and what Dask printed.

``expected_deaths(labels)`` turns ``labels.json`` (what ``sample_logs/corpus/generate.py`` did to each
worker, see ``docs/death-classes.md`` for the classes) into the (cause, detail) list ``kwdiag explain``
must report for the case's logs. The label says what was done; the logs decide what can be seen. Three
things hide part of it, each read off the real logs of the corpus, not assumed:

* **LocalCluster at its default level** (``silence_logs=WARNING``, every version): the nanny's exit line
  (``Worker process N was killed by signal S`` / ``exited with status S``) is INFO and does not appear;
  its WARNING ``Restarting worker`` does. A death by a signal or by a status without a traceback is then
  ``unknown/restarted`` (kwdiag says the worker died and what to collect). Memory kills (WARNING),
  tracebacks logged at ERROR (``sys.exit`` in a task) and heartbeat removals (WARNING) stay visible.
  Orderly ends (retire, lifetime, scale-down, restart, the final close) print nothing: no death to see.
  Without a nanny nothing of a worker's end is printed at this level.
* **No nanny**: nobody reports the exit status or signal. A worker killed by a signal, or that called
  ``os._exit``, vanishes without a word: the scheduler sees its connection close, and the lines cannot tell
  which it was (``unknown/abrupt_end``, with those readings as its alternatives).
* **The final close**: every worker alive when the cluster closes ends ``chose_to_exit/shutdown`` (in the
  logs a handled SIGTERM to the ``dask worker`` command and the scheduler together, or LocalCluster
  closing): counted as chosen, detail not compared (``sigterm`` and ``shutdown`` both say it).

* **A version that does not say it**: before distributed 2023.3.2 a task's ``sys.exit()`` is not logged
  (``async instruction handlers should never raise!``, later ``Unhandled exception in async instruction``,
  appear then: ``sample_logs/wording/catalog.json``); the nanny's exit status still shows it ended itself.
  From 2022.4.2 to 2023.3.1 it may show as Dask's fail-hard exit instead (a race). Before 2022.5.1 a
  SIGINT to ``dask worker`` is not logged. A restart the client asked for shows at WARNING level only
  when the nanny printed "Restarting worker" for it (2.30.1 never does; later versions do, racily).

Details are compared where the logs can state them; ``None`` means only the class is compared.
"""

from __future__ import annotations

SIGNAL_DEATHS = {("sudden_exit", d) for d in ("sigkill", "segfault", "signal_6", "sigterm", "unknown_signal")}
SILENT_SELF_EXITS = {("unrecoverable_exception", "os_exit")}
WARNING_VISIBLE = {"nanny_memory_restart", "version_mismatch"}


SYS_EXIT_LOGGED_FROM = (2023, 3, 2)
# From 2022.4.2 to 2023.3.1 a task's sys.exit() can break the worker's state machine: Dask's CRITICAL
# "Error trying close worker in response to broken internal state. Forcibly exiting worker NOW" (fail-hard).
# It is a race: in the 2022.12.1 corpus one case of three prints it, the others exit with status 3 and no
# word. So the expectation asks the case's files whether Dask printed it (``fail_hard_printed``).
SYS_EXIT_FAIL_HARD_FROM = (2022, 4, 2)
FAIL_HARD_LINE = "Forcibly exiting worker NOW"
RESTARTING_LINE = "distributed.nanny - WARNING - Restarting worker"
KILL_AFTER_CLOSE_LINE = "distributed.nanny - WARNING - Worker process still alive after"
START_LINE = "Start worker at:"   # every worker process prints it once, when it listens
FAILED_PROCESS_LINES = ("Process Dask Worker process (from Nanny):", "Failed to initialize Worker")
# `dask worker` logs a SIGINT from 2022.5.1 ("Received signal SIGINT (2)"); before, only SIGTERM
# ("Exiting on signal 15"), and a worker without a nanny then prints just "End worker".
SIGINT_LOGGED_FROM = (2022, 5, 1)
# The nanny's WARNING "Restarting worker" after a restart it was asked for (client.restart()): 2.30.1
# prints nothing, 2022.12.1 to 2026.8.0 print it in the corpus. Used only when the case's files are not at
# hand (``expected_deaths`` then counts the printed lines).
ASKED_RESTART_LOGGED_FROM = (2026, 7, 0)


def _version(labels: dict) -> tuple[int, ...]:
    return tuple(int(x) for x in str(labels.get("version", "9999")).split(".")[:3] if x.isdigit())


def _visible(cause: str, detail: str | None, factors: dict, version: tuple[int, ...] = (9999,),
             restarted: bool = False, printed_fail_hard: bool = False) -> tuple[str, str | None] | None:
    launch, nanny = factors.get("launch"), factors.get("nanny")
    key = (cause, detail)
    if (key == ("unrecoverable_exception", "system_exit") and printed_fail_hard
            and SYS_EXIT_FAIL_HARD_FROM <= version < SYS_EXIT_LOGGED_FROM):
        return ("unrecoverable_exception", "fail_hard")  # CRITICAL: visible at every level
    if key == ("unrecoverable_exception", "system_exit") and version < SYS_EXIT_LOGGED_FROM:
        key = ("unrecoverable_exception", "os_exit")  # a status and no traceback: all the lines can show
        cause, detail = "unrecoverable_exception", None
        if nanny != "nanny":
            return ("unknown", None) if launch != "local_warning" else None
    if key == ("chose_to_exit", "sigint") and version < SIGINT_LOGGED_FROM:
        return ("chose_to_exit", None) if nanny == "nanny" else ("unknown", None)
    if detail == "restart" and launch == "local_warning" and version < ASKED_RESTART_LOGGED_FROM:
        return None
    if launch == "local_warning":
        if cause == "chose_to_exit":
            # orderly ends print nothing at WARNING level, except the nanny's WARNING "Restarting worker"
            # when it starts the worker again (client.restart(), --lifetime-restart): a restart whose why
            # is not in the logs
            return ("unknown", "restarted") if nanny == "nanny" and restarted else None
        if nanny != "nanny":
            return None if key in SIGNAL_DEATHS | SILENT_SELF_EXITS else (cause, detail)
        if key in SIGNAL_DEATHS | SILENT_SELF_EXITS:
            return ("unknown", "restarted")
        return (cause, detail)
    if nanny != "nanny" and key in SIGNAL_DEATHS | SILENT_SELF_EXITS:
        return ("unknown", "abrupt_end")
    return (cause, detail)


def _restarted(death: dict, labels: dict) -> bool:
    """The nanny started the worker again after this chosen end."""
    return death.get("detail") == "restart" or (death.get("detail") == "lifetime"
                                                 and bool(labels.get("parameters", {}).get("lifetime_restart")))


def _count_in_logs(case_dir, line: str) -> int:
    """How often ``line`` is in the case's log files (gzipped ones too)."""
    import gzip
    from pathlib import Path

    n = 0
    for p in Path(case_dir).iterdir():
        if p.name.endswith(".log"):
            n += p.read_text(errors="replace").count(line)
        elif p.name.endswith(".log.gz"):
            n += gzip.decompress(p.read_bytes()).decode(errors="replace").count(line)
    return n


def fail_hard_printed(case_dir) -> bool:
    """Dask printed its fail-hard CRITICAL line somewhere in this case's files."""
    return _count_in_logs(case_dir, FAIL_HARD_LINE) > 0


def expected_deaths(labels: dict, case_dir=None) -> list[tuple[str, str | None]]:
    factors = labels.get("factors", {})
    printed = case_dir is not None and fail_hard_printed(case_dir)
    # A restart the client asked for shows at WARNING level only through the nanny's "Restarting worker",
    # which some versions print and some do not, and 2022-2024 print or not by a race with the restart's
    # own instantiate: the case's files say how many were printed.
    restarting = _count_in_logs(case_dir, RESTARTING_LINE) if case_dir is not None else None
    out = []
    for d in labels.get("deaths", []):
        if (restarting is not None and d.get("detail") == "restart" and factors.get("launch") == "local_warning"
                and factors.get("nanny") == "nanny"):
            if restarting > 0:
                restarting -= 1
                out.append(("unknown", "restarted"))
            continue
        seen = _visible(d["cause"], d.get("detail"), factors, _version(labels), _restarted(d, labels), printed)
        if seen is not None:
            out.append(seen)
    if case_dir is not None and factors.get("nanny") == "nanny":
        # a worker class that raises: the nanny may start it more than once, and each process is a death (each
        # failed process says so once: multiprocessing's header over its traceback in 2.9.3 and 2.30.1, the
        # process's own "Failed to initialize Worker" in 2021.11.2 and 2022.6.1)
        init = [x for x, d in zip(out, labels.get("deaths", [])) if d.get("detail") == "worker_init_exception"] \
            if len(out) == len(labels.get("deaths", [])) else []
        if len(init) == 1:
            failed = sum(_count_in_logs(case_dir, line) for line in FAILED_PROCESS_LINES)
            out += init * max(0, failed - 1)
    if factors.get("launch") != "local_warning":
        out += [("chose_to_exit", None) for _ in labels.get("closed_alive", [])]
        if case_dir is not None:
            # Every process that printed its start ended by the case's end. One the labels do not account for
            # (a replacement its nanny was starting when the cluster closed, a worker that hung before it
            # registered) was ended by the final close, which is not always in time to count it alive.
            unaccounted = _count_in_logs(case_dir, START_LINE) - len(labels.get("deaths", [])) \
                - len(labels.get("closed_alive", []))
            out += [("chose_to_exit", None)] * max(0, unaccounted)
    elif case_dir is not None:
        # At WARNING level the final close is silent, unless a worker the nanny restarted did not close in time: its
        # kill ("still alive after N seconds, killing", after the "Restarting worker") shows that process's end,
        # of a cause the lines cannot tell (nothing says the cluster was closing).
        out += [("unknown", "close_timeout")] * _kills_after_a_restart(case_dir)
    return out


def _kills_after_a_restart(case_dir) -> int:
    from pathlib import Path

    kills = 0
    for p in Path(case_dir).glob("*.log"):
        text = p.read_text(errors="replace")
        first_restart = text.find(RESTARTING_LINE)
        if first_restart >= 0:
            kills += text.count(KILL_AFTER_CLOSE_LINE, first_restart)
    return kills
