"""Dask collections on the embedded runtime: a Dask graph becomes kwdiag tasks (``client.compute``,
``client.persist``, ``client.get`` and ``dask.compute`` with a kwdiag client as the scheduler).

Covers: turning a collection (``dask.delayed``, ``dask.bag``, ``dask.array``, ``dask.dataframe``) into
its optimised graph as Dask's own client does (the expression, finalised for ``compute``), each graph
node into one task whose dependencies are the nodes it reads (and any kwdiag future inside it, as in a
persisted collection), and the keys Dask asked for into futures. Dask's keys may be tuples; a task's key
is the key's ``str()``.

Does not cover: Dask's own scheduling order (tasks run in submission order and by ``priority``), graph
annotations, or Dask versions whose graphs predate ``dask._task_spec`` (before 2024.12): those raise a
clear error naming the version. Needs ``dask``; nothing here is imported unless a collection is used.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from kwdiag.runtime.client import Client, Future


class KeyRef:
    """A reference to another task's result inside a task's spec: pickled as a dependency, loaded as its value."""

    __slots__ = ("key",)

    def __init__(self, key: str):
        self.key = key


def stringify(key: Any) -> str:
    return key if isinstance(key, str) else str(key)


def run_node(node: Any, values: dict) -> Any:
    """Run one Dask graph node on a worker, with its dependencies' values keyed by their Dask keys."""
    return node(values)


def _task_spec_module() -> Any:
    try:
        from dask import _task_spec
    except ImportError:
        import dask

        raise NotImplementedError(f"Dask collections need dask 2024.12 or later on kwdiag's runtime; this is "
                                  f"dask {dask.__version__}") from None
    return _task_spec


def collection_graph(collections: list[Any], optimize_graph: bool = True, finalize: bool = False
                     ) -> tuple[dict, list[Any]]:
    """The graph of ``collections`` and the keys to ask for: for ``compute`` (``finalize``), one key per
    collection that holds its final value; for ``persist``, each collection's own keys (nested lists)."""
    import dask
    from dask.core import flatten

    try:
        from dask.base import collections_to_expr
    except ImportError:   # before expressions: a plain graph
        from dask.base import collections_to_dsk

        graph = collections_to_dsk(collections, optimize_graph)
        if finalize:
            raise NotImplementedError(f"client.compute needs dask 2025.1 or later on kwdiag's runtime; this is "
                                      f"dask {dask.__version__} (client.persist and dask.compute work)")
        return dict(graph), [c.__dask_keys__() for c in collections]
    expr = collections_to_expr(collections, optimize_graph)
    if finalize:
        from dask._expr import FinalizeCompute

        expr = FinalizeCompute(expr)
    expr = expr.optimize()
    keys = expr.__dask_keys__()
    return dict(expr.__dask_graph__()), list(flatten(keys)) if finalize else keys


def graph_of(dsk: Any) -> dict:
    """A graph given to ``Client.get``: an expression, a HighLevelGraph or a plain dict."""
    if hasattr(dsk, "__dask_graph__") and not isinstance(dsk, dict):
        dsk = dsk.__dask_graph__()
    return dict(dsk)


def submit_graph(client: "Client", graph: dict, keys: Iterable[Any], *, retries: int | None = None,
                 priority: int = 0, workers: Any = None, allow_other_workers: bool = False) -> dict[Any, "Future"]:
    """Submit every node of ``graph`` as a task (in one message) and return futures of ``keys``."""
    from kwdiag.runtime.client import _SpecPickler, _as_list

    nodes = _task_spec_module().convert_legacy_graph(graph)
    specs = []
    restrictions = _as_list(workers)
    for key, node in nodes.items():
        deps = {dep: KeyRef(stringify(dep)) for dep in node.dependencies if dep in nodes}
        buffer, dep_keys = io.BytesIO(), []
        _SpecPickler(buffer, dep_keys).dump((run_node, (node, deps), {}))
        specs.append({"key": stringify(key), "spec": buffer.getvalue(), "deps": dep_keys, "workers": restrictions,
                      "loose": allow_other_workers, "priority": priority, "retries": retries})
    return client._submit_specs(specs, [stringify(k) for k in keys], keep_alive=graph)
