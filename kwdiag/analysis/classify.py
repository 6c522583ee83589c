"""Classify deaths: one verdict per ended incarnation, in four phases. Pure.

1. **gather** the evidence that belongs to the death: the incarnation's own lines (lifecycle lines
   whenever they came; crash evidence within ``CRASH_WINDOW`` of its end), environment lines with its
   pid, and lines of its file that name no process but sit just before its end;
2. **derive facts** the lines imply but no single line states (``kwdiag.analysis.facts``);
3. **vote**: every rule with a ``[verdict]`` that reads an evidence line or a fact votes, and
   ``kwdiag.analysis.vote.decide`` picks the verdict; environment lines that name no process (a
   ``kubectl describe``) join only if they fit it;
4. **explain**: the evidence lines (deciding ones first), the fixes (``kwdiag.analysis.remedies``),
   who noticed and how fast, what was running, the memory trace.

Every verdict comes from a rule: a death with no evidence is ``unknown`` because the rule for the
``fact-no-evidence`` fact says so. A Python exception never outvotes a signal: a process killed by a
signal did not die of an exception printed before it (a task error's traceback, say).

Does not cover: reading logs (``kwdiag.readers``), grouping lines into incarnations
(``kwdiag.timeline``), KilledWorker blame (``kwdiag.analysis.blame``) or task errors.
"""

from __future__ import annotations

from typing import Iterable

from kwdiag.analysis.facts import chose_first, derive_facts, exit_signal, nanny_killed_it
from kwdiag.analysis.memory import memory_trace
from kwdiag.analysis.model import Death, Evidence
from kwdiag.analysis.remedies import hints_for, observations, runtimes_in_order
from kwdiag.analysis.stack import Frame, crash_stack, named_frame
from kwdiag.analysis.vote import Decision, Vote, decide, refines_key
from kwdiag.engine import Rule, RuleSet
from kwdiag.events import Event
from kwdiag.kinds import CONTEXT, LIFECYCLE, QUIET, START_LIKE
from kwdiag.records import record
from kwdiag.timeline import Incarnation, Timeline, known_ts, stream_of
from kwdiag.timeline.streams import same_machine

CRASH_WINDOW = 60.0  # crash evidence (tracebacks, dumps) counts if this close before/after the end
ENV_WINDOW = 120.0  # environment evidence without a pid counts if this close in time
CONTEXT_WINDOW = 30.0  # lines of a shared file that name no process count if this close before the end
MAX_EVIDENCE = 12
EXCEPTION_CAUSE = "unrecoverable_exception"


@record(frozen=True)
class Inputs:
    """What classification needs besides the timeline: the rules and which runtime wrote each file."""

    rules: RuleSet
    file_runtime: dict[str, str | None]


# ---------------------------------------------------------------- phase 1: gather
def gather(inc: Incarnation, tl: Timeline) -> list[Event]:
    end = inc.ended_at
    out = []
    for e in inc.events:
        ts = known_ts(e)
        if e.kind in LIFECYCLE or e.kind in START_LIKE or ts is None or end is None \
                or end - CRASH_WINDOW <= ts <= end + CRASH_WINDOW:
            out.append(e)
    out.extend(tl.environment_of(inc.pids))
    if inc.stream is not None:
        out.extend(_stream_context(inc, tl))
    return out


def _stream_context(inc: Incarnation, tl: Timeline) -> list[Event]:
    """Lines of the incarnation's file that name no process (a signal to the process several workers
    share, "End worker") shortly before or at its end."""
    ends = [e for e in inc.end_events if e.origin is not None and stream_of(e) == inc.stream]
    if not ends or inc.stream not in tl.stream_context:
        return []
    last_line = max(e.origin.line for e in ends)
    end = inc.ended_at
    lo, hi = (end - CONTEXT_WINDOW, end + CONTEXT_WINDOW) if end is not None else (None, None)
    out = []
    for e in tl.context_between(inc.stream, lo, hi, CONTEXT):
        if e.origin is not None and e.origin.line <= last_line + 20 and same_machine(inc.address, e.get("nanny")):
            out.append(e)   # (not a nanny's close on another machine: several nodes' commands may share a file)
    return out


def _env_by_time(tl: Timeline, end: float | None) -> list[Event]:
    """Environment lines that name no process (one that names a process is ours by pid, or not ours to guess),
    close in time to ``end``."""
    return [] if end is None else tl.environment_near(end, ENV_WINDOW)


# ---------------------------------------------------------------- phase 3: vote
# Event rules of these areas read every event, whoever wrote it: what a close reason or a derived fact
# means does not depend on the runtime. The others (``kwdiag``) read only kwdiag's own JSONL events.
SHARED_AREAS = {"lifecycle", "facts"}


def rules_for(event: Event, rules: RuleSet) -> list[Rule]:
    """The rules that read ``event``: the line rule that produced it (plus the shared event rules on the
    event it became), or, for a structured event, the event rules on its kind and fields."""
    rid = event.fields.get("rule") if hasattr(event.fields, "get") else None
    if isinstance(rid, str):
        r = rules.by_id.get(rid)
        shared = [x for x in rules.match_event(event.kind, event.fields) if x.area in SHARED_AREAS]
        return ([r] if r else []) + shared
    return rules.match_event(event.kind, event.fields)


class _Safe(dict):
    def __missing__(self, key):
        return "unknown"


def collect_votes(events: Iterable[Event], rules: RuleSet) -> tuple[list[Vote], list[tuple[Event, Rule | None]]]:
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


def _relevant_votes(inc: Incarnation, votes: list[Vote]) -> list[Vote]:
    """A process its nanny saw killed by a signal did not die of a Python exception: not of a traceback
    printed before it (a task error's), nor of what failed after it (a nanny that then fails to start).
    Nor did one that was already closing by choice when its exception or exit status came."""
    if (exit_signal(inc) is None or nanny_killed_it(inc)) and not chose_first(inc):
        return votes
    return [v for v in votes if v.cause != EXCEPTION_CAUSE]


def vote(inc: Incarnation, tl: Timeline, events: list[Event], inp: Inputs) -> tuple[Decision, list[Vote], list]:
    votes, seen = collect_votes(events, inp.rules)
    votes = _relevant_votes(inc, votes)
    decision = decide(votes)
    env = _env_by_time(tl, inc.ended_at)
    if env:
        env_votes, env_seen = collect_votes(env, inp.rules)
        open_question = decision.cause == "unknown"
        readings: set[str] = set()
        if open_question and any(v.cause == "unknown" and v.refines for v in decision.kept):
            # an unknown that names its readings (the nanny's kill after a slow stop): only those may settle it
            open_question = False
            readings = {a for v in decision.kept if v.rule.verdict is not None for a in v.rule.verdict.alternatives}
        fitting = [v for v in env_votes if open_question or refines_key(v.refines, decision.cause, decision.detail)
                   or v.key == (decision.cause, decision.detail) or f"{v.cause}/{v.detail}" in readings]
        if fitting:
            votes = votes + fitting
            seen = seen + [(v.event, v.rule) for v in fitting]
            decision = decide(votes)
    return decision, votes, seen


# ---------------------------------------------------------------- phase 4: explain
def evidence_of(e: Event, rule: Rule | None) -> Evidence:
    o = e.origin
    text = e.message or e.kind
    if len(text) > 500:
        text = text[:497] + "..."
    return Evidence(file=o.file if o else "?", line=o.at if o else 0, text=text,
                    rule=rule.id if rule else None, source=e.source)


def evidence_lines(decision: Decision, seen: list[tuple[Event, Rule | None]]) -> tuple[Evidence, ...]:
    """The deciding lines first, then the rest of the lifecycle; at most ``MAX_EVIDENCE``, in file order."""
    deciding = {id(v.event) for v in decision.kept}
    ranked: list[tuple[int, float, Evidence]] = []
    used = set()
    for e, r in seen:
        if id(e) not in deciding and (e.kind in QUIET or (r is None and e.kind not in LIFECYCLE)):
            continue
        if e.kind.startswith("fact-") and id(e) not in deciding:
            continue
        key = (e.origin, e.message)
        if key in used:
            continue
        used.add(key)
        ranked.append((0 if id(e) in deciding else 1, e.ts, evidence_of(e, r)))
    ranked.sort(key=lambda t: (t[0], t[1]))
    return tuple(sorted((x[2] for x in ranked[:MAX_EVIDENCE]), key=lambda ev: (ev.file, ev.line)))


def _deciding_rules(decision: Decision) -> list[Rule]:
    out: list[Rule] = []
    for v in sorted(decision.kept, key=lambda v: (v.key != (decision.cause, decision.detail), -v.weight)):
        if v.rule not in out:
            out.append(v.rule)
    return out


def runtimes_of(files: Iterable[str], file_runtime: dict[str, str | None]) -> set[str]:
    rts = {file_runtime.get(f) for f in files}
    rts.discard(None)
    if "dask" in rts:
        rts.add("coiled")
    return rts  # type: ignore[return-value]


def _hints(inc: Incarnation, decision: Decision, rules_used: list[Rule], events: list[Event], tl: Timeline,
           inp: Inputs, stack: tuple[Frame, ...] = ()):
    if decision.cause == "chose_to_exit":
        return ()
    obs = observations(events, tl.allowed_failures)
    if inc.pid is not None:
        obs["pid"] = inc.pid
    if stack:
        obs["crash_frame"] = str(named_frame(stack))
    rts = runtimes_of({e.origin.file for e in inc.events if e.origin}, inp.file_runtime)
    winners: list[Rule] = []
    for v in decision.kept:
        if v.key == (decision.cause, decision.detail) and v.rule not in winners:
            winners.append(v.rule)
    winners.sort(key=lambda r: -(r.verdict.weight if r.verdict else 0))
    hints = hints_for(winners, rts, obs)
    have = {h.runtime for h in hints}
    missing = {rt for rt in runtimes_in_order(rts) if rt not in have}
    if not missing:
        return hints
    return hints + hints_for(rules_used, missing, obs)   # the absorbed rules' fixes, for runtimes the winners lack


def _noticed(inc: Incarnation) -> tuple[str | None, float | None]:
    removed = inc.slots.get("removed", [])
    if not removed:
        return None, None
    r0 = removed[0]
    na = r0.get("noticed_after")
    if isinstance(na, (int, float)) and not isinstance(na, bool):
        return "scheduler", float(na)
    end = inc.ended_at
    ts = known_ts(r0)
    return "scheduler", (max(0.0, ts - end) if end is not None and ts is not None else None)


def _running(inc: Incarnation) -> tuple[str, ...]:
    running: list[str] = []
    for e in inc.events:
        rt = e.get("running_tasks")
        if isinstance(rt, list):
            running.extend(str(x) for x in rt if str(x) not in running)
    return tuple(running)


# Deaths a faulthandler dump is about: the signals it handles (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL).
CRASH_DETAILS = frozenset({"segfault", "signal_4", "signal_6", "signal_7", "signal_8", "sigabrt", "sigbus", "sigfpe",
                           "sigill"})
CRASH_SIGNALS = frozenset({4, 6, 7, 8, 11})


def _crash_stack(events: list[Event]) -> tuple[Frame, ...]:
    """The crashing thread's frames, from a faulthandler dump: the one the nanny kept whole (``crash_dump``) or
    the end of the worker's stderr (``stderr_tail``), or the lines under a ``Fatal Python error`` line of a text
    log (``kwdiag.readers.dumps``). None when the nanny saw another signal end the process: a dump in its
    stderr is then a forked child's, not its own."""
    signals = {e.get("signal") for e in events if e.kind == "worker-exit" and isinstance(e.get("signal"), int)}
    if signals - CRASH_SIGNALS:
        return ()
    for e in events:
        candidates = [e.get("crash_dump"), e.get("stderr_tail")] if e.kind in ("worker-exit", "worker-removed") else []
        if e.kind == "fatal-signal" and isinstance(e.get("dump"), list):
            candidates.append([e.message, *e.get("dump")])
        for lines in candidates:
            stack = crash_stack(lines) if isinstance(lines, list) else ()
            if stack:
                return stack
    return ()


def explain(inc: Incarnation, tl: Timeline, decision: Decision, events: list[Event], seen, inp: Inputs) -> Death:
    rules_used = _deciding_rules(decision)
    stack = _crash_stack(events) if decision.detail in CRASH_DETAILS else ()
    noticed_by, noticed_after = _noticed(inc)
    severity = "info" if decision.cause == "chose_to_exit" else max(
        (r.severity for r in rules_used), key=lambda s: ("info", "warning", "error").index(s), default="error")
    summary = rules_used[0].title if rules_used else ""
    return Death(
        worker=inc.worker, incarnation=inc.number, cause=decision.cause, detail=decision.detail,
        confidence=round(decision.confidence, 2), at=inc.ended_at, address=inc.address, pid=inc.pid,
        started=inc.started, evidence=evidence_lines(decision, seen),
        hints=_hints(inc, decision, rules_used, events, tl, inp, stack), rules=tuple(r.id for r in rules_used),
        noticed_by=noticed_by, noticed_after=noticed_after, running=_running(inc), severity=severity,
        summary=summary, disagreement=tuple(decision.disagreement), memory=memory_trace(events),
        alternatives=_alternatives(decision, rules_used), stack=stack,
    )


def _alternatives(decision: Decision, rules_used) -> tuple[str, ...]:
    """What an ``unknown`` death could have been, as its deciding rules say (none for a known cause)."""
    if decision.cause != "unknown":
        return ()
    out: list[str] = []
    for r in rules_used:
        out += [a for a in (r.verdict.alternatives if r.verdict else ()) if a not in out]
    return tuple(out)


# ---------------------------------------------------------------- all four
def classify_incarnation(inc: Incarnation, tl: Timeline, inp: Inputs, also: list[Event] | None = None) -> Death:
    events = gather(inc, tl) + list(also or [])
    events += derive_facts(inc, tl, events)
    decision, _votes, seen = vote(inc, tl, events, inp)
    return explain(inc, tl, decision, events, seen, inp)


def classify(tl: Timeline, rules: RuleSet, file_runtime: dict[str, str | None] | None = None) -> list[Death]:
    """A ``Death`` for every incarnation that ended, in time order.

    Environment evidence that names neither a process nor a time (``kubectl describe`` output: an
    ``OOMKilled`` reason) is used only when exactly one death fits it (its verdict is one the
    evidence refines, e.g. a SIGKILL for an OOM kill).
    """
    inp = Inputs(rules, file_runtime or {})
    ended = [inc for inc in tl.incarnations() if inc.ended]
    out = [classify_incarnation(inc, tl, inp) for inc in ended]
    timeless = [e for e in tl.environment if known_ts(e) is None and not isinstance(e.get("pid"), int)]
    if timeless:
        votes, _ = collect_votes(timeless, rules)
        for v in votes:
            fits = [i for i, d in enumerate(out) if d.failure and refines_key(v.refines, d.cause, d.detail)]
            if len(fits) == 1:
                i = fits[0]
                out[i] = classify_incarnation(ended[i], tl, inp, also=[v.event])
    return out
