"""The fact layer (kwdiag/analysis/facts.py) as tested data: its conditions at their edges, and its rules on real logs.

A fact rule (``rules/facts/``) matches an event the fact layer derives, so its ``[examples]`` (that event as JSON)
prove only ``kind == kind``. What decides is the fact's condition, tested here two ways:

* the edges: events written in kwdiag's event format (docs/events.md), read by the reader, built into a timeline,
  and given to ``derive_facts`` — just inside and just outside each window, each close reason;
* each fact rule's ``[[examples.pipeline]]``: real fragments of the corpus's Dask logs (written by
  ``sample_logs/corpus/fact_examples.py``, which keeps lines verbatim) run through the whole pipeline
  (readers → timeline → facts → vote) must give the verdict they state, decided with the rule's vote.
"""

from __future__ import annotations

import gzip
import json
import re
import tomllib
from pathlib import Path

import pytest

from kwdiag import reasons
from kwdiag.analysis import facts
from kwdiag.analysis.classify import gather
from kwdiag.engine import load_rules
from kwdiag.pipeline import analyze
from kwdiag.readers import read_events
from kwdiag.timeline import build_timeline

ROOT = Path(__file__).resolve().parent.parent
FACT_RULES = sorted((ROOT / "rules" / "facts").glob("fact-*.toml"))
RULES = load_rules()
T0 = 1_795_258_000.0
ADDRESS = "tcp://127.0.0.1:40001"


# ---------------------------------------------------------------- building a cluster's events
def ev(source: str, kind: str, at: float, worker: str | None = "w1", **fields) -> dict:
    return {"v": 1, "ts": T0 + at, "time": "", "source": source, "kind": kind, "worker": worker, "level": "info",
            "message": "", "pid": 100 if source != "scheduler" else 1, "host": "h", "fields": fields}


def started(at: float = 0.0) -> list[dict]:
    """A worker w1 that started and registered."""
    return [ev("worker", "worker-start", at, address=ADDRESS, name="w1", incarnation=1),
            ev("scheduler", "worker-registered", at + 0.1, address=ADDRESS, name="w1", pid=100, incarnation=1)]


def facts_of(tmp_path: Path, events: list[dict]) -> set[tuple[str, str]]:
    """(fact kind, its main field) of every fact derived for w1's incarnations, through the reader and timeline."""
    tmp_path.mkdir(exist_ok=True)
    by_file: dict[str, list[str]] = {}
    for e in events:
        name = "scheduler.jsonl" if e["source"] == "scheduler" else f"{e['source']}-{e['worker']}.jsonl"
        by_file.setdefault(name, []).append(json.dumps(e))
    for name, lines in by_file.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    read, _, problems = read_events([str(tmp_path)], RULES)
    assert not problems, problems
    tl = build_timeline(read)
    out = set()
    for inc in tl.workers.get("w1", []):
        for f in facts.derive_facts(inc, tl, gather(inc, tl)):
            main = f.get("request") or f.get("reason") or f.get("own_log")
            out.add((f.kind, main))
    return out


def kinds(found: set[tuple[str, str]]) -> set[str]:
    return {k for k, _ in found}


def closed(at: float, reason: str | None = None) -> list[dict]:
    """w1's own orderly close at ``at`` (with ``reason``, if any), and the scheduler's expected removal."""
    fields = {"address": ADDRESS} if reason is None else {"address": ADDRESS, "reason": reason}
    return [ev("worker", "worker-closing", at, **fields),
            ev("scheduler", "worker-removed", at + 0.001, address=ADDRESS, name="w1", how="deregistered",
               expected=True)]


# ---------------------------------------------------------------- fact-cluster-closed: the window
CLOSE_AT = 200.0
EDGE = 0.01


@pytest.mark.parametrize("end, inside", [
    (CLOSE_AT - facts.CLOSE_BEFORE + EDGE, True),
    (CLOSE_AT - facts.CLOSE_BEFORE - EDGE, False),
    (CLOSE_AT, True),
    (CLOSE_AT + facts.CLOSE_AFTER - EDGE, True),
    (CLOSE_AT + facts.CLOSE_AFTER + EDGE, False),
], ids=["just-inside-before", "just-outside-before", "at", "just-inside-after", "just-outside-after"])
def test_an_orderly_end_is_part_of_the_close_within_its_window(tmp_path, end, inside):
    events = started() + closed(end) + [ev("scheduler", "scheduler-close", CLOSE_AT, worker=None, reason=None)]
    assert ("fact-cluster-closed" in kinds(facts_of(tmp_path, events))) is inside


@pytest.mark.parametrize("reason", sorted(facts.CLUSTER_REASONS))
def test_a_cluster_wide_close_reason_is_the_close_itself(tmp_path, reason):
    """No scheduler line at all: the worker's own reason says the cluster was going."""
    assert "fact-cluster-closed" in kinds(facts_of(tmp_path, started() + closed(50.0, reason)))


@pytest.mark.parametrize("reason", ["retired", "lifetime", "signal-15", "worker-close"])
def test_a_reason_of_its_own_is_not_the_cluster_closing(tmp_path, reason):
    """It left for a reason of its own even though the scheduler closed a moment later."""
    events = started() + closed(50.0, reason) + [ev("scheduler", "scheduler-close", 50.5, worker=None, reason=None)]
    assert "fact-cluster-closed" not in kinds(facts_of(tmp_path, events))


@pytest.mark.parametrize("signal", [9, 11])
def test_a_violent_end_seconds_before_the_close_is_not_part_of_it(tmp_path, signal):
    """The class follows from who ended the process, not from when: a SIGKILL 1 s before the close stays one."""
    events = started() + [
        ev("nanny", "worker-exit", 99.0, pid=100, incarnation=1, exitcode=-signal, signal=signal, caused_by=None,
           address=ADDRESS),
        ev("scheduler", "scheduler-close", 100.0, worker=None, reason=None)]
    assert "fact-cluster-closed" not in kinds(facts_of(tmp_path, events))


@pytest.mark.parametrize("after, inside", [(facts.CLOSE_AFTER_LINES, True), (facts.CLOSE_AFTER_LINES + 1, False)],
                         ids=["just-inside", "just-outside"])
def test_without_times_the_close_line_may_follow_the_end_in_the_same_file(tmp_path, after, inside):
    """Old Dask's default layout has no times: in one stream (a LocalCluster's stderr) the workers' stops come
    first and the scheduler's close after them, so the window is counted in lines of that file."""
    untimed = [dict(e, fields=dict(e["fields"], ts_unknown=True)) for e in started() + closed(50.0)]
    filler = [ev("scheduler", "client-connected", 50.0, worker=None, client=f"Client-{i}", ts_unknown=True)
              for i in range(after - 1)]   # the close line is ``after`` lines after the last end line
    close = ev("scheduler", "scheduler-close", 50.0, worker=None, reason=None, ts_unknown=True)
    (tmp_path / "cluster.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [*untimed, *filler, close]))
    tl = build_timeline(read_events([str(tmp_path / "cluster.jsonl")], RULES)[0])
    (inc,) = tl.workers["w1"]
    assert max(e.origin.line for e in inc.end_events) + after == len(untimed) + len(filler) + 1
    assert ("fact-cluster-closed" in {f.kind for f in facts.derive_facts(inc, tl, gather(inc, tl))}) is inside


def test_a_replacement_started_as_an_untimed_cluster_closed_did_not_give_up_waiting(tmp_path):
    """Real Dask 2.9.3 (no times in its default layout): a task's os._exit(1), the nanny's restart, and the
    LocalCluster's close while the replacement still waits to register. Every process that ended is a death: the
    replacement ended in the close (not on a --death-timeout), as did the two healthy workers, whose stops come
    before the scheduler's "Scheduler closing..." in the file."""
    case = ROOT / "sample_logs" / "corpus" / "cases" / "2.9.3" / "018-osexit-li-nn-random-end"
    lines = (case / "cluster.log").read_text().splitlines(keepends=True)
    deaths = sorted((d.worker, d.cause, d.detail) for d in analyze([str(case / "cluster.log")], rules=RULES).deaths)
    assert deaths == [("0", "chose_to_exit", "shutdown"), ("1", "unrecoverable_exception", "os_exit"),
                      ("2", "chose_to_exit", "shutdown"), ("tcp://127.0.0.1:36827", "chose_to_exit", "shutdown")]
    tl = build_timeline(read_events([str(case / "cluster.log")], RULES)[0])
    (replacement,) = tl.workers["tcp://127.0.0.1:36827"]
    found = {f.kind for f in facts.derive_facts(replacement, tl, gather(replacement, tl))}
    assert "fact-cluster-closed" in found and "fact-gave-up-waiting" not in found
    # the same lines pasted without the scheduler's close: nothing says the cluster closed
    cut = next(i for i, line in enumerate(lines) if "Scheduler closing..." in line)
    (tmp_path / "cluster.log").write_text("".join(lines[:cut]))
    deaths = sorted((d.worker, d.cause, d.detail) for d in analyze([str(tmp_path / "cluster.log")], rules=RULES).deaths)
    assert deaths == [("0", "chose_to_exit", "ended"), ("1", "unrecoverable_exception", "os_exit"),
                      ("2", "chose_to_exit", "ended"), ("tcp://127.0.0.1:36827", "chose_to_exit", "death_timeout")]


@pytest.mark.parametrize("reason", sorted(reasons.NANNY_WENT))
def test_the_nanny_going_counts_only_when_the_end_was_orderly(tmp_path, reason):
    """A nanny also closes after its worker crashed: its reason is the close's only for an orderly end."""
    crash = [ev("nanny", "worker-exit", 50.0, pid=100, incarnation=1, exitcode=-9, signal=9, caused_by=None,
                nanny_close_reason=reason, address=ADDRESS)]
    assert "fact-cluster-closed" not in kinds(facts_of(tmp_path / "crash", started() + crash))
    assert "fact-cluster-closed" in kinds(facts_of(tmp_path / "orderly", started() + closed(50.0, reason)))


# ---------------------------------------------------------------- fact-close-requested: the window
@pytest.mark.parametrize("after, inside", [
    (0.0, True),
    (facts.REQUEST_BEFORE - EDGE, True),
    (facts.REQUEST_BEFORE + EDGE, False),
    (-EDGE, False),
], ids=["at", "just-inside", "just-outside", "before-the-request"])
def test_a_retire_request_counts_for_an_end_within_its_window(tmp_path, after, inside):
    request = ev("scheduler", "retire-request", 100.0, worker=None, request="retire")
    request["message"] = f"Retire worker addresses ['{ADDRESS}']"
    events = started() + [request] + closed(100.0 + after)
    found = facts_of(tmp_path, events)
    assert (("fact-close-requested", "retire") in found) is inside, found


def test_a_restart_of_every_worker_names_each_worker(tmp_path):
    restart = ev("scheduler", "close-request", 100.0, worker=None, request="restart", addresses=None)
    assert ("fact-close-requested", "restart") in facts_of(tmp_path, started() + [restart] + closed(101.0))


def test_a_request_naming_another_worker_does_not_count(tmp_path):
    request = ev("scheduler", "retire-request", 100.0, worker=None, request="retire")
    request["message"] = "Retire worker addresses ['tcp://127.0.0.1:40002']"
    assert "fact-close-requested" not in kinds(facts_of(tmp_path, started() + [request] + closed(101.0)))


def test_a_recorded_retirement_is_a_request_unless_the_worker_gave_its_own_reason(tmp_path):
    retired = [ev("scheduler", "worker-removed", 50.0, address=ADDRESS, name="w1", how="retired", expected=True)]
    assert ("fact-close-requested", "retire") in facts_of(tmp_path, started() + retired)
    own = [ev("worker", "worker-closing", 49.9, address=ADDRESS, reason="signal-15")] + retired
    assert "fact-close-requested" not in kinds(facts_of(tmp_path / "own", started() + own))


def _retired_by_address(tmp_path: Path, events: list[dict]) -> dict[str, bool]:
    """For each worker the scheduler removed (named by address only): whether a retire request covers it."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "scheduler.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    read, _, problems = read_events([str(tmp_path)], RULES)
    assert not problems, problems
    tl = build_timeline(read)
    return {inc.address: any(f.kind == "fact-close-requested" for f in facts.derive_facts(inc, tl, gather(inc, tl)))
            for inc in tl.incarnations() if inc.ended}


def _by_names(at: float, names: str) -> dict:
    request = ev("scheduler", "retire-request", at, worker=None, request="retire")
    request["message"] = f"Retire worker names {names}"
    return request


def _removal(at: float, port: int) -> dict:
    return ev("scheduler", "worker-removed", at, worker=None, address=f"tcp://10.0.0.1:{port}", how="deregistered")


def test_a_retirement_by_names_never_tied_to_addresses_covers_as_many_removals_as_it_names(tmp_path):
    """Dask's retire_workers logs the names it retires, then removes those workers (the scheduler's lines give
    their addresses only): the removals after the request, as many as it names, are retirements; the next is not,
    nor one before the request."""
    events = [_removal(10.0, 1), _by_names(20.0, "(5, 6)"), _removal(20.1, 2), _removal(20.2, 3), _removal(20.3, 4)]
    assert _retired_by_address(tmp_path, events) == {
        "tcp://10.0.0.1:1": False, "tcp://10.0.0.1:2": True, "tcp://10.0.0.1:3": True, "tcp://10.0.0.1:4": False}


def test_a_retirement_by_names_covers_no_removal_when_a_worker_bears_one_of_its_names_or_it_is_too_old(tmp_path):
    named = [ev("scheduler", "worker-registered", 1.0, worker="5", address="tcp://10.0.0.1:9", name="5")]
    assert _retired_by_address(tmp_path / "named", named + [_by_names(20.0, "[5, 6]"), _removal(20.1, 2)]) \
        == {"tcp://10.0.0.1:2": False}
    late = 20.0 + facts.REQUEST_BEFORE
    assert _retired_by_address(tmp_path / "late", [_by_names(20.0, "(5, 6)"), _removal(late - EDGE, 2),
                                                   _removal(late + EDGE, 3)]) \
        == {"tcp://10.0.0.1:2": True, "tcp://10.0.0.1:3": False}


# ---------------------------------------------------------------- fact-vanished, fact-silent-exit
@pytest.mark.parametrize("how, expected, vanished", [
    ("connection-closed", False, True),
    ("deregistered", True, False),
    ("retired", True, False),
    ("heartbeat-timeout", False, False),
])
def test_a_worker_vanished_only_when_its_removal_was_not_expected(tmp_path, how, expected, vanished):
    removed = [ev("scheduler", "worker-removed", 50.0, address=ADDRESS, name="w1", how=how, expected=expected)]
    found = facts_of(tmp_path, started() + removed)
    assert (("fact-vanished", True) in found) is vanished, found


@pytest.mark.parametrize("traceback, silent", [(False, True), (True, False)])
def test_a_non_zero_exit_without_a_traceback_is_a_silent_exit(tmp_path, traceback, silent):
    events = started()
    if traceback:
        events.append(ev("worker", "worker-fatal", 49.0, exception="RuntimeError", error="boom", traceback="..."))
    events.append(ev("nanny", "worker-exit", 50.0, pid=100, incarnation=1, exitcode=3, signal=None, caused_by=None,
                     address=ADDRESS, stderr_tail=[]))
    assert ("fact-silent-exit" in kinds(facts_of(tmp_path, events))) is silent


# ---------------------------------------------------------------- the reasons
@pytest.mark.parametrize("reason", sorted(reasons.SCHEDULER_LOST | reasons.START_FAILED | reasons.UNCHOSEN)
                         + ["failure-to-start-OSError"])
def test_a_close_nobody_chose_is_not_a_choice(reason):
    assert not reasons.chosen(reason)


@pytest.mark.parametrize("reason", ["signal-15", "retired", "lifetime", "scheduler-close", "restart"])
def test_a_stated_reason_is_a_choice(reason):
    assert reasons.chosen(reason)


def test_the_rules_name_the_one_list_of_cluster_close_reasons():
    """closing-cluster votes on the reason alone, so it names CLUSTER_CLOSE (not the nanny's reasons, which
    need an orderly end: the fact layer's rule); its words name each reason of the list it reads."""
    rule = next(r for r in RULES.rules if r.id == "closing-cluster")
    assert set(rule.event_fields["reason"]) == reasons.CLUSTER_CLOSE
    for reason in reasons.CLUSTER_CLOSE:
        assert f"`{reason}`" in rule.why


# ---------------------------------------------------------------- the rules say what the layer does
def _why(rule_id: str) -> str:
    return tomllib.loads((ROOT / "rules" / "facts" / f"{rule_id}.toml").read_text())["why"]


def test_each_fact_rule_states_its_windows_and_reasons_with_the_layers_numbers():
    closed_why = _why("fact-cluster-closed")
    assert f"{facts.CLOSE_BEFORE:g} s before" in closed_why and f"{facts.CLOSE_AFTER:g} s after" in closed_why
    assert f"at most {facts.CLOSE_AFTER_LINES} lines after" in closed_why
    for reason in facts.CLUSTER_REASONS:
        assert f"`{reason}`" in closed_why, reason
    for rule_id in ("fact-close-requested-retire", "fact-close-requested-restart"):
        assert f"at most {facts.REQUEST_BEFORE:g} s before" in _why(rule_id), rule_id


# ---------------------------------------------------------------- real fragments through the pipeline
def _pipeline_examples():
    for path in FACT_RULES:
        for i, ex in enumerate(tomllib.loads(path.read_text()).get("examples", {}).get("pipeline", [])):
            yield pytest.param(path.stem, ex, id=f"{path.stem}-{i}")


def test_every_fact_rule_has_a_real_fragment_through_the_pipeline():
    have = {p.values[0] for p in _pipeline_examples()}
    assert have == {p.stem for p in FACT_RULES}, {p.stem for p in FACT_RULES} - have


def _case_lines(source: str) -> set[str]:
    case = ROOT / source.split(" (")[0]
    out: set[str] = set()
    for f in case.iterdir():
        raw = f.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        out.update(raw.decode("utf-8", "replace").splitlines())
    return out


@pytest.mark.parametrize("rule_id, example", list(_pipeline_examples()))
def test_a_fact_rules_real_fragment_gives_its_verdict(tmp_path, rule_id, example):
    real = _case_lines(example["from"])
    for name, text in example["files"].items():
        lines = text.splitlines()
        assert lines and all(line in real for line in lines), f"{name}: a line not in {example['from']}"
        (tmp_path / name).write_text(text)
    report = analyze([str(tmp_path)], rules=RULES)
    want = example["expect"]
    got = [(d.worker, d.cause, d.detail, d.rules) for d in report.deaths]
    assert any((w, c, d) == (want["worker"], want["cause"], want["detail"]) and rule_id in rules
               for w, c, d, rules in got), got
    assert re.search(r"\(Dask [\d.]+\)$", example["from"])


@pytest.mark.parametrize("between, vanished", [(0, True), (2, True), (3, False)])
def test_a_connection_line_counts_only_just_before_the_removal(tmp_path, between, vanished):
    """The scheduler's 'Connection to ... has been closed.' says the worker simply went only when it comes at most
    kinds.NEAR_REMOVAL lines before the removal (the reader keeps it only then). Real lines of a real case, with
    other real lines of the same log put between them."""
    from kwdiag.kinds import NEAR_REMOVAL

    case = ROOT / "sample_logs/corpus/cases/2026.8.0/002-sigkill-cli-nonanny-fixed-end/scheduler.log"
    lines = case.read_text().splitlines()
    removal = next(i for i, line in enumerate(lines) if "Remove worker" in line and "Connection to" in lines[i - 1])
    filler = [line for line in lines if "Starting established connection" in line][:between]
    assert len(filler) == between and NEAR_REMOVAL == 3
    (tmp_path / "scheduler.log").write_text("\n".join([lines[removal - 1], *filler, lines[removal]]) + "\n")
    report = analyze([str(tmp_path)], rules=RULES)
    assert len(report.deaths) == 1
    assert ("fact-vanished-scheduler-only" in report.deaths[0].rules) is vanished, report.deaths[0].rules


# ---------------------------------------------------------------- fact-counted-death
def _killed_worker_lines() -> list[str]:
    """Real KilledWorker lines of the corpus and the samples: (task, count, line)."""
    out = []
    for path in sorted((ROOT / "sample_logs").glob("**/*.log")):
        for line in path.read_text(errors="replace").splitlines():
            m = re.search(r"Task (\S+) marked as failed because (\d+) workers died", line)
            if m:
                out.append((m.group(1), int(m.group(2)), line))
    return out


def test_a_killed_worker_count_beyond_the_deaths_shown_is_that_many_unseen_deaths(tmp_path):
    """A paste of the KilledWorker line alone: the scheduler counted N deaths, none is shown; N deaths of
    unknown cause, counted against the task."""
    task, n, line = next(x for x in _killed_worker_lines() if x[1] >= 2)
    (tmp_path / "scheduler.log").write_text(line + "\n")
    report = analyze([str(tmp_path)], rules=RULES)
    assert [(d.worker, d.cause, d.detail, d.rules) for d in report.deaths] == [
        ("unseen worker", "unknown", "no_evidence", ("fact-counted-death",))] * n
    (blame,) = report.killed_workers
    assert blame.task == task and len(blame.deaths) == n and blame.fair is None


def test_two_tasks_that_lost_the_same_workers_do_not_double_the_unseen_deaths(tmp_path):
    """Two KilledWorkers in one paste, counting 2 and 1: the later count is covered by the deaths already made
    for the earlier one (whichever came first), so there are 2 unseen deaths, not 3."""
    lines = _killed_worker_lines()
    two = next(x for x in lines if x[1] == 2)
    one = next(x for x in lines if x[1] == 1 and x[0] != two[0])
    (tmp_path / "scheduler.log").write_text(two[2] + "\n")
    (tmp_path / "later.log").write_text(one[2] + "\n")
    report = analyze([str(tmp_path)], rules=RULES)
    assert sorted((d.worker, d.incarnation) for d in report.deaths) == [("unseen worker", 1), ("unseen worker", 2)]
    assert sorted(len(b.deaths) for b in report.killed_workers) == [1, 2]


def test_a_worker_that_never_registered_and_got_sigterm_did_not_give_up_waiting():
    """Real Dask 2021.11.2 (corpus 039/040): a `dask worker` that kept "Waiting to connect" (the scheduler refused
    its version) was ended by the final close's SIGTERM ("Exiting on signal 15"): that signal, not its
    --death-timeout, ended the wait (was chose_to_exit/death_timeout)."""
    from kwdiag.pipeline import analyze

    cases = Path(__file__).resolve().parent.parent / "sample_logs" / "corpus" / "cases" / "2021.11.2"
    for case in ("039-versions-cli-nn-fixed-start", "040-versions-cli-nonanny-random-start"):
        log = cases / case / "w1.log"
        assert "Exiting on signal 15" in log.read_text() and "Waiting to connect" in log.read_text()
        assert [(d.cause, d.detail) for d in analyze([str(log)]).deaths] == [("chose_to_exit", "sigterm")], case
