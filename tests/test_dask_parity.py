"""Dask is the oracle: every program in ``dask_programs`` runs on Dask's LocalCluster and on kwdiag's, same answer.

Both clusters (two workers of two threads, under nannies) serve the whole module; each program is one
test that runs on Dask first, then on kwdiag, and compares what they returned: values, statuses,
exception types, and orders only where Dask documents one. A difference kwdiag keeps on purpose is in
``docs/runtime.md``'s parity table and is tested there as kwdiag's behaviour, not here.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

import dask_programs

distributed = pytest.importorskip("distributed")

import kwdiag.runtime as kwdiag_runtime  # noqa: E402


def _api(module: Any, client) -> types.SimpleNamespace:
    names = ("as_completed", "wait", "fire_and_forget", "get_client", "get_worker", "secede", "rejoin",
             "worker_client", "KilledWorker", "Future", "FIRST_COMPLETED", "ALL_COMPLETED")
    api = types.SimpleNamespace(client=client, name=module.__name__.split(".")[0])
    for name in names:
        setattr(api, name, getattr(module, name, None))
    return api


@pytest.fixture(scope="module")
def dask_api(kwdiag_api):
    # Started after kwdiag's: the newest client becomes Dask's default scheduler, as a user's would, and
    # kwdiag's programs that use dask.compute say which client they mean (``client.as_current()``).
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0",
                                  memory_limit="1GiB") as cluster, distributed.Client(cluster) as client:
        yield _api(distributed, client)


@pytest.fixture(scope="module")
def kwdiag_api(tmp_path_factory):
    log_dir = str(tmp_path_factory.mktemp("parity-logs"))
    with kwdiag_runtime.LocalCluster(n_workers=2, threads_per_worker=2, memory_limit="1GiB",
                                     log_dir=log_dir) as cluster, kwdiag_runtime.Client(cluster) as client:
        yield _api(kwdiag_runtime, client)


@pytest.mark.parametrize("name", sorted(dask_programs.PROGRAMS))
def test_kwdiag_gives_dasks_answer(name, dask_api, kwdiag_api):
    program = dask_programs.PROGRAMS[name]
    expected = dask_programs.outcome(lambda: program(dask_api))
    got = dask_programs.outcome(lambda: program(kwdiag_api))
    assert got == expected, f"{name}: Dask gave {expected!r}, kwdiag {got!r}"
