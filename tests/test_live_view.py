"""The live view of `kwdiag run` on a terminal: one screen high at any cluster size, memory known from the start.

The view renders the scheduler's own ``scheduler_info`` (a real cluster's, in the second test) into rich
on a console of a given size; nothing is mocked below the renderer.
"""

from __future__ import annotations

import io

from conftest import wait_until
from kwdiag.run.view import ClusterState, LiveView
from kwdiag.runtime import Client, LocalCluster

GiB = 1024**3


def _rendered(state: ClusterState, height: int = 24, width: int = 100) -> list[str]:
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, width=width, height=height, force_terminal=True, color_system=None)
    view = LiveView("job.py", "/tmp/run", console=console)
    view.state = state
    console.print(view._render())
    return out.getvalue().rstrip("\n").splitlines()


def test_thirty_two_workers_fit_one_screen_with_the_ones_near_their_limit_shown():
    workers = [{"name": f"worker-{i:02d}", "memory": (i + 1) * GiB // 64, "memory_limit": GiB, "executing": 1,
                "restarts": 0} for i in range(32)]
    workers[3]["memory"] = int(0.97 * GiB)   # the one about to be killed for memory
    lines = _rendered(ClusterState(workers=workers, running=32, submitted=100))
    assert len(lines) <= 24 - 2, "\n".join(lines)   # room left for the lines printed above the view
    text = "\n".join(lines)
    assert "worker-03" in text and "worker-31" in text   # the fullest are shown
    more = next(line for line in lines if "more" in line)
    assert more.split()[0] == f"+{32 - (len(lines) - 3)}"   # every other worker counted in one row


def test_a_small_cluster_shows_every_worker_and_its_memory_from_registration():
    """A worker's memory is known as soon as it registers (it sends it then), not '? / 1 GiB' until its
    first heartbeat."""
    with LocalCluster(n_workers=2, memory_limit="1GiB", config={"heartbeat_interval": 60}) as cluster, \
            Client(cluster) as client:
        info = wait_until(lambda: (lambda i: i if len(i["workers"]) == 2 else None)(client.scheduler_info()))
        state = ClusterState.from_info(info, 1.0, 0, {})
        assert all(w["memory"] and w["memory"] > 10 * 1024**2 for w in state.workers), state.workers
        text = "\n".join(_rendered(state))
        assert "? /" not in text and text.count("/ 1 GiB") == 2
