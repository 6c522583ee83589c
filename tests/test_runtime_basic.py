"""The client API on a real local cluster: tasks, dependencies, errors, data, introspection.

One cluster (two workers with nannies) serves the whole module; tests here do not kill anything.
"""

from __future__ import annotations

import operator
import os
import time

import pytest

from conftest import read_events, wait_until
from kwdiag.runtime import Client, FutureCancelledError, LocalCluster


def inc(x):
    return x + 1


def div(a, b):
    return a / b


def fail_with_pid():
    raise ValueError(f"failed in process {os.getpid()}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    log_dir = str(tmp_path_factory.mktemp("basic-logs"))
    with LocalCluster(n_workers=2, threads_per_worker=2, memory_limit="1GiB", log_dir=log_dir) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster) as client:
        yield client


def test_submit_map_gather_and_dependencies(client):
    x = client.submit(inc, 1)
    y = client.submit(operator.mul, x, 10)           # a future as an argument is a dependency
    assert y.result(timeout=30) == 20
    assert x.done() and x.status == "finished"
    futures = client.map(inc, range(100))
    total = client.submit(sum, futures)              # a list of futures nested in an argument
    assert total.result(timeout=30) == sum(range(1, 101))
    assert client.gather({"a": x, "b": [y, x]}) == {"a": 2, "b": [20, 2]}


def test_pure_submissions_share_a_key_and_impure_ones_do_not(client):
    assert client.submit(inc, 41).key == client.submit(inc, 41).key
    assert client.map(inc, [41, 42])[0].key == client.submit(inc, 41).key   # map pickles inc once: the same key
    assert client.submit(inc, 41, pure=False).key != client.submit(inc, 41, pure=False).key
    assert client.submit(inc, 1, key="my-key").key == "my-key"


def test_user_error_reaches_the_client_and_its_dependents_and_disturbs_nothing(client, cluster):
    before = {a: i["pid"] for a, i in client.scheduler_info()["workers"].items()}
    x = client.submit(div, 1, 0)
    y = client.submit(operator.add, x, 10)
    z = client.submit(inc, 5)
    with pytest.raises(ZeroDivisionError):
        x.result(timeout=30)
    with pytest.raises(ZeroDivisionError, match="division by zero"):
        y.result(timeout=30)             # same exception for a dependent
    assert isinstance(x.exception(), ZeroDivisionError)
    assert z.result(timeout=30) == 6     # nothing else disturbed
    assert {a: i["pid"] for a, i in client.scheduler_info()["workers"].items()} == before
    assert not read_events(cluster.log_dir, "worker-exit")
    erred = wait_until(lambda: read_events(cluster.log_dir, "task-erred", key=x.key), what="task-erred event")
    assert erred[0].fields["exception"] == "ZeroDivisionError"
    assert "Remote traceback" in "".join(getattr(x.exception(), "__notes__", []))


def test_recreate_error_locally_raises_in_this_process(client):
    f = client.submit(fail_with_pid, pure=False)
    with pytest.raises(ValueError) as remote:
        f.result(timeout=30)
    assert str(os.getpid()) not in str(remote.value)
    with pytest.raises(ValueError, match=f"failed in process {os.getpid()}$"):
        client.recreate_error_locally(f)


def test_result_timeout(client):
    slow = client.submit(time.sleep, 3, pure=False)
    with pytest.raises(TimeoutError):
        slow.result(timeout=0.2)
    assert slow.result(timeout=30) is None


def test_run_who_has_scheduler_info(client):
    pids = client.run(os.getpid)
    info = client.scheduler_info()
    assert set(pids) == set(info["workers"])
    assert sorted(pids.values()) == sorted(w["pid"] for w in info["workers"].values())
    assert {w["name"] for w in info["workers"].values()} == {"worker-0", "worker-1"}
    one = sorted(info["workers"])[0]
    assert list(client.run(os.getpid, workers=[one])) == [one]
    f = client.submit(inc, 100, workers=[one])
    assert f.result(timeout=30) == 101
    assert client.who_has([f])[f.key] == [one]


def test_scatter_and_replicate(client):
    info = client.scheduler_info()["workers"]
    data = client.scatter({"big": list(range(1000))})
    assert client.submit(sum, data["big"]).result(timeout=30) == sum(range(1000))
    assert len(client.who_has(data["big"])["big"]) == 1
    client.replicate(data["big"])
    assert sorted(client.who_has(data["big"])["big"]) == sorted(info)
    several = client.scatter([1, 2, 3])
    assert client.gather(several) == [1, 2, 3]
    everywhere = client.scatter(7, broadcast=True)
    assert len(client.who_has(everywhere)[everywhere.key]) == len(info)


def test_a_function_that_closes_over_a_future_depends_on_it(client):
    """A map pickles its function once; one that holds a future is still pickled with each task, where the
    future becomes that task's dependency (and its value stands in for it)."""
    base = client.submit(inc, 99)

    def add_base(x):
        return x + base

    assert client.gather(client.map(add_base, [1, 2]), timeout=30) == [101, 102]
    assert client.submit(add_base, 3).result(timeout=30) == 103


def make_doubler():
    return lambda x: x * 2   # only cloudpickle can carry this


def test_small_results_travel_with_the_news_and_large_ones_are_fetched_from_the_worker(client):
    """A result whose pickle fits ``INLINE_RESULT_BYTES`` comes worker -> scheduler -> client with its "finished"
    news, so result() makes no trip to the worker; a larger one is fetched from the worker as before. Both give
    the same values, by result() and by gather(), as do results that only cloudpickle can pickle."""
    from kwdiag.runtime.worker import INLINE_RESULT_BYTES

    small, doubler = client.submit(inc, 1), client.submit(make_doubler)
    large = client.submit(bytes, INLINE_RESULT_BYTES * 4)
    assert small.result(timeout=30) == 2 and doubler.result(timeout=30)(21) == 42
    assert large.result(timeout=30) == bytes(INLINE_RESULT_BYTES * 4)
    states = client._states
    assert states[small.key].value is not None and states[doubler.key].value is not None
    assert states[large.key].value is None
    assert client.gather([small, large], timeout=30) == [2, bytes(INLINE_RESULT_BYTES * 4)]


def one_mib(i):
    return bytes([i % 256]) * (1 << 20)


def test_gathering_more_than_one_reply_holds_comes_in_several_replies_without_stalling_a_worker(client, cluster):
    """A worker's get-data reply holds at most GET_DATA_BYTES (64 MiB); the rest is deferred and asked for
    again. 160 MiB of results from two workers: every value right, no worker silent past its heartbeat."""
    futures = client.map(one_mib, range(160), pure=False)
    values = client.gather(futures, timeout=120)
    assert [v[:1] for v in values] == [bytes([i]) for i in range(160)] and {len(v) for v in values} == {1 << 20}
    assert not read_events(cluster.log_dir, "heartbeat-missed")
    del futures, values


def test_a_get_data_reply_stops_at_its_byte_budget_and_defers_the_rest(tmp_path):
    """The worker's handler itself (a real Worker, not started): 100 MiB asked for, 64 MiB sent."""
    import asyncio

    from kwdiag.runtime import config
    from kwdiag.runtime.worker import GET_DATA_BYTES, Worker

    async def ask():
        worker = Worker(name="t", scheduler_address="tcp://127.0.0.1:1", secret=b"x" * 32, config=config.load(),
                        log_dir=str(tmp_path))
        worker.data = {f"k{i}": bytes(1 << 20) for i in range(100)}
        return worker.handle_get_data(None, {"keys": [f"k{i}" for i in range(100)]})

    reply = asyncio.run(ask())
    assert len(reply["data"]) == GET_DATA_BYTES >> 20 and len(reply["deferred"]) == 100 - (GET_DATA_BYTES >> 20)
    assert not reply["missing"] and list(reply["data"]) + reply["deferred"] == [f"k{i}" for i in range(100)]


def test_packing_a_result_stops_early_when_it_is_large():
    import pickle

    from kwdiag.runtime.worker import INLINE_RESULT_BYTES, pack_small

    assert pickle.loads(pack_small({"a": [1, 2.5, "x"]})) == {"a": [1, 2.5, "x"]}
    assert pack_small(list(range(10**6))) is None                 # stopped at the first frame past the limit
    assert pack_small(b"x" * (INLINE_RESULT_BYTES + 1)) is None
    assert pack_small(__import__("threading").Lock()) is None     # cannot be pickled: the fetch reports it


def test_a_result_that_cannot_be_pickled_is_an_error_not_a_hang(client):
    import threading

    f = client.submit(threading.Lock)
    with pytest.raises(TypeError, match="cannot be sent from its worker: TypeError: cannot pickle"):
        f.result(timeout=60)
    assert client.gather([f], errors="skip", timeout=60) == []   # left out, as Dask leaves a failed future out


def test_released_futures_are_forgotten_by_the_scheduler(client):
    futures = client.map(inc, range(1000, 1050))
    client.gather(futures)
    keys = {f.key for f in futures}
    del futures
    wait_until(lambda: not keys & set(client.who_has()), what="released keys forgotten")


def test_gathering_a_released_key_is_an_error_not_a_hang(client):
    f = client.submit(inc, 7)
    f.release()
    with pytest.raises(FutureCancelledError):      # as in Dask: a released future is cancelled
        f.result(timeout=5)


def test_futures_collected_by_the_garbage_collector_never_deadlock_the_client(client):
    """Futures in reference cycles are freed by the GC at arbitrary points — also inside the client's
    own locked sections. That must never deadlock (it once did, when __del__ took the client's lock)."""
    import gc
    import threading

    def churn():
        old = gc.get_threshold()
        try:
            for threshold in (3, 5, 7, 11, 13, 17, 23, 29):
                gc.set_threshold(threshold)  # collections at varied points, some inside the client's lock
                for i in range(40):
                    for _ in range(20):
                        cycle = [client.submit(inc, i, pure=False)]
                        cycle.append(cycle)  # only the cyclic GC can free this future
                        del cycle
                    client.map(inc, range(i * 50, i * 50 + 50), pure=False)  # many _inc_ref calls in a row
        finally:
            gc.set_threshold(*old)

    worker = threading.Thread(target=churn, daemon=True)
    worker.start()
    worker.join(300)   # a deadlock never ends; a loaded box only takes longer
    assert not worker.is_alive(), "the client deadlocked while the GC released futures"
    gc.collect()
    assert client.submit(inc, 1).result(timeout=30) == 2
