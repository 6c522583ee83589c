"""The death model as pure functions over events (as the readers make them from Dask's text lines).

What a death is (one per process end, however many lines tell of it, whatever its address), what
decides its class (who ended it, never when), and that every verdict names its rule.
"""

from __future__ import annotations

from kwdiag.analysis import analyze_events
from kwdiag.engine import load_rules
from kwdiag.events import Event, Origin

RULES = load_rules()


class Log:
    """Events of one file, in line order, as the readers emit them for the rules named."""

    def __init__(self, name: str):
        self.name = name
        self.line = 0
        self.events: list[Event] = []

    def add(self, ts, rule, kind, source, ctx=True, worker=None, **fields):
        self.line += 1
        fields = dict(fields, rule=rule, ctx=ctx)
        if ts is None:
            fields["ts_unknown"] = True
        self.events.append(Event(ts=ts or 0.0, source=source, kind=kind, worker=worker, fields=fields,
                                 message=f"{kind} {fields}", origin=Origin(self.name, self.line)))
        return self

    # the kinds Dask's lines become (rules/dask/*)
    def start(self, ts, address):
        return self.add(ts, "dask-worker-start", "worker-start", "worker", address=address)

    def registered(self, ts):
        return self.add(ts, "dask-registered-to", "worker-connected", "worker", scheduler="tcp://s:1")

    def killed(self, ts, pid, sig=9):
        rule = {9: "dask-nanny-sigkill", 11: "dask-nanny-segfault"}.get(sig, "dask-nanny-other-signal")
        extra = {9: {"signal_name": "SIGKILL"}, 11: {"signal_name": "SIGSEGV"}}.get(sig, {})
        return self.add(ts, rule, "worker-exit", "nanny", pid=pid, signal=sig, **extra)

    def restarting(self, ts):
        return self.add(ts, "dask-restarting-worker", "worker-restarting", "nanny")

    def stopping(self, ts, address, reason):
        return self.add(ts, "dask-stopping-worker", "worker-closing", "worker", address=address, reason=reason)

    def end(self, ts):
        return self.add(ts, "dask-end-worker", "worker-end", "worker")


def deaths(*logs):
    report = analyze_events([e for log in logs for e in log.events], RULES)
    assert all(d.rules for d in report.deaths), "every verdict names its rule"
    return [(d.worker, d.cause, d.detail) for d in report.deaths]


def test_fifty_sigkills_on_one_fixed_port_are_fifty_deaths():
    w = Log("w1.log")
    for i in range(50):
        w.start(i * 10.0, "tcp://10.0.0.5:40001").registered(i * 10.0 + 0.1).killed(i * 10.0 + 5, 1000 + i).restarting(
            i * 10.0 + 5.1)
    got = deaths(w)
    assert len(got) == 50 and all(c == ("tcp://10.0.0.5:40001", "sudden_exit", "sigkill") for c in got)


def test_one_nanny_line_alone_is_a_death_even_without_a_time():
    w = Log("paste.txt").killed(None, 31)
    assert deaths(w) == [("process 31", "sudden_exit", "sigkill")]


def test_restart_lines_alone_count_deaths_and_say_unknown():
    w = Log("client.log").restarting(1.0).restarting(50.0)
    assert deaths(w) == [("unnamed worker", "unknown", "restarted")] * 2


def test_a_sigkill_just_before_the_cluster_closes_stays_a_sigkill():
    s = Log("scheduler.log")
    w = Log("w1.log").start(0.0, "tcp://h:1").registered(0.1).killed(99.0, 42).restarting(99.1)
    w.start(99.5, "tcp://h:2").registered(99.6)
    s.add(100.0, "dask-scheduler-close", "scheduler-close", "scheduler", ctx=False, reason="signal-15")
    w.add(100.0, "dask-received-signal", "signal-received", "worker", signal=15, signal_name="SIGTERM")
    w.stopping(100.01, "tcp://h:2", "signal-15").end(100.1)
    got = deaths(s, w)
    assert got[0] == ("tcp://h:1", "sudden_exit", "sigkill")
    assert got[1] == ("tcp://h:2", "chose_to_exit", "shutdown")


def test_a_worker_retired_a_moment_before_the_close_was_retired():
    s = Log("scheduler.log")
    w = Log("w1.log").start(0.0, "tcp://h:1").registered(0.1).stopping(98.0, "tcp://h:1", "scheduler-remove-worker")
    w.end(98.1)
    s.add(100.0, "dask-scheduler-close", "scheduler-close", "scheduler", ctx=False, reason="signal-15")
    assert deaths(s, w) == [("tcp://h:1", "chose_to_exit", "retired")]


def test_a_traceback_before_a_signal_does_not_make_an_exception_death():
    w = Log("w1.log").start(0.0, "tcp://h:1").registered(0.1)
    w.add(4.0, "python-module-not-found", "exception", "worker", exception="ModuleNotFoundError", module="x")
    w.killed(5.0, 42, sig=11)
    assert deaths(w) == [("tcp://h:1", "sudden_exit", "segfault")]


def test_interleaved_deaths_in_a_shared_file_each_keep_their_restart():
    # LocalCluster's one stderr, two workers dying at once: exit, exit, restart, restart.
    c = Log("cluster.log").killed(5.0, 1).killed(5.01, 2).restarting(5.02).restarting(5.03)
    assert sorted(deaths(c)) == [("process 1", "sudden_exit", "sigkill"), ("process 2", "sudden_exit", "sigkill")]


def test_only_closing_lines_are_chosen_exits_and_reported():
    w = Log("paste.txt")
    for i in range(3):
        w.stopping(None, f"tcp://10.0.0.{i}:4000", None)
    assert deaths(w) == [(f"tcp://10.0.0.{i}:4000", "chose_to_exit", "ended") for i in range(3)]


def test_a_start_up_failure_before_registration_is_a_death():
    w = Log("w1.log")
    w.add(None, "dask-worker-process-traceback", "worker-startup-failed", "worker")
    w.add(None, "python-module-not-found", "exception", "worker", exception="ModuleNotFoundError", module="mymod")
    assert deaths(w) == [("unnamed worker", "unrecoverable_exception", "missing_module")]


def test_an_environment_only_paste_is_a_death_but_another_programs_oom_is_not():
    k = Log("dmesg.txt")
    k.add(None, "kernel-oom-kill", "kernel-oom-kill", "kernel", ctx=False, pid=4242, comm="python3")
    k.add(None, "kernel-oom-kill", "kernel-oom-kill", "kernel", ctx=False, pid=99, comm="chrome")
    assert deaths(k) == [("process 4242", "sudden_exit", "oom_killer")]


def test_a_slow_stop_killed_by_the_nanny_is_not_settled_by_a_nearby_line_that_names_no_process():
    """The nanny's kill after a slow stop, whose reason is not in the input, is unknown with its readings; an
    environment line that names no process (a SLURM time limit a second later) does not settle it, as it did
    not settle the chose_to_exit/close_timeout this kill used to be read as. The SIGKILL is the nanny's."""
    w = Log("w1.log").start(0.0, "tcp://10.0.0.5:40001").registered(0.1)
    w.add(50.0, "dask-nanny-kill-after-close", "nanny-kill-after-close", "nanny", seconds=8.0)
    w.killed(50.1, 4242)
    slurm = Log("slurm.out").add(51.0, "slurm-time-limit", "slurm-time-limit", "slurm", ctx=False)
    assert deaths(w, slurm) == [("tcp://10.0.0.5:40001", "unknown", "close_timeout")]
