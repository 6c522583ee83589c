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


def test_every_package_is_listed_for_a_non_editable_install():
    """pyproject.toml lists packages by hand (package-dir and discovery do not mix): a package folder left
    out installs as nothing and `pip install .` breaks with "No module named ..." while `-e` still works."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"kwdiag." + ".".join(p.parent.relative_to(root / "kwdiag").parts) if p.parent != root / "kwdiag"
             else "kwdiag" for p in (root / "kwdiag").rglob("__init__.py")}
    found |= {"kwdiag.runtime." + ".".join(p.parent.relative_to(root / "runtime").parts)
              if p.parent != root / "runtime" else "kwdiag.runtime" for p in (root / "runtime").rglob("__init__.py")}
    assert found <= listed, f"not in pyproject.toml packages: {sorted(found - listed)}"
