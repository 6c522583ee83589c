"""Client programs written the way Dask's users and Dask's documentation write them, for ``test_dask_parity``.

Each program takes ``api`` — the client and the module-level names of one library (``distributed`` or
``kwdiag.runtime``): ``api.client``, ``api.as_completed``, ``api.wait``, ... — and returns plain data:
values, statuses, exception type names (``outcome()``), in an order the program makes deterministic or that
Dask documents. The test runs every program on Dask's ``LocalCluster`` and on kwdiag's and compares the two
answers. A program's task functions live here, at module level, so both runtimes' workers import them by
reference as they would a user's module. A task that needs the library itself (``get_worker``,
``get_client``, ``secede``, ...) is handed that function as an argument, so no task names either library.

Programs share one cluster and run one after another in name order: a program that blocks a task releases
it before returning (the task waits on a file under the program's own scratch folder, and gives up when
the folder is gone), and a program that restarts or kills workers waits until two are running again.
Synchronisation is always on a condition with a generous deadline (a file appearing, an event), never a
fixed sleep.

Does not cover: programs that must start or kill a cluster of their own (those are in the test module).
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import os
import shutil
import tempfile
import threading
import time
from typing import Any, Callable

PROGRAMS: dict[str, Callable[[Any], Any]] = {}

DEADLINE = 60.0   # seconds any wait on a condition may take before the program gives up


def program(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    PROGRAMS[fn.__name__] = fn
    return fn


def outcome(call: Callable[[], Any]) -> Any:
    """``("ok", value)`` or ``("raised", ExceptionTypeName)``: what a user's ``try`` would see."""
    try:
        return ("ok", call())
    except Exception as exc:  # the type is what both runtimes must agree on; messages differ in wording
        return ("raised", type(exc).__name__)


# ---------------------------------------------------------------------- helpers the programs use
@contextlib.contextmanager
def scratch():
    """A folder of the program's own for files its tasks wait on or write; removed (which frees any task
    still waiting on a file in it) when the program is done."""
    folder = tempfile.mkdtemp(prefix="kwdiag-parity-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def wait_until(condition: Callable[[], Any], timeout: float = DEADLINE) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for a condition")
        time.sleep(0.005)


def touch(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):   # the program's folder may be gone already
        with open(path, "w"):
            pass


def read_when_written(path: str) -> str:
    wait_until(lambda: os.path.exists(path))
    with open(path, encoding="utf-8") as f:
        return f.read()


def workers_of(api) -> list[str]:
    return sorted(api.client.scheduler_info()["workers"])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------- task functions
def inc(x, *_):
    return x + 1


def add(a, b):
    return a + b


def double(x):
    return 2 * x


def square(x):
    return x * x


def div(a, b):
    return a / b


def total(xs):
    return sum(xs)


def total_of_values(d):
    return sum(d.values())


def scale(x, factor=1, offset=0):
    return x * factor + offset


def add3(a, b, c):
    return a + b + c


def is_even(x):
    return x % 2 == 0


def mod3(x):
    return x % 3


def collatz_step(n):
    return n // 2 if n % 2 == 0 else 3 * n + 1


def wait_for_file(path, value=None):
    """Block until ``path`` exists (or its folder is gone: the program is over), then return ``value``."""
    folder = os.path.dirname(path)
    deadline = time.monotonic() + DEADLINE
    while not os.path.exists(path) and os.path.isdir(folder):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.005)
    return value


def started_then_wait(started, path, value=None):
    """Say the task is running (a file the program waits for), then block like ``wait_for_file``."""
    touch(started)
    return wait_for_file(path, value)


def inc_after_file(x, path):
    wait_for_file(path)
    return x + 1


def write_file(path, text):
    """Write ``text`` to ``path`` in one step (a reader never sees half of it)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(str(text))
    os.replace(tmp, path)
    return text


def write_sum(path, a, b):
    return write_file(path, a + b)


def flaky(folder, failures, value):
    """Fail the first ``failures`` calls (counted as files in ``folder``), then return ``value``."""
    attempt = len(os.listdir(folder))
    touch(os.path.join(folder, f"attempt-{attempt}"))
    if attempt < failures:
        raise FlakyError("attempt", attempt)
    return value


def needs_file(path, value):
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    return value


def raise_parity_error(x):
    raise ParityError(x)


def withdraw(account, amount):
    raise Overdrawn(account, amount)


def raise_value_error_with_args(*args):
    raise ValueError(*args)


def exit_process(_):
    os._exit(1)


def where(get_worker, *_):
    """The address of the worker that runs this task."""
    return get_worker().address


def blob(n, seed=0):
    """``n`` deterministic bytes (64 KiB blocks derived from ``seed``)."""
    block = hashlib.sha256(str(seed).encode()).digest() * 2048
    reps, rest = divmod(n, len(block))
    return block * reps + block[:rest]


def digest(data):
    return len(data), hashlib.sha256(data).hexdigest()


def split_or_sum(lo, hi):
    """Work that splits itself: a wide range comes back as two halves, a narrow one as its sum."""
    if hi - lo <= 8:
        return ("sum", sum(range(lo, hi)))
    mid = (lo + hi) // 2
    return ("split", [(lo, mid), (mid, hi)])


def sum_via_get_client(n, get_client):
    """A task that submits tasks with ``get_client()`` and gathers them (a few, so no deadlock)."""
    client = get_client()
    futures = client.map(inc, range(n))
    return sum(client.gather(futures))


def sum_via_worker_client(n, worker_client):
    with worker_client() as client:
        futures = client.map(square, range(n))
        return sum(client.gather(futures))


def sum_after_secede(n, get_client, secede, rejoin, wait):
    """Submit children, leave the thread pool while blocked on them, come back to add them up."""
    client = get_client()
    futures = client.map(double, range(n))
    secede()
    wait(futures)
    rejoin()
    return sum(f.result() for f in futures)


def fib_get_client(n, get_client, secede, rejoin):
    """Dask's recursive Fibonacci: each call submits its two predecessors, seceding while it waits."""
    if n < 2:
        return n
    client = get_client()
    a = client.submit(fib_get_client, n - 1, get_client, secede, rejoin)
    b = client.submit(fib_get_client, n - 2, get_client, secede, rejoin)
    secede()
    a, b = client.gather([a, b])
    rejoin()
    return a + b


def fib_worker_client(n, worker_client):
    if n < 2:
        return n
    with worker_client() as client:
        a = client.submit(fib_worker_client, n - 1, worker_client)
        b = client.submit(fib_worker_client, n - 2, worker_client)
        return a.result() + b.result()


def address_of(dask_worker):
    """For ``client.run``: Dask hands the worker itself to a function with a ``dask_worker`` parameter."""
    return dask_worker.address


def pid():
    return os.getpid()


class ParityError(Exception):
    """A user's own exception class, defined in the module the workers import."""


class FlakyError(Exception):
    pass


class Overdrawn(Exception):
    def __init__(self, account, amount):
        super().__init__(account, amount)
        self.account = account
        self.amount = amount


# ---------------------------------------------------------------------- loops that rebind their futures
@program
def rebinding_chain_of_1500_links(api):
    """The commonest idiom: each new future replaces the one it depends on (only the last is kept)."""
    f = api.client.submit(inc, 0, 0)
    for i in range(1, 1500):
        f = api.client.submit(inc, f, i)
    return f.result(timeout=120)


@program
def tree_reduction_of_512_leaves_rebinding_its_list(api):
    """Dask's documented pairwise reduction: the list is rebound at every level."""
    L = api.client.map(operator.neg, range(512))
    while len(L) > 1:
        L = [api.client.submit(add, L[i], L[i + 1]) for i in range(0, len(L), 2)]
    return L[0].result(timeout=120)


@program
def running_sum_rebinds_its_total(api):
    """``total = client.submit(add, total, x)`` over a map's futures: a running sum kept as one future."""
    squares = api.client.map(square, range(100))
    running = api.client.submit(operator.mul, 0, 1)
    for x in squares:
        running = api.client.submit(add, running, x)
    return running.result()


@program
def while_loop_rebinds_until_a_result_says_stop(api):
    """A while-loop that looks at each result to decide whether to submit the next step (Collatz from 7)."""
    x = api.client.submit(inc, 6)
    seen = [x.result()]
    while seen[-1] != 1:
        x = api.client.submit(collatz_step, x)
        seen.append(x.result())
    return seen


@program
def while_loop_rebinds_without_waiting(api):
    """``x = client.submit(f, x)`` in a while-loop that never waits, alternating functions, then one result."""
    x = api.client.submit(inc, 1)
    i = 0
    while i < 300:
        x = api.client.submit(double if i % 10 == 0 else inc, x)
        i += 1
    return x.result()


@program
def dict_of_futures_rebuilt_each_round(api):
    """A dict of futures rebuilt each round from the previous round's futures (a ring of neighbours)."""
    names = ["a", "b", "c", "d", "e"]
    state = {name: api.client.submit(inc, i) for i, name in enumerate(names)}
    for _ in range(12):
        state = {name: api.client.submit(add, state[name], state[names[(i + 1) % len(names)]])
                 for i, name in enumerate(names)}
    return api.client.gather(state)


@program
def tree_reduction_of_37_leaves_carrying_the_odd_one(api):
    """Pairwise reduction over an uneven count: the odd future out is carried to the next level."""
    level = api.client.map(inc, range(37))
    depth = 0
    while len(level) > 1:
        nxt = [api.client.submit(add, level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
        depth += 1
    return level[0].result(), depth


@program
def four_ary_tree_reduction_passing_lists_of_futures(api):
    """A k-ary reduction: each task gets a list of up to four futures (Dask resolves futures inside lists)."""
    level = api.client.map(square, range(101))
    while len(level) > 1:
        level = [api.client.submit(total, level[i:i + 4]) for i in range(0, len(level), 4)]
    return level[0].result()


@program
def fan_out_from_one_root_then_fan_in(api):
    """One root future fanned out to fifty tasks (``map`` over ``[root] * 50``), then fanned back into one."""
    root = api.client.submit(square, 7)
    spread = api.client.map(add, [root] * 50, range(50))
    return api.client.submit(total, spread).result()


@program
def chain_of_maps_over_futures(api):
    """``client.map`` over the futures of an earlier ``map``, three stages, then ``gather``."""
    stage = api.client.map(inc, range(20))
    stage = api.client.map(double, stage)
    stage = api.client.map(operator.neg, stage)
    return api.client.gather(stage)


@program
def diamonds_stacked_in_a_loop(api):
    """Each round splits one future into two and joins them again: ``top`` is rebound to the join."""
    top = api.client.submit(inc, 0)
    for _ in range(40):
        left = api.client.submit(inc, top)
        right = api.client.submit(double, top)
        top = api.client.submit(add, left, right)
    return top.result() % 1_000_003


# ---------------------------------------------------------------------- as_completed
@program
def as_completed_yields_every_future_once(api):
    """The documented loop: ``for future in as_completed(futures): future.result()``."""
    futures = api.client.map(square, range(30))
    return sorted(f.result() for f in api.as_completed(futures))


@program
def as_completed_add_submits_follow_up_work(api):
    """Dask's documented pipeline: each result small enough gets a follow-up task added to the iterator."""
    ac = api.as_completed(api.client.map(inc, [1, 2, 3]))
    results = []
    for future in ac:
        value = future.result()
        results.append(value)
        if value < 40:
            ac.add(api.client.submit(double, future))
    return sorted(results)


@program
def as_completed_work_queue_that_splits_itself(api):
    """A work queue: a task may answer with more work, which the loop submits and adds as it arrives."""
    ac = api.as_completed([api.client.submit(split_or_sum, 0, 1000)])
    grand_total, tasks = 0, 0
    for future in ac:
        kind, value = future.result()
        tasks += 1
        if kind == "split":
            for lo, hi in value:
                ac.add(api.client.submit(split_or_sum, lo, hi))
        else:
            grand_total += value
    return grand_total, tasks


@program
def as_completed_with_results(api):
    """``as_completed(futures, with_results=True)`` yields ``(future, result)`` pairs."""
    futures = api.client.map(double, range(25))
    pairs = list(api.as_completed(futures, with_results=True))
    return sorted(r for _, r in pairs), all(f.result() == r for f, r in pairs), len(pairs)


@program
def as_completed_with_results_adding_work(api):
    """``with_results=True`` and ``ac.add``: square each result until it passes 1000."""
    ac = api.as_completed(api.client.map(inc, [1, 2, 4]), with_results=True)
    seen = []
    for _, value in ac:
        seen.append(value)
        if value < 1000:
            ac.add(api.client.submit(square, value))
    return sorted(seen)


@program
def as_completed_batches(api):
    """``for batch in as_completed(futures).batches(): client.gather(batch)``: every future, once."""
    futures = api.client.map(inc, range(40))
    batches = list(api.as_completed(futures).batches())
    flat = [v for batch in batches for v in api.client.gather(batch)]
    return sorted(flat), all(isinstance(b, list) and b for b in batches)


@program
def as_completed_batches_with_results(api):
    """``batches()`` of ``with_results=True`` yields lists of ``(future, result)`` pairs."""
    futures = api.client.map(square, range(20))
    pairs = [p for batch in api.as_completed(futures, with_results=True).batches() for p in batch]
    return sorted(r for _, r in pairs)


@program
def as_completed_with_results_raises_the_error(api):
    """With ``with_results=True`` (``raise_errors`` default True) iterating reaches the failed one and raises."""
    futures = [api.client.submit(inc, 1), api.client.submit(div, 1, 0), api.client.submit(inc, 3)]
    return outcome(lambda: [r for _, r in api.as_completed(futures, with_results=True)])


@program
def as_completed_raise_errors_false_yields_the_exceptions(api):
    """``raise_errors=False``: the failed future comes out with its error instead of raising."""
    futures = [api.client.submit(inc, 1), api.client.submit(div, 1, 0), api.client.submit(inc, 3)]
    out = []
    for future, result in api.as_completed(futures, with_results=True, raise_errors=False):
        out.append((future.status, result if future.status == "finished" else "failed"))
    return sorted(out)


@program
def as_completed_over_errors_yields_futures_without_raising(api):
    """Plain ``as_completed`` yields failed futures too; ``result()`` is where the error shows."""
    futures = [api.client.submit(inc, 1), api.client.submit(raise_parity_error, 2), api.client.submit(inc, 3)]
    return sorted((f.status, outcome(f.result)) for f in api.as_completed(futures))


@program
def as_completed_update_adds_many(api):
    """``ac.update(more_futures)`` adds a whole list to a running ``as_completed``."""
    ac = api.as_completed(api.client.map(inc, range(5)))
    ac.update(api.client.map(double, range(5)))
    return sorted(f.result() for f in ac)


@program
def as_completed_count_and_is_empty(api):
    """``count()`` is every future not yet returned; ``is_empty()`` once all have been."""
    futures = api.client.map(inc, range(8))
    ac = api.as_completed(futures)
    before = (ac.count(), ac.is_empty())
    first = next(ac)
    after_one = ac.count()
    ac.add(api.client.submit(inc, first))
    after_add = ac.count()
    rest = list(ac)
    return before, after_one, after_add, len(rest), ac.count(), ac.is_empty()


@program
def as_completed_starts_empty_then_grows(api):
    """``as_completed()`` with no futures is empty; futures added later are yielded."""
    ac = api.as_completed()
    empty = (ac.is_empty(), list(ac))
    ac.add(api.client.submit(square, 9))
    ac.update([api.client.submit(square, 10)])
    return empty, sorted(f.result() for f in ac)


@program
def as_completed_order_a_file_controls(api):
    """Completion order the program controls: the blocked future can only finish after the first arrives."""
    with scratch() as folder:
        go = os.path.join(folder, "go")
        futures = [api.client.submit(wait_for_file, go, "slow"), api.client.submit(inc, 41)]
        order = []
        for future in api.as_completed(futures):
            order.append(futures.index(future))
            touch(go)
        return order, [f.result() for f in futures]


@program
def as_completed_timeout_raises_TimeoutError(api):
    """``as_completed(futures, timeout=...)``: ``next`` past the deadline raises ``TimeoutError``."""
    with scratch() as folder:
        go = os.path.join(folder, "go")
        blocked = api.client.submit(wait_for_file, go, 1)
        got = outcome(lambda: list(api.as_completed([blocked], timeout=0.3)))
        touch(go)
        return got, blocked.result()


# ---------------------------------------------------------------------- wait
@program
def wait_all_completed(api):
    """``wait(futures)`` returns when all are done: ``done`` holds every one, ``not_done`` none."""
    futures = api.client.map(inc, range(20))
    done, not_done = api.wait(futures)
    return len(done), len(not_done), sorted({f.status for f in done})


@program
def wait_all_completed_named_tuple(api):
    """``wait(..., return_when="ALL_COMPLETED")``: the named tuple's ``.done`` / ``.not_done``."""
    futures = api.client.map(square, range(6))
    result = api.wait(futures, return_when="ALL_COMPLETED")
    return len(result.done), len(result.not_done), result.done == set(futures)


@program
def wait_first_completed_with_one_blocked(api):
    """``return_when="FIRST_COMPLETED"`` with one instant task and one blocked on a file created after."""
    with scratch() as folder:
        go = os.path.join(folder, "go")
        quick = api.client.submit(inc, 1)
        blocked = api.client.submit(wait_for_file, go, 2)
        done, not_done = api.wait([quick, blocked], return_when="FIRST_COMPLETED")
        sizes = (len(done), len(not_done), quick in done, blocked in not_done, blocked.status)
        touch(go)
        return sizes, blocked.result()


@program
def wait_timeout_raises_TimeoutError(api):
    """``wait(futures, timeout=0.3)`` on a blocked task raises ``TimeoutError``; the task still finishes."""
    with scratch() as folder:
        go = os.path.join(folder, "go")
        blocked = api.client.submit(wait_for_file, go, "done")
        got = outcome(lambda: api.wait([blocked, api.client.submit(inc, 1)], timeout=0.3))
        status = blocked.status
        touch(go)
        api.wait([blocked])
        return got, status, blocked.status, blocked.result()


@program
def wait_timeout_as_a_string(api):
    """``wait`` takes its timeout as a string too (``"300ms"``), as Dask documents."""
    with scratch() as folder:
        go = os.path.join(folder, "go")
        blocked = api.client.submit(wait_for_file, go, 3)
        got = outcome(lambda: api.wait([blocked], timeout="300ms"))
        touch(go)
        return got, blocked.result()


@program
def wait_over_failed_futures_does_not_raise(api):
    """``wait`` waits; it does not raise for a future that failed (``result()`` would)."""
    futures = [api.client.submit(inc, 1), api.client.submit(div, 1, 0)]
    done, not_done = api.wait(futures)
    return len(done), len(not_done), [f.status for f in futures]


@program
def wait_over_a_cancelled_future_raises(api):
    """``wait`` on a list holding a cancelled future raises (Dask: a CancelledError group)."""
    with scratch() as folder:
        go = os.path.join(folder, "go")
        blocked = api.client.submit(wait_for_file, go, 1)
        ok = api.client.submit(inc, 1)
        blocked.cancel()
        got = outcome(lambda: api.wait([ok, blocked]))
        return got, ok.result(), blocked.status


@program
def result_timeout_raises_TimeoutError(api):
    """``future.result(timeout=...)`` on a blocked task raises ``TimeoutError``; so does ``exception``."""
    with scratch() as folder:
        go = os.path.join(folder, "go")
        blocked = api.client.submit(wait_for_file, go, 5)
        got = (outcome(lambda: blocked.result(timeout=0.2)), outcome(lambda: blocked.exception(timeout=0.2)))
        touch(go)
        return got, blocked.result(timeout=DEADLINE)


# ---------------------------------------------------------------------- fire_and_forget
@program
def fire_and_forget_task_still_runs(api):
    """``fire_and_forget(client.submit(...))`` with no future kept: the task's file appears."""
    with scratch() as folder:
        path = os.path.join(folder, "out")
        api.fire_and_forget(api.client.submit(write_file, path, "fired"))
        return read_when_written(path)


@program
def fire_and_forget_runs_the_dependencies_too(api):
    """A forgotten task whose inputs are other futures the program drops: they run for it."""
    with scratch() as folder:
        path = os.path.join(folder, "out")
        a = api.client.submit(square, 12)
        b = api.client.submit(inc, a)
        api.fire_and_forget(api.client.submit(write_sum, path, a, b))
        del a, b
        return read_when_written(path)


@program
def fire_and_forget_a_list(api):
    """``fire_and_forget`` of a list of futures: every one runs."""
    with scratch() as folder:
        paths = [os.path.join(folder, f"out-{i}") for i in range(6)]
        api.fire_and_forget(api.client.map(write_file, paths, range(6)))
        return [read_when_written(p) for p in paths]


@program
def fire_and_forget_then_release_the_future(api):
    """Keep the future, forget it, then ``del`` it before the task can run: it runs anyway."""
    with scratch() as folder:
        gate, path = os.path.join(folder, "gate"), os.path.join(folder, "out")
        gated = api.client.submit(wait_for_file, gate, "late")
        writer = api.client.submit(write_file, path, gated)
        api.fire_and_forget(writer)
        del writer, gated
        touch(gate)
        return read_when_written(path)


# ---------------------------------------------------------------------- cancel
@program
def future_cancel_mid_flight(api):
    """``future.cancel()`` of a running task: status ``cancelled``, ``cancelled()``, ``result()`` raises."""
    with scratch() as folder:
        started, go = os.path.join(folder, "started"), os.path.join(folder, "go")
        f = api.client.submit(started_then_wait, started, go, 1)
        wait_until(lambda: os.path.exists(started))
        before = (f.status, f.cancelled(), f.done())
        f.cancel()
        return before, (f.status, f.cancelled(), f.done()), outcome(f.result), outcome(f.exception)


@program
def client_cancel_a_list_mid_flight(api):
    """``client.cancel(futures)`` of one running task and five more blocked on the same file or queued."""
    with scratch() as folder:
        started, go = os.path.join(folder, "started"), os.path.join(folder, "go")
        running = api.client.submit(started_then_wait, started, go, 1)
        queued = api.client.map(inc_after_file, range(5), [go] * 5)
        wait_until(lambda: os.path.exists(started))
        api.client.cancel([running] + queued)
        return sorted({f.status for f in [running] + queued}), [outcome(f.result) for f in queued]


@program
def cancel_a_task_whose_dependent_is_pending(api):
    """Cancelling a running task with a pending dependent: what the dependent's ``result()`` raises."""
    with scratch() as folder:
        started, go = os.path.join(folder, "started"), os.path.join(folder, "go")
        a = api.client.submit(started_then_wait, started, go, 1)
        b = api.client.submit(inc, a)
        wait_until(lambda: os.path.exists(started))
        a.cancel()
        got = outcome(b.result)
        return a.status, got, b.status


@program
def cancel_the_dependent_leaves_the_dependency(api):
    """Cancelling only the dependent: the task it waited on still finishes with its value."""
    with scratch() as folder:
        started, go = os.path.join(folder, "started"), os.path.join(folder, "go")
        a = api.client.submit(started_then_wait, started, go, 10)
        b = api.client.submit(inc, a)
        wait_until(lambda: os.path.exists(started))
        b.cancel()
        cancelled = (b.status, outcome(b.result))
        touch(go)
        return cancelled, a.result(), a.status


@program
def cancel_a_finished_future(api):
    """``cancel()`` after the result is in: the future is cancelled all the same."""
    f = api.client.submit(inc, 99)
    value = f.result()
    f.cancel()
    return value, f.status, f.cancelled(), outcome(f.result)


@program
def cancel_then_submit_the_work_again(api):
    """After cancelling a running task, the same call submitted afresh (``pure=False``) computes it."""
    with scratch() as folder:
        started, go = os.path.join(folder, "started"), os.path.join(folder, "go")
        first = api.client.submit(started_then_wait, started, go, 7)
        wait_until(lambda: os.path.exists(started))
        first.cancel()
        touch(go)
        again = api.client.submit(started_then_wait, started, go, 7, pure=False)
        return first.key == again.key, again.result(), first.status


@program
def cancel_a_queued_task_before_it_runs(api):
    """A task waiting on a blocked dependency is cancelled before it starts: cancelled, and its input unharmed.
    (Whether it runs anyway is a race in Dask — its cancel can overtake the submission — and kwdiag never
    runs it: tested in test_runtime_basic, a stated difference in docs/runtime.md.)"""
    with scratch() as folder:
        go, path = os.path.join(folder, "go"), os.path.join(folder, "ran")
        gate = api.client.submit(wait_for_file, go, 1)
        writer = api.client.submit(write_file, path, gate)
        writer.cancel()
        touch(go)
        return gate.result(), writer.status, outcome(writer.result)


# ---------------------------------------------------------------------- retries
@program
def submit_retries_recovers_a_flaky_task(api):
    """``submit(..., retries=2)`` on a task that fails twice: the third attempt's value."""
    with scratch() as folder:
        f = api.client.submit(flaky, folder, 2, "third time", retries=2)
        return f.result(), len(os.listdir(folder)), f.status


@program
def submit_retries_exhausted_raises_the_last_error(api):
    """``retries=2`` on a task that fails three times: the last attempt's exception, with its args."""
    with scratch() as folder:
        f = api.client.submit(flaky, folder, 3, "never", retries=2)
        return outcome(f.result), f.exception().args, len(os.listdir(folder)), f.status


@program
def submit_without_retries_fails_once(api):
    """No ``retries``: a flaky task is tried once and its error kept."""
    with scratch() as folder:
        f = api.client.submit(flaky, folder, 1, "unused")
        return outcome(f.result), len(os.listdir(folder))


@program
def map_with_retries(api):
    """``map(..., retries=3)``: each item fails a different number of times and all recover."""
    with scratch() as folder:
        dirs = [tempfile.mkdtemp(dir=folder) for _ in range(4)]
        futures = api.client.map(flaky, dirs, [0, 1, 2, 3], ["a", "b", "c", "d"], retries=3)
        return api.client.gather(futures), [len(os.listdir(d)) for d in dirs]


@program
def client_retry_after_fixing_the_cause(api):
    """A task fails for a missing file; the program creates it and calls ``client.retry([future])``."""
    with scratch() as folder:
        path = os.path.join(folder, "config")
        f = api.client.submit(needs_file, path, "configured")
        first = outcome(f.result)
        touch(path)
        api.client.retry([f])
        return first, f.result(), f.status


@program
def future_retry_also_retries_failed_dependencies(api):
    """``future.retry()`` on a dependent whose input failed: the input is retried too."""
    with scratch() as folder:
        path = os.path.join(folder, "config")
        a = api.client.submit(needs_file, path, 20)
        b = api.client.submit(inc, a)
        first = (outcome(b.result), a.status, b.status)
        touch(path)
        b.retry()
        return first, b.result(), a.result()


@program
def retry_of_a_finished_future_changes_nothing(api):
    """``client.retry`` of futures that did not fail: they keep their results."""
    futures = api.client.map(inc, range(3))
    values = api.client.gather(futures)
    api.client.retry(futures)
    return values, api.client.gather(futures), [f.status for f in futures]


# ---------------------------------------------------------------------- errors
@program
def error_propagates_to_dependents(api):
    """A failed task's dependents fail with the same exception type."""
    a = api.client.submit(div, 1, 0)
    b = api.client.submit(inc, a)
    c = api.client.submit(add, b, 1)
    return [outcome(f.result) for f in (a, b, c)], [f.status for f in (a, b, c)]


@program
def error_propagates_down_a_rebinding_chain(api):
    """An error at link 5 of a 50-link rebinding chain reaches the last link."""
    f = api.client.submit(inc, 0)
    for i in range(50):
        f = api.client.submit(div, f, 0) if i == 5 else api.client.submit(inc, f)
    return outcome(f.result), f.status, type(f.exception()).__name__


@program
def future_exception_returns_the_exception(api):
    """``future.exception()`` returns the task's exception with its args; ``None`` for a success."""
    bad = api.client.submit(raise_value_error_with_args, "bad input", 7)
    good = api.client.submit(inc, 1)
    exc = bad.exception()
    return type(exc).__name__, exc.args, good.exception()


@program
def future_traceback_is_a_traceback(api):
    """``future.traceback()`` is a traceback object for a failure, ``None`` for a success."""
    bad = api.client.submit(div, 1, 0)
    good = api.client.submit(inc, 1)
    tb = bad.traceback()
    return type(tb).__name__, tb is not None, good.traceback()


@program
def gather_errors_raise(api):
    """``client.gather(futures)`` (``errors="raise"``, the default) raises the first failure's type."""
    futures = [api.client.submit(inc, 1), api.client.submit(raise_parity_error, 2)]
    return outcome(lambda: api.client.gather(futures)), outcome(lambda: api.client.gather(futures, errors="raise"))


@program
def gather_errors_skip_list(api):
    """``gather(futures, errors="skip")`` leaves the failed ones out of a list."""
    futures = [api.client.submit(inc, 1), api.client.submit(div, 1, 0), api.client.submit(inc, 3),
               api.client.submit(raise_parity_error, 4)]
    return api.client.gather(futures, errors="skip")


@program
def gather_errors_skip_dict(api):
    """``gather({name: future}, errors="skip")`` of a dict with one failure."""
    futures = {"ok": api.client.submit(inc, 1), "bad": api.client.submit(div, 1, 0)}
    return api.client.gather(futures, errors="skip")


@program
def custom_exception_class_comes_back(api):
    """A user's exception class defined in the workers' module: the client gets an instance of it."""
    f = api.client.submit(raise_parity_error, "x")
    exc = f.exception()
    return outcome(f.result), isinstance(exc, ParityError), exc.args


@program
def custom_exception_with_arguments_and_attributes(api):
    """An exception whose ``__init__`` takes two arguments keeps its args and attributes."""
    f = api.client.submit(withdraw, "acct-7", 250)
    exc = f.exception()
    return outcome(f.result), exc.args, exc.account, exc.amount


@program
def map_with_some_failures(api):
    """``map`` where some items fail: each future's status and outcome, in the map's order."""
    futures = api.client.map(div, [1, 2, 3, 4], [1, 0, 3, 0])
    api.wait(futures)
    return [(f.status, outcome(f.result)) for f in futures]


@program
def try_except_around_result(api):
    """The user's ``try: f.result() except ZeroDivisionError:`` catches the task's exception."""
    f = api.client.submit(div, 5, 0)
    try:
        f.result()
    except ZeroDivisionError:
        return "caught ZeroDivisionError", f.status
    return "not caught", f.status


# ---------------------------------------------------------------------- submit / map keywords
@program
def submit_with_a_user_key(api):
    """``submit(..., key="...")``: the future's key is the one given."""
    f = api.client.submit(inc, 1, key="parity-user-key-1")
    return f.key, f.result()


@program
def submit_pure_gives_the_same_key(api):
    """Pure calls (the default) with the same arguments share a key; ``pure=False`` calls do not."""
    a, b = api.client.submit(inc, 10), api.client.submit(inc, 10)
    c, d = api.client.submit(inc, 10, pure=False), api.client.submit(inc, 10, pure=False)
    return a.key == b.key, c.key == d.key, a.key == c.key, [f.result() for f in (a, b, c, d)]


@program
def map_pure_keys(api):
    """Two identical ``map`` calls share keys; with ``pure=False`` they do not; different items differ."""
    a, b = api.client.map(inc, range(4)), api.client.map(inc, range(4))
    c = api.client.map(inc, range(4), pure=False)
    return ([x.key == y.key for x, y in zip(a, b)], [x.key == y.key for x, y in zip(a, c)],
            len({x.key for x in a}), api.client.gather(c))


@program
def map_with_a_list_of_keys(api):
    """``map(..., key=[...])``: each future gets its given key."""
    keys = [f"parity-map-key-{i}" for i in range(4)]
    futures = api.client.map(square, range(4), key=keys)
    return [f.key for f in futures], api.client.gather(futures)


@program
def submit_with_priority(api):
    """``priority=`` changes only the order work is picked, never the values."""
    high = api.client.submit(inc, 1, priority=10)
    low = api.client.map(double, range(10), priority=-5)
    return high.result(), api.client.gather(low)


@program
def submit_restricted_to_each_worker(api):
    """``submit(..., workers=[address])`` runs there (``get_worker().address`` inside the task)."""
    addresses = workers_of(api)
    futures = [api.client.submit(where, api.get_worker, addr, workers=[addr], pure=False) for addr in addresses]
    return [f.result() == addr for f, addr in zip(futures, addresses)]


@program
def map_restricted_to_one_worker(api):
    """``map(..., workers=[address])``: every task runs on that worker."""
    target = workers_of(api)[-1]
    futures = api.client.map(where, [api.get_worker] * 8, range(8), workers=[target])
    return sorted(set(api.client.gather(futures))) == [target], len(futures)


@program
def allow_other_workers_when_the_named_worker_is_absent(api):
    """``workers=[unknown], allow_other_workers=True``: the task runs on a worker that exists."""
    f = api.client.submit(where, api.get_worker, workers=["tcp://127.0.0.1:9"], allow_other_workers=True,
                          pure=False)
    return f.result() in workers_of(api)


@program
def restriction_to_an_absent_worker_waits(api):
    """``workers=[unknown]`` without ``allow_other_workers``: the task waits (``result`` times out)."""
    f = api.client.submit(inc, 1, workers=["tcp://127.0.0.1:9"], pure=False)
    return outcome(lambda: f.result(timeout=0.5)), f.status, f.done()


@program
def map_over_several_iterables(api):
    """``client.map(f, xs, ys, zs)`` zips its iterables like the builtin ``map``."""
    futures = api.client.map(add3, range(5), range(10, 15), range(100, 105))
    return api.client.gather(futures)


@program
def map_with_extra_keyword_arguments(api):
    """``client.map(f, xs, factor=3, offset=1)``: keywords go to every call."""
    return api.client.gather(api.client.map(scale, range(6), factor=3, offset=1))


@program
def submit_with_futures_in_keywords_and_containers(api):
    """Futures passed as keywords and inside lists and dicts are replaced by their values."""
    x, y = api.client.submit(inc, 1), api.client.submit(inc, 2)
    a = api.client.submit(scale, x, factor=y, offset=x)
    b = api.client.submit(total, [x, y, 10])
    c = api.client.submit(total_of_values, {"x": x, "y": y})
    return a.result(), b.result(), c.result()


@program
def map_over_an_empty_list(api):
    """``client.map(f, [])`` is an empty list."""
    return api.client.map(inc, [])


@program
def gather_nested_structures(api):
    """``client.gather`` of a dict of lists and tuples of futures keeps the structure."""
    fs = api.client.map(square, range(4))
    return api.client.gather({"pair": (fs[0], fs[1]), "list": [fs[2], fs[3]], "plain": 5})


# ---------------------------------------------------------------------- scatter
@program
def scatter_a_value_and_use_it(api):
    """``future = client.scatter(value)`` then tasks take the future as input."""
    f = api.client.scatter(41)
    return f.status, api.client.submit(inc, f).result(), f.result()


@program
def scatter_a_list(api):
    """``client.scatter([..])`` returns a list of futures in the same order."""
    futures = api.client.scatter([10, 20, 30])
    return type(futures).__name__, len(futures), api.client.gather(futures), \
        api.client.submit(total, futures).result()


@program
def scatter_a_dict_uses_its_names_as_keys(api):
    """``client.scatter({name: value})`` returns a dict of futures whose keys are the names."""
    futures = api.client.scatter({"parity-scatter-x": 1, "parity-scatter-y": 2})
    return sorted(futures), sorted(f.key for f in futures.values()), \
        api.client.submit(add, futures["parity-scatter-x"], futures["parity-scatter-y"]).result()


@program
def scatter_broadcast_lands_on_every_worker(api):
    """``scatter(value, broadcast=True)``: ``who_has`` lists every worker for it."""
    f = api.client.scatter(b"lookup table " * 1000, broadcast=True)
    holders = api.client.who_has([f])
    return [len(v) for v in holders.values()], len(workers_of(api)), api.client.submit(len, f).result()


@program
def scatter_hash_false_gives_a_new_key(api):
    """The same value scattered twice shares a key; with ``hash=False`` it gets a fresh one."""
    a, b = api.client.scatter(12345), api.client.scatter(12345)
    c = api.client.scatter(12345, hash=False)
    return a.key == b.key, a.key == c.key, c.result()


@program
def scatter_to_a_named_worker(api):
    """``scatter(data, workers=[address])`` puts the data on that worker only."""
    target = workers_of(api)[0]
    futures = api.client.scatter([1, 2, 3], workers=[target])
    holders = api.client.who_has(futures)
    return [list(holders[f.key]) == [target] for f in futures]


@program
def replicate_to_both_workers(api):
    """``client.replicate(futures)`` copies results to every worker: holder counts."""
    futures = api.client.map(inc, range(3))
    api.wait(futures)
    api.client.replicate(futures)
    holders = api.client.who_has(futures)
    return [len(holders[f.key]) for f in futures]


# ---------------------------------------------------------------------- large results
@program
def result_of_50_MB(api):
    """A task returning 50 MB of bytes: its length and hash on the client."""
    data = api.client.submit(blob, 50_000_000, 1).result()
    return len(data), sha(data)


@program
def fifty_MB_passed_between_workers(api):
    """50 MB made on one worker and read by a task restricted to the other."""
    first, second = workers_of(api)
    data = api.client.submit(blob, 50_000_000, 2, workers=[first])
    return api.client.submit(digest, data, workers=[second]).result()


@program
def gather_of_200_results_of_100_kB(api):
    """A gather of many mid-size results, in the map's order."""
    futures = api.client.map(blob, [100_000] * 200, range(200))
    values = api.client.gather(futures)
    return len(values), sum(map(len, values)), sha(b"".join(values))


@program
def scatter_20_MB_and_digest_it(api):
    """Scatter 20 MB from the client, digest it in a task."""
    data = blob(20_000_000, 3)
    f = api.client.scatter(data)
    return api.client.submit(digest, f).result() == digest(data)


# ---------------------------------------------------------------------- client.run, who_has, has_what, get_worker
@program
def client_run_reaches_every_worker(api):
    """``client.run(fn)`` runs on every worker and answers ``{address: value}``."""
    answers = api.client.run(pid)
    return sorted(answers) == workers_of(api), len(set(answers.values()))


@program
def client_run_on_one_worker(api):
    """``client.run(fn, workers=[address])`` runs on that worker only."""
    target = workers_of(api)[1]
    answers = api.client.run(pid, workers=[target])
    return list(answers) == [target]


@program
def client_run_with_dask_worker_and_arguments(api):
    """``client.run`` passes the worker as ``dask_worker``, and forwards positional arguments."""
    addresses = api.client.run(address_of)
    sums = api.client.run(add, 2, 3)
    return all(k == v for k, v in addresses.items()), sorted(sums.values())


@program
def who_has_counts(api):
    """``client.who_has(futures)``: one holder for each computed leaf."""
    futures = api.client.map(square, range(5))
    api.wait(futures)
    holders = api.client.who_has(futures)
    return sorted(holders) == sorted(f.key for f in futures), [len(holders[f.key]) for f in futures]


@program
def has_what_lists_the_keys_held(api):
    """``client.has_what()``: per worker, the keys it holds; ours are among them."""
    futures = api.client.map(inc, range(6))
    api.wait(futures)
    held = api.client.has_what()
    return sorted(held) == workers_of(api), {f.key for f in futures} <= set().union(*map(set, held.values()))


@program
def get_worker_inside_a_task(api):
    """``get_worker()`` in a task: its address is one of the cluster's workers."""
    addresses = api.client.gather(api.client.map(where, [api.get_worker] * 6, range(6)))
    return all(a in workers_of(api) for a in addresses)


# ---------------------------------------------------------------------- restart, killed workers
@program
def restart_mid_job_then_new_work(api):
    """``client.restart()`` with finished and running futures held: what they become, then new work."""
    done = api.client.submit(inc, 100)
    done.result()
    running = api.client.map(square, range(2000))
    running[0].result()                      # the job has reached the scheduler: restart it mid-way
    api.client.restart()
    api.client.wait_for_workers(2)
    after = (done.status, outcome(done.result), sorted({f.status for f in running}),
             outcome(running[-1].result))
    fresh = api.client.submit(inc, 100, pure=False)
    return after, fresh.result(), len(workers_of(api))


@program
def task_that_kills_its_worker_raises_KilledWorker(api):
    """A task that kills its worker process each try ends in ``KilledWorker``; the cluster recovers."""
    f = api.client.submit(exit_process, 1, pure=False)
    got = outcome(f.result)
    is_killed = isinstance(f.exception(), api.KilledWorker)
    api.client.wait_for_workers(2)
    return got, is_killed, f.status, api.client.submit(inc, 1, pure=False).result(), len(workers_of(api))


# ---------------------------------------------------------------------- tasks that submit tasks
@program
def get_client_inside_a_task(api):
    """A task calls ``get_client()`` and maps a few children itself."""
    return api.client.submit(sum_via_get_client, 10, api.get_client).result()


@program
def worker_client_context(api):
    """``with worker_client() as client:`` inside a task: submit, gather, return."""
    return api.client.gather(api.client.map(sum_via_worker_client, [5, 10], [api.worker_client] * 2))


@program
def secede_and_rejoin_around_a_wait(api):
    """A task submits children, ``secede()``s, ``wait``s on them, ``rejoin()``s, then sums them."""
    f = api.client.submit(sum_after_secede, 12, api.get_client, api.secede, api.rejoin, api.wait)
    return f.result()


@program
def recursive_fib_with_get_client(api):
    """Dask's recursive Fibonacci with ``get_client`` / ``secede`` / ``rejoin`` (n=8)."""
    return api.client.submit(fib_get_client, 8, api.get_client, api.secede, api.rejoin).result()


@program
def recursive_fib_with_worker_client(api):
    """The same recursion written with ``worker_client()`` (n=7)."""
    return api.client.submit(fib_worker_client, 7, api.worker_client).result()


# ---------------------------------------------------------------------- releasing futures
@program
def map_of_3000_dropped_while_running_then_new_work(api):
    """3,000 futures dropped while they run; new work afterwards is still right."""
    futures = api.client.map(inc, range(3000))
    del futures
    return api.client.submit(total, api.client.map(double, range(100))).result()


@program
def keep_every_tenth_of_3000(api):
    """Keep every tenth future of a 3,000-task map and drop the rest while it runs: the kept are right."""
    futures = api.client.map(square, range(3000))
    kept = futures[::10]
    del futures
    return sum(api.client.gather(kept)), len(kept)


@program
def del_a_dependency_whose_dependent_is_pending(api):
    """``del`` of a future still needed by a pending dependent: the dependent still gets its value."""
    with scratch() as folder:
        started, go = os.path.join(folder, "started"), os.path.join(folder, "go")
        a = api.client.submit(started_then_wait, started, go, 5)
        b = api.client.submit(inc, a)
        wait_until(lambda: os.path.exists(started))
        del a
        touch(go)
        return b.result()


@program
def del_a_finished_input_of_a_gated_task(api):
    """A finished input is dropped while its dependent waits on a gate: the value survives for it."""
    with scratch() as folder:
        go = os.path.join(folder, "go")
        a = api.client.submit(square, 9)
        a.result()
        gate = api.client.submit(wait_for_file, go, 1)
        b = api.client.submit(add3, a, gate, 0)
        del a
        touch(go)
        return b.result()


@program
def future_release_then_resubmit(api):
    """``future.release()`` drops the result; submitting the same call again recomputes it."""
    f = api.client.submit(square, 321)
    first = f.result()
    key = f.key
    f.release()
    again = api.client.submit(square, 321)
    return first, again.key == key, again.result()


# ---------------------------------------------------------------------- done callbacks and statuses
@program
def add_done_callback_records_each_status(api):
    """``add_done_callback`` on a success and a failure: the callback runs in the client with each status."""
    lock, all_called = threading.Lock(), threading.Event()
    seen = []

    def record(future):
        with lock:
            seen.append((future.status, os.getpid() == client_pid))
            if len(seen) == 2:
                all_called.set()

    client_pid = os.getpid()
    good, bad = api.client.submit(inc, 1), api.client.submit(div, 1, 0)
    good.add_done_callback(record)
    bad.add_done_callback(record)
    called = all_called.wait(DEADLINE)
    return called, sorted(seen)


@program
def add_done_callback_after_the_future_is_done(api):
    """A callback added to an already finished future is still called."""
    called = threading.Event()
    seen = []
    f = api.client.submit(inc, 5)
    f.result()
    f.add_done_callback(lambda fut: (seen.append((fut.status, fut.result())), called.set()))
    return called.wait(DEADLINE), seen


@program
def add_done_callback_on_cancel(api):
    """A cancelled future's callbacks run, and see ``cancelled``."""
    with scratch() as folder:
        started, go = os.path.join(folder, "started"), os.path.join(folder, "go")
        called = threading.Event()
        seen = []
        f = api.client.submit(started_then_wait, started, go, 1)
        f.add_done_callback(lambda fut: (seen.append(fut.status), called.set()))
        wait_until(lambda: os.path.exists(started))
        before = list(seen)
        f.cancel()
        return before, called.wait(DEADLINE), seen


@program
def status_pending_then_finished(api):
    """``status`` / ``done()`` move from ``pending`` to ``finished`` when the blocked task is let go."""
    with scratch() as folder:
        go = os.path.join(folder, "go")
        f = api.client.submit(wait_for_file, go, "value")
        before = (f.status, f.done())
        touch(go)
        value = f.result()
        return before, (f.status, f.done()), value


@program
def status_pending_then_error(api):
    """A blocked task that then fails: ``pending`` → ``error``, ``done()`` is true."""
    with scratch() as folder:
        go = os.path.join(folder, "go")
        gate = api.client.submit(wait_for_file, go, 0)
        f = api.client.submit(div, 1, gate)
        before = (f.status, f.done())
        touch(go)
        api.wait([f])
        return before, (f.status, f.done()), outcome(f.result)


@program
def statuses_of_a_mixed_batch(api):
    """``status`` of finished, failed and cancelled futures side by side."""
    with scratch() as folder:
        go = os.path.join(folder, "go")
        ok, bad = api.client.submit(inc, 1), api.client.submit(div, 1, 0)
        blocked = api.client.submit(wait_for_file, go, 1)
        api.wait([ok, bad])
        blocked.cancel()
        return [(f.status, f.done(), f.cancelled()) for f in (ok, bad, blocked)]


# ---------------------------------------------------------------------- dask collections on the client
@program
def client_compute_a_delayed(api):
    """``client.compute(delayed)`` returns a future of the delayed's value."""
    import dask

    x = dask.delayed(inc)(1)
    y = dask.delayed(double)(x)
    z = dask.delayed(add)(x, y)
    future = api.client.compute(z)
    return isinstance(future, api.Future), future.result()


@program
def client_compute_a_list_of_delayed_then_gather(api):
    """``client.gather(client.compute([d1, d2, ...]))``: a list of futures, gathered in order."""
    import dask

    parts = [dask.delayed(square)(i) for i in range(10)]
    whole = dask.delayed(total)(parts)
    return api.client.gather(api.client.compute(parts + [whole]))


@program
def client_persist_a_delayed_then_compute(api):
    """``client.persist(delayed)`` keeps the result on the cluster; computing it again reuses it."""
    import dask

    x = dask.delayed(square)(12)
    persisted = api.client.persist(x)
    return api.client.compute(dask.delayed(inc)(persisted)).result(), api.client.compute(persisted).result()


@program
def dask_compute_with_the_client_as_current(api):
    """``with client.as_current(): dask.compute(...)`` uses that client as the scheduler."""
    import dask

    a = dask.delayed(inc)(10)
    b = dask.delayed(double)(a)
    with api.client.as_current():
        return dask.compute(a, b, dask.delayed(add)(a, b))


@program
def dask_persist_with_the_client_as_current(api):
    """``with client.as_current(): dask.persist(...)`` then ``.compute()``."""
    import dask

    with api.client.as_current():
        (x,) = dask.persist(dask.delayed(square)(11))
        return x.compute(), dask.delayed(inc)(x).compute()


@program
def delayed_error_through_client_compute(api):
    """A delayed that fails: the future from ``client.compute`` raises the same type."""
    import dask

    bad = dask.delayed(div)(1, 0)
    future = api.client.compute(dask.delayed(inc)(bad))
    return outcome(future.result), future.status


@program
def bag_map_filter_sum_with_client_compute(api):
    """A dask.bag pipeline: ``from_sequence(...).map(...).filter(...).sum()`` through ``client.compute``."""
    import dask.bag as db

    bag = db.from_sequence(range(100), npartitions=4).map(inc).filter(is_even)
    return api.client.compute(bag.sum()).result(), api.client.compute(bag.count()).result()


@program
def bag_frequencies_with_dask_compute(api):
    """``bag.map(...).frequencies()`` with ``dask.compute`` under ``client.as_current()``."""
    import dask
    import dask.bag as db

    bag = db.from_sequence(range(30), npartitions=3).map(mod3)
    with api.client.as_current():
        (freqs,) = dask.compute(bag.frequencies())
    return sorted(freqs)


@program
def bag_persist_then_compute(api):
    """``client.persist(bag)`` then a further computation on the persisted bag."""
    import dask.bag as db

    bag = api.client.persist(db.from_sequence(range(12), npartitions=3).map(square))
    return sorted(api.client.compute(bag).result()), api.client.compute(bag.map(inc).sum()).result()


# ---------------------------------------------------------------------- dask.array and dask.dataframe
@program
def array_sum_of_a_chunked_arange_with_client_compute(api):
    """``client.compute`` of a reduction over a chunked ``dask.array``."""
    import dask.array as da

    x = da.arange(10_000, chunks=1_000)
    return int(api.client.compute((x * 2).sum()).result()), int(api.client.compute(x.max()).result())


@program
def array_matrix_product_persisted_then_reduced(api):
    """A persisted 2-D array reused by two computations (``x @ x.T``, then its mean by column)."""
    import dask.array as da

    x = api.client.persist(da.ones((400, 300), chunks=(100, 100)) * 2)
    product = api.client.compute((x @ x.T).sum()).result()
    return int(product), api.client.compute(x.mean(axis=0)).result().tolist()[:3], x.shape


@program
def array_dask_compute_of_several_results_as_current(api):
    """``dask.compute`` of several array results at once, with the client as Dask's scheduler."""
    import dask
    import dask.array as da

    x = da.arange(1_000, chunks=100).reshape(10, 100)
    with api.client.as_current():
        total, column, rows = dask.compute(x.sum(), x.sum(axis=0)[:5], x.shape[0])
    return int(total), column.tolist(), rows


@program
def array_with_a_failing_block_raises_its_error(api):
    """A ``map_blocks`` function that raises on one block: the computation raises that error."""
    import dask.array as da

    x = da.arange(100, chunks=10).map_blocks(explode_on_block_with, 55, dtype=int)
    return outcome(lambda: api.client.compute(x.sum()).result())


@program
def dataframe_groupby_sum_with_client_compute(api):
    """``dask.dataframe`` from pandas, a groupby aggregation computed on the cluster."""
    import dask.dataframe as dd
    import pandas as pd

    frame = pd.DataFrame({"key": [i % 5 for i in range(200)], "value": range(200)})
    ddf = dd.from_pandas(frame, npartitions=4)
    result = api.client.compute(ddf.groupby("key").value.sum()).result()
    return sorted((int(k), int(v)) for k, v in result.items())


@program
def dataframe_persist_then_filter_and_count(api):
    """A persisted dataframe, filtered and counted, and a column's mean."""
    import dask.dataframe as dd
    import pandas as pd

    frame = pd.DataFrame({"x": range(1_000), "y": [i * 0.5 for i in range(1_000)]})
    ddf = api.client.persist(dd.from_pandas(frame, npartitions=8))
    filtered = ddf[ddf.x % 3 == 0]
    return int(api.client.compute(filtered.x.count()).result()), float(api.client.compute(ddf.y.mean()).result())


def explode_on_block_with(block, value):
    if value in block:
        raise ParityError(f"block holding {value}")
    return block
