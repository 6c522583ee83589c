"""The scheduler's pure state machine, driven without sockets, threads or processes (``scheduler_sim``).

Every stimulus's outbox is delivered to simulated workers and clients, and the state's invariants are
checked after each one. The scenarios are the ones that broke or could break on real clusters: loops that
rebind their futures, tree reductions, releases while tasks run, cancel, retries, a worker lost mid-chain,
blame and KilledWorker, and a scheduler that restarts from its journal.
"""

from __future__ import annotations

import operator
import random

import pytest

from scheduler_sim import CLIENT_ID, Sim
from kwdiag.runtime.scheduler_state import ERRED, MEMORY, PROCESSING, SchedulerState, TaskStatus


def inc(x):
    return x + 1


def one():
    return 1


def explode(*_):
    raise ValueError("boom")


def rebinding_chain(sim: Sim, n: int, run_between: bool = False) -> str:
    """``f = submit(inc, f)`` n times: each submission is followed by the release of the previous future."""
    prev = sim.submit("inc-0", one)
    for i in range(1, n):
        key = sim.submit(f"inc-{i}", inc, [prev])
        sim.release(prev)
        prev = key
        if run_between and i % 7 == 0:
            for _ in range(3):
                sim.step()
    return prev


@pytest.mark.parametrize("run_between", [False, True])
def test_a_rebinding_chain_keeps_each_link_until_its_dependent_has_run(run_between):
    sim = Sim(validate_every=25)
    last = rebinding_chain(sim, 1500, run_between)
    sim.run()
    assert sim.value(last) == 1500
    # Every released link's result is freed once used; its record stays as the lineage of the last one.
    assert {k for k, ts in sim.state.tasks.items() if ts.state == MEMORY} == {last}
    assert [k for w in sim.workers.values() for k in w.data] == [last]
    sim.release(last)
    assert not sim.state.tasks and not any(w.data for w in sim.workers.values())


def test_a_tree_reduction_that_rebinds_its_list_gives_the_sum():
    sim = Sim(n_workers=3, validate_every=25)
    level = [sim.submit(f"leaf-{i}", (lambda i=i: i)) for i in range(512)]
    depth = 0
    while len(level) > 1:
        depth += 1
        new = [sim.submit(f"add-{depth}-{i}", operator.add, [level[i], level[i + 1]]) for i in range(0, len(level), 2)]
        sim.release(*level)
        level = new
    rng = random.Random(1)
    sim.run(pick=rng.choice)
    assert sim.value(level[0]) == sum(range(512))
    assert [k for w in sim.workers.values() for k in w.data] == [level[0]]
    sim.release(level[0])
    assert not sim.state.tasks


def test_release_while_processing_frees_the_task_on_its_worker_and_forgets_it():
    sim = Sim(n_workers=1)
    sim.submit("slow", one)
    sim.step()                                          # started
    (w,) = sim.workers.values()
    assert w.executing == {"slow"} and sim.state.tasks["slow"].state == PROCESSING
    sim.release("slow")
    assert "slow" not in sim.state.tasks and "slow" in w.freed_while_executing
    sim.run()
    assert not w.data and not sim.state.tasks             # its result, when it came, was dropped


def test_thousands_of_released_futures_leave_nothing_behind_and_new_work_is_right():
    sim = Sim()
    keys = [sim.submit(f"inc-{i}", (lambda i=i: i)) for i in range(3000)]
    for _ in range(50):
        sim.step()
    sim.release(*keys)
    assert not sim.state.tasks
    assert all(not w.queued for w in sim.workers.values())
    total = sim.submit("total", lambda: 42)
    sim.run()
    assert sim.value(total) == 42 and set(sim.state.tasks) == {"total"}


def test_cancel_of_a_task_with_dependents_cancels_the_dependents_the_client_holds():
    sim = Sim()
    sim.submit("a", one)
    sim.submit("b", inc, ["a"])
    sim.submit("c", inc, ["b"])
    sim.cancel("a")
    client = sim.clients[CLIENT_ID]
    assert client.cancelled == {"a", "b", "c"}
    assert not sim.state.tasks
    sim.run()
    assert not any(w.data for w in sim.workers.values())


def test_a_key_another_client_wants_is_not_released_by_a_cancel_without_force():
    sim = Sim()
    sim.deliver(sim.state.add_client("other"))
    sim.submit("a", one)
    sim.submit("a", one, client="other")
    sim.cancel("a")
    assert sim.state.tasks["a"].wanted_by == {"other"}
    sim.run()
    assert sim.clients["other"].finished.get("a")
    sim.cancel("a", client="other", force=True)
    assert not sim.state.tasks


def test_retries_run_a_flaky_task_again_and_exhausted_retries_err_its_dependents():
    sim = Sim()
    sim.submit("flaky", one, fails=2, retries=2)
    sim.submit("after", inc, ["flaky"])
    sim.run()
    assert sim.value("after") == 2 and sim.runs["flaky"] == 3
    sim.submit("doomed", one, fails=5, retries=1)
    sim.submit("doomed-child", inc, ["doomed"])
    sim.run()
    client = sim.clients[CLIENT_ID]
    assert sim.runs["doomed"] == 2
    assert set(client.erred) == {"doomed", "doomed-child"}
    assert client.erred["doomed-child"]["key"] == "doomed"       # the dependent fails with its cause's error


def test_client_retry_runs_the_erred_tasks_and_their_dependents_again():
    sim = Sim()
    sim.submit("src", one, fails=1)
    sim.submit("mid", inc, ["src"])
    sim.submit("top", inc, ["mid"])
    sim.release("mid")                                        # held only through its dependent
    sim.run()
    assert sim.state.tasks["top"].state == ERRED
    reset = sim.retry("top")
    assert set(reset) == {"src", "mid", "top"}
    sim.run()
    assert sim.value("top") == 3
    assert not sim.clients[CLIENT_ID].erred


def test_a_worker_lost_mid_chain_blames_only_the_executing_link_and_the_chain_completes():
    sim = Sim(n_workers=2)
    last = rebinding_chain(sim, 50)
    for _ in range(21):
        sim.step()
    victim = next(w for w in sim.workers.values() if w.executing)
    executing = set(victim.executing)
    sim.kill(victim.address)
    removed = [fields for kind, _, fields in sim.events if kind == "worker-removed"]
    assert set(removed[-1]["blamed"]) == executing
    sim.run()
    assert sim.value(last) == 50


def test_a_task_that_kills_every_worker_it_runs_on_is_failed_with_killed_worker():
    sim = Sim(n_workers=1, allowed_failures=2)
    sim.submit("killer", one)
    for attempt in range(3):
        sim.step()
        (w,) = sim.live_workers()
        assert w.executing == {"killer"}
        sim.kill(w.address)
        sim.add_worker()
    error = sim.clients[CLIENT_ID].erred["killer"]
    assert error["type"] == "killed-worker" and len(error["workers"]) == 3
    assert sum(1 for kind, _, _ in sim.events if kind == "killed-worker") == 1


def test_an_expected_departure_blames_nothing_and_lost_results_are_recomputed():
    sim = Sim(n_workers=2)
    keys = [sim.submit(f"x-{i}", (lambda i=i: i)) for i in range(20)]
    total = sim.submit("total", lambda *xs: sum(xs), keys)
    sim.release(*keys)
    for _ in range(30):
        sim.step()
    victim = max(sim.live_workers(), key=lambda w: len(w.data))
    sim.kill(victim.address, expected=True)
    assert not [f for k, _, f in sim.events if k == "worker-removed" and f["blamed"]]
    sim.run()
    assert sim.value(total) == sum(range(20))


def test_a_scheduler_restarted_from_its_journal_reuses_results_and_finishes_the_work():
    sim = Sim(n_workers=2)
    last = rebinding_chain(sim, 200)
    tree = [sim.submit(f"leaf-{i}", (lambda i=i: i)) for i in range(16)]
    total = sim.submit("total", lambda *xs: sum(xs), tree)
    sim.release(*tree)
    for _ in range(150):
        sim.step()
    runs_before = dict(sim.runs)
    sim.restart_scheduler()
    sim.run()
    assert sim.value(last) == 200 and sim.value(total) == sum(range(16))
    rerun = [k for k, n in sim.runs.items() if n > runs_before.get(k, 0) and k in runs_before]
    assert not rerun                                      # nothing finished before the restart ran again
    assert {k for k, ts in sim.state.tasks.items() if ts.state == MEMORY} == {last, total}


def test_a_restart_flushes_everything_and_cancels_every_future():
    sim = Sim()
    rebinding_chain(sim, 30)
    sim.run()
    out = sim.state.restart()
    assert not sim.state.tasks and not sim.state.workers
    cancelled = [m for _, ident, m in out.messages if m["op"] == "cancelled"]
    assert cancelled and cancelled[0]["reason"] == "restart"


def test_states_are_enums_and_an_unknown_dependency_errs_the_task():
    state = SchedulerState()
    out = state.update_graph("c", [{"key": "b", "spec": b"", "deps": ["nope"]}])
    assert state.tasks["b"].state is TaskStatus.ERRED
    assert [m["error"]["type"] for _, _, m in out.messages] == ["unknown-dependency"]
    assert state.task_counts() == {"erred": 1}


def test_a_random_mix_of_stimuli_keeps_every_invariant():
    """Random graphs, releases, cancels, errors with retries, worker deaths and a scheduler restart: the
    invariants hold after every stimulus, and every key still wanted ends in memory with the right value or
    erred with the error of a task that failed."""
    for seed in range(25):
        rng = random.Random(seed)
        sim = Sim(n_workers=3)
        expected: dict[str, int | None] = {}   # plain in-process evaluation; None: erred
        wanted: list[str] = []
        client = sim.clients[CLIENT_ID]
        for i in range(120):
            live = [k for k in wanted if k not in client.cancelled]   # (a cancel also cancels held dependents)
            deps = rng.sample(live, min(len(live), rng.choice([0, 1, 2, 3])))
            key = f"t-{i}"
            fails = rng.choice([0, 0, 0, 0, 1, 3])
            retries = rng.choice([0, 2])
            sim.submit(key, lambda *xs: 1 + sum(xs), deps, fails=fails, retries=retries)
            erred = fails > retries or any(expected[d] is None for d in deps)
            expected[key] = None if erred else 1 + sum(expected[d] for d in deps)
            wanted.append(key)
            if rng.random() < 0.2 and wanted:
                gone = rng.choice(wanted)
                wanted.remove(gone)
                (sim.cancel if rng.random() < 0.3 else sim.release)(gone)
            for _ in range(rng.randint(0, 4)):
                sim.step(rng.choice)
            if rng.random() < 0.02 and len(sim.live_workers()) > 1:
                sim.kill(rng.choice(sim.live_workers()).address)
                sim.add_worker()
            if i == 60:
                sim.restart_scheduler()
        sim.run(pick=rng.choice)
        for key in wanted:
            ts = sim.state.tasks.get(key)
            if key in client.cancelled:
                continue
            assert ts is not None and ts.state in (MEMORY, ERRED), (seed, key, ts)
            if expected[key] is None:
                assert ts.state == ERRED and key in client.erred, (seed, key)
            else:
                assert ts.state == MEMORY and sim.value(key) == expected[key], (seed, key)
        sim.release(*wanted)
        sim.run(pick=rng.choice)
        assert not sim.state.tasks, (seed, list(sim.state.tasks.values())[:5])
        assert not any(w.data for w in sim.live_workers()), seed


def test_a_copy_reported_after_the_same_worker_was_asked_to_compute_the_key_keeps_the_computation():
    """A worker fetched a copy of d; d's other holder died before the scheduler heard of the copy, so d was
    lost and given to that same worker to compute; then the copy's report arrives. Freeing the copy there would
    drop the queued computation too (found by bench/property_dags.py: a task processing on a worker that had
    nothing)."""
    sim = Sim(n_workers=2)
    sim.submit("d", one)
    sim.submit("t", inc, ["d"])
    w1, w2 = sim.workers.values()
    sim.step()   # d starts somewhere
    holder = next(w for w in (w1, w2) if w.executing)
    other = w2 if holder is w1 else w1
    sim.step()   # d finished on its holder
    other.data["d"] = holder.data["d"]   # the other worker fetched a copy; its add-keys is not sent yet
    sim.kill(holder.address)
    assert sim.state.tasks["d"].processing_on is not None
    if sim.state.tasks["d"].processing_on.address == other.address:
        sim.deliver(sim.state.add_keys(other.address, ["d"]))   # the late report of the copy
        assert "d" in other.queued or "d" in other.executing
    sim.run()
    assert sim.value("t") == 2
