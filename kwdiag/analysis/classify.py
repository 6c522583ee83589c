"""Classify deaths: weigh the evidence around each ended incarnation into one verdict. Pure.

Covers: collecting the evidence that belongs to a death (the incarnation's own events, crash
evidence close to its end, environment evidence matched by pid or, failing that, by time), turning
evidence into votes through the rules' ``[verdict]`` tables, combining votes (agreeing evidence from
several rules raises confidence; a more specific detail absorbs the generic one it ``refines``;
disagreeing evidence lowers confidence), recognising the orderly close of the whole cluster
(``chose_to_exit``/``shutdown``), remediation hints with values computed from what was observed,
and the ``KilledWorker`` blame analysis.

Does not cover: reading logs (``kwdiag.readers``) or grouping events (``kwdiag.timeline``).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable

from kwdiag.engine import Rule, RuleSet
from kwdiag.analysis.memory import memory_trace
from kwdiag.analysis.model import Death, Evidence, Hint, KilledWorkerBlame, TaskError
from kwdiag.events import Event
from kwdiag.timeline import Incarnation, Timeline

CRASH_WINDOW = 60.0  # crash evidence (tracebacks, dumps) counts if this close before/after the end
ENV_WINDOW = 120.0  # environment evidence without a pid counts if this close in time
SHUTDOWN_BEFORE = 5.0  # a chosen exit this close before the scheduler closed is part of the shutdown
SHUTDOWN_AFTER = 60.0
LIFECYCLE_KINDS = {"worker-exit", "worker-removed", "worker-closing", "worker-end", "worker-closed",
                   "worker-fatal", "heartbeat-missed", "nanny-memory-terminate", "nanny-closing",
                   "signal-received", "versions-mismatch", "worker-restarting"}
MAX_EVIDENCE = 12
SHUTDOWN_CONSISTENT = {"sigkill", "sigterm", "sigint", "ended", "close_timeout", "connection_lost", "shutdown",
                       "retired"}
QUIET_KINDS = {"worker-registered", "worker-name", "worker-info"}  # context, not evidence
# Reasons with which kwdiag's runtime records a worker closing because the whole cluster closed.
CLUSTER_CLOSE_REASONS = {"scheduler-close", "cluster-close", "parent-died"}


def _closed_on_its_own(events: list[Event], scheduler_reason: str | None) -> bool:
    """kwdiag's structured record says this worker left for a reason of its own, not the cluster's close.

    Text logs only let us guess that from timing; a JSONL ``worker-closing``/``worker-end`` names it.
    The same signal reaching the scheduler too (a whole process group stopped) is still a shutdown.
    """
    return any(e.kind in ("worker-closing", "worker-end") and e.origin is not None
               and e.origin.file.endswith(".jsonl") and e.get("reason")
               and e.get("reason") not in CLUSTER_CLOSE_REASONS and e.get("reason") != scheduler_reason
               for e in events)


@dataclass(frozen=True)
class Vote:
    rule: Rule
    cause: str
    detail: str
    weight: float
    refines: tuple[str, ...]
    event: Event


def rules_for(event: Event, rules: RuleSet) -> list[Rule]:
    """The rules that read ``event``: the line rule that produced it, or event rules on its kind/fields."""
    rid = event.fields.get("rule") if isinstance(event.fields, dict) or hasattr(event.fields, "get") else None
    if isinstance(rid, str):
        r = rules.by_id.get(rid)
        return [r] if r else []
    return rules.match_event(event.kind, event.fields)


def _evidence(e: Event, rule: Rule | None) -> Evidence:
    o = e.origin
    text = e.message or e.kind
    if len(text) > 500:
        text = text[:497] + "..."
    return Evidence(file=o.file if o else "?", line=o.line if o else 0, text=text,
                    rule=rule.id if rule else None, source=e.source)


def _combine(ws: Iterable[float]) -> float:
    p = 1.0
    for w in ws:
        p *= 1.0 - max(0.0, min(1.0, w))
    return 1.0 - p


def decide(votes: list[Vote]) -> tuple[str, str, float, list[Vote], list[str]]:
    """(cause, detail, confidence, supporting votes, disagreeing explanations) from ``votes``."""
    if not votes:
        return "unknown", "no_evidence", 0.0, [], []
    by_key: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    refines: dict[tuple[str, str], set[str]] = defaultdict(set)
    for v in votes:
        k = (v.cause, v.detail)
        by_key[k][v.rule.id] = max(by_key[k].get(v.rule.id, 0.0), v.weight)
        refines[k].update(v.refines)

    def own(k):
        return _combine(by_key[k].values())

    def absorbed(k):
        return {j for j in by_key if j != k and j[1] in refines[k]}

    def support(k):
        ws: dict[str, float] = dict(by_key[k])
        for j in absorbed(k):
            for rid, w in by_key[j].items():
                ws[rid] = max(ws.get(rid, 0.0), w)
        return _combine(ws.values())

    ranked = sorted(by_key, key=lambda k: (support(k), len(refines[k]), own(k)), reverse=True)
    win = ranked[0]
    absorbed_win = absorbed(win)
    conflicts = [k for k in by_key if k != win and k not in absorbed_win and win[1] not in refines[k]]
    conflict = max((own(k) for k in conflicts), default=0.0)
    conf = support(win) * (1.0 - 0.6 * conflict)
    conf = max(0.05, min(0.99, conf))
    keep = [v for v in votes if (v.cause, v.detail) == win or (v.cause, v.detail) in absorbed_win]
    dis = [f"{c}/{d}" for c, d in sorted(conflicts, key=own, reverse=True)]
    return win[0], win[1], conf, keep, dis


def _votes(events: Iterable[Event], rules: RuleSet) -> tuple[list[Vote], list[tuple[Event, Rule | None]]]:
    votes, seen = [], []
    for e in events:
        rs = rules_for(e, rules)
        if not rs:
            seen.append((e, None))
        for r in rs:
            seen.append((e, r))
            if r.verdict is not None:
                v = r.verdict
                detail = v.detail.format_map(_Safe(e.fields)) if "{" in v.detail else v.detail
                votes.append(Vote(r, v.cause, detail, v.weight, v.refines, e))
    return votes, seen


class _Safe(dict):
    def __missing__(self, key):
        return "unknown"


def _relevant(inc: Incarnation, tl: Timeline, end: float | None) -> list[Event]:
    out = []
    for e in inc.events:
        if e.kind in LIFECYCLE_KINDS or e.kind in ("worker-start", "worker-registered", "worker-spawn"):
            out.append(e)
        elif end is None or e.get("ts_unknown") or (end - CRASH_WINDOW <= e.ts <= end + CRASH_WINDOW):
            out.append(e)
    pids = inc.pids
    for e in tl.environment:
        pid = e.get("pid")
        if isinstance(pid, int) and pid in pids:
            out.append(e)
    return out


def _nearby_unnamed_memory(inc: Incarnation, tl: Timeline, end: float | None) -> list[Event]:
    """Memory readings that name no worker (LocalCluster's one shared stderr), from a file this
    incarnation's events are in and within 5 s before its end: used for the values in fixes only."""
    if end is None:
        return []
    files = {e.origin.file for e in inc.events if e.origin}
    return [e for e in tl.cluster if e.kind == "memory-pressure" and e.origin and e.origin.file in files
            and end - 5.0 <= e.ts <= end]


def _env_by_time(tl: Timeline, end: float | None, pids_known: set[int]) -> list[Event]:
    out = []
    for e in tl.environment:
        pid = e.get("pid")
        if isinstance(pid, int) and pid in pids_known:
            continue  # belongs to some incarnation by pid
        if isinstance(pid, int):
            continue  # names a process we do not know: not ours to guess
        if end is not None and not e.get("ts_unknown") and abs(e.ts - end) <= ENV_WINDOW:
            out.append(e)
    return out


_SIZE = re.compile(r"([\d.]+)\s*([KMGT]?i?B)", re.I)
_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 1024, "mib": 1024**2, "gib": 1024**3,
          "tib": 1024**4}


def parse_size(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        m = _SIZE.search(v)
        if m:
            return float(m.group(1)) * _UNITS.get(m.group(2).lower(), 1)
    return None


def fmt_size(n: float) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            v = n / size
            return f"{v:.0f}{unit}" if v >= 10 or v == int(v) else f"{v:.1f}{unit}"
    return f"{n:.0f}B"


def _nice_up(n: float) -> float:
    """Round a byte count up to a size people write: 512 MiB steps below 4 GiB, then whole GiB."""
    gib = 1024**3
    step = 512 * 1024**2 if n < 4 * gib else gib
    return math.ceil(n / step) * step


def observations(inc_events: Iterable[Event], tl: Timeline) -> dict[str, Any]:
    """Values the remediation texts can use, computed from what the logs show."""
    obs: dict[str, Any] = {}
    limit = peak = frac = None
    for e in inc_events:
        f = e.fields
        for key in ("memory_limit",):
            v = parse_size(f.get(key))
            if v:
                limit = v
        for key in ("peak_rss", "rss", "process_memory"):
            v = parse_size(f.get(key))
            if v:
                peak = max(peak or 0.0, v)
        tf = f.get("terminate_fraction")
        if isinstance(tf, (int, float)):
            frac = float(tf)
        elif isinstance(f.get("percent"), int) and e.kind == "nanny-memory-terminate":
            frac = f.get("percent") / 100
        for key in ("module", "package", "exception", "signal", "exitcode", "reason"):
            if f.get(key) is not None and key not in obs:
                obs[key] = f.get(key)
    if limit and frac and not peak:
        peak = limit * frac  # the nanny acted when memory crossed this
    if limit:
        obs["memory_limit"] = fmt_size(limit)
    if peak:
        obs["peak"] = fmt_size(peak)
    if frac:
        obs["terminate_fraction"] = f"{frac:g}"
    base = max(x for x in (limit, peak) if x) if (limit or peak) else None
    if base:
        obs["suggested_memory"] = fmt_size(_nice_up(base * 2))
    af = tl.allowed_failures
    obs["allowed_failures"] = af if af is not None else 3
    obs["suggested_allowed_failures"] = (af if af is not None else 3) + 2
    return obs


DEFAULTS = {
    "memory_limit": "the current limit",
    "peak": "the observed peak",
    "suggested_memory": "about twice the current limit",
    "terminate_fraction": "0.95",
    "module": "the missing module",
    "package": "the mismatched packages",
    "exception": "the exception",
    "signal": "the signal",
    "exitcode": "the exit status",
    "reason": "the reason",
    "pid": "the worker's pid",
}


class _Fill(dict):
    def __missing__(self, key):
        return DEFAULTS.get(key, key)


_OPTIONAL = re.compile(r"\[\[(.*?)(?:\|\|(.*?))?\]\]", re.S)
_FIELD = re.compile(r"(?<!\{)\{(\w+)\}(?!\})")


def fill_template(text: str, obs: dict[str, Any]) -> str:
    """Fill ``{name}`` from ``obs``. ``[[A||B]]`` is A when every value A names was observed, else B
    (``[[A]]``: A or nothing), so a fix never reads 'a limit of the current limit'."""
    def choose(m: re.Match) -> str:
        a, b = m.group(1), m.group(2) or ""
        return a if all(k in obs for k in _FIELD.findall(a)) else b

    text = _OPTIONAL.sub(choose, text)
    try:
        return text.format_map(_Fill(obs))
    except (ValueError, IndexError):
        return text


# Fixes for verdicts no single rule makes (inferred from what is missing from the logs).
FALLBACK_HINTS = {
    "connection_lost": {
        "dask": "The worker vanished without a word in its own log: its process was killed from outside (SIGKILL, the "
                "kernel's OOM killer, a container or node going away). Check the host's kernel log (`dmesg -T`, "
                "`journalctl -k`) and your cluster manager's events around that time; run workers with a nanny "
                "(the default) so the exit status is logged.",
        "coiled": "Check the cluster's instance events in Coiled for a preempted or OOM-killed instance at that time.",
        "kwdiag": "The worker vanished without a word: check the host's kernel log and run workers under a nanny so the "
                  "exit status is recorded.",
    },
    "no_evidence": {
        "dask": "Nothing in these logs says why the worker ended: add the worker's own stderr, the host's kernel log "
                "(`dmesg -T`) and your cluster manager's pod/job events to the input.",
        "kwdiag": "Nothing in these logs says why the worker ended: add the run directory's JSONL files and the host's "
                  "kernel log to the input.",
    },
}


def fallback_hints(detail: str, runtimes: set[str]) -> tuple[Hint, ...]:
    table = FALLBACK_HINTS.get(detail, {})
    order = [r for r in ("kwdiag", "dask", "coiled") if r in runtimes] or ["dask", "coiled"]
    return tuple(Hint(text=table[r], runtime=r) for r in order if r in table)


def hints_for(rules_used: list[Rule], runtimes: set[str], obs: dict[str, Any]) -> tuple[Hint, ...]:
    """One fix per runtime: from the first rule (most decisive first) that has one for it."""
    order = [r for r in ("kwdiag", "dask", "coiled") if r in runtimes] or ["dask", "coiled"]
    out = []
    for rt in order:
        for rule in rules_used:
            text = rule.remediation.get(rt)
            if not text:
                continue
            out.append(Hint(text=fill_template(text, obs), runtime=rt, rule=rule.id))
            break
    return tuple(out)


def _runtime(files: Iterable[str], file_runtime: dict[str, str | None]) -> set[str]:
    rts = {file_runtime.get(f) for f in files}
    rts.discard(None)
    if "dask" in rts:
        rts.add("coiled")
    return rts  # type: ignore[return-value]


def classify_incarnation(inc: Incarnation, tl: Timeline, rules: RuleSet,
                         file_runtime: dict[str, str | None] | None = None,
                         all_pids: set[int] | None = None, also: list[Event] | None = None) -> Death:
    file_runtime = file_runtime or {}
    end = inc.ended_at
    events = _relevant(inc, tl, end) + list(also or [])
    votes, seen = _votes(events, rules)
    cause, detail, conf, keep, dis = decide(votes)
    # Environment evidence that names no known process: use it only if it fits what we know.
    env = _env_by_time(tl, end, all_pids or set())
    if env:
        env_votes, env_seen = _votes(env, rules)
        fitting = [v for v in env_votes if not votes or detail in v.refines or (v.cause, v.detail) == (cause, detail)
                   or cause == "unknown"]
        if fitting:
            votes = votes + fitting
            seen = seen + [(v.event, v.rule) for v in fitting]
            cause, detail, conf, keep, dis = decide(votes)
    has_worker_log = any(e.source in ("worker", "nanny") for e in inc.events)
    removed = [e for e in inc.events if e.kind == "worker-removed"]
    if cause == "unknown" and removed:
        # The scheduler lost the connection and the worker said nothing about leaving.
        how = removed[0].get("how")
        if how in (None, "connection-closed"):
            cause, detail = "sudden_exit", "connection_lost"
            conf = 0.5 if has_worker_log else 0.3
    if tl.scheduler_close is not None and end is not None and not _closed_on_its_own(inc.events, tl.scheduler_close_reason) and (
            tl.scheduler_close - SHUTDOWN_BEFORE <= end <= tl.scheduler_close + SHUTDOWN_AFTER):
        if cause in ("chose_to_exit", "unknown") or detail == "connection_lost":
            if cause != "chose_to_exit" or detail in ("sigterm", "ended", "shutdown", "close_timeout", "sigint"):
                cause, detail = "chose_to_exit", "shutdown"
                conf = max(conf, 0.8)
                # the nanny's SIGKILL of a worker slow to close is part of the shutdown, not a rival story
                dis = [x for x in dis if x.split("/")[-1] not in SHUTDOWN_CONSISTENT]
    # evidence lines: the deciding ones first, then the rest of the lifecycle, in time order
    deciding = {id(v.event) for v in keep}
    ev_list: list[tuple[int, float, Evidence]] = []
    used = set()
    for e, r in seen:
        if id(e) not in deciding and (e.kind in QUIET_KINDS or (r is None and e.kind not in LIFECYCLE_KINDS)):
            continue
        key = (e.origin, e.message)
        if key in used:
            continue
        used.add(key)
        ev_list.append((0 if id(e) in deciding else 1, e.ts, _evidence(e, r)))
    ev_list.sort(key=lambda t: (t[0], t[1]))
    evidence = tuple(x[2] for x in ev_list[:MAX_EVIDENCE])
    evidence = tuple(sorted(evidence, key=lambda ev: (ev.file, ev.line)))
    rules_used: list[Rule] = []
    for v in sorted(keep, key=lambda v: ((v.cause, v.detail) != (cause, detail), -v.weight)):
        if v.rule not in rules_used:
            rules_used.append(v.rule)
    hint_rules = [v.rule for v in keep if (v.cause, v.detail) == (cause, detail)]
    hint_rules = [r for i, r in enumerate(hint_rules) if r not in hint_rules[:i]]
    hint_rules.sort(key=lambda r: -(r.verdict.weight if r.verdict else 0))
    # notice: who saw it and how fast
    noticed_by = noticed_after = None
    if removed:
        r0 = removed[0]
        noticed_by = "scheduler"
        na = r0.get("noticed_after")
        if isinstance(na, (int, float)):
            noticed_after = float(na)
        elif end is not None:
            noticed_after = max(0.0, r0.ts - end)
    files = {e.origin.file for e in inc.events if e.origin}
    obs = observations(events + _nearby_unnamed_memory(inc, tl, end), tl)
    pid0 = inc.pid or next((e.get("pid") for e in inc.events if e.kind == "worker-exit" and e.get("pid")), None)
    if pid0:
        obs["pid"] = pid0
    rts = _runtime(files, file_runtime)
    hints = hints_for(hint_rules, rts, obs) if cause != "chose_to_exit" else ()
    if cause != "chose_to_exit":  # a runtime the deciding rules have no fix for: take the absorbed rules' fixes
        have = {h.runtime for h in hints}
        extra = []
        for h in hints_for(rules_used, rts, obs):
            if h.runtime not in have:
                have.add(h.runtime)
                extra.append(h)
        hints = hints + tuple(extra)
        if not hints:
            hints = fallback_hints(detail, rts)
    running: list[str] = []
    for e in inc.events:
        rt = e.get("running_tasks")
        if isinstance(rt, list):
            running.extend(str(x) for x in rt if str(x) not in running)
    severity = "info" if cause == "chose_to_exit" else max(
        (r.severity for r in rules_used), key=lambda s: ("info", "warning", "error").index(s), default="error")
    pid = inc.pid
    if pid is None:
        for e in inc.events:
            if e.kind == "worker-exit" and isinstance(e.get("pid"), int):
                pid = e.get("pid")
    summary = rules_used[0].title if rules_used else {
        "connection_lost": "The scheduler lost the connection and the worker logged nothing about leaving",
        "shutdown": "The whole cluster was closed",
        "no_evidence": "The logs do not say why this worker ended",
    }.get(detail, "")
    if detail == "shutdown":
        summary = "The whole cluster was closed (orderly shutdown)"
    return Death(
        worker=inc.worker, incarnation=inc.number, cause=cause, detail=detail, confidence=round(conf, 2),
        at=end, address=inc.address, pid=pid, started=inc.started, evidence=evidence, hints=hints,
        rules=tuple(r.id for r in rules_used), noticed_by=noticed_by, noticed_after=noticed_after,
        running=tuple(running), severity=severity, summary=summary, disagreement=tuple(dis),
        memory=memory_trace(inc.events + _nearby_unnamed_memory(inc, tl, end)),
    )


def classify(tl: Timeline, rules: RuleSet, file_runtime: dict[str, str | None] | None = None) -> list[Death]:
    """A ``Death`` for every incarnation that ended, in time order.

    Environment evidence that names neither a process nor a time (``kubectl describe`` output: an
    ``OOMKilled`` reason) is used only when exactly one death fits it (its verdict is one the
    evidence refines, e.g. a SIGKILL for an OOM kill).
    """
    all_pids: set[int] = set()
    for inc in tl.incarnations():
        all_pids |= inc.pids
    ended = [inc for inc in tl.incarnations() if inc.ended]
    out = [classify_incarnation(inc, tl, rules, file_runtime, all_pids) for inc in ended]
    timeless = [e for e in tl.environment if e.get("ts_unknown") and not isinstance(e.get("pid"), int)]
    if timeless:
        votes, _ = _votes(timeless, rules)
        for v in votes:
            fits = [i for i, d in enumerate(out) if d.failure and d.detail in v.refines]
            if len(fits) == 1:
                i = fits[0]
                extra = Timeline(workers=tl.workers, cluster=tl.cluster, environment=tl.environment,
                                 killed=tl.killed, task_errors=tl.task_errors, scheduler_close=tl.scheduler_close,
                                 allowed_failures=tl.allowed_failures)
                out[i] = classify_incarnation(ended[i], extra, rules, file_runtime, all_pids, also=[v.event])
    return out


def _key_of(e: Event) -> str | None:
    k = e.get("key")
    return str(k) if k is not None else None


def blame(tl: Timeline, deaths: list[Death], rules: RuleSet,
          file_runtime: dict[str, str | None] | None = None) -> list[KilledWorkerBlame]:
    """One ``KilledWorkerBlame`` per task the scheduler gave up on."""
    by_task: dict[str, list[Event]] = {}
    for e in tl.killed:
        k = _key_of(e)
        if k is not None:
            by_task.setdefault(_norm_key(k), []).append(e)
    # kwdiag: the scheduler names the blamed keys in worker-removed events
    blamed_at: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for inc in tl.incarnations():
        for e in inc.events:
            if e.kind == "worker-removed":
                for k in e.get("blamed") or []:
                    blamed_at[_norm_key(str(k))].append((inc.worker, inc.number))
    out = []
    for task, evs in by_task.items():
        evs.sort(key=lambda e: e.ts)
        first = next((e for e in evs if e.source == "scheduler"), evs[0])
        n = next((e.get("deaths") for e in evs if isinstance(e.get("deaths"), int)), None)
        af = next((e.get("allowed_failures") for e in evs if isinstance(e.get("allowed_failures"), int)), None)
        if af is None and n is not None:
            af = n - 1
        reasons: list[str] = []
        if task in blamed_at:
            keys = set(blamed_at[task])
            counted = [d for d in deaths if (d.worker, d.incarnation) in keys]
        else:
            before = [d for d in deaths if d.failure and d.at is not None and d.at <= first.ts + 1.0]
            counted = before[-n:] if n else before[-1:]
            reasons.append("the logs do not name the task running at each death; the deaths counted are the "
                           f"last {len(counted)} unexpected death(s) before the scheduler gave up")
        causes = tuple(sorted({f"{d.cause}/{d.detail}" for d in counted}))
        fair: bool | None
        if n is not None and len(counted) < n:
            fair = None
            reasons.append(f"the scheduler counted {n} deaths but the logs show {len(counted)}")
        elif not counted:
            fair = None
        elif len(causes) == 1 and not causes[0].startswith("unknown"):
            others = set()
            for d in counted:
                others |= {t for t in d.running if _norm_key(t) != task}
            if others:
                fair = False
                reasons.append(f"other tasks were also running at those deaths: {', '.join(sorted(others)[:5])}")
            else:
                fair = True
                reasons.append(f"every counted death has the same cause ({causes[0]}): the task itself most likely "
                               "kills workers")
        else:
            fair = False
            reasons.append("the counted deaths have different causes (" + ", ".join(causes)
                           + "): some may be unrelated to this task")
        ev = tuple(_evidence(e, (rules_for(e, rules) or [None])[0]) for e in evs)
        used_rules = [r for e in evs for r in rules_for(e, rules)]
        obs = {"allowed_failures": af if af is not None else 3,
               "suggested_allowed_failures": (af if af is not None else 3) + 2, "task": task}
        files = {e.origin.file for e in evs if e.origin} | {x.file for d in counted for x in d.evidence}
        hints = hints_for(used_rules, _runtime(files, file_runtime or {}), obs)
        if fair is True:  # more retries would only kill more workers
            hints = (Hint(text=f"The task itself kills the workers that run it ({causes[0]}): fix the task (see the "
                          "fix for those deaths above); allowing more failures would only kill more workers.",
                          runtime="any", rule=None),)
        out.append(KilledWorkerBlame(task=task, deaths=tuple(counted), causes=causes, fair=fair,
                                     reasons=tuple(reasons), allowed_failures=af, at=first.ts, evidence=ev,
                                     hints=hints))
    out.sort(key=lambda b: b.at or 0.0)
    return out


def _norm_key(k: str) -> str:
    k = k.strip()
    if len(k) >= 2 and k[0] == k[-1] and k[0] in "'\"":
        k = k[1:-1]
    return k


def task_errors(tl: Timeline, rules: RuleSet) -> list[TaskError]:
    """Task errors, one per erred task: the lines of one Dask ``Compute Failed`` block are merged."""
    out: list[TaskError] = []
    groups: list[list[Event]] = []
    for e in sorted(tl.task_errors, key=lambda e: (e.origin.file if e.origin else "", e.origin.line if e.origin else 0)):
        part = e.get("part")
        prev = groups[-1][-1] if groups else None
        if (part and prev is not None and prev.origin and e.origin and prev.origin.file == e.origin.file
                and 0 < e.origin.line - prev.origin.line <= 8):
            groups[-1].append(e)
        else:
            groups.append([e])
    seen = set()
    for g in groups:
        key = next((_key_of(e) for e in g if _key_of(e)), None)
        exc = next((e.get("exception") for e in g if e.get("exception")), None)
        if exc is not None and not isinstance(exc, str):  # a JSONL event may carry any JSON value
            exc = str(exc)
        if key is not None and (key, exc) in seen:
            continue
        seen.add((key, exc))
        head = g[0]
        r = (rules_for(head, rules) or [None])[0]
        out.append(TaskError(task=key, exception=exc, worker=head.worker, at=head.ts,
                             evidence=tuple(_evidence(e, (rules_for(e, rules) or [None])[0]) for e in g)))
    out.sort(key=lambda t: t.at or 0.0)
    return out
