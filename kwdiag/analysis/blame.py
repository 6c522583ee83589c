"""KilledWorker blame: which deaths counted against a task the scheduler gave up on, and whether that looks fair. Pure.

Covers: one ``KilledWorkerBlame`` per task: the deaths counted (kwdiag: the scheduler names the blamed
keys in its removal records; Dask: the last *N* unexpected deaths before the scheduler gave up, as its
log does not say which tasks were running), their causes, and whether blaming the task looks fair
(one consistent cause and no other task running: the task itself kills workers; different causes or
other tasks running: raising allowed-failures may be right; too few deaths in the logs: cannot tell).

Deaths the scheduler counted but no line shows (a LocalCluster at WARNING level, a paste of the KilledWorker
line alone) are deaths too: ``blame`` returns them, of unknown cause (``fact-counted-death``), as many as the
count exceeds the deaths seen before it; a death so made counts for a later task as well, so two tasks that
lost the same workers do not double them — unless the two KilledWorkers name their last worker on different
clusters (another protocol, or one on the loopback address and one not: two tests' clusters in one CI log).

Does not cover: classifying the deaths themselves (``kwdiag.analysis.classify``).
"""

from __future__ import annotations

import re
from collections import defaultdict

from kwdiag.analysis.classify import evidence_of, rules_for, runtimes_of
from kwdiag.analysis.facts import counted_death
from kwdiag.analysis.model import Death, Hint, KilledWorkerBlame
from kwdiag.analysis.remedies import hints_for
from kwdiag.engine import RuleSet
from kwdiag.events import Event
from kwdiag.timeline import Timeline


def task_key(e: Event) -> str | None:
    k = e.get("key")
    return str(k) if k is not None else None


def blame(tl: Timeline, deaths: list[Death], rules: RuleSet,
          file_runtime: dict[str, str | None] | None = None) -> tuple[list[KilledWorkerBlame], list[Death]]:
    """One ``KilledWorkerBlame`` per task the scheduler gave up on, and the deaths it counted that no line shows."""
    by_task: dict[str, list[Event]] = {}
    for e in tl.killed:
        k = task_key(e)
        if k is not None:
            by_task.setdefault(_norm_key(k), []).append(e)
    # kwdiag: the scheduler names the blamed keys in worker-removed events
    blamed_at: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for inc in tl.incarnations():
        for e in inc.events:
            if e.kind == "worker-removed":
                for k in e.get("blamed") or []:
                    blamed_at[_norm_key(str(k))].append((inc.worker, inc.number))
    out: list[KilledWorkerBlame] = []
    unseen: list[Death] = []
    cluster_of: dict[int, tuple[str, bool] | None] = {}  # id of an unseen death -> its KilledWorker's cluster
    for task, evs in sorted(by_task.items(), key=lambda kv: min(e.ts for e in kv[1])):
        evs.sort(key=lambda e: e.ts)
        first = next((e for e in evs if e.source == "scheduler"), evs[0])
        n, maybe_one_more = deaths_counted(evs)
        af, obs = _allowed_failures(evs, n, maybe_one_more, task)
        reasons: list[str] = []
        if maybe_one_more:
            reasons.append(maybe_one_more)
        if task in blamed_at:
            keys = set(blamed_at[task])
            counted = [d for d in deaths if (d.worker, d.incarnation) in keys]
        else:
            here = _cluster(evs)
            mine = [u for u in unseen if _same_cluster(cluster_of.get(id(u)), here)]
            # a death of unknown time (a paste without timestamps) is counted as before: it cannot be placed after
            before = sorted((d for d in [*deaths, *mine] if d.failure and (d.at is None or d.at <= first.ts + 1.0)),
                            key=lambda d: (d.at is not None, d.at or 0.0))
            if n and len(before) < n:
                more = _unseen_deaths(first, n - len(before), len(unseen), rules, file_runtime or {})
                unseen += more
                before += more
                cluster_of.update((id(d), here) for d in more)
            counted = before[-n:] if n else before[-1:]
            reasons.append("the logs do not name the task running at each death; the deaths counted are the "
                           f"last {len(counted)} unexpected death(s) before the scheduler gave up")
        causes = tuple(sorted({f"{d.cause}/{d.detail}" for d in counted}))
        fair = _fairness(task, counted, n, causes, reasons)
        ev = tuple(evidence_of(e, (rules_for(e, rules) or [None])[0]) for e in evs)
        used_rules = [r for e in evs for r in rules_for(e, rules)]
        files = {e.origin.file for e in evs if e.origin} | {x.file for d in counted for x in d.evidence}
        hints = hints_for(used_rules, runtimes_of(files, file_runtime or {}), obs)
        if fair is True:  # more retries would only kill more workers
            hints = (Hint(text=f"The task itself kills the workers that run it ({causes[0]}): fix the task (see the "
                          "fix for those deaths above); allowing more failures would only kill more workers.",
                          runtime="any", rule=None),)
        out.append(KilledWorkerBlame(task=task, deaths=tuple(counted), causes=causes, fair=fair,
                                     reasons=tuple(reasons), allowed_failures=af, at=first.ts, evidence=ev,
                                     hints=hints))
    out.sort(key=lambda b: b.at or 0.0)
    return out, unseen


def _allowed_failures(evs: list[Event], n: int | None, maybe_one_more: str | None,
                      task: str) -> tuple[int | None, dict]:
    """The allowed-failures setting the lines show (None when they do not tell it), and the values the fixes quote:
    the setting now (both readings when the count may be one short) and a suggestion past it."""
    af = next((e.get("allowed_failures") for e in evs if isinstance(e.get("allowed_failures"), int)), None)
    now: int | str | None = af
    if af is None and n is not None and maybe_one_more:
        now = f"{n - 1} or {n}"   # the setting is one of these, and the fix suggests past both
    elif af is None and n is not None:
        af = now = n - 1
    most = n if isinstance(now, str) else (af if af is not None else 3)
    return af, {"allowed_failures": now if now is not None else 3, "suggested_allowed_failures": most + 2,
                "task": task}


# Until a release fixed each, Dask printed its allowed-failures setting in these lines where the deaths were one more
# (the task fails when its deaths exceed the setting): the scheduler's "Task K marked as failed because N workers
# died" (from 2020.12.0) until 2023.8.0 (dask/distributed#8029), the client's "KilledWorker: Attempted to run task K
# on N different workers" (from 2022.9.2) until 2023.9.3 (#8203). A line dated before the fixing release came out
# was written by an older Dask: N + 1 workers died. The date bounds the version that wrote the line; it says nothing
# of why anyone died.
_COUNT_FIXED = {"dask-task-marked-failed": ("2023.8.0", 1_691_107_200.0),       # 2023-08-04 00:00 UTC
                "dask-killedworker-client": ("2023.9.3", 1_695_945_600.0)}      # 2023-09-29 00:00 UTC
_DAY = 86_400.0


def deaths_counted(evs: list[Event]) -> tuple[int | None, str | None]:
    """How many deaths a task's KilledWorker lines prove, and, when the lines may be from a Dask that printed one
    less (no date before the fix, and no scheduler's line at ERROR, its level from 2024.3.0 on), a sentence saying
    so."""
    best: int | None = None
    undated: list[tuple[str, int]] = []
    # the scheduler's line at ERROR: 2024.3.0 or later, which prints the deaths (and so does its client)
    recent = any(e.get("rule") == "dask-task-marked-failed" and _said_at_error(e) for e in evs)
    for e in evs:
        n = e.get("deaths")
        if not isinstance(n, int) or isinstance(n, bool):
            continue
        fixed = _COUNT_FIXED.get(e.get("rule"))
        if fixed is not None and not e.get("ts_unknown") and e.ts < fixed[1] - _DAY:
            n += 1   # dated (a day's margin for time zones) before the release that fixed the count
        elif fixed is not None and not recent:
            undated.append((fixed[0], n))
        best = n if best is None else max(best, n)
    if best is None or not undated or max(n for _, n in undated) < best:
        return best, None
    release = max(r for r, n in undated if n == best)
    return best, (f"Dask releases before {release} print the allowed-failures setting here, one less than the "
                  f"deaths: if one of them wrote this log, {best + 1} workers died")


def _said_at_error(e: Event) -> bool:
    """Whether the line itself shows level ERROR before its message (``e.level`` is the rule's severity when the
    line shows none: a paste without the logging prefix)."""
    return _ERROR_LEVEL.search(e.message.split("Task ", 1)[0]) is not None


_ERROR_LEVEL = re.compile(r"\bERROR\b")
UNSEEN = "unseen worker"  # the worker of a death only a KilledWorker count shows
# Dask's KilledWorker (2023 on): "... The last worker that attempt to run the task was tcp://10.0.0.5:40123."
_LAST_WORKER = re.compile(r"last worker that attempt(?:ed)? to run the task was ([a-z]+)://([^\s:/]+|\[[^\]]*\])")


def _cluster(evs: list[Event]) -> tuple[str, bool] | None:
    """What the KilledWorker tells of its cluster: the protocol of its last worker's address and whether that
    address is the loopback one (a LocalCluster's); None when it names no worker."""
    for e in evs:
        m = _LAST_WORKER.search(e.message or "")
        if m:
            host = m.group(2)
            return m.group(1), host.startswith("127.") or host in ("localhost", "[::1]")
    return None


def _same_cluster(a: tuple[str, bool] | None, b: tuple[str, bool] | None) -> bool:
    """Two KilledWorkers may be of one cluster (so may have counted the same deaths) unless both name their
    last worker and those differ in protocol or in being on the loopback address."""
    return a is None or b is None or a == b


def _unseen_deaths(killed: Event, k: int, already: int, rules: RuleSet,
                   file_runtime: dict[str, str | None]) -> list[Death]:
    """``k`` deaths the scheduler counted before ``killed`` and no line shows, of the verdict their fact's rule gives."""
    fact = counted_death(killed)
    rule = next((r for r in rules.match_event(fact.kind, fact.fields) if r.verdict is not None), None)
    if rule is None:   # a rule set without the built-in fact rules: nothing to say of them
        return []
    hints = hints_for([rule], runtimes_of({killed.origin.file} if killed.origin else set(), file_runtime),
                      {"task": task_key(killed)})
    return [Death(worker=UNSEEN, incarnation=already + i + 1, cause=rule.verdict.cause, detail=rule.verdict.detail,
                  confidence=0.0, at=None if killed.get("ts_unknown") else killed.ts, evidence=(evidence_of(killed, rule),), hints=hints, rules=(rule.id,),
                  severity=rule.severity, summary=rule.title, alternatives=rule.verdict.alternatives)
            for i in range(k)]


def _fairness(task: str, counted: list[Death], n: int | None, causes: tuple[str, ...],
              reasons: list[str]) -> bool | None:
    """Whether blaming ``task`` looks fair (None: the logs cannot tell); appends the reason to ``reasons``."""
    if n is not None and len(counted) < n:
        reasons.append(f"the scheduler counted {n} deaths but the logs show {len(counted)}")
        return None
    if not counted:
        return None
    if all(c.startswith("unknown") for c in causes):
        reasons.append("the logs do not say how the counted workers died")
        return None
    if len(causes) == 1 and not causes[0].startswith("unknown"):
        others = set()
        for d in counted:
            others |= {t for t in d.running if _norm_key(t) != task}
        if others:
            reasons.append(f"other tasks were also running at those deaths: {', '.join(sorted(others)[:5])}")
            return False
        reasons.append(f"every counted death has the same cause ({causes[0]}): the task itself most likely "
                       "kills workers")
        return True
    reasons.append("the counted deaths have different causes (" + ", ".join(causes)
                   + "): some may be unrelated to this task")
    return False


def _norm_key(k: str) -> str:
    k = k.strip()
    if len(k) >= 2 and k[0] == k[-1] and k[0] in "'\"":
        k = k[1:-1]
    return k
