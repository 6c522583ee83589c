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


def test_runtime_imports_only_the_event_and_settings_modules_from_kwdiag():
    """The runtime shares the event format, the settings reader (one search rule for every command and
    process), the one size dialect and what a faulthandler dump looks like, and nothing else of kwdiag."""
    offenders = []
    for path in (ROOT / "runtime").rglob("*.py"):
        for module in imported_modules(path):
            if module.startswith("kwdiag") and not (module in ("kwdiag.events", "kwdiag.settings", "kwdiag.units", "kwdiag.crashdump")
                                                    or module.startswith("kwdiag.runtime")):
                offenders.append(f"{path.relative_to(ROOT)}: {module}")
    assert not offenders, offenders


# ---------------------------------------------------------------- the stages, bottom to top
# A module may import only modules of its own layer or below (docs/architecture.md draws this), in
# function bodies too. The runtime is a separate stack that uses only kwdiag.events from kwdiag.
LAYERS = [
    ("kwdiag", "kwdiag.events", "kwdiag.errors", "kwdiag.escape", "kwdiag.units", "kwdiag.settings",
     "kwdiag.kinds", "kwdiag.reasons", "kwdiag.records", "kwdiag.crashdump"),
    ("kwdiag.engine", "kwdiag.rulebundle"),
    ("kwdiag.readers",),
    ("kwdiag.timeline",),
    ("kwdiag.analysis",),
    ("kwdiag.pipeline",),
    ("kwdiag.report", "kwdiag.check"),
    ("kwdiag.runtime", "kwdiag.dask", "kwdiag.run"),
    ("kwdiag.cli", "kwdiag.cli_analysis", "kwdiag.cli_check", "kwdiag.cli_io", "kwdiag.cli_run", "kwdiag.cli_runtime",
     "kwdiag.__main__"),
]


def layer_of(module: str) -> int | None:
    best = None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if module == p or (p != "kwdiag" and module.startswith(p + ".")):
                if best is None or len(p) > best[1]:
                    best = (i, len(p))
    return best[0] if best else None


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    if parts[0] == "runtime":
        parts = ["kwdiag", "runtime", *parts[1:]]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def all_imports(path: pathlib.Path, module: str | None = None):
    """Every module ``path`` imports, at its top or in a function body, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = (module or module_name(path)).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            yield base
            for alias in node.names:
                yield f"{base}.{alias.name}"


def test_stages_import_only_what_lies_below_them():
    offenders = []
    for path in list((ROOT / "kwdiag").rglob("*.py")) + list((ROOT / "runtime").rglob("*.py")):
        me = module_name(path)
        mine = layer_of(me)
        if mine is None:
            offenders.append(f"{me}: in no layer (add it to LAYERS and docs/architecture.md)")
            continue
        for target in all_imports(path):
            if not target.startswith("kwdiag"):
                continue
            theirs = layer_of(target)
            if theirs is not None and theirs > mine and not target.startswith(me + "."):
                offenders.append(f"{me} (layer {mine}) imports {target} (layer {theirs})")
    assert not offenders, "\n".join(offenders)


def test_the_layer_check_would_catch_a_back_edge(tmp_path):
    bad = tmp_path / "kwdiag" / "engine_bad.py"
    bad.parent.mkdir()
    bad.write_text("def f():\n    from kwdiag.report.terminal import render_terminal\n")
    targets = [t for t in all_imports(bad, "kwdiag.engine_bad") if t.startswith("kwdiag")]
    assert "kwdiag.report.terminal" in targets
    assert layer_of("kwdiag.report.terminal") > layer_of("kwdiag.engine")


def test_runtime_client_and_cluster_share_helpers_instead_of_importing_each_other():
    """The cluster (what starts processes) never imports the client (what a job uses): they share helpers
    (``core``, ``comm``, ``loopthread``, ``identity``, ``spawn``). The client imports the cluster one way,
    for ``Client()`` with no address, which starts one as Dask's does. Neither imports a process's entry."""
    for name, others in (("client", ("kwdiag.runtime.entry",)),
                         ("cluster", ("kwdiag.runtime.client", "kwdiag.runtime.entry"))):
        path = ROOT / "runtime" / f"{name}.py"
        bad = [m for m in all_imports(path) if m in others]
        assert not bad, f"runtime/{name}.py imports {bad}"


def test_every_command_group_registers_or_the_cli_fails():
    """A command module that cannot be imported is an error at start, not a command missing from --help."""
    import kwdiag.cli as cli

    app = cli.register(None)
    names = {c.name or c.callback.__name__ for c in app.registered_commands} | \
        {g.typer_instance.info.name for g in app.registered_groups}
    # every command is listed under the module that registers it, so `kwdiag NAME` registers the right one
    assert names == {n for commands in cli.COMMAND_MODULES.values() for n in commands}
    assert cli.modules_for(["--debug", "explain", "x.log"]) == ["cli_analysis"]
    assert cli.modules_for(["rules", "list"]) == ["cli_analysis"]
    assert cli.modules_for(["--help"]) == cli.modules_for(["explian"]) == list(cli.COMMAND_MODULES)
    source = (ROOT / "kwdiag" / "cli.py").read_text()
    assert "except ModuleNotFoundError" not in source


def test_no_function_over_sixty_lines_without_a_reason_in_its_docstring():
    """Long functions hide what they do; the few that stay long say why ("Over 60 lines on purpose: ...")."""
    long = []
    for path in list((ROOT / "kwdiag").rglob("*.py")) + list((ROOT / "runtime").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                if "Over 60 lines on purpose" not in " ".join((ast.get_docstring(node) or "").split()):
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not long, long
