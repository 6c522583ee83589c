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
