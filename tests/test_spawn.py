"""The spawn seam: a child imports the same kwdiag as its parent, whatever directory it starts in."""

from __future__ import annotations

import os
import subprocess
import sys

from kwdiag.runtime.spawn import child_env, entry_command, module_command, parent_path


def _shadowing_folder(tmp_path):
    """A folder holding a ``kwdiag/`` that is not kwdiag, as a clone's root is after `pip install .`."""
    fake = tmp_path / "kwdiag"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('the wrong kwdiag was imported')\n")
    return tmp_path


def test_a_child_started_in_a_shadowing_folder_imports_the_parents_kwdiag(tmp_path):
    cwd = _shadowing_folder(tmp_path)
    ok = subprocess.run(entry_command("--help"), cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "scheduler" in ok.stdout
    # The same child started the way kwdiag used to (python -m, current directory first) gets the wrong one:
    # the test can fail.
    bad = subprocess.run([sys.executable, "-m", "kwdiag.runtime.entry", "--help"], cwd=cwd, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": ""})
    assert bad.returncode != 0 and "wrong kwdiag" in bad.stderr


def test_child_path_order_explicit_then_parent_then_appended_then_inherited(tmp_path):
    base = {"PYTHONPATH": str(tmp_path / "inherited"), "HOME": "/nowhere"}
    env = child_env({"PYTHONPATH": str(tmp_path / "explicit"), "X": "1"}, base=base,
                    append_path=[str(tmp_path / "job")])
    path = env["PYTHONPATH"].split(os.pathsep)
    parent = parent_path()
    assert path[0] == str(tmp_path / "explicit")
    assert path[1:1 + len(parent)] == parent
    assert path[-2:] == [str(tmp_path / "job"), str(tmp_path / "inherited")]
    assert env["X"] == "1" and env["HOME"] == "/nowhere"
    assert all(os.path.isabs(p) for p in path)


def test_parent_path_makes_the_current_directory_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parent_path(["", "relative", "/abs", "/abs"]) == [str(tmp_path), str(tmp_path / "relative"), "/abs"]


def test_module_command_never_puts_the_current_directory_first():
    assert module_command("kwdiag", "demo")[:4] == [sys.executable, "-P", "-m", "kwdiag"]


def test_the_source_tree_is_the_package():
    """kwdiag/runtime and kwdiag/rules are links to the top-level runtime/ and rules/: in the clone's root,
    ``import kwdiag.runtime`` (a job script there, ``python -m kwdiag``) finds the same files an install has,
    with no search-path fallback, and pyproject.toml lists no packages by hand (discovery finds them)."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for name in ("runtime", "rules"):
        link = root / "kwdiag" / name
        assert link.is_symlink() and link.resolve() == (root / name).resolve(), link
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert not isinstance(setuptools.get("packages"), list) and "package-dir" not in setuptools
    found = subprocess.run([sys.executable, "-I", "-c", "import kwdiag.runtime.scheduler_state as s, kwdiag.rules as r;"
                            "print(s.__file__); print(r.__file__)"], cwd=root, capture_output=True, text=True,
                           timeout=60)
    # -I: no user site, no PYTHONPATH: the installed (editable) kwdiag or the clone.s own folder, the same files.
    assert found.returncode == 0, found.stderr
    state, rules = found.stdout.split()
    assert Path(state).resolve() == (root / "runtime" / "scheduler_state.py").resolve()
    assert Path(rules).resolve() == (root / "rules" / "__init__.py").resolve()
