"""kwdiag's Futures API where it is kwdiag's own: the stated differences from Dask, and what Dask has no
counterpart for. Everything the two share is compared with Dask itself in ``test_dask_parity``.

One cluster (two workers of two threads, with nannies) serves the module; nothing here kills a worker.
"""

from __future__ import annotations

import os
import time
import traceback

import pytest

import dask_programs as P
from kwdiag.runtime import Client, LocalCluster, as_completed, fire_and_forget, wait


def echo_kwargs(**kwargs):
    return sorted(kwargs)


def fail_deep(x):
    return _inner_failure(x)


def _inner_failure(x):
    raise ValueError(f"bad input {x}")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    log_dir = str(tmp_path_factory.mktemp("futures-api-logs"))
    with LocalCluster(n_workers=2, threads_per_worker=2, memory_limit="1GiB", log_dir=log_dir) as cluster, \
            Client(cluster) as client:
        yield client


def test_a_cancelled_task_that_waits_on_a_running_one_never_runs(client, tmp_path):
    """Dask's cancel can overtake the submission it cancels and then the task runs anyway; kwdiag's cannot (one
    ordered stream per client), so a cancelled task never starts."""
    go, ran = str(tmp_path / "go"), str(tmp_path / "ran")
    gate = client.submit(P.wait_for_file, go, 1)
    writer = client.submit(P.write_file, ran, gate)      # sent ahead to the gate's worker
    writer.cancel()
    P.touch(go)
    assert gate.result(timeout=60) == 1
    # A task submitted now on the gate runs after anything that worker still had queued behind it.
    assert client.gather([client.submit(P.inc, gate, pure=False) for _ in range(8)], timeout=60) == [2] * 8
    assert writer.status == "cancelled" and not os.path.exists(ran)


def test_a_cancel_does_not_reach_a_dependent_dropped_before_it(client, tmp_path):
    """Program order holds between dropping a future and a later request: ``mid`` is dropped before the cancel
    of its input, so the cancel does not go through it (Dask's rule: only through dependents the client holds),
    and what depends on ``mid`` gets its value. Releases of dropped futures wait a few ms for company; a cancel
    that overtook them found ``mid`` still held and cancelled ``last`` with it (found by the property test)."""
    go = str(tmp_path / "go")
    first = client.submit(P.wait_for_file, go, 1)
    mid = client.submit(P.inc, first)
    last = client.submit(P.inc, mid)
    del mid
    first.cancel()
    P.touch(go)
    assert last.result(timeout=60) == 3
    assert first.status == "cancelled"


def test_futures_dropped_while_the_clients_loop_is_late_are_released_after_their_messages(client, tmp_path):
    """Program order again, the other way: ``fire_and_forget(writers)`` then ``del writers``, while the client's
    loop is late (kept busy here on purpose), so the message and the releases wait together. The releases must
    follow the message: sent first, they dropped the writers before the scheduler heard they were forgotten, and
    the writers never ran (``fire_and_forget(client.map(...))`` in the parity suite, seen once in CI)."""
    gate = str(tmp_path / "gate")
    paths = [str(tmp_path / f"out-{i}") for i in range(4)]
    writers = client.map(P.write_file, paths, [client.submit(P.wait_for_file, gate, str(i)) for i in range(4)])
    client.scheduler_info()   # a request: every message before it has left
    client._loop.call(time.sleep, 0.5)   # the loop is busy: what follows queues behind it
    fire_and_forget(writers)
    del writers
    client.scheduler_info()   # the forget and the releases have left (in whichever order the client chose)
    P.touch(gate)
    assert [P.read_when_written(p) for p in paths] == ["0", "1", "2", "3"]


def test_a_release_timer_coming_due_does_not_overtake_a_message_still_queued(client, tmp_path):
    """The batching timer (simulated here by calling its drain while the loop is busy: a real one comes due at a
    moment no test can pick) found ``writers`` dropped and released them, though the ``fire_and_forget`` queued
    before they were dropped had not left yet: the writers never ran (2 of 172 ``fire_and_forget(client.map(...))``
    in a loop). It now releases only what was dropped before the oldest message still queued."""
    gate = str(tmp_path / "gate")
    paths = [str(tmp_path / f"out-{i}") for i in range(4)]
    writers = client.map(P.write_file, paths, [client.submit(P.wait_for_file, gate, str(i)) for i in range(4)])
    client.scheduler_info()   # a request: every message before it has left
    client._loop.call(time.sleep, 0.5)   # the loop is busy: what follows queues behind it
    client._loop.call(client._drain_garbage)   # the timer, coming due before the forget is sent
    fire_and_forget(writers)
    del writers
    client.scheduler_info()
    P.touch(gate)
    assert [P.read_when_written(p) for p in paths] == ["0", "1", "2", "3"]


@pytest.mark.parametrize("keyword, value", [("resources", {"GPU": 1}), ("actor", True), ("actors", True)])
def test_an_unsupported_keyword_is_refused_by_name_and_never_reaches_the_function(client, keyword, value):
    with pytest.raises(NotImplementedError, match=f"{keyword}="):
        client.submit(echo_kwargs, **{keyword: value})
    with pytest.raises(NotImplementedError, match=f"{keyword}="):
        client.map(echo_kwargs, [1], **{keyword: value})


def test_dasks_keywords_are_the_clients_and_every_other_keyword_is_the_functions(client):
    f = client.submit(echo_kwargs, retries=2, priority=5, pure=False, fifo_timeout="1s", workers=None,
                      allow_other_workers=False, key=None, colour="red")
    assert f.result(timeout=60) == ["colour"]


@pytest.mark.parametrize("method", ["upload_file", "run_on_scheduler", "publish_dataset", "register_plugin",
                                    "get_task_stream"])
def test_a_dask_method_kwdiag_lacks_says_why(client, method):
    with pytest.raises(NotImplementedError, match=f"Client.{method} is not supported by kwdiag's runtime: .+"):
        getattr(client, method)()
    with pytest.raises(AttributeError):
        client.no_such_method()


def test_a_failed_tasks_traceback_points_into_the_task(client):
    f = client.submit(fail_deep, 3)
    tb = f.traceback(timeout=60)
    names = [frame.name for frame in traceback.extract_tb(tb)]
    assert names[-2:] == ["fail_deep", "_inner_failure"]
    assert traceback.extract_tb(tb)[-1].filename == __file__
    with pytest.raises(ValueError, match="bad input 3") as raised:
        f.result()
    assert [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)][-1] == "_inner_failure"


def test_timeouts_take_dasks_duration_strings(client, tmp_path):
    blocked = client.submit(P.wait_for_file, str(tmp_path / "never"), pure=False)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        wait([blocked], timeout="200ms")
    with pytest.raises(TimeoutError):
        blocked.result(timeout="0.2s")
    with pytest.raises(TimeoutError):
        next(iter(as_completed([blocked], timeout="200ms")))
    assert time.monotonic() - started < 30
    blocked.cancel()


def test_gather_refuses_an_unknown_error_mode(client):
    f = client.submit(P.inc, 1)
    with pytest.raises(ValueError, match="errors must be"):
        client.gather([f], errors="ignore")


def _api_tables() -> str:
    doc = open(os.path.join(os.path.dirname(__file__), "..", "docs", "runtime.md"), encoding="utf-8").read()
    start = doc.index("## Client API")
    return doc[start:doc.index("\n## ", start + 1)]


def test_the_parity_table_names_every_public_client_and_future_attribute_of_dask():
    distributed = pytest.importorskip("distributed")
    table = _api_tables()
    internal = {"loop", "asynchronous", "id", "status", "scheduler", "scheduler_file", "cluster", "futures",
                "refcount", "generation", "executor", "type", "bind_client", "substitute", "client"}
    for cls in (distributed.Client, distributed.Future):
        missing = [n for n in dir(cls) if not n.startswith("_") and n not in internal
                   and f"`{n}`" not in table and f"`{n}(" not in table]
        assert not missing, f"docs/runtime.md's table does not say what kwdiag does with {cls.__name__}.{missing}"


def test_every_method_the_table_calls_unsupported_raises_and_every_supported_one_exists(client):
    from kwdiag.runtime.client import NOT_SUPPORTED

    table = _api_tables()
    for name in NOT_SUPPORTED:
        assert f"`{name}`" in table, f"{name} raises NotImplementedError but the table does not say so"
        with pytest.raises(NotImplementedError, match=name):
            getattr(client, name)()
    for name in ("submit", "map", "gather", "scatter", "cancel", "retry", "compute", "persist", "get", "who_has",
                 "has_what", "nthreads", "ncores", "scheduler_info", "run", "restart", "retire_workers", "replicate",
                 "wait_for_workers", "get_versions", "recreate_error_locally", "close", "shutdown", "as_current",
                 "futures_of"):
        assert callable(getattr(client, name)), name
