"""The nanny's kill of a worker that did not finish stopping decides nothing alone; what asked for the stop does.

`Worker process still alive after N seconds, killing` is `Nanny.kill` escalating a stop it was asked for. In
Dask 2026.8 that stop is a chosen close or restart, or the scheduler restarting a worker that stopped answering
(`Worker failed to heartbeat ...; attempting restart`: a hang, `sudden_exit/heartbeat_timeout` in the spec).
The lines below are real, cut from the corpus's Dask 2026.8.0 runs (`sample_logs/corpus/cases/2026.8.0/`) as a
user pastes a part of a log: each paste is read by `kwdiag explain` as it stands.
"""

from __future__ import annotations

import pytest

from kwdiag.pipeline import analyze

HEARTBEAT = ("2026-11-23 22:45:12,116 - distributed.scheduler - WARNING - Worker failed to heartbeat for 5s; "
             "attempting restart: <WorkerState 'tcp://127.0.0.1:42885', name: 1, status: running, memory: 0, "
             "processing: 1>")
KILL_4S = "2026-11-23 22:45:16,121 - distributed.nanny - WARNING - Worker process still alive after 4.0 seconds, killing"
RESTARTING = "2026-11-23 22:45:16,136 - distributed.nanny - WARNING - Restarting worker (status=Status.running)"
SIGTERM_CLOSE = [  # 041-sigterm-cli-nn-random-end/w0.log: SIGTERM to the nanny, whose worker was slow to stop
    "2026-11-23 22:51:49,349 - distributed._signals - INFO - Received signal SIGTERM (15)",
    "2026-11-23 22:51:49,349 - distributed.nanny - INFO - Closing Nanny at 'tcp://127.0.0.1:38751'. Reason: signal-15",
    "2026-11-23 22:51:49,351 - distributed.nanny - INFO - Nanny asking worker to close. Reason: signal-15",
    "2026-11-23 22:51:57,353 - distributed.nanny - WARNING - Worker process still alive after 8.0 seconds, killing",
    "2026-11-23 22:51:57,358 - distributed.nanny - INFO - Worker process 6868 was killed by signal 9",
    "2026-11-23 22:51:57,366 - distributed.nanny - INFO - Nanny at 'tcp://127.0.0.1:38751' closed.",
    "2026-11-23 22:51:57,366 - distributed.dask_worker - INFO - End worker",
]
KILL_8S, SIGKILL_AFTER = SIGTERM_CLOSE[3], SIGTERM_CLOSE[4]


def _deaths(tmp_path, lines):
    path = tmp_path / "paste.log"
    path.write_text("\n".join(lines) + "\n")
    return analyze([str(path)]).deaths


@pytest.mark.parametrize("lines", [[KILL_4S, RESTARTING], [KILL_8S, SIGKILL_AFTER]],
                         ids=["kill-then-restart", "kill-then-sigkill"])
def test_the_kill_alone_is_unknown_with_both_readings(tmp_path, lines):
    (death,) = _deaths(tmp_path, lines)
    assert (death.cause, death.detail) == ("unknown", "close_timeout")
    assert set(death.alternatives) == {"chose_to_exit/close_timeout", "sudden_exit/heartbeat_timeout"}
    assert death.disagreement == ()                   # the SIGKILL is the nanny's, not an outside killer's
    assert any("failed to heartbeat" in h.text for h in death.hints)   # what tells the readings apart


def test_with_the_schedulers_heartbeat_line_it_is_the_hang(tmp_path):
    (death,) = _deaths(tmp_path, [HEARTBEAT, KILL_4S, RESTARTING])
    assert (death.cause, death.detail) == ("sudden_exit", "heartbeat_timeout")


def test_with_the_close_it_completes_it_is_that_close(tmp_path):
    (death,) = _deaths(tmp_path, SIGTERM_CLOSE)
    assert (death.cause, death.detail) == ("chose_to_exit", "sigterm")
