"""Timelines and classification as pure functions over kwdiag ``Event``s (no files, no processes)."""

from __future__ import annotations

from pathlib import Path

from kwdiag.analysis import analyze_events
from kwdiag.engine import load_rules
from kwdiag.events import Event, Origin
from kwdiag.timeline import build_timeline

RULES = load_rules()
_line = iter(range(1, 10**6))


def ev(ts, source, kind, worker=None, **fields):
    return Event(ts=ts, source=source, kind=kind, worker=worker, fields=fields, origin=Origin("run.jsonl", next(_line)))


def start(ts, w, n, port):
    return [ev(ts, "nanny", "worker-spawn", w, pid=1000 + n, incarnation=n),
            ev(ts + 0.1, "worker", "worker-start", w, address=f"tcp://h:{port}", name=w, incarnation=n),
            ev(ts + 0.2, "scheduler", "worker-registered", w, address=f"tcp://h:{port}", name=w, pid=1000 + n)]


def exit_(ts, w, n, **f):
    return ev(ts, "nanny", "worker-exit", w, pid=1000 + n, incarnation=n, **f)


def removed(ts, w, port, **f):
    return ev(ts, "scheduler", "worker-removed", w, address=f"tcp://h:{port}", name=w, **f)


def test_incarnations_split_on_restart():
    evs = start(0, "a", 1, 1) + [exit_(5, "a", 1, exitcode=-9, signal_name="SIGKILL", caused_by=None)] + start(6, "a", 2, 2)
    tl = build_timeline(evs)
    incs = tl.workers["a"]
    assert [(i.number, i.address, i.ended) for i in incs] == [(1, "tcp://h:1", True), (2, "tcp://h:2", False)]


def test_sigkill_and_noticed_after():
    evs = start(0, "a", 1, 1) + [exit_(5, "a", 1, exitcode=-9, signal_name="SIGKILL", caused_by=None),
                                 removed(5.4, "a", 1, how="connection-closed", expected=False, noticed_after=0.4)]
    r = analyze_events(evs, RULES)
    (d,) = r.deaths
    assert (d.worker, d.incarnation, d.cause, d.detail) == ("a", 1, "sudden_exit", "sigkill")
    assert d.noticed_by == "scheduler" and d.noticed_after == 0.4
    assert d.failure and d.hints


def test_task_error_is_never_a_death():
    evs = start(0, "a", 1, 1) + [ev(3, "scheduler", "task-erred", "a", key="div-1", exception="ZeroDivisionError",
                                    error="division by zero")]
    r = analyze_events(evs, RULES)
    assert r.deaths == ()
    assert [(t.task, t.exception) for t in r.task_errors] == [("div-1", "ZeroDivisionError")]


def test_cluster_shutdown_is_chosen_and_not_a_failure():
    evs = start(0, "a", 1, 1) + start(0, "b", 1, 2) + [
        ev(10, "scheduler", "scheduler-close", reason="signal-15"),
        ev(10.1, "worker", "worker-closing", "a", reason="scheduler-close"),
        ev(10.2, "worker", "worker-closing", "b", reason="signal-15"),
        ev(10.3, "worker", "worker-end", "b", reason="signal-15"),
    ]
    r = analyze_events(evs, RULES)
    assert sorted((d.worker, d.cause, d.detail) for d in r.deaths) == [
        ("a", "chose_to_exit", "shutdown"), ("b", "chose_to_exit", "shutdown")]
    assert not r.failures and "no failures" in r.verdict()


def test_agreeing_sources_raise_confidence_and_disagreeing_lower_it():
    base = start(0, "a", 1, 1)
    alone = analyze_events(base + [exit_(5, "a", 1, exitcode=-11, signal_name="SIGSEGV", caused_by=None)], RULES)
    dump = ev(4.9, "worker", "fatal-signal", "a", rule="faulthandler-segfault", signal_name="SIGSEGV", incarnation=1)
    agree = analyze_events(base + [dump, exit_(5, "a", 1, exitcode=-11, signal_name="SIGSEGV", caused_by=None)], RULES)
    odd = ev(4.9, "scheduler", "heartbeat-missed", "a", address="tcp://h:1")  # a rival story: a missed heartbeat
    disagree = analyze_events(base + [odd, exit_(5, "a", 1, exitcode=-11, signal_name="SIGSEGV", caused_by=None)], RULES)
    c0, c1, c2 = (x.deaths[0].confidence for x in (alone, agree, disagree))
    assert all(x.deaths[0].detail == "segfault" for x in (alone, agree, disagree))
    assert c1 > c0 > c2
    assert "sudden_exit/heartbeat_timeout" in disagree.deaths[0].disagreement


def test_no_evidence_is_unknown_not_a_guess():
    evs = start(0, "a", 1, 1) + [exit_(5, "a", 1, exitcode=0, caused_by=None)]
    (d,) = analyze_events(evs, RULES).deaths
    assert d.cause == "unknown" and d.confidence == 0.0


def test_kernel_oom_matched_by_pid_refines_sigkill():
    evs = start(0, "a", 1, 1) + start(0, "b", 1, 2)[:0] + [
        exit_(5, "a", 1, exitcode=-9, signal_name="SIGKILL", caused_by=None),
        Event(ts=4.9, source="kernel", kind="kernel-oom-kill", worker=None,
              fields={"pid": 1001, "comm": "python3", "rule": "kernel-oom-kill"}, origin=Origin("dmesg.txt", 3)),
        Event(ts=4.9, source="kernel", kind="kernel-oom-kill", worker=None,
              fields={"pid": 4242, "comm": "python3", "rule": "kernel-oom-kill"}, origin=Origin("dmesg.txt", 9)),
    ]
    (d,) = analyze_events(evs, RULES).deaths
    assert (d.cause, d.detail) == ("sudden_exit", "oom_killer") and d.confidence > 0.9
    assert [e.line for e in d.evidence if e.file == "dmesg.txt"] == [3]  # not the other process's kill


def _kw_run(deaths):
    evs = []
    port = 10
    for i, (w, fields, blamed, running) in enumerate(deaths):
        port += 1
        evs += start(i * 10, w, 1, port)
        evs.append(exit_(i * 10 + 5, w, 1, running_tasks=running, **fields))
        evs.append(removed(i * 10 + 5.1, w, port, how="connection-closed", expected=False, blamed=blamed))
    evs.append(ev(100, "scheduler", "killed-worker", key="bad-task", deaths=len(deaths), allowed_failures=len(deaths) - 1,
                  workers=[d[0] for d in deaths], last_worker=deaths[-1][0]))
    return analyze_events(evs, RULES)


SEGV = dict(exitcode=-11, signal=11, signal_name="SIGSEGV", caused_by=None)
MEMK = dict(exitcode=-15, signal=15, signal_name="SIGTERM", caused_by="memory", memory_limit=2**30, peak_rss=2**30)


def test_killed_worker_blame_fair():
    r = _kw_run([("a", SEGV, ["bad-task"], ["bad-task"]), ("b", SEGV, ["bad-task"], ["bad-task"])])
    (k,) = r.killed_workers
    assert k.task == "bad-task" and len(k.deaths) == 2 and k.fair is True
    assert k.causes == ("sudden_exit/segfault",)


def test_killed_worker_blame_unfair_mixed_causes_and_other_tasks():
    r = _kw_run([("a", SEGV, ["bad-task"], ["bad-task"]), ("b", MEMK, ["bad-task"], ["bad-task", "other-task"])])
    (k,) = r.killed_workers
    assert k.fair is False and len(k.causes) == 2
    assert any("allowed" in h.text for h in k.hints)
    r = _kw_run([("a", SEGV, ["bad-task"], ["bad-task", "x"]), ("b", SEGV, ["bad-task"], ["bad-task", "x"])])
    assert r.killed_workers[0].fair is False
    assert any("other tasks" in s for s in r.killed_workers[0].reasons)


def test_memory_hint_uses_observed_values():
    evs = start(0, "a", 1, 1) + [exit_(5, "a", 1, **MEMK)]
    (d,) = analyze_events(evs, RULES).deaths
    assert (d.cause, d.detail) == ("nanny_memory_restart", "memory_limit")
    text = " ".join(h.text for h in d.hints)
    assert "1GiB" in text and "2GiB" in text  # peak seen, and a concrete new limit


def test_fingerprint_is_stable_across_runs():
    a = analyze_events(start(0, "a", 1, 1) + [exit_(5, "a", 1, **SEGV)], RULES).deaths[0]
    b = analyze_events(start(500, "a", 1, 7) + [exit_(505, "a", 1, **SEGV)], RULES).deaths[0]
    assert a.fingerprint == b.fingerprint and a.at != b.at


def test_fix_templates_drop_what_was_not_observed():
    from kwdiag.analysis.remedies import fill_template

    t = "[[Reached {peak} of {memory_limit}. ]]Use [[--memory-limit {suggested_memory}||a bigger --memory-limit]]."
    assert fill_template(t, {"peak": "1GiB", "memory_limit": "1GiB", "suggested_memory": "2GiB"}) == \
        "Reached 1GiB of 1GiB. Use --memory-limit 2GiB."
    assert fill_template(t, {}) == "Use a bigger --memory-limit."
    assert fill_template('scheduler_options={{"allowed_failures": {n}}}', {"n": 5}) == \
        'scheduler_options={"allowed_failures": 5}'


def test_fix_templates_filled_once_per_values_are_filled_as_each_time():
    """``fill_template`` chooses a template's ``[[A||B]]`` parts once per names observed and keeps one string per
    fix: values that are equal but written differently (1, 1.0, True), formats and index fields must still be
    filled as a fresh fill would."""
    from kwdiag.analysis.remedies import _fill, fill_template

    t = "n={n} r={n!r} f={n:>4} [[has {x}||no x]] i={l[0]}"
    cases = [{"n": 1, "l": (1,)}, {"n": 1.0, "l": (1,)}, {"n": True, "l": (1,)}, {"n": 1, "x": 2, "l": (3,)},
             {"n": "1", "l": "ab"}, {"n": 1, "l": [1]}]   # the last one unhashable
    for obs in cases * 2:
        assert fill_template(t, obs) == _fill(t, obs), obs
    assert len({fill_template(t, obs) for obs in cases}) == 5


def test_event_rules_matched_once_per_values_match_as_each_time():
    """``RuleSet.match_event`` remembers its answer per kind and tested values: for every rule's own kind and
    fields, equal-but-different values (0, False) and unhashable ones, the answer is the rules' own."""
    values = [None, 0, False, 1, True, 9, 15, 137, -9, "SIGKILL", "x" * 600, ["a"], "memory", 0.5]
    checked = 0
    for r in RULES.event_rules:
        for kind in r.event_kinds:
            names = list(r.event_fields)
            for v in values:
                fields = {n: v for n in names}
                want = [x.id for x in RULES.events_by_kind[kind] if x.match_event(kind, fields)]
                for _ in range(2):
                    assert [x.id for x in RULES.match_event(kind, fields)] == want, (kind, fields)
                checked += 1
    assert checked > 100


# ---------------------------------------------------------------- shapes pastes take (pastes6's first run)
def _paste_deaths(tmp_path, lines: list[str]) -> list[tuple[str, str, str]]:
    from kwdiag.pipeline import analyze

    (tmp_path / "paste.txt").write_text("\n".join(lines) + "\n")
    return sorted((d.worker, d.cause, d.detail) for d in analyze([str(tmp_path / "paste.txt")], rules=RULES).deaths)


def _corpus_lines(case: str, *numbers: int, cut: int = 0) -> list[str]:
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "sample_logs/corpus/cases" / case
    lines = path.read_text().splitlines()
    return [lines[n - 1][cut:] for n in numbers]


LOCALCLUSTER_CLOSE = "2026.8.0/015-sysexit-li-nn-random-end/cluster.log"


def test_nannies_closing_in_one_stream_are_as_many_workers_as_the_order_of_their_lines_shows(tmp_path):
    """A LocalCluster's close in its one stream, pasted without the time column: 'Nanny asking worker to close',
    'Closing Nanny at A', 'Closing Nanny at B', 'Nanny asking worker to close', then the scheduler's removal of
    worker 0. Dask prints a nanny's 'Closing' before its 'asking', so the first 'asking' is a third nanny's (its
    'Closing' came before the paste): three workers ended, not two (the removal is one of them)."""
    lines = _corpus_lines(LOCALCLUSTER_CLOSE, 126, 127, 128, 129, 134, cut=26)
    assert lines[0].startswith("distributed.nanny - INFO - Nanny asking worker to close")
    assert _paste_deaths(tmp_path, lines) == sorted(
        [("0", "chose_to_exit", "shutdown")] + [("unnamed worker", "chose_to_exit", "shutdown")] * 2)
    # with the time column and the two workers' own stops: still three, two of them named by their stops
    lines = _corpus_lines(LOCALCLUSTER_CLOSE, 125, 126, 127, 128, 129, 130, 135)
    assert _paste_deaths(tmp_path, lines) == sorted(
        [("tcp://127.0.0.1:35987", "chose_to_exit", "shutdown"), ("tcp://127.0.0.1:44017", "chose_to_exit", "shutdown"),
         ("unnamed worker", "chose_to_exit", "shutdown")])


def test_one_memory_kill_printed_twice_is_one_death(tmp_path):
    """The nanny logs its memory kill of a pid once; two handlers (Dask's and an orchestrator's, or the root
    logger's too) print that record twice. One death; two kills of two pids stay two."""
    case = "2026.8.0/012-nannymem-li-nn-fixed-end/cluster.log"
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "sample_logs/corpus/cases" / case).read_text().splitlines()
    kills = [line for line in text if "exceeded 95% memory budget" in line]
    assert len(kills) >= 1
    one = _paste_deaths(tmp_path, [kills[0], kills[0]])
    assert len(one) == 1 and one[0][1:] == ("nanny_memory_restart", "memory_limit")
    corpus = Path(__file__).resolve().parent.parent / "sample_logs/corpus/cases/2026.8.0"
    two = sorted({line for log in corpus.glob("*/*.log") for line in log.read_text().splitlines()
                  if "exceeded 95% memory budget" in line})[:2]
    assert two[0].split("pid=")[1][:6] != two[1].split("pid=")[1][:6]
    assert [d[1:] for d in _paste_deaths(tmp_path, two)] == [("nanny_memory_restart", "memory_limit")] * 2


def test_a_line_pasted_in_an_inline_code_span_reads_as_the_line(tmp_path):
    """'...Restarting worker`': a paste inside an inline code span keeps the closing backtick on the line;
    the rules' line ends ($) must not see it."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "sample_logs/corpus/cases/2024.12.1"
    line = next(x for p in sorted(root.glob("*/*.log")) for x in p.read_text().splitlines()
                if x.endswith("distributed.nanny - WARNING - Restarting worker"))
    plain = _paste_deaths(tmp_path, [line])
    assert plain and _paste_deaths(tmp_path, [line + "`"]) == plain
    assert _paste_deaths(tmp_path, ["`" + line + "`"]) == plain


# ---------------------------------------------------------------- pastes, pastes3, pastes4: their misses
def _paste_lines(case: str, *numbers: int, cut: int = 0) -> list[str]:
    """Lines of a real paste (sample_logs/pastes*/CASE/paste.txt), by line number."""
    from pathlib import Path

    lines = (Path(__file__).resolve().parent.parent / "sample_logs" / case / "paste.txt").read_text().splitlines()
    return [lines[n - 1][cut:] for n in numbers]


def test_the_old_retire_line_names_the_workers_it_retires(tmp_path):
    """'Retire workers {<Worker ADDRESS, name: N, ...>}' (distributed 2.3.0 to 2022.01): the scheduler retired
    those workers, so their removal that follows is a retirement, in any line layout."""
    for case, numbers in (("pastes/distributed-4752", (2, 3, 4)), ("pastes3/distributed-4394", (4, 5, 6, 7))):
        deaths = _paste_deaths(tmp_path, _paste_lines(case, *numbers))
        assert [d[1:] for d in deaths] == [("chose_to_exit", "retired")], case


def test_a_broken_scheduler_connection_names_the_worker_it_closes(tmp_path):
    """'Connection to scheduler broken. Closing without reporting. ID: ... Address A Status: ...' (2022.6.0 to
    2022.10.2) names its worker: in a stream several workers share, each goes to its own, one of them seen
    by no other line."""
    deaths = _paste_deaths(tmp_path, _paste_lines("pastes/distributed-6925", *range(1, 10)))
    assert deaths == [("database-worker", "chose_to_exit", "ended"), ("general-worker-0", "chose_to_exit", "ended"),
                      ("general-worker-2", "chose_to_exit", "ended"),
                      ("tcp://127.0.0.1:58633", "chose_to_exit", "scheduler_lost")]


def test_a_traceback_inside_a_json_string_is_read(tmp_path):
    """Docker output pasted as a platform's JSON message keeps its quotes escaped (File \\"...\\"): the frames
    of the dask-spec command (SpecCluster's and Coiled's worker command) are still read."""
    lines = _paste_lines("pastes/feedback-189", *range(2, 23))
    assert any('File \\"' in x for x in lines)
    assert [d[1] for d in _paste_deaths(tmp_path, lines)] == ["unrecoverable_exception"]


def test_old_nanny_words_for_a_dead_worker(tmp_path):
    """'Discovered failed worker' (1.10 to 1.17), then 'Restarting worker...' (1.15 to 1.17): one death whose
    cause the lines do not give."""
    line = _paste_lines("pastes3/distributed-1066", 2)[0]
    assert _paste_deaths(tmp_path, [line]) == [("unnamed worker", "unknown", "restarted")]
    restart = line.replace("Discovered failed worker", "Restarting worker...")  # 1.16.2 nanny.py, same layout
    assert [d[1:] for d in _paste_deaths(tmp_path, [line, restart, line, restart])] == [("unknown", "restarted")] * 2


def test_each_nanny_reports_its_failed_start_once(tmp_path):
    """Two 'Failed while trying to start worker process: X' lines (distributed 2.x to 2022.5) in one stream are
    two nannies' workers (dask-worker --nprocs 2), not one failure told twice; 'Failed to connect to process'
    (2022.4.2 to 2022.7.1) is the same failure with its traceback."""
    deaths = _paste_deaths(tmp_path, _paste_lines("pastes3/distributed-3876", *range(1, 15)))
    assert [d[1] for d in deaths] == ["unrecoverable_exception"] * 2
    deaths = _paste_deaths(tmp_path, _paste_lines("pastes4/dask-cuda-986", *range(1, 22)))
    assert deaths == [("unnamed worker", "unrecoverable_exception", "startup_failure")]


def test_each_worker_stops_once(tmp_path):
    """Worker.close prints 'Stopping worker' (no address: it had none yet) once; three in one stream are three
    workers, and the nanny's kills that follow go to them."""
    deaths = _paste_deaths(tmp_path, _paste_lines("pastes3/distributed-5662", *range(9, 20)))
    assert deaths == [("unnamed worker", "chose_to_exit", "death_timeout"),
                      ("unnamed worker", "chose_to_exit", "ended"), ("unnamed worker", "chose_to_exit", "ended"),
                      ("unnamed worker", "unknown", "close_timeout")]


def test_the_old_memory_kill_repeats_until_the_process_is_gone(tmp_path):
    """Before 2022.6 the nanny printed 'Worker exceeded 95% memory budget. Restarting' (no pid) on each tick of
    its 100 ms monitor while the terminated process lived: two such lines and one restart are one death; two
    and two restarts are two (two workers killed at once); a kill after a restart is the next process's."""
    lines = _paste_lines("pastes3/pathml-299", *range(1, 22))
    deaths = _paste_deaths(tmp_path, lines)
    memory = ("unnamed worker", "nanny_memory_restart", "memory_limit")
    restarted = ("unnamed worker", "unknown", "restarted")
    assert deaths == [memory] * 8 + [restarted] * 2
    kill, restart = lines[2], lines[4]
    assert _paste_deaths(tmp_path, [kill, kill, restart, restart]) == [memory] * 2
    assert _paste_deaths(tmp_path, [kill, kill, kill, restart]) == [memory]


def test_the_windows_memory_escalation_is_a_memory_kill_once_per_pid(tmp_path):
    """'is slow to terminate; trying again' (Windows, 2022.6.0 on): the nanny's memory kill escalating, printed on
    every tick while that pid lives (each failed kill raises again): one death."""
    line = _paste_lines("pastes4/distributed-7858", 1)[0]
    assert _paste_deaths(tmp_path, [line] * 3) == [("tcp://127.0.0.1:60050", "nanny_memory_restart", "memory_limit")]


def test_native_crash_reports_without_a_dask_line(tmp_path):
    """glibc's abort banner names a worker by its process title (dask-worker [ADDRESS]); the kernel's segfault and
    general-protection lines name a process by pid: one death each."""
    deaths = _paste_deaths(tmp_path, _paste_lines("pastes4/xgboost-6469", *range(2, 8)))
    assert deaths == [("tcp://172.16.4.18:34761", "sudden_exit", "signal_6")]
    deaths = _paste_deaths(tmp_path, _paste_lines("pastes/distributed-2243", *range(1, 13)))
    assert deaths == [(f"process {pid}", "sudden_exit", "segfault") for pid in (24623, 24625, 24634, 26421)]


def test_killedworkers_of_two_clusters_count_their_deaths_apart(tmp_path):
    """Two KilledWorkers whose last workers are on different clusters (tcp on the loopback address, tls on
    another host: two tests in one CI summary) do not share the deaths they counted."""
    from kwdiag.pipeline import analyze

    lines = _paste_lines("pastes3/benchmarks-1308", 1, 2)
    (tmp_path / "paste.txt").write_text("\n".join(lines) + "\n")
    unseen = ("unseen worker", "unknown", "no_evidence")
    assert [(d.worker, d.cause, d.detail) for d in analyze([str(tmp_path / "paste.txt")], rules=RULES).deaths] \
        == [unseen] * 8
    # the second on the first one's cluster: the deaths it counted may be the first one's
    same = lines[1].replace("tls://10.0.32.47:45841", "tcp://127.0.0.1:33210")
    (tmp_path / "paste.txt").write_text("\n".join([lines[0], same]) + "\n")
    assert [(d.worker, d.cause, d.detail) for d in analyze([str(tmp_path / "paste.txt")], rules=RULES).deaths] \
        == [unseen] * 4


def _corpus_line(version: str, case: str, file: str, needle: str) -> str:
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "sample_logs" / "corpus" / "cases" / version / case / file
    return next(line for line in path.read_text().splitlines() if needle in line)


def test_a_killedworker_count_dated_before_the_release_that_fixed_it_is_one_death_more(tmp_path):
    """Until 2023.8.0 the scheduler's 'marked as failed because N workers died' printed allowed-failures, one
    less than the deaths (the client's 'on N different workers' until 2023.9.3). A line dated before the fix is
    N + 1 deaths; an undated one, or one dated later but at INFO (old versions still run), is N with the other
    reading said; the ERROR level (2024.3.0 on) prints the deaths."""
    from kwdiag.pipeline import analyze

    def run(*lines: str):
        (tmp_path / "paste.txt").write_text("\n".join(lines) + "\n")
        r = analyze([str(tmp_path / "paste.txt")], rules=RULES)
        kw = r.killed_workers[0]
        fix = next(h.text for h in kw.hints if h.runtime == "dask")
        return ([(d.worker, d.cause, d.detail) for d in r.deaths], kw.allowed_failures,
                [x for x in kw.reasons if "one less than the deaths" in x], fix)

    unseen = ("unseen worker", "unknown", "no_evidence")
    dated_2022 = _paste_lines("pastes7/staged-recipes-151", 2)[0]          # "3 workers died", 2022-07-13
    deaths, af, said, fix = run(dated_2022)
    assert (deaths, af, said) == ([unseen] * 4, 3, []) and "allowed-failures: 5` (now 3)" in fix
    # Dask 2022.12.1 run in 2026 with allowed-failures 1 (two deaths): INFO, dated after the fix
    old_info = _corpus_line("2022.12.1", "069-killedworker-cli-nn-random-mid", "scheduler.log", "marked as failed")
    deaths, af, said, fix = run(old_info)
    assert deaths == [unseen] and af is None and "now 0 or 1" in fix
    assert said == ["Dask releases before 2023.8.0 print the allowed-failures setting here, one less than the "
                    "deaths: if one of them wrote this log, 2 workers died"]
    # its client's KilledWorker, undated: "on 1 different workers" (two deaths); fixed in 2023.9.3
    client = _corpus_line("2022.12.1", "069-killedworker-cli-nn-random-mid", "client.log", "different workers")
    deaths, af, said, fix = run(client)
    assert deaths == [unseen] and len(said) == 1 and "before 2023.9.3" in said[0]
    # Dask 2024.12.1 (allowed-failures 2, three deaths): the ERROR line prints the deaths
    new_error = _corpus_line("2024.12.1", "070-killedworker-lw-nn-fixed-mid", "cluster.log", "marked as failed")
    deaths, af, said, fix = run(new_error)
    assert (deaths, af, said) == ([unseen] * 3, 2, []) and "(now 2)" in fix
    # with its client's undated KilledWorker: the scheduler's ERROR line dates the cluster, no other reading
    client_2024 = _corpus_line("2024.12.1", "070-killedworker-lw-nn-fixed-mid", "cluster.log", "different workers")
    assert run(new_error, client_2024)[:3] == ([unseen] * 3, 2, [])


def test_a_start_timeout_never_has_an_exit_line_of_its_own(tmp_path):
    """distributed 1.21 WorkerProcess.start: after 'Failed to start worker process.  Restarting' the nanny terminates
    that process and starts another, and _on_exit ignores the old one's exit ('Ignore exit of old process instance'):
    an exit line next to it is another process's death, and a start that times out after a 'Restarting worker' is
    the restarted process's."""
    timeout, exit_, restart = _paste_lines("pastes2/dask-jobqueue-20-1", 1, 2, 8)   # 1.21's lines, as pasted
    deaths = _paste_deaths(tmp_path, [timeout, exit_, restart, timeout])
    assert sorted(d[2] for d in deaths) == ["start_timeout", "start_timeout", "unknown_signal"]


def test_removed_worker_is_the_end_of_one_removal_or_a_removal_by_itself(tmp_path):
    """1.x's scheduler logs "Remove worker X" first and "Removed worker X" last in one removal: the pair is one
    death, and a "Removed worker" whose first half the paste cut off is a death too."""
    remove, removed = _paste_lines("pastes5/distributed-1189", 5, 6)
    alone = _paste_lines("pastes5/distributed-1189", 1)[0]
    assert [d[0] for d in _paste_deaths(tmp_path, [remove, removed])] == ["tcp://192.168.1.203:45998"]
    assert sorted(d[0] for d in _paste_deaths(tmp_path, [alone, remove, removed])) == \
        ["tcp://192.168.1.203:45998", "tcp://192.168.1.204:33518"]
    # with time stamps (a layout that prints them): the two lines of one removal come moments apart; a "Removed
    # worker" of the same address ten minutes later ends another removal (its first line cut off), another death
    soon, later = "2017-08-03 10:00:00,120 - ", "2017-08-03 10:10:00,000 - "
    first = "2017-08-03 10:00:00,100 - " + remove
    assert len(_paste_deaths(tmp_path, [first, soon + removed])) == 1
    assert len(_paste_deaths(tmp_path, [first, later + removed])) == 2


def test_a_worker_process_repr_with_sigsegv_and_a_c_assertion_are_crashes(tmp_path):
    """multiprocessing's repr of the nanny's worker process ('... exitcode=-SIGSEGV') and a C library's
    'Assertion ... failed' before its abort() (UCX) each prove a death by a signal."""
    segv = [line for line in (Path(__file__).resolve().parent.parent / "sample_logs/pastes2/distributed-5082/paste.txt")
            .read_text().splitlines() if "exitcode=-SIGSEGV" in line]
    assert segv and [d[1:] for d in _paste_deaths(tmp_path, segv[:1])] == [("sudden_exit", "segfault")]
    ucx = [line for line in (Path(__file__).resolve().parent.parent / "sample_logs/pastes2/ucx-5045/paste.txt")
           .read_text().splitlines() if "Assertion `" in line]
    assert ucx and [d[1:] for d in _paste_deaths(tmp_path, ucx[:1])] == [("sudden_exit", "signal_6")]


# ---------------------------------------------------------------- several `dask worker` commands in one stream
def _whole_paste(case: str) -> list[str]:
    return (Path(__file__).resolve().parent.parent / "sample_logs" / case / "paste.txt").read_text().splitlines()


def test_two_commands_failing_at_start_in_one_stream_are_two_failures(tmp_path):
    """Two `dask worker` commands whose nanny raised in Nanny.start (a handshake timeout): each logs "End worker" in
    the finally of its main and then dies of the exception, srun interleaving the two tracebacks line by line.
    Each command is one start-up failure."""
    deaths = _paste_deaths(tmp_path, _whole_paste("pastes8/Xperiment-Dask_ipca_wconf_same-E2-P4_W2_D256"))
    assert [d[1] for d in deaths] == ["unrecoverable_exception"] * 2, deaths


def test_dask_worker_commands_stopped_together_in_one_file_each_handled_their_sigterm():
    """A SLURM job's ``worker.e`` (pastes8, Dask ~2021.12 as a DEISA build, no time stamps): eight `dask worker`
    commands on four nodes, cancelled together. Each printed "Exiting on signal 15" (naming no process) before its
    nanny closed ("Closing Nanny at 'ADDR'", no reason in that release) and, its worker slow to stop, killed and
    reaped it (by pid only, interleaved across commands). Eight deaths, not one more per reaping line, each of the
    SIGTERM it handled (the reaping is how it ended, the signal why), each with one of the eight signal lines, none
    with another node's nanny; the worker whose "Stopping worker" line is missing (known by its start banner) is the
    one process of the file still alive when the last reaping comes, so that reaping is its."""
    from kwdiag.pipeline import analyze

    root = Path(__file__).resolve().parent.parent / "sample_logs/pastes8/Xperiment-dask_ipca-E1-P8_W4_D512"
    deaths = analyze([str(root / "paste.txt")]).deaths
    assert sorted((d.address, d.cause, d.detail) for d in deaths) == sorted(
        (f"tcp://172.21.5.{a}", "chose_to_exit", "sigterm")
        for a in ("14:34269", "14:40999", "10:36199", "10:38433", "11:33797", "11:36471", "15:42009", "15:46738"))
    for d in deaths:
        assert sum("Exiting on signal 15" in e.text for e in d.evidence) == 1, d.evidence
        host = d.address.rsplit(":", 1)[0]
        assert all(host in e.text for e in d.evidence if "Closing Nanny" in e.text), d.evidence
    assert [e.text.split("pid=")[1].split()[0] for d in deaths if d.address.endswith(":36471")
            for e in d.evidence if "reaping" in e.text] == ["63067"]


def test_a_nannys_close_goes_only_to_a_worker_of_its_machine():
    from kwdiag.timeline.streams import same_machine

    assert same_machine("tcp://10.0.0.1:4000", "tcp://10.0.0.1:5000")
    assert not same_machine("tcp://10.0.0.1:4000", "tcp://10.0.0.2:4000")
    assert not same_machine("tcp://[::1]:4000", "tcp://[::2]:4000")
    # a name and an address may be one machine; so may anything unknown
    assert same_machine("tcp://node7:4000", "tcp://10.0.0.2:4000") and same_machine(None, "tcp://10.0.0.2:4000")


def test_an_exit_does_not_join_a_worker_that_wrote_lines_after_it():
    """Real Dask 2021.11.2 (corpus 032, a LocalCluster at INFO level, every process in one stream): a failed
    worker process's "Worker process 22978 was killed by signal 15" (no address) was joined to a healthy worker
    whose removal came a few lines after that process's traceback; that worker's own "Stopping worker at ..." comes
    after the exit line, and a process writes nothing once it is gone. The healthy workers end in the close."""
    from kwdiag.pipeline import analyze

    case = Path(__file__).resolve().parent.parent / "sample_logs/corpus/cases/2021.11.2/032-workerclass-li-nn-fixed-start"
    deaths = {d.worker: (d.cause, d.detail) for d in analyze([str(case)], rules=RULES).deaths}
    assert deaths["0"] == deaths["2"] == ("chose_to_exit", "shutdown"), deaths
    assert "process 22978" in deaths


def test_a_refusal_is_no_account_of_the_holders_end(tmp_path):
    """The holder of a name dies of an OOM kill (its pod's status), its replacement is refused for the name, and the
    scheduler's log has not removed the holder yet: the refusal is one death, the kill another (a refusal once hid
    the environment's deaths, which are read only when no death of the cluster's own is seen). The refusal is
    Dask 2026.8's real line; the pod block is kubectl describe's layout, as in test_readers."""
    from kwdiag.pipeline import analyze

    (tmp_path / "scheduler.log").write_text(
        "2026-11-27 15:48:19,235 - distributed.scheduler - WARNING - Worker tried to connect with a duplicate name: w\n")
    (tmp_path / "describe-pod.txt").write_text(
        "    Last State:     Terminated\n      Reason:       OOMKilled\n      Exit Code:    137\n")
    deaths = analyze([str(tmp_path)], rules=RULES).deaths
    assert sorted((d.cause, d.detail) for d in deaths) == [
        ("sudden_exit", "oom_killer"), ("unrecoverable_exception", "name_taken")], deaths
