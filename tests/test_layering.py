"""Imports follow the data flow: analysis never imports the runtime; the runtime imports only kwdiag.events."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Where the runtime and the analyzer meet: the commands that start runtime processes, and `kwdiag run`.
RUNTIME_USERS = ("kwdiag/cli_runtime.py", "kwdiag/cli_run.py", "kwdiag/run/")


def imported_modules(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_analysis_code_never_imports_the_runtime():
    offenders = []
    for path in (ROOT / "kwdiag").rglob("*.py"):
        if str(path.relative_to(ROOT)).startswith(RUNTIME_USERS):
            continue
        offenders += [f"{path.relative_to(ROOT)}: {m}" for m in imported_modules(path)
                      if m == "kwdiag.runtime" or m.startswith("kwdiag.runtime.")]
    assert not offenders, offenders


def test_runtime_imports_only_the_event_module_from_kwdiag():
    offenders = []
    for path in (ROOT / "runtime").rglob("*.py"):
        for module in imported_modules(path):
            if module.startswith("kwdiag") and not (module == "kwdiag.events" or module.startswith("kwdiag.runtime")):
                offenders.append(f"{path.relative_to(ROOT)}: {module}")
    assert not offenders, offenders
