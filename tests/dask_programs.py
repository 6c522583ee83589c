"""Client programs written the way Dask's users and Dask's documentation write them, for ``test_dask_parity``.

Each program takes ``api`` — the client and the module-level names of one library (``distributed`` or
``kwdiag.runtime``): ``api.client``, ``api.as_completed``, ``api.wait``, ... — and returns plain data:
values, statuses, exception type names (``outcome()``), in an order the program makes deterministic or that
Dask documents. The test runs every program on Dask's ``LocalCluster`` and on kwdiag's and compares the two
answers. A program's task functions live here, at module level, so both runtimes' workers import them by
reference as they would a user's module.

Does not cover: programs that must start or kill a cluster of their own (those are in the test module).
"""

from __future__ import annotations

import operator
from typing import Any, Callable

PROGRAMS: dict[str, Callable[[Any], Any]] = {}


def program(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    PROGRAMS[fn.__name__] = fn
    return fn


def outcome(call: Callable[[], Any]) -> Any:
    """``("ok", value)`` or ``("raised", ExceptionTypeName)``: what a user's ``try`` would see."""
    try:
        return ("ok", call())
    except Exception as exc:  # the type is what both runtimes must agree on; messages differ in wording
        return ("raised", type(exc).__name__)


# ---------------------------------------------------------------------- task functions
def inc(x, *_):
    return x + 1


def add(a, b):
    return a + b


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
