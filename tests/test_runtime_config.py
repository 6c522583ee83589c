"""Runtime configuration layering and parsing (pure)."""

import pytest

from kwdiag.runtime import config


def test_sizes_and_durations():
    assert config.parse_bytes("2GiB") == 2 * 2**30 and config.parse_bytes("500MB") == 500 * 10**6
    assert config.parse_bytes(None) is None and config.parse_bytes("0") is None and config.parse_bytes(1e9) == 10**9
    assert config.parse_timedelta("5s") == 5 and config.parse_timedelta("300ms") == pytest.approx(0.3)
    assert config.parse_timedelta("2m") == 120
    for bad in ("lots", "2 parsecs"):
        with pytest.raises(ValueError):
            config.parse_bytes(bad)
    with pytest.raises(ValueError):
        config.parse_timedelta("soon")


def test_layering_file_then_env_then_arguments(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.kwdiag]\nallowed-failures = 5\nworker_ttl = "7s"\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert config.load(environ={})["allowed_failures"] == 5          # found by walking up
    assert config.load(environ={})["worker_ttl"] == 7.0
    assert config.load(environ={"KWDIAG_ALLOWED_FAILURES": "6"})["allowed_failures"] == 6
    assert config.load({"allowed_failures": 1}, environ={"KWDIAG_ALLOWED_FAILURES": "6"})["allowed_failures"] == 1
    (tmp_path / "sub" / "kwdiag.toml").write_text("allowed_failures = 9\n")
    assert config.load(environ={})["allowed_failures"] == 9          # the nearer file wins
    with pytest.raises(ValueError, match="unknown runtime setting"):
        config.load({"allowed_failure": 1})


def test_lists_from_the_environment():
    loaded = config.load(environ={"KWDIAG_VERSIONS_PACKAGES": "numpy, pandas"}, use_file=False)
    assert loaded["versions_packages"] == ["numpy", "pandas"]


def test_the_prefetch_window_widens_for_short_tasks_and_narrows_when_they_turn_long():
    """Placement's window (tasks a worker may hold beyond its threads) from the durations workers report:
    unknown -> worker_window; short -> about worker_window_seconds of work, capped; long again -> back."""
    from kwdiag.runtime.scheduler import Scheduler, TaskState, key_prefix

    scheduler = Scheduler(secret=b"s" * 32, config=config.load({}, use_file=False, environ={}), log_dir=None).state
    task = TaskState("noop-3f2a", b"", (0, 0))
    assert key_prefix("noop-3f2a") == key_prefix("noop-99") == "noop" and key_prefix("plain") == "plain"
    assert scheduler.window(task) == 4                        # nothing known yet: the configured window
    scheduler.learn_duration("noop-1", 0.001)                 # 1 ms tasks: 10 ms of work is 10 tasks
    assert scheduler.window(task) == 10
    for _ in range(10):
        scheduler.learn_duration("noop-2", 0.00001)           # no-ops: the estimate follows them down
    assert scheduler.window(task) == 64                        # never past worker_window_max
    for _ in range(3):
        scheduler.learn_duration("noop-3", 2.0)               # the same function turns slow
    assert scheduler.window(task) == 4
    assert scheduler.window(TaskState("other-1", b"", (0, 0))) == 4   # per function, not global
    narrow = Scheduler(secret=b"s" * 32, log_dir=None,
                       config=config.load({"worker_window_seconds": "0s"}, use_file=False, environ={})).state
    narrow.learn_duration("noop-1", 0.00001)
    assert narrow.window(task) == 4                           # 0 s turns the widening off
