#!/usr/bin/env python3
"""Catalog how each release of dask `distributed` words its log messages around a worker's
life and death, read from the real source of each version.

What it does (stdlib only; needs pip, and git if --bracket-git is used):
  1. `pip download distributed==X --no-deps` for each primary version into a scratch dir
     and unpacks the wheel (or sdist);
  2. optionally unpacks every other release tag from a git clone of dask/distributed
     (`--bracket-git`), to find the first and last version of each exact template;
  3. parses every non-test module with `ast`: each logging call (logger.debug/info/warning/
     error/exception/critical/log) with its logger name and level and the literal template
     (f-strings kept as written: {x!r}, {x=}; '%' templates as written), following a message
     built in a local variable or returned by a helper (nanny's _death_message); plus
     exception texts (KilledWorker.__str__, raise/warn strings), WorkerState.__repr__,
     close-reason and stimulus-id strings;
  4. keeps the templates matched by MESSAGES below and writes catalog.json and examples.txt.

Usage:
  python3 extract.py                                   # 27 default versions via pip
  python3 extract.py --bracket-git /path/to/distributed.git --print-config
  python3 extract.py --versions 2022.5.2,2026.8.0 --out /tmp/out

Not needed at test time. Nothing here runs Dask; examples.txt lines are filled templates.
"""
import argparse
import ast
import builtins
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from concurrent.futures import ProcessPoolExecutor


# =============================================================================
# Scanning one source tree
# =============================================================================

LEVELS = {
    "debug": "DEBUG",
    "info": "INFO",
    "warning": "WARNING",
    "warn": "WARNING",
    "error": "ERROR",
    "exception": "ERROR",
    "critical": "CRITICAL",
    "fatal": "CRITICAL",
    "log": None,
}
SKIP_PARTS = ("/tests/", "/dashboard/", "/http/", "/shuffle/", "/_vendor/")
SKIP_FILES = ("utils_test.py", "pytest_resourceleaks.py", "_version.py", "versioneer.py")


def read_string_pieces(seg):
    """Split the source text of a (possibly implicitly concatenated) string literal.

    Returns [(prefix, quote, body)], or None if the text is not only string literals.
    """
    i, n = 0, len(seg)
    out = []
    while i < n:
        c = seg[i]
        if c in " \t\r\n()":
            i += 1
            continue
        if c == "\\" and i + 1 < n and seg[i + 1] in "\r\n":
            i += 2
            continue
        if c == "#":
            while i < n and seg[i] != "\n":
                i += 1
            continue
        j = i
        while j < n and seg[j].isalpha():
            j += 1
        prefix = seg[i:j]
        if j >= n or seg[j] not in "'\"" or len(prefix) > 3:
            return None
        q = seg[j : j + 3] if seg[j : j + 3] in ('"""', "'''") else seg[j]
        k = j + len(q)
        start = k
        while k < n:
            if seg[k] == "\\":
                k += 2
                continue
            if seg.startswith(q, k):
                break
            k += 1
        else:
            return None
        out.append((prefix, q, seg[start:k]))
        i = k + len(q)
    return out


class Module:
    def __init__(self, path, rel, modname):
        with open(path, encoding="utf-8") as f:
            self.src = f.read()
        raw = self.src.encode("utf-8").split(b"\n")
        self.blines = [l + b"\n" for l in raw[:-1]] + [raw[-1]]
        self.rel = rel
        self.modname = modname
        self.tree = ast.parse(self.src)
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                child._parent = node
        self.loggers = self._find_loggers()
        self.functions = {}
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, []).append(node)
        self.consumed = set()
        self.format_nodes = set()

    # ---------------------------------------------------------------- loggers
    def _logger_arg(self, arg):
        if isinstance(arg, ast.Name) and arg.id == "__name__":
            return self.modname
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add):
            left = self._logger_arg(arg.left)
            right = self._logger_arg(arg.right)
            if left and right:
                return left + right
        if isinstance(arg, ast.JoinedStr):
            return None
        return None

    def _find_loggers(self):
        found = {}
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                f = node.value.func
                if isinstance(f, ast.Attribute) and f.attr == "getLogger" and node.value.args:
                    name = self._logger_arg(node.value.args[0])
                    if name:
                        for t in node.targets:
                            if isinstance(t, ast.Name):
                                found[t.id] = name
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                f = node.value.func
                if isinstance(f, ast.Attribute) and f.attr == "getLogger" and node.value.args:
                    name = self._logger_arg(node.value.args[0])
                    cls = self.enclosing(node, (ast.ClassDef,))
                    for t in node.targets:
                        if isinstance(t, ast.Attribute) and name:
                            key = (cls.name if cls else "") + ":" + ast.unparse(t)
                            found[key] = name
        return found

    def _attr_key(self, node, recv):
        cls = self.enclosing(node, (ast.ClassDef,))
        return (cls.name if cls else "") + ":" + ast.unparse(recv)

    # ---------------------------------------------------------------- helpers
    def segment(self, node):
        """ast.get_source_segment without re-splitting the whole file each call."""
        try:
            l1, l2 = node.lineno - 1, node.end_lineno - 1
            c1, c2 = node.col_offset, node.end_col_offset
        except AttributeError:
            return None
        if l1 == l2:
            return self.blines[l1][c1:c2].decode("utf-8")
        parts = [self.blines[l1][c1:]] + self.blines[l1 + 1 : l2] + [self.blines[l2][:c2]]
        return b"".join(parts).decode("utf-8")

    def seg(self, node):
        return self.segment(node) or ast.unparse(node)

    def literal(self, node):
        """Template of a str Constant / JoinedStr as written in the source."""
        seg = self.segment(node)
        pieces = read_string_pieces(seg) if seg else None
        if isinstance(node, ast.Constant):
            return node.value
        if not pieces:
            return ast.unparse(node)
        has_f = any("f" in p.lower() for p, _, _ in pieces)
        out = []
        for prefix, q, body in pieces:
            p = prefix.lower()
            if "f" in p:
                try:
                    out.append(ast.literal_eval(p.replace("f", "") + q + body + q))
                except Exception:
                    out.append(body)
            else:
                v = ast.literal_eval(prefix + q + body + q)
                if has_f:
                    v = v.replace("{", "{{").replace("}", "}}")
                out.append(v)
        return "".join(out)

    def style(self, nodes):
        if any(id(n) in self.format_nodes for n in nodes):
            return "str.format"
        if any(isinstance(n, ast.JoinedStr) for n in nodes):
            return "f-string"
        return "%"

    def qualname(self, node):
        names = []
        p = getattr(node, "_parent", None)
        while p is not None:
            if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.append(p.name)
            p = getattr(p, "_parent", None)
        return ".".join(reversed(names))

    def enclosing(self, node, types):
        p = getattr(node, "_parent", None)
        while p is not None and not isinstance(p, types):
            p = getattr(p, "_parent", None)
        return p

    def templates(self, node, call=None, depth=0):
        """List of (template, [string nodes]) that an expression can produce."""
        if depth > 6:
            return [("<" + self.seg(node) + ">", [])]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [(node.value, [node])]
        if isinstance(node, ast.JoinedStr):
            return [(self.literal(node), [node])]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return self.templates(node.left, call, depth + 1)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            out = []
            for lt, ln in self.templates(node.left, call, depth + 1):
                for rt, rn in self.templates(node.right, call, depth + 1):
                    out.append((lt + rt, ln + rn))
            return out
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format"
            and isinstance(node.func.value, (ast.Constant, ast.JoinedStr))
        ):
            self.format_nodes.add(id(node.func.value))
            return self.templates(node.func.value, call, depth + 1)
        if isinstance(node, ast.Call) and depth < 4:
            fname = self.seg(node.func).split(".")[-1]
            out = []
            for fn in self.functions.get(fname, []):
                for sub in ast.walk(fn):
                    if isinstance(sub, ast.Return) and sub.value is not None:
                        if self.enclosing(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) is not fn:
                            continue
                        out.extend(
                            (t, ns) for t, ns in self.templates(sub.value, sub, depth + 1) if ns
                        )
            if out:
                return out
        if isinstance(node, ast.IfExp):
            return self.templates(node.body, call, depth + 1) + self.templates(
                node.orelse, call, depth + 1
            )
        if isinstance(node, ast.Name) and call is not None:
            fn = self.enclosing(call, (ast.FunctionDef, ast.AsyncFunctionDef))
            out = []
            if fn is not None:
                for sub in ast.walk(fn):
                    if (
                        isinstance(sub, (ast.Assign, ast.AnnAssign))
                        and sub.lineno < call.lineno
                        and sub.value is not None
                    ):
                        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                        if any(isinstance(t, ast.Name) and t.id == node.id for t in targets):
                            if isinstance(
                                sub.value, (ast.Constant, ast.JoinedStr, ast.BinOp, ast.Call, ast.IfExp)
                            ):
                                ts = self.templates(sub.value, call, depth + 1)
                                for t, ns in ts:
                                    out.append((t, ns, sub.lineno))
            good = [(t, ns) for t, ns, _ in out if ns]
            if good:
                self._var_lines = [ln for t, ns, ln in out if ns]
                return good
        return [("<" + self.seg(node) + ">", [])]

    # ---------------------------------------------------------------- scanning
    def logging_calls(self):
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            meth = node.func.attr
            if meth not in LEVELS:
                continue
            recv = node.func.value
            if isinstance(recv, ast.Name):
                if recv.id in self.loggers:
                    logger = self.loggers[recv.id]
                elif recv.id == "logging":
                    logger = "root"
                elif recv.id.endswith("logger"):
                    fn = self.enclosing(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    params = [a.arg for a in fn.args.args + fn.args.kwonlyargs] if fn else []
                    if recv.id in params:
                        logger = "(caller's logger, parameter %r of %s())" % (recv.id, fn.name)
                    else:
                        logger = self.modname + " (?)"
                else:
                    continue
            elif isinstance(recv, ast.Attribute) and self._attr_key(node, recv) in self.loggers:
                logger = self.loggers[self._attr_key(node, recv)]
            elif isinstance(recv, ast.Attribute) and recv.attr.endswith("logger"):
                logger = "(" + self.seg(recv) + ")"
            elif (
                isinstance(recv, ast.Call)
                and isinstance(recv.func, ast.Attribute)
                and recv.func.attr == "getLogger"
                and recv.args
            ):
                logger = self._logger_arg(recv.args[0]) or "?"
            else:
                continue
            args = node.args
            if meth == "log":
                if len(args) < 2:
                    continue
                level = self.seg(args[0]).replace("logging.", "")
                msg = args[1]
            else:
                if not args:
                    continue
                level = LEVELS[meth]
                msg = args[0]
            call = "logger." + meth
            for kw in node.keywords:
                if kw.arg == "exc_info" and not (
                    isinstance(kw.value, ast.Constant) and not kw.value.value
                ):
                    call = "logger.%s(..., exc_info=%s)" % (meth, self.seg(kw.value))
            self._var_lines = None
            tmpls = self.templates(msg, node)
            var_lines = self._var_lines
            for t, ns in tmpls:
                for n in ns:
                    self.consumed.add(id(n))
                text_line = ns[0].lineno if ns else node.lineno
                yield {
                    "file": self.rel,
                    "line": node.lineno,
                    "text_line": text_line,
                    "logger": logger,
                    "level": level,
                    "call": call,
                    "template": t,
                    "sink": "log",
                    "expr": not ns,
                    "end_line": node.end_lineno,
                    "func": self.qualname(node),
                    "style": self.style(ns),
                    "nargs": len(args) - (2 if meth == "log" else 1),
                    "args_src": [self.seg(a) for a in args[(2 if meth == "log" else 1):]],
                }

    def other_strings(self):
        """Strings not consumed by logging calls: raise/warn/__str__/__repr__/other."""
        for node in ast.walk(self.tree):
            if not (
                isinstance(node, ast.JoinedStr)
                or (isinstance(node, ast.Constant) and isinstance(node.value, str))
            ):
                continue
            if id(node) in self.consumed:
                continue
            parent = getattr(node, "_parent", None)
            if isinstance(parent, (ast.JoinedStr, ast.FormattedValue)):
                continue
            if isinstance(parent, ast.Expr):  # docstring / bare string
                continue
            tmpl = self.literal(node)
            if len(tmpl) < 8:
                continue
            sink = "string"
            p = parent
            if isinstance(parent, ast.keyword) and parent.arg:
                sink = "kwarg " + parent.arg
                p = None
            elif isinstance(parent, ast.arguments):
                args = parent.posonlyargs + parent.args
                names = {}
                for a, d in zip(args[len(args) - len(parent.defaults):], parent.defaults):
                    names[id(d)] = a.arg
                for a, d in zip(parent.kwonlyargs, parent.kw_defaults):
                    if d is not None:
                        names[id(d)] = a.arg
                fn = getattr(parent, "_parent", None)
                sink = "default %s=" % names.get(id(node), "?")
                if fn is not None and hasattr(fn, "name"):
                    sink += " of %s()" % fn.name
                p = None
            while p is not None:
                if isinstance(p, ast.Raise):
                    exc = p.exc
                    if isinstance(exc, ast.Call):
                        sink = "raise " + self.seg(exc.func)
                    else:
                        sink = "raise"
                    break
                if isinstance(p, ast.Call):
                    fname = self.seg(p.func)
                    if fname in ("warnings.warn", "warn"):
                        cat = None
                        if len(p.args) > 1:
                            cat = self.seg(p.args[1])
                        for kw in p.keywords:
                            if kw.arg == "category":
                                cat = self.seg(kw.value)
                        sink = "warnings.warn(%s)" % (cat or "UserWarning")
                        break
                    last = fname.split(".")[-1]
                    if last.endswith(("Error", "Exception", "Warning", "Worker")) and last[:1].isupper():
                        sink = "exception " + fname
                        break
                if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if p.name in ("__str__", "__repr__"):
                        cls = self.enclosing(p, (ast.ClassDef,))
                        sink = "%s.%s" % (cls.name if cls else "?", p.name)
                    break
                p = getattr(p, "_parent", None)
            yield {
                "file": self.rel,
                "line": node.lineno,
                "text_line": node.lineno,
                "logger": None,
                "level": None,
                "call": None,
                "template": tmpl,
                "sink": sink,
                "end_line": node.end_lineno,
                "func": self.qualname(node),
                "style": "str.format"
                if isinstance(parent, ast.Attribute) and parent.attr == "format"
                else self.style([node]),
            }


def killed_worker_records(m):
    """KilledWorker without __str__: Exception.__str__ prints the args tuple."""
    for node in ast.walk(m.tree):
        if isinstance(node, ast.ClassDef) and node.name == "KilledWorker":
            methods = {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            if "__str__" in methods:
                continue
            init = methods.get("__init__")
            args = None
            if init is not None:
                for sub in ast.walk(init):
                    if (
                        isinstance(sub, ast.Call)
                        and isinstance(sub.func, ast.Attribute)
                        and sub.func.attr == "__init__"
                    ):
                        args = ", ".join(m.seg(a) for a in sub.args)
            yield {
                "file": m.rel,
                "line": node.lineno,
                "text_line": node.lineno,
                "end_line": node.end_lineno,
                "logger": None,
                "level": None,
                "call": None,
                "template": "<str(self.args): repr of the tuple (%s)>" % (args or "?"),
                "sink": "KilledWorker args (no __str__)",
                "func": "KilledWorker",
                "style": "repr",
            }


def scan_tree(root):
    """Scan an unpacked tree containing distributed/. Returns list of records."""
    pkg = os.path.join(root, "distributed")
    recs = []
    for dirpath, dirnames, filenames in os.walk(pkg):
        dirnames.sort()
        for fn in sorted(filenames):
            if not fn.endswith(".py") and fn not in ("dask-worker", "dask-scheduler"):
                continue
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, pkg).replace(os.sep, "/")
            if any(s in "/" + rel for s in SKIP_PARTS) or fn in SKIP_FILES:
                continue
            mod = "distributed." + rel[:-3].replace("/", ".") if rel.endswith(".py") else "distributed." + rel
            if mod.endswith(".__init__"):
                mod = mod[: -len(".__init__")]
            try:
                m = Module(path, rel, mod)
            except SyntaxError as e:
                recs.append({"file": rel, "error": "SyntaxError: %s" % e})
                continue
            recs.extend(m.logging_calls())
            recs.extend(m.other_strings())
            recs.extend(killed_worker_records(m))
    return recs


# =============================================================================
# Per-version logging defaults
# =============================================================================


def version_config(root):
    """Log line format, default logger levels and LocalCluster's silence_logs default."""
    pkg = os.path.join(root, "distributed")
    out = {"log_format": None, "log_format_at": None, "logger_levels": None, "silence_logs": None}
    yaml_path = os.path.join(pkg, "distributed.yaml")
    if os.path.exists(yaml_path):
        with open(yaml_path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                m = re.match(r"\s*log-format:\s*'(.*)'\s*$", line) or re.match(
                    r'\s*log-format:\s*"(.*)"\s*$', line
                )
                if m:
                    out["log_format"] = m.group(1)
                    out["log_format_at"] = "distributed.yaml:%d" % i
                    break
    cfg = os.path.join(pkg, "config.py")
    if os.path.exists(cfg):
        tree = ast.parse(open(cfg, encoding="utf-8").read())
        for n in ast.walk(tree):
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and isinstance(n.value, ast.Dict):
                tg = n.targets[0] if isinstance(n, ast.Assign) else n.target
                if getattr(tg, "id", "") == "loggers":
                    try:
                        out["logger_levels"] = ast.literal_eval(n.value)
                    except Exception:
                        pass
                    break
    local = os.path.join(pkg, "deploy", "local.py")
    if os.path.exists(local):
        tree = ast.parse(open(local, encoding="utf-8").read())
        for n in ast.walk(tree):
            if isinstance(n, ast.ClassDef) and n.name == "LocalCluster":
                for f in n.body:
                    if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                        a = f.args
                        pos = a.posonlyargs + a.args
                        pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults))
                        pairs += [(x, d) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
                        for arg, d in pairs:
                            if arg.arg == "silence_logs":
                                out["silence_logs"] = "%s (local.py:%d)" % (ast.unparse(d), d.lineno)
    return out


# =============================================================================
# The catalog: which templates we care about, and what they mean for a death
# =============================================================================
#
# Each message: id, meaning, class_hint, match (regexes searched in the template
# text), optional sinks (prefixes of the record's sink, default: logging calls
# only), files / funcs (regexes on the file and enclosing function), and sample
# values used only to build examples.txt.
#
# Sample tokens: $W worker address, $N nanny address, $S scheduler address,
# $WS the version's WorkerState repr (worker alive), $WSC the repr of the cleaned
# WorkerState a KilledWorker carries (status closed, no data).

W = "tcp://10.0.0.12:36591"
N = "tcp://10.0.0.12:41877"
S = "tcp://10.0.0.5:8786"
PID = 6992

LOG = ("log",)

MESSAGES = [
    # ------------------------------------------------------------ start-up / registration
    dict(
        id="nanny-start",
        meaning="A nanny process started listening; one per nanny, not per worker incarnation.",
        class_hint="context",
        match=[r"^\s+Start Nanny at: "],
        sample=dict(args=[N]),
    ),
    dict(
        id="worker-start",
        meaning="A worker process (one incarnation) started; a nanny restart prints it again with a new port, so it delimits incarnations.",
        class_hint="context",
        match=[r"^\s+Start worker at: "],
        sample=dict(args=[W]),
    ),
    dict(
        id="worker-listening",
        meaning="Start-up banner line of a worker incarnation (listening address).",
        class_hint="context",
        match=[r"^\s+Listening to: "],
        sample=dict(args=[W]),
    ),
    dict(
        id="worker-name",
        meaning="Start-up banner line giving the worker's name, which ties the worker address to the name the scheduler reports.",
        class_hint="context",
        match=[r"^\s+Worker name: "],
        sample=dict(args=[0]),
    ),
    dict(
        id="worker-waiting-to-connect",
        meaning="Worker banner / retry line while it tries to reach the scheduler; repeated lines mean the scheduler is unreachable.",
        class_hint="context",
        match=[r"^Waiting to connect to: "],
        sample=dict(args=[S]),
    ),
    dict(
        id="worker-threads",
        meaning="Start-up banner line (threads).",
        class_hint="context",
        match=[r"^\s+Threads: %26d$"],
        sample=dict(args=[2]),
    ),
    dict(
        id="worker-memory-limit-banner",
        meaning="Start-up banner line giving the worker's memory limit, the reference for the nanny's terminate fraction.",
        class_hint="context",
        match=[r"^\s+Memory: %26s$"],
        files=r"^worker\.py$",
        sample=dict(args=["1.86 GiB"]),
    ),
    dict(
        id="worker-local-directory",
        meaning="Start-up banner line (local directory).",
        class_hint="context",
        match=[r"^\s+Local Directory: %26s$"],
        files=r"^worker\.py$",
        sample=dict(args=["/tmp/dask-scratch-space/worker-8x2ld0dv"]),
    ),
    dict(
        id="worker-service-banner",
        meaning="Start-up banner line for a worker service (dashboard, nanny).",
        class_hint="context",
        match=[r"^  %16s at: %26s$", r"^  \{:>16\} at: \{:>26\}$"],
        files=r"^worker\.py$",
        sample=dict(args=["dashboard", "10.0.0.12:40713"], format_args=["dashboard", "10.0.0.12:40713"]),
    ),
    dict(
        id="worker-registered",
        meaning="The worker registered with the scheduler; a worker that dies before this line never registered (a start-up failure).",
        class_hint="context",
        match=[r"^\s+Registered to: "],
        sample=dict(args=[S]),
    ),
    dict(
        id="scheduler-register-worker",
        meaning="Scheduler side of registration; the worker exists for the scheduler from here on.",
        class_hint="context",
        match=[r"^Register %s$", r"^Register worker %s$", r"^Register worker addr: %s name: %s$"],
        files=r"^scheduler\.py$",
        sample=dict(ws=dict(memory=0, processing=0), args=[W, 0], by_src={"str(address)": W, "address": W, "ws": "$WS", "ws.address": W, "ws.name": 0}),
    ),
    dict(
        id="scheduler-worker-compute-stream",
        meaning="Scheduler opened the batched stream to the worker; its closing later is how the scheduler notices a death.",
        class_hint="context",
        match=[r"^Starting worker compute stream, %s$"],
        sample=dict(args=[W]),
    ),
    dict(
        id="scheduler-duplicate-worker-name",
        meaning="A worker was refused because its name is taken (often a restarted worker whose old incarnation is not yet removed); the new worker does not join.",
        class_hint="unrecoverable_exception/worker_init_exception",
        match=[r"duplicate name"],
        sample=dict(args=[0]),
    ),
    dict(
        id="core-established-connection",
        meaning="A server (scheduler or worker) starts handling a long-lived stream from a peer.",
        class_hint="context",
        match=[r"^Starting established connection"],
        sample=dict(args=[W]),
    ),
    dict(
        id="worker-plugin-start",
        meaning="A worker plugin's setup is about to run.",
        class_hint="context",
        match=[r"^Starting Worker plugin"],
        sample=dict(args=["shuffle"]),
    ),
    dict(
        id="nanny-plugin-start",
        meaning="A nanny plugin's setup is about to run.",
        class_hint="context",
        match=[r"^Starting Nanny plugin"],
        sample=dict(args=["kwdiag-nanny"]),
    ),
    dict(
        id="scheduler-address-banner",
        meaning="Scheduler start-up banner.",
        class_hint="context",
        match=[r"^  Scheduler at: %25s$"],
        sample=dict(args=[S]),
    ),
    # ------------------------------------------------------------ nanny supervision
    dict(
        id="nanny-worker-killed-by-signal",
        meaning="The nanny saw its worker process end from a signal (negative exit code): 9 = SIGKILL (OOM killer, kill -9, nanny escalation), 11 = SIGSEGV, 15 = SIGTERM (the nanny's own memory kill), 6 = SIGABRT.",
        class_hint="sudden_exit/signal_N (sigkill, segfault); with a preceding memory-budget line: nanny_memory_restart/memory_limit",
        match=[r"^Worker process (%d|\{pid\}) was killed by signal"],
        sample=dict(args=[PID, 9], names=dict(pid=PID, exitcode=-9)),
    ),
    dict(
        id="nanny-worker-exited-with-status",
        meaning="The nanny saw its worker process exit by itself with a non-zero status (sys.exit(N), os._exit(N), an uncaught exception at start-up, fail-hard's os._exit(1)).",
        class_hint="unrecoverable_exception/exception|system_exit|os_exit|fail_hard",
        match=[r"^Worker process (%d|\{pid\}) exited with status"],
        sample=dict(args=[PID, 1], names=dict(pid=PID, exitcode=1)),
    ),
    dict(
        id="nanny-worker-killed-by-unknown-signal",
        meaning="The worker's exit code was 255 (exitcode could not be read, or the process did os._exit(-1) because its parent died).",
        class_hint="sudden_exit/unknown_signal",
        match=[r"was killed by unknown signal"],
        sample=dict(args=[PID], names=dict(pid=PID)),
    ),
    dict(
        id="process-exit-status-already-read",
        meaning="The exit status of the worker process was reaped elsewhere; the nanny will report exit code 255 ('unknown signal').",
        class_hint="sudden_exit/unknown_signal",
        match=[r"exit status was already read"],
        sample=dict(args=["<AsyncProcess Dask Worker process (from Nanny)>", PID]),
    ),
    dict(
        id="nanny-restarting-worker",
        meaning="The nanny is restarting a worker process that exited without being asked to; the only death evidence visible at WARNING level (LocalCluster default).",
        class_hint="context (a death happened; its class comes from the lines before)",
        match=[r"^Restarting worker( \(status=%s\))?$"],
        sample=dict(args=["Status.running"]),
    ),
    dict(
        id="nanny-unregistering-worker",
        meaning="The nanny noticed an exit it did not ask for and tells the scheduler to remove the worker before restarting it.",
        class_hint="context (a death happened)",
        match=[r"^Unregistering worker"],
        sample=dict(args=["Status.running"]),
    ),
    dict(
        id="nanny-failed-to-unregister",
        meaning="The nanny could not tell the scheduler that its worker died (scheduler unreachable).",
        class_hint="context",
        match=[r"^Failed to unregister"],
        sample=dict(args=["Status.running"]),
    ),
    dict(
        id="nanny-failed-to-restart",
        meaning="After an unexpected exit the nanny could not start a new worker process; the worker stays dead.",
        class_hint="unrecoverable_exception/worker_init_exception",
        match=[r"^Failed to restart worker after its process exited"],
    ),
    dict(
        id="nanny-worker-still-alive-killing",
        meaning="A graceful close/restart timed out; the nanny now kills the worker process (next line: killed by signal 9).",
        class_hint="chose_to_exit (the close was requested) escalated to SIGKILL",
        match=[r"^Worker process still alive after"],
        sample=dict(args=[2], names=dict(timeout=2, wait_timeout=5.0)),
    ),
    dict(
        id="nanny-failed-to-kill",
        meaning="The nanny's attempt to kill its worker process raised.",
        class_hint="context",
        match=[r"^Failed to kill worker process", r"^Error in Nanny killing Worker subprocess"],
        sample=dict(args=["[Errno 3] No such process"]),
    ),
    dict(
        id="nanny-restart-timed-out",
        meaning="Nanny.restart did not finish in time (restart requested by client.restart or the scheduler).",
        class_hint="chose_to_exit/restart",
        match=[r"^Restart timed out(, returning before finished| after \{timeout\}s; returning before finished)"],
        files=r"^nanny\.py$",
        sample=dict(names=dict(timeout=30)),
    ),
    dict(
        id="worker-process-died-unexpectedly",
        meaning="Logged inside the worker process by the nanny-stop-queue watcher thread when that queue breaks; not by itself a cause (seen after graceful lifetime restarts too).",
        class_hint="context",
        match=[r"^Worker process died unexpectedly$"],
    ),
    dict(
        id="process-reaping-stray",
        meaning="A child process of the worker/nanny is killed during shutdown.",
        class_hint="context",
        match=[r"^reaping stray process"],
        sample=dict(args=["<SpawnProcess name='Dask Worker process (from Nanny)' pid=6992 parent=6980 started daemon>"], names=dict(proc="<SpawnProcess name='Dask Worker process (from Nanny)' pid=6992 parent=6980 started daemon>")),
    ),
    # ------------------------------------------------------------ memory
    dict(
        id="nanny-memory-terminate",
        meaning="The nanny's memory monitor terminates (SIGTERM) the worker for crossing the terminate fraction of its memory limit; expect 'killed by signal 15' (or 9) and a restart next.",
        class_hint="nanny_memory_restart/memory_limit",
        match=[r"memory budget\. Restarting"],
        sample=dict(args=[95], names=dict(nanny=None, process=None, self=None)),
    ),
    dict(
        id="nanny-memory-slow-to-terminate",
        meaning="The worker is still alive one monitor tick after the memory SIGTERM; the nanny sends SIGKILL (on Windows: terminates again).",
        class_hint="nanny_memory_restart/memory_limit",
        match=[r"\) is slow to %s$"],
        sample=dict(args=["accept SIGTERM; sending SIGKILL"]),
    ),
    dict(
        id="worker-memory-pause",
        meaning="The worker paused (process memory above the pause fraction); not a death by itself, but the usual prelude to a memory death.",
        class_hint="not-a-death (memory pressure evidence)",
        match=[r"memory usage\. Pausing worker"],
        sample=dict(args=[81, "1.52 GiB", "1.86 GiB"]),
    ),
    dict(
        id="worker-memory-resume",
        meaning="The worker resumed after a pause.",
        class_hint="not-a-death",
        match=[r"memory usage\. Resuming worker"],
        sample=dict(args=[59, "1.10 GiB", "1.86 GiB"]),
    ),
    dict(
        id="worker-memory-no-data-to-spill",
        meaning="Memory is above the spill threshold but nothing managed is left to spill (old wording of the unmanaged-memory warning); memory pressure evidence.",
        class_hint="not-a-death (memory pressure evidence)",
        match=[r"^Memory use is high but worker has no data to store to disk"],
        sample=dict(args=["1.40 GiB", "1.86 GiB"]),
    ),
    dict(
        id="worker-unmanaged-memory-high",
        meaning="Unmanaged memory (leaks, fragmentation, large temporaries) is above the spill threshold; memory pressure evidence.",
        class_hint="not-a-death (memory pressure evidence)",
        match=[r"^Unmanaged memory use is high"],
        sample=dict(args=["1.40 GiB", "1.86 GiB"]),
    ),
    dict(
        id="worker-memory-spill-start",
        meaning="The worker starts spilling to disk because of process memory (DEBUG, not shown by default).",
        class_hint="not-a-death",
        match=[r"memory usage\. Start spilling data to disk"],
        sample=dict(args=[71]),
    ),
    dict(
        id="worker-memory-moved-to-disk",
        meaning="Spill summary (DEBUG, not shown by default).",
        class_hint="not-a-death",
        match=[r"^Moved %d (pieces of data data and %s|tasks worth %s) to disk"],
        sample=dict(args=[12, "240.00 MiB"]),
    ),
    dict(
        id="spill-failed",
        meaning="Spilling to disk failed (disk full / max-spill reached); data stays in memory, which can lead to a memory death.",
        class_hint="not-a-death (memory pressure evidence; disk_full hint)",
        match=[r"^Spill file on disk reached capacity", r"^Spill to disk failed"],
    ),
    dict(
        id="memory-limit-ignored",
        meaning="The configured memory limit exceeds the system/cgroup limit; the smaller one is used.",
        class_hint="context",
        match=[r"^Ignoring provided memory limit"],
        sample=dict(args=["8.00 GiB", "2.00 GiB"]),
    ),
    # ------------------------------------------------------------ graceful ends
    dict(
        id="worker-stopping",
        meaning="The worker is closing; since 2022.10.2 the Reason says why (signal-15, scheduler-remove-worker, worker-lifetime-reached, worker-handle-scheduler-connection-broken, nanny-close, ...).",
        class_hint="chose_to_exit/<reason> (or unrecoverable_exception/fail_hard, version_mismatch when the reason is a broken scheduler connection after a deserialization error)",
        match=[r"^Stopping worker at %s(\. Reason: %s)?$"],
        sample=dict(args=[W, "signal-15"]),
    ),
    dict(
        id="worker-stopping-no-address",
        meaning="A worker that has no address yet is closing.",
        class_hint="chose_to_exit/<reason>",
        match=[r"^Stopping worker(\. Reason: %s)?$"],
        sample=dict(args=["nanny-instantiate-failed"]),
    ),
    dict(
        id="worker-closed-not-started",
        meaning="Close was called on a worker that never finished starting (start-up failure or early shutdown).",
        class_hint="unrecoverable_exception/worker_init_exception or chose_to_exit",
        match=[r"^Closed worker has not yet started"],
        sample=dict(args=["Status.init"]),
    ),
    dict(
        id="worker-not-waiting-executor",
        meaning="Close without waiting for running tasks (executor_wait=False), the fail-hard / nanny-kill path.",
        class_hint="context",
        match=[r"^Not waiting on executor to close"],
    ),
    dict(
        id="worker-not-reporting-closure",
        meaning="The worker closes without telling the scheduler (2022.4.2-2022.5.0).",
        class_hint="context",
        match=[r"^Not reporting worker closure to scheduler"],
    ),
    dict(
        id="worker-closing-gracefully",
        meaning="The worker asked the scheduler to retire it (worker --lifetime, close_gracefully); since 2022.10.2 with a Reason.",
        class_hint="chose_to_exit/lifetime|retired",
        match=[r"^Closing worker gracefully: %s"],
        sample=dict(args=[W, "worker-lifetime-reached"]),
    ),
    dict(
        id="nanny-worker-closed",
        meaning="Logged in the worker process after a clean close: the worker ended on purpose.",
        class_hint="chose_to_exit",
        match=[r"^Worker closed$"],
    ),
    dict(
        id="nanny-closing",
        meaning="The nanny is closing (and its worker with it); since 2022.10.2 with a Reason (signal-15, nanny-close, nanny-close-gracefully, nanny-instantiate-failed, failure-to-start-...).",
        class_hint="chose_to_exit/<reason> (failure-to-start-* / nanny-instantiate-failed: unrecoverable_exception or death_timeout)",
        match=[r"^Closing Nanny at "],
        sample=dict(args=[N, "signal-15"], names=dict(report=True, self=dict(address=N))),
    ),
    dict(
        id="nanny-closing-gracefully",
        meaning="The nanny will not restart its worker when it exits (retire, lifetime, scheduler connection broken).",
        class_hint="chose_to_exit/<reason>",
        match=[r"^Closing Nanny gracefully at"],
        sample=dict(args=[N, "worker-lifetime-reached"]),
    ),
    dict(
        id="nanny-asking-worker-to-close",
        meaning="The nanny asks its worker process to close (restart, signal, kill); since 2022.10.2 with a Reason.",
        class_hint="chose_to_exit/<reason> (client-restart-*: restart; check-worker-ttl-*: sudden_exit/heartbeat_timeout)",
        match=[r"^Nanny asking worker to close"],
        sample=dict(args=["client-restart-1763718799.5348115"]),
    ),
    dict(
        id="nanny-closed",
        meaning="The nanny finished closing.",
        class_hint="chose_to_exit",
        match=[r"^Nanny at %r closed\.$"],
        sample=dict(args=[N]),
    ),
    dict(
        id="cli-end-worker",
        meaning="Last line of a `dask-worker`/`dask worker` CLI process, always printed (finally block).",
        class_hint="context (end of the CLI process)",
        match=[r"^End worker$"],
    ),
    dict(
        id="cli-exiting-on-signal",
        meaning="The dask-worker CLI received a signal other than SIGINT (<= 2022.5.0).",
        class_hint="chose_to_exit/sigterm",
        match=[r"^Exiting on signal %d$"],
        sample=dict(args=[15]),
    ),
    dict(
        id="signal-received",
        meaning="The dask worker / dask scheduler CLI received SIGTERM/SIGINT (>= 2022.5.1) and starts an orderly shutdown.",
        class_hint="chose_to_exit/sigterm|sigint",
        match=[r"^Received signal %s \(%d\)$"],
        sample=dict(args=["SIGTERM", 15]),
    ),
    dict(
        id="worker-async-task-cancelled-on-close",
        meaning="An async task was running when the worker closed; it is rescheduled.",
        class_hint="context",
        match=[r"cancelled during worker close"],
        sample=dict(names=dict(key="slow-task-0")),
    ),
    dict(
        id="worker-async-instruction-cancelled",
        meaning="A task/instruction was running when the worker closed.",
        class_hint="context",
        match=[r"^Async instruction for \{task\} ended with CancelledError"],
        sample=dict(names=dict(task="<Task cancelled name='execute(slow-task-0)' coro=<...>>")),
    ),
    dict(
        id="worker-plugin-remove",
        meaning="Part of every worker close.",
        class_hint="context",
        match=[r"^Removing Worker plugin"],
        sample=dict(names=dict(name="shuffle")),
    ),
    dict(
        id="nanny-plugin-remove",
        meaning="Part of every nanny close.",
        class_hint="context",
        match=[r"^Removing Nanny plugin"],
        sample=dict(names=dict(name="kwdiag-nanny")),
    ),
    dict(
        id="scheduler-retire-workers",
        meaning="The scheduler starts retiring workers (client.retire_workers, scale-down, worker close_gracefully/lifetime).",
        class_hint="chose_to_exit/retired",
        match=[r"^Retire workers %s$", r"^Retire worker addresses"],
        sample=dict(args=["retire-workers-1763718799.5348115", [W]], vargs={"^Retire workers %s$": [[W]], "^Retire worker addresses %s$": [[W]]}),
    ),
    dict(
        id="scheduler-retire-worker-names",
        meaning="Retire by worker name.",
        class_hint="chose_to_exit/retired",
        match=[r"^Retire worker names %s$"],
        sample=dict(args=[[0]]),
    ),
    dict(
        id="scheduler-retiring-worker",
        meaning="The scheduler retires one worker.",
        class_hint="chose_to_exit/retired",
        match=[r"^Retiring worker (%s|\{ws\.address!r\} \(\{stimulus_id=!r\}\))$"],
        files=r"^scheduler\.py$",
        sample=dict(args=[W], names=dict(stimulus_id="retire-workers-1763718799.5348115")),
    ),
    dict(
        id="scheduler-retired-worker",
        meaning="A worker has been retired; its removal is expected, so its tasks do not count towards KilledWorker.",
        class_hint="chose_to_exit/retired",
        match=[r"^Retired worker "],
        sample=dict(args=[W], names=dict(stimulus_id="retire-workers-1763718799.5348115")),
    ),
    dict(
        id="scheduler-could-not-retire",
        meaning="Retirement was abandoned; the worker stays.",
        class_hint="not-a-death",
        match=[r"^Could not retire worker"],
        sample=dict(names=dict(stimulus_id="retire-workers-1763718799.5348115")),
    ),
    dict(
        id="scheduler-moving-keys-retire",
        meaning="Retirement moves data away (<= 2022.1.1).",
        class_hint="chose_to_exit/retired",
        match=[r"^Moving %d keys to other workers$"],
        sample=dict(args=[12]),
    ),
    dict(
        id="amm-retiring-worker",
        meaning="The Active Memory Manager drains a worker being retired.",
        class_hint="chose_to_exit/retired",
        match=[r"^Retiring worker \{self\.address\}; "],
        sample=dict(names=dict(self=dict(address=W), nrepl=12)),
    ),
    dict(
        id="amm-retire-blocked",
        meaning="The AMM cannot drain a worker being retired (actors, or nowhere to put its data); the worker is not retired.",
        class_hint="not-a-death",
        match=[r"^Tried retiring worker "],
        sample=dict(names=dict(self=dict(address=W), nno_rec=3, ws=dict(actors=["Counter-8a2c6b0e"]))),
    ),
    dict(
        id="adaptive-retiring-workers",
        meaning="Adaptive scaling is retiring workers (scale-down).",
        class_hint="chose_to_exit/retired",
        match=[r"^Retiring workers %s$"],
        sample=dict(args=[[W]]),
    ),
    dict(
        id="scheduler-close-worker",
        meaning="Scheduler.close_worker: the scheduler tells one worker to close.",
        class_hint="chose_to_exit/shutdown",
        match=[r"^Closing worker %s$"],
        sample=dict(args=[W]),
    ),
    dict(
        id="scheduler-closing",
        meaning="The scheduler is shutting down (workers will follow: scheduler-close / connection broken).",
        class_hint="chose_to_exit/shutdown",
        match=[r"^Scheduler closing\.\.\.$", r"^Scheduler closing due to %s\.\.\.$", r"^Closing scheduler\. Reason: %s$"],
        sample=dict(args=["signal-15"]),
    ),
    dict(
        id="scheduler-closing-all-comms",
        meaning="Scheduler shutdown step.",
        class_hint="chose_to_exit/shutdown",
        match=[r"^Scheduler closing all comms$"],
    ),
    dict(
        id="scheduler-idle-close",
        meaning="The scheduler closes itself after --idle-timeout.",
        class_hint="chose_to_exit/shutdown",
        match=[r"^Scheduler closing after being idle"],
        sample=dict(args=["1hr"]),
    ),
    dict(
        id="scheduler-no-workers-close",
        meaning="The scheduler shut itself down because tasks waited too long without workers.",
        class_hint="chose_to_exit/shutdown",
        match=[r"^Tasks have been without any workers to run them"],
        sample=dict(args=["10m"]),
    ),
    dict(
        id="scheduler-end",
        meaning="Last lines of the dask-scheduler CLI.",
        class_hint="context",
        match=[r"^End scheduler( at %r)?$", r"^Stopped scheduler at %r$"],
        sample=dict(args=[S]),
    ),
    dict(
        id="scheduler-lost-all-workers",
        meaning="The last worker was removed.",
        class_hint="context",
        match=[r"^Lost all workers$"],
    ),
    dict(
        id="scheduler-restart-begin",
        meaning="client.restart(): all workers are restarted and all keys released.",
        class_hint="chose_to_exit/restart",
        match=[r"^Restarting workers and releasing all keys", r"^Clear task state$"],
        sample=dict(names=dict(stimulus_id="client-restart-1763718799.5348115")),
    ),
    dict(
        id="scheduler-restarting-workers",
        meaning="The scheduler restarts workers through their nannies (client.restart, restart_workers, and the worker-ttl path since 2024.4.2).",
        class_hint="chose_to_exit/restart (check-worker-ttl-* stimulus: sudden_exit/heartbeat_timeout)",
        match=[r"^Restarting all workers \(", r"^Restarting \{len\(workers\)\} workers"],
        sample=dict(names=dict(stimulus_id="client-restart-1763718799.5348115", workers=[W])),
    ),
    dict(
        id="scheduler-restart-finished",
        meaning="Restart finished.",
        class_hint="chose_to_exit/restart",
        match=[r"^Restarting finished\.$", r"^Workers restart finished"],
        sample=dict(names=dict(stimulus_id="client-restart-1763718799.5348115")),
    ),
    dict(
        id="scheduler-restart-problems",
        meaning="Some workers did not restart cleanly during client.restart (they are force-closed).",
        class_hint="chose_to_exit/restart",
        match=[
            r"did not shut down within",
            r"^Nannies didn't report back restarted",
            r"^Exception while restarting\.  This is normal",
            r"^Not all workers responded positively",
        ],
        sample=dict(args=[{"tcp://10.0.0.12:36591": "timed out"}], names=dict(bad_nannies=[N], timeout=30)),
    ),
    dict(
        id="scheduler-restart-no-nanny",
        meaning="Workers without a nanny cannot be restarted; they are closed for good.",
        class_hint="chose_to_exit/restart",
        match=[r"do not use a nanny and will be terminated"],
        sample=dict(names=dict(no_nanny_workers=[W])),
    ),
    dict(
        id="client-restart-timed-out",
        meaning="client.restart() timed out on the client side.",
        class_hint="chose_to_exit/restart",
        match=[r"^Restart timed out after %"],
        files=r"^client\.py$",
        sample=dict(args=[30.0]),
    ),
    dict(
        id="client-receive-restart",
        meaning="The client saw the scheduler restart the cluster (distributed.client logs at INFO are hidden by default).",
        class_hint="chose_to_exit/restart",
        match=[r"^Receive restart signal from scheduler$"],
    ),
    dict(
        id="plugin-restart-refresh",
        meaning="PipInstall/Conda plugin with restart=True restarts the worker after installing packages.",
        class_hint="chose_to_exit/restart",
        match=[r"^Restarting worker to refresh interpreter"],
    ),
    # ------------------------------------------------------------ scheduler view of a death
    dict(
        id="scheduler-remove-worker",
        meaning="The scheduler removed a worker (any cause). Old forms print the address or the WorkerState repr; since 2023.7.1 the stimulus_id tells the path (handle-worker-cleanup = stream closed, retire-workers, worker-close-gracefully, check-worker-ttl).",
        class_hint="context (the class comes from how it was noticed)",
        match=[r"^Remove worker (%s|\{ws\} \(\{stimulus_id=\}\)|addr: )"],
        files=r"^scheduler\.py$",
        sample=dict(args=[W], by_src={"address": W, "ws": "$WS"}, names=dict(stimulus_id="handle-worker-cleanup-1763718799.5348115")),
    ),
    dict(
        id="core-connection-closed",
        meaning="A peer's stream closed without a goodbye: on the scheduler, the worker vanished (SIGKILL, segfault, os._exit, OOM, nanny killed, fail-hard).",
        class_hint="sudden_exit/connection_lost (unless the worker's own log shows a chosen exit)",
        match=[r"^Connection to %s has been closed\.$"],
        sample=dict(args=[W]),
    ),
    dict(
        id="core-close-stream",
        meaning="The peer closed its stream cleanly (graceful stop, retire, teardown).",
        class_hint="chose_to_exit",
        match=[r"^Received 'close-stream' from"],
        sample=dict(args=[W]),
    ),
    dict(
        id="core-lost-connection",
        meaning="A handler's comm broke (peer died or closed).",
        class_hint="context",
        match=[r"^Lost connection to %r"],
        sample=dict(args=[W, "CommClosedError()"], by_src={"address": W, "e": "$RAW:CommClosedError('in <TCP (closed) ConnectionPool.gather local=tcp://10.0.0.5:49962 remote=tcp://10.0.0.12:36591>: Stream is closed')", "op": "gather"}),
    ),
    dict(
        id="batched-comm-closed",
        meaning="The batched stream to a peer closed while sending.",
        class_hint="context",
        match=[r"^Batched Comm Closed"],
        sample=dict(args=["$RAW:<TCP (closed) Worker->Scheduler local=tcp://10.0.0.12:36591 remote=tcp://10.0.0.5:8786>"]),
    ),
    dict(
        id="scheduler-worker-heartbeat-ttl",
        meaning="The scheduler removes (or, since 2024.4.2 with a nanny, restarts) a worker that missed heartbeats for worker-ttl: hung, SIGSTOPped, frozen by GIL or swapped, or its host is gone.",
        class_hint="sudden_exit/heartbeat_timeout",
        match=[r"^Worker failed to heartbeat"],
        sample=dict(args=[300.0, "$WS"], names=dict(last_seen=302.6, ws=None)),
    ),
    dict(
        id="scheduler-heartbeat-from-unregistered",
        meaning="A worker the scheduler already removed sent a heartbeat (resumed after SIGSTOP, a ttl removal, or a lifetime race).",
        class_hint="context (supports sudden_exit/heartbeat_timeout)",
        match=[r"^Received heartbeat from (removed|unregistered) worker"],
        sample=dict(args=[W], names=dict(address=W)),
    ),
    dict(
        id="worker-scheduler-unaware",
        meaning="The worker learned from a heartbeat reply that the scheduler removed it; it shuts down (reason worker-heartbeat-missing).",
        class_hint="chose_to_exit/scheduler_lost (after sudden_exit/heartbeat_timeout on the scheduler side)",
        match=[r"^Scheduler was unaware of this worker"],
        sample=dict(names=dict(self=dict(address=W))),
    ),
    dict(
        id="scheduler-task-killed-workers",
        meaning="A task exceeded allowed-failures worker deaths while processing; the client will get KilledWorker. %d = allowed-failures + 1.",
        class_hint="context (KilledWorker blame)",
        match=[r"workers died while trying to run it"],
        sample=dict(args=["inc-5f3c1b1d1c5e3e0a", 4]),
    ),
    dict(
        id="killed-worker-exception",
        meaning="What the client raises/prints for a task that killed too many workers: up to 2022.9.1 the bare args tuple (task key, last WorkerState); since 2022.9.2 a sentence.",
        class_hint="context (KilledWorker blame)",
        match=[r"^Attempted to run task .* different workers", r"^<str\(self\.args\): repr of the tuple"],
        sinks=("KilledWorker",),
        sample=dict(names=dict(self=dict(task="inc-5f3c1b1d1c5e3e0a", allowed_failures=3, last_worker=dict(address=W)))),
    ),
    dict(
        id="scheduler-lost-computed-tasks",
        meaning="Removing a worker lost results that will be recomputed elsewhere.",
        class_hint="context",
        match=[r"caused the cluster to lose already computed"],
        sample=dict(names=dict(ws=None, recompute_keys="{'inc-5f3c1b1d1c5e3e0a': 3}", stimulus_id="handle-worker-cleanup-1763718799.5348115")),
    ),
    dict(
        id="scheduler-lost-scattered-data",
        meaning="Removing a worker lost scattered data, which cannot be recomputed.",
        class_hint="context",
        match=[r"caused the cluster to lose scattered data"],
        sample=dict(names=dict(ws=None, lost_keys="['data-8d1f7e8a4f0b']", stimulus_id="handle-worker-cleanup-1763718799.5348115")),
    ),
    dict(
        id="worker-state-repr",
        meaning="The scheduler's repr of a worker, embedded in old 'Remove worker', 'Register worker', heartbeat-ttl and KilledWorker texts.",
        class_hint="context",
        match=[r"^<Worker", r"^, name: \{self\.name\}$"],
        sinks=("WorkerState.__repr__",),
        sample=dict(args=[W, 0, "running", 3, 1]),
    ),
    dict(
        id="scheduler-closed-comm-write",
        meaning="The scheduler tried to write to a worker/client whose comm is closed (the peer died).",
        class_hint="context (supports sudden_exit/connection_lost)",
        match=[r"^Tried writing to closed comm", r"^Closed comm %r while trying to write"],
        sample=dict(args=["$RAW:<TCP (closed) Scheduler connection to worker local=tcp://10.0.0.5:8786 remote=tcp://10.0.0.12:46380>", "{'op': 'compute-task', 'key': 'inc-5f3c1b1d1c5e3e0a'}"]),
    ),
    dict(
        id="worker-scheduler-connection-broken",
        meaning="The worker's stream to the scheduler broke: up to 2022.5.0 the worker tried to reconnect; 2022.4.2-2022.10.2 it closes without reporting.",
        class_hint="chose_to_exit/scheduler_lost (or version_mismatch/unrecoverable_exception if a deserialization error/traceback precedes it)",
        match=[r"^Connection to scheduler broken"],
        sample=dict(args=["Status.running"], by_src={"self.status": "Status.running", "self.id": "Worker-7d2f0f2e-3b2c-4a5e-9b7c-2f0a8f0c1d2e", "self.address": W}),
    ),
    dict(
        id="worker-heartbeat-failed",
        meaning="A heartbeat to the scheduler failed (scheduler unreachable or slow); not fatal by itself.",
        class_hint="context (supports scheduler_lost)",
        match=[r"^Heartbeat to scheduler failed$", r"^Timed out while trying to connect during heartbeat", r"^Failed to communicate with scheduler during heartbeat"],
    ),
    dict(
        id="worker-heartbeat-unexpected-exception",
        meaning="An unexpected exception in the heartbeat closes the worker (reason worker-heartbeat-error).",
        class_hint="unrecoverable_exception/exception",
        match=[r"^Unexpected exception during heartbeat"],
    ),
    dict(
        id="event-loop-unresponsive",
        meaning="The process's event loop was blocked (GIL-holding task, SIGSTOP, swapping); a cause of missed heartbeats, not a death.",
        class_hint="not-a-death (supports sudden_exit/heartbeat_timeout)",
        match=[r"^Event loop was unresponsive"],
        sample=dict(args=["Worker", 12.34]),
    ),
    dict(
        id="scheduler-worker-reconnect-refused",
        meaning="A worker tried to reconnect holding data; reconnection is not supported and it is told to shut down.",
        class_hint="chose_to_exit/scheduler_lost",
        match=[r"Worker reconnection is not supported"],
        sample=dict(names=dict(address=W, nbytes=["inc-5f3c1b1d1c5e3e0a"])),
    ),
    dict(
        id="scheduler-no-workers-timeout",
        meaning="A task was failed because no (suitable) worker appeared within no-workers-timeout; not a worker death.",
        class_hint="not-a-death",
        match=[r"marked as failed because it timed out waiting"],
        sample=dict(args=["inc-5f3c1b1d1c5e3e0a"]),
    ),
    dict(
        id="scheduler-shut-down-missing-keys",
        meaning="Workers that do not have data the scheduler expects are shut down.",
        class_hint="chose_to_exit/shutdown",
        match=[r"^Shut down workers that don't have promised key", r"^Workers don't have promised key"],
        sample=dict(args=[[W], "inc-5f3c1b1d1c5e3e0a"]),
    ),
    dict(
        id="worker-stream-died",
        meaning="A worker-to-worker data transfer failed because the peer died.",
        class_hint="context (a peer died)",
        match=[r"^Worker stream died during communication"],
        sample=dict(args=["tcp://10.0.0.13:40211"]),
    ),
    # ------------------------------------------------------------ start-up failures
    dict(
        id="preload-import",
        meaning="A preload module is imported; a missing module raises here (fatal: the worker/nanny cannot be constructed).",
        class_hint="context (start-up)",
        match=[r"^Import preload module: %s$"],
        sample=dict(args=["kwdiag.dask"]),
    ),
    dict(
        id="preload-download",
        meaning="A preload given as URL is downloaded.",
        class_hint="context (start-up)",
        match=[r"^Downloading preload at"],
        sample=dict(args=["https://example.org/setup.py"]),
    ),
    dict(
        id="preload-create",
        meaning="A preload object is created.",
        class_hint="context (start-up)",
        match=[r"^Creating preload: %s$"],
        sample=dict(args=["kwdiag.dask"]),
    ),
    dict(
        id="preload-setup",
        meaning="A preload's dask_setup is about to run; before 2022.6.0 an exception there escapes Worker.start (fatal), since 2022.6.0 it is logged and start-up continues.",
        class_hint="context (start-up)",
        match=[r"^Run preload setup( function| click command)?: %s$"],
        sample=dict(args=["kwdiag.dask"]),
    ),
    dict(
        id="preload-failed",
        meaning="A preload's dask_setup raised; logged with traceback and NOT fatal (2022.6.0+: worker/scheduler start continues).",
        class_hint="unrecoverable_exception/preload_exception (only if the worker then dies; otherwise not-a-death)",
        match=[r"^Failed to start preload"],
        sample=dict(args=["kwdiag.dask"]),
    ),
    dict(
        id="preload-teardown-failed",
        meaning="A preload's dask_teardown raised during close.",
        class_hint="context",
        match=[r"^Failed to tear down preload"],
        sample=dict(args=["kwdiag.dask"]),
    ),
    dict(
        id="preload-file-collision",
        meaning="Two preload files with the same name.",
        class_hint="context",
        match=[r"^File name collision"],
        sample=dict(args=["setup.py"]),
    ),
    dict(
        id="worker-plugin-setup-failed",
        meaning="A worker plugin's setup raised (logged with traceback). For a plugin registered on a running worker it is not fatal (the client's register call gets the error); for plugins given at construction (Worker(plugins=...)) Worker.start re-raises it and the worker fails to start ('Failed to start worker' in the nanny child).",
        class_hint="unrecoverable_exception/plugin_setup_exception if the worker then fails to start; otherwise not-a-death",
        match=[r"^Worker plugin %s failed to setup$"],
        sample=dict(args=["my-plugin"]),
    ),
    dict(
        id="nanny-plugin-setup-failed",
        meaning="A nanny plugin's setup raised; logged with traceback and not fatal (Nanny.plugin_add returns the error).",
        class_hint="not-a-death (plugin_setup_exception only if the worker then dies)",
        match=[r"^Nanny plugin %s failed to setup$"],
        sample=dict(args=["my-plugin"]),
    ),
    dict(
        id="worker-plugins-multiple-exceptions",
        meaning="Several plugins given at worker construction raised in setup; all are logged and the first is re-raised, so the worker fails to start.",
        class_hint="unrecoverable_exception/plugin_setup_exception",
        match=[r"^Multiple plugin exceptions raised"],
    ),
    dict(
        id="nanny-worker-init-failed",
        meaning="Inside the nanny's child process, constructing or starting the Worker raised (custom --worker-class, bad config, preload failure before 2022.6.0); the process then exits and the nanny reports a start failure.",
        class_hint="unrecoverable_exception/worker_init_exception",
        match=[r"^Failed to (start|initialize) [Ww]orker$", r"^Failed to \{failure_type\} worker$"],
        files=r"^nanny\.py$",
        sample=dict(names=dict(failure_type="initialize")),
    ),
    dict(
        id="nanny-start-process-failed",
        meaning="The nanny could not start or connect to its worker process; the nanny then closes (reason nanny-instantiate-failed).",
        class_hint="unrecoverable_exception/worker_init_exception",
        match=[r"^Nanny failed to start process$", r"^Failed to start process$", r"^Failed while trying to start worker process", r"^Failed to connect to process$", r"^Worker failed to connect$"],
        sample=dict(args=["Worker failed to start"]),
    ),
    dict(
        id="nanny-timed-out-connecting",
        meaning="The nanny's worker did not come up / register within --death-timeout.",
        class_hint="chose_to_exit/death_timeout (or a start-up failure seen earlier)",
        match=[r"^Timed out connecting Nanny"],
        sample=dict(args=["<Nanny: None, threads: 2>", S]),
    ),
    dict(
        id="cli-timed-out-starting-worker",
        meaning="The dask-worker CLI gave up: the worker/nanny did not start within --death-timeout (exit code 1).",
        class_hint="chose_to_exit/death_timeout",
        match=[r"^Timed out starting worker$"],
    ),
    dict(
        id="cli-failed-to-launch-worker",
        meaning="The dask-worker CLI could not construct the worker/nanny (exception text follows).",
        class_hint="unrecoverable_exception/worker_init_exception",
        match=[r"^Failed to launch worker\. (<str\(e\)>|\{e\})$"],
        sample=dict(text={"Failed to launch worker. <str(e)>": "Failed to launch worker. No module named 'mymodule'"}, names=dict(e="No module named 'mymodule'")),
    ),
    dict(
        id="cli-invalid-arguments",
        meaning="The dask-worker CLI rejected its arguments; no worker started.",
        class_hint="unrecoverable_exception/worker_init_exception",
        match=[r"^Failed to launch worker\.  ?(You|Must)", r"^Both --nprocs and --nworkers"],
        files=r"^cli/dask_worker\.py$",
    ),
    dict(
        id="worker-timed-out-connecting",
        meaning="The worker could not reach the scheduler within its timeout.",
        class_hint="chose_to_exit/death_timeout",
        match=[r"^Timed out when connecting to scheduler"],
        sample=dict(args=[S]),
    ),
    dict(
        id="worker-unable-to-connect",
        meaning="The scheduler refused the worker's registration (e.g. duplicate name); the worker fails to start.",
        class_hint="unrecoverable_exception/worker_init_exception",
        match=[r"^Unable to connect to scheduler"],
        sample=dict(names=dict(msg="name taken, 0")),
    ),
    dict(
        id="spec-cluster-closed-without-start",
        meaning="A SpecCluster (LocalCluster) was closed before it finished starting (start-up failure).",
        class_hint="unrecoverable_exception/worker_init_exception",
        match=[r"^Cluster closed without starting up"],
    ),
    # ------------------------------------------------------------ fail-hard / internal errors
    dict(
        id="worker-fail-hard-exception",
        meaning="fail_hard: an exception escaped a worker stream/state handler; it is logged (logger.exception(e): the exception text, then the traceback) and the worker is closed (reason worker-<method>-fail-hard since 2022.10.2).",
        class_hint="unrecoverable_exception/fail_hard",
        match=[r"^<e>$"],
        files=r"^worker\.py$",
        funcs=r"^fail_hard\b",
        sample=dict(text={"<e>": "'NoneType' object has no attribute 'key'"}),
    ),
    dict(
        id="log-errors-generic",
        meaning="An exception escaped a handler wrapped in @log_errors (plugin_add, start-up and close paths, many RPC handlers): the line is the exception's own text, then the traceback. Before 2024.8.0 this is the only line a failing construction-time plugin setup produced.",
        class_hint="context (the traceback says what failed)",
        match=[r"^<(e|exc_value)>$"],
        files=r"^utils\.py$",
        funcs=r"log_errors|LogErrors",
        sample=dict(text={"<e>": "division by zero", "<exc_value>": "division by zero"}),
    ),
    dict(
        id="worker-fail-hard-exit",
        meaning="fail_hard could not close the worker cleanly; the worker process exits with os._exit(1).",
        class_hint="unrecoverable_exception/fail_hard",
        match=[r"^Error trying close worker in response to broken internal state"],
    ),
    dict(
        id="worker-validate-state-failed",
        meaning="Worker state validation failed (validation mode only); the worker closes.",
        class_hint="unrecoverable_exception/fail_hard",
        match=[r"^Validate state failed"],
    ),
    dict(
        id="worker-async-instruction-exception",
        meaning="An async instruction (task execution, gather) raised outside user code; with SystemExit from a task (2022.12.0+ lets SystemExit pass) the worker process exits with that status.",
        class_hint="unrecoverable_exception/system_exit|exception",
        match=[r"^Unhandled exception in async instruction", r"^async instruction handlers should never raise"],
        sample=dict(names=dict(task="<Task finished name='execute(exit-task-0)' coro=<...> exception=SystemExit(3)>")),
    ),
    dict(
        id="threadpool-exception-in-worker",
        meaning="A BaseException escaped a thread of Dask's ThreadPoolExecutor (e.g. SystemExit raised by a task before 2022.12.0).",
        class_hint="unrecoverable_exception/system_exit",
        match=[r"^Exception in worker$"],
    ),
    dict(
        id="worker-thread-pool-error",
        meaning="Submitting a task to the executor failed.",
        class_hint="unrecoverable_exception/exception",
        match=[r"^Thread Pool Executor error"],
        sample=dict(args=["cannot schedule new futures after shutdown"]),
    ),
    dict(
        id="worker-invalid-status-transition",
        meaning="Internal error: impossible worker status change.",
        class_hint="unrecoverable_exception/fail_hard",
        match=[r"^Invalid Worker\.status transition"],
        sample=dict(args=["Status.closed", "Status.running"]),
    ),
    dict(
        id="worker-no-runspec",
        meaning="Internal error: a task to execute has no run_spec.",
        class_hint="unrecoverable_exception/fail_hard",
        match=[r"^No runspec available for task"],
        sample=dict(args=["inc-5f3c1b1d1c5e3e0a"]),
    ),
    # ------------------------------------------------------------ versions / (de)serialization
    dict(
        id="versions-mismatch",
        meaning="Package versions differ between client, scheduler and workers (table follows on the next lines). Logged by a worker at registration (scheduler's warning), warned on the client (VersionMismatchWarning), raised by get_versions(check=True) in old versions.",
        class_hint="version_mismatch/package_versions",
        match=[r"^Mismatched versions found", r'^<response\["warning"\]>$'],
        sinks=("log", "string", "exception"),
        files=r"^(versions|client|worker)\.py$",
        sample=dict(args=["$OLDTABLE"], text={'<response["warning"]>': "$VERSIONS_TABLE"}),
    ),
    dict(
        id="versions-mismatch-old-components",
        meaning="Some component is older than distributed 1.28 (2.9.2-2.10.0).",
        class_hint="version_mismatch/distributed_version",
        match=[r"^Version mismatch for dask\.distributed"],
        sinks=("string",),
    ),
    dict(
        id="protocol-failed-to-deserialize",
        meaning="A message from a peer could not be deserialized (traceback follows: pickle protocol, missing module, class changed); on a worker this breaks the scheduler stream and the worker closes without restart.",
        class_hint="version_mismatch/deserialization (missing_module if the traceback says ModuleNotFoundError)",
        match=[r"^Failed to deserialize$"],
    ),
    dict(
        id="pickle-failed-to-deserialize",
        meaning="pickle.loads failed on a payload (bytes shown, traceback follows).",
        class_hint="version_mismatch/unpickling",
        match=[r"^Failed to deserialize %s$"],
        sample=dict(args=["b'\\x80\\x05\\x95\\x1f\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x8c\\x0fdask._task_spec\\x94'"]),
    ),
    dict(
        id="protocol-failed-to-serialize",
        meaning="A message could not be serialized (or falls back to pickle).",
        class_hint="context",
        match=[r"^Failed to Serialize$", r"^Failed to serialize %s", r"^Failed to serialize \(\{e\}\)"],
        sample=dict(args=["<function <lambda> at 0x7f3a2c1e5e50>", "Can't pickle local object"], names=dict(e="TypeError('cannot pickle _thread.lock object')")),
    ),
    dict(
        id="worker-could-not-deserialize-task",
        meaning="The worker could not unpickle a task's function/arguments (missing module or version skew); the task errs, the worker lives.",
        class_hint="not-a-death (task error; version_mismatch/missing_module evidence)",
        match=[r"^Could not deserialize task"],
        sample=dict(args=["inc-5f3c1b1d1c5e3e0a"]),
    ),
    dict(
        id="scheduler-graph-deserialization-error",
        meaning="The scheduler could not deserialize a submitted graph (client/scheduler environments differ); the tasks err, no worker dies. Since 2024.2.1 the scheduler also logs it at ERROR via logger.error(str(e)).",
        class_hint="version_mismatch/deserialization (not a worker death)",
        match=[r"Error during deserialization of the task graph", r"^<str\(e\)>$"],
        sinks=("log", "string"),
        files=r"^scheduler\.py$",
        funcs=r"update_graph",
        sample=dict(dedent=True, text={"<str(e)>": "$DEDENT:Error during deserialization of the task graph"}),
    ),
    dict(
        id="comm-truncated-or-unserializable",
        meaning="A frame could not be (de)serialized at the comm layer.",
        class_hint="version_mismatch/deserialization",
        match=[r"^truncated data stream", r"^Unserializable Message"],
        sample=dict(args=[1024, "b'...'"]),
    ),
    dict(
        id="process-exited-debug",
        meaning="The nanny's process wrapper saw the worker process exit (DEBUG: hidden by default); exit code as returned by multiprocessing (negative = signal).",
        class_hint="context",
        match=[r"^\[%s\] process %r exited with code %r$"],
        sample=dict(args=["<AsyncProcess Dask Worker process (from Nanny)>", PID, -9]),
    ),
    dict(
        id="core-exception-handling-op",
        meaning="A server handler raised while handling a peer's request (traceback follows); context for deserialization and registration failures.",
        class_hint="context",
        match=[r"^Exception while handling op %s$", r"^Exception while reading from %s$"],
        sample=dict(args=["register-worker"]),
    ),
    dict(
        id="batched-write-error",
        meaning="Writing on a batched stream failed (peer gone).",
        class_hint="context",
        match=[r"^Error in batched write"],
    ),
    dict(
        id="plugin-package-install-failed",
        meaning="PipInstall/CondaInstall plugin could not install packages; the plugin's setup raises (not fatal for the worker since 2024.8.0: see worker-plugin-setup-failed).",
        class_hint="not-a-death (plugin_setup_exception only if the worker then dies)",
        match=[r"^[Pp]ip install failed", r"^conda install failed"],
        sample=dict(args=["ERROR: No matching distribution found for nosuchpkg"], names=dict(stderr=b"ERROR: No matching distribution found for nosuchpkg")),
    ),
    dict(
        id="worker-plugin-transition-failed",
        meaning="A worker plugin's transition hook raised; logged, not fatal.",
        class_hint="not-a-death",
        match=[r"^Plugin '%s' failed with exception$"],
        sample=dict(args=["my-plugin"]),
    ),
    dict(
        id="client-future-cancelled",
        meaning="What a client prints for futures cancelled because the scheduler connection was lost (scheduler died).",
        class_hint="context (scheduler lost)",
        match=[r"cancelled for reason: \{self\.reason\}", r"^Client lost the connection to the scheduler"],
        sinks=("FutureCancelledError", "CancelledFuturesGroup", "string", "kwarg msg", "log"),
        files=r"^client\.py$",
        sample=dict(names=dict(keys=["inc-5f3c1b1d1c5e3e0a", "inc-9b1e0c7d2a4f6e3b"], example_message="Client lost the connection to the scheduler. Please check your connection and re-run your work.", self=dict(key="inc-5f3c1b1d1c5e3e0a", reason="scheduler-connection-lost"))),
    ),
    # ------------------------------------------------------------ task errors (not deaths)
    dict(
        id="worker-compute-failed",
        meaning="A task raised; the exception goes to the client. The worker lives.",
        class_hint="not-a-death",
        match=[r"Compute Failed"],
        sample=dict(args=["inc-5f3c1b1d1c5e3e0a", "executing", "<function inc at 0x7f3a2c1e5e50>", "(1,)", "{}", "ZeroDivisionError('division by zero')", "'  File \"job.py\", line 4, in inc\\n'"]),
    ),
    dict(
        id="worker-task-execution-exception",
        meaning="Unexpected error around task execution (not the user exception itself).",
        class_hint="not-a-death",
        match=[r"^Exception during execution of task"],
        sample=dict(args=["inc-5f3c1b1d1c5e3e0a"], names=dict(key="inc-5f3c1b1d1c5e3e0a")),
    ),
    dict(
        id="worker-run-failed",
        meaning="client.run function raised on the worker.",
        class_hint="not-a-death",
        match=[r"Run Failed"],
        sample=dict(args=["<function f at 0x7f3a2c1e5e50>", "()", "{}"]),
    ),
    # ------------------------------------------------------------ client
    dict(
        id="client-failed-to-reconnect",
        meaning="The client lost the scheduler and gave up reconnecting.",
        class_hint="context (scheduler lost)",
        match=[r"^Failed to reconnect to scheduler after"],
        sample=dict(args=[30.0]),
    ),
    dict(
        id="client-report-stream-closed",
        meaning="The client's stream to the scheduler closed (INFO on distributed.client: hidden by default).",
        class_hint="context (scheduler lost)",
        match=[r"^Client report stream closed to scheduler$", r"^Reconnecting\.\.\.$"],
        files=r"^client\.py$",
    ),
    # ------------------------------------------------------------ reason / stimulus strings
    dict(
        id="close-reasons",
        meaning="Reason strings passed to close()/kill(); they appear after 'Reason:' in Stopping worker / Closing Nanny / Nanny asking worker to close (2022.10.2+).",
        class_hint="context (maps to a chose_to_exit detail, or fail_hard / scheduler_lost)",
        match=[r"^[a-z{][a-z0-9_{}().!-]*-[a-z0-9_{}().!-]+$"],
        sinks=("kwarg reason", "default reason", "string"),
        sample=dict(names=dict(self=dict(name="pip"), name="my-plugin")),
        only_strings=[
            "scheduler-remove-worker",
            "scheduler-close-worker",
            "scheduler-close",
            "worker-{method.__name__}-fail-hard",
        ],
    ),
    dict(
        id="stimulus-id-prefixes",
        meaning="stimulus_id values that appear in 'Remove worker ... (stimulus_id=...)', Retire, Restart and Nanny-close lines; the prefix tells which path removed the worker.",
        class_hint="context",
        match=[
            r"^(handle-worker-cleanup|retire-workers|worker-close-gracefully|check-worker-ttl|client-restart"
            r"|client-restart-workers|restart|nanny-close|worker-close|worker-closing|worker-connect"
            r"|worker-send-comm-fail|send-all-comm-fail|worker-status-change|check-no-workers-timeout"
            r"|cancelled-by-worker-close|remove-client)-\{(time\(\)|now)\}$"
        ],
        sinks=("kwarg stimulus_id", "string"),
    ),
]


# =============================================================================
# Getting the sources
# =============================================================================

DEFAULT_VERSIONS = [
    "2.0.1", "2.5.2", "2.9.3", "2.15.2", "2.20.0", "2.25.0", "2.30.1",
    "2021.1.1", "2021.4.1", "2021.7.2", "2021.11.2", "2022.1.1", "2022.5.2",
    "2022.8.1", "2022.12.1", "2023.3.2", "2023.6.1", "2023.9.3", "2023.12.1",
    "2024.4.2", "2024.8.2", "2024.12.1", "2025.3.0", "2025.7.0", "2025.12.0",
    "2026.3.0", "2026.8.0",
]


def vkey(v):
    return tuple(int(x) for x in v.split("."))


def normalize(v):
    """'2021.01.1' -> '2021.1.1' (PEP 440 normalisation of the numeric parts)."""
    try:
        return ".".join(str(int(x)) for x in v.split("."))
    except ValueError:
        return None


def _extract(t, dest):
    try:
        t.extractall(dest, filter="data")
    except TypeError:  # Python without extraction filters
        t.extractall(dest)


def unpack(archive, dest):
    os.makedirs(dest, exist_ok=True)
    if archive.endswith(".whl") or archive.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(dest)
    else:
        with tarfile.open(archive) as t:
            _extract(t, dest)
        # sdist: <name>-<version>/distributed -> move up
        for entry in os.listdir(dest):
            inner = os.path.join(dest, entry, "distributed")
            if os.path.isdir(inner) and not os.path.isdir(os.path.join(dest, "distributed")):
                shutil.move(inner, os.path.join(dest, "distributed"))
    return dest


def fetch_pip(version, workdir):
    dest = os.path.join(workdir, "src", version)
    if os.path.isdir(os.path.join(dest, "distributed")):
        return dest
    wheels = os.path.join(workdir, "wheels")
    os.makedirs(wheels, exist_ok=True)
    found = [f for f in os.listdir(wheels) if f.startswith("distributed-%s-" % version) or f == "distributed-%s.tar.gz" % version]
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "distributed==%s" % version, "--no-deps", "-d", wheels, "-q"]
        subprocess.run(cmd, check=True)
        found = [f for f in os.listdir(wheels) if f.startswith("distributed-%s-" % version) or f == "distributed-%s.tar.gz" % version]
    if not found:
        raise SystemExit("pip did not produce an archive for distributed==%s" % version)
    found.sort(key=lambda f: (not f.endswith(".whl"), f))
    return unpack(os.path.join(wheels, found[0]), dest)


def git_tags(git_dir):
    out = subprocess.run(["git", "--git-dir", git_dir, "tag"], capture_output=True, text=True, check=True).stdout
    tags = {}
    for t in out.split():
        n = normalize(t)
        if n:
            tags.setdefault(n, t)
    return tags


def fetch_git(version, tag, git_dir, workdir):
    dest = os.path.join(workdir, "gitsrc", version)
    if os.path.isdir(os.path.join(dest, "distributed")):
        return dest
    os.makedirs(dest, exist_ok=True)
    data = subprocess.run(
        ["git", "--git-dir", git_dir, "archive", "--format=tar", tag, "distributed"],
        capture_output=True, check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        _extract(t, dest)
    return dest


def pypi_versions():
    """Released versions of distributed, from `pip index versions` (one query)."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", "distributed"],
            capture_output=True, text=True, timeout=120,
        ).stdout
    except Exception:
        return None
    m = re.search(r"Available versions:\s*(.*)", out)
    if not m:
        return None
    return {normalize(v.strip()) for v in m.group(1).split(",") if normalize(v.strip())}


def _scan_job(args):
    version, root, cache = args
    path = os.path.join(cache, version + ".json")
    if os.path.exists(path):
        with open(path) as f:
            return version, json.load(f)
    data = {"records": scan_tree(root), "config": version_config(root)}
    with open(path, "w") as f:
        json.dump(data, f)
    return version, data


# =============================================================================
# Matching and building the catalog
# =============================================================================


def match_message(rec):
    t = rec["template"]
    for m in MESSAGES:
        sinks = m.get("sinks", LOG)
        if not any(rec["sink"].startswith(s) for s in sinks):
            continue
        if m.get("files") and not re.search(m["files"], rec["file"]):
            continue
        if m.get("funcs") and not re.search(m["funcs"], rec.get("func") or ""):
            continue
        if rec["sink"] == "string" and "only_strings" in m and t not in m["only_strings"]:
            continue
        if any(re.search(p, t) for p in m["match"]):
            return m
    return None


def kind_of(rec):
    s = rec["sink"]
    if s == "log":
        return "log"
    if s.startswith("KilledWorker.__str__"):
        return "exception text (KilledWorker.__str__, shown by the client)"
    if s.startswith("KilledWorker args"):
        return "exception text (KilledWorker has no __str__: Exception.__str__ shows the args tuple)"
    if s.startswith("WorkerState.__repr__"):
        return "repr (WorkerState.__repr__, embedded in other messages)"
    if s.startswith("exception ") or s.startswith("raise"):
        return "exception text (%s)" % s
    if s.startswith("kwarg ") or s.startswith("default "):
        return "argument value (%s)" % s
    return "string (built here; reaches logs or the client elsewhere)"


def build_catalog(scans, primary, all_versions):
    """scans: {version: {"records": [...], "config": {...}}}"""
    order = sorted(all_versions, key=vkey)
    by_msg = {}
    for v in order:
        for rec in scans[v]["records"]:
            if "error" in rec:
                continue
            m = match_message(rec)
            if m is None:
                continue
            key = (rec["template"], rec["logger"], rec["level"], rec["call"], kind_of(rec))
            var = by_msg.setdefault(m["id"], {}).setdefault(key, {})
            var.setdefault(v, []).append(rec)
    catalog = []
    for m in MESSAGES:
        variants = []
        for key, per_v in by_msg.get(m["id"], {}).items():
            template, logger, level, call, kind = key
            present = sorted(per_v, key=vkey)
            first, last = present[0], present[-1]
            span = order[order.index(first): order.index(last) + 1]
            absent = [v for v in span if v not in per_v]
            shown = [v for v in present if v in primary or v in (first, last)]
            where, text_at = {}, {}
            for v in shown:
                recs = sorted(per_v[v], key=lambda r: (r["file"], r["line"]))
                where[v] = ", ".join(dict.fromkeys("%s:%d" % (r["file"], r["line"]) for r in recs))
                ta = [
                    "%s:%d" % (r["file"], r["text_line"])
                    for r in recs
                    if r["sink"] == "log" and not (r["line"] <= r["text_line"] <= r.get("end_line", r["line"]))
                ]
                if ta:
                    text_at[v] = ", ".join(dict.fromkeys(ta))
            lastrec = per_v[last][0]
            var = {
                "template": template,
                "logger": logger,
                "level": level,
                "versions": [first, last],
                "where": where,
            }
            if kind != "log":
                var["kind"] = kind
            if call and call != "logger." + (level or "").lower():
                var["call"] = call
            if call and (call == "logger.exception" or "exc_info" in call):
                var["traceback"] = True
            if absent:
                var["absent_in"] = absent
            if text_at:
                var["text_at"] = text_at
            if lastrec.get("args_src"):
                var["args"] = lastrec["args_src"]
            changes, prev = {}, None
            for v in present:
                a = per_v[v][0].get("args_src")
                if a != prev:
                    changes[v] = a
                prev = a
            if len(changes) > 1:
                var["args_by_version"] = changes
            var["style"] = lastrec.get("style", "%")
            var["is_expr"] = bool(lastrec.get("expr"))
            var["func"] = lastrec.get("func")
            var["_recs"] = per_v
            variants.append(var)
        variants.sort(key=lambda x: (vkey(x["versions"][0]), vkey(x["versions"][1]), x["template"]))
        if not variants:
            continue
        catalog.append(
            {
                "id": m["id"],
                "meaning": m["meaning"],
                "class_hint": m["class_hint"],
                "variants": variants,
            }
        )
    return catalog


# =============================================================================
# Examples (filled templates; NOT produced by running Dask)
# =============================================================================


class Auto:
    """Stands in for names a sample does not define: renders as <name>."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Auto(self._name + "." + attr)

    def __call__(self, *a, **k):
        return Auto(self._name + "()")

    def __str__(self):
        return "<%s>" % self._name

    __repr__ = __str__

    def __format__(self, spec):
        return str(self)


class NS:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Auto(attr)


class Text:
    """An object whose str and repr are a given text (e.g. a WorkerState repr)."""

    def __init__(self, text, **attrs):
        self._text = text
        self.__dict__.update(attrs)

    def __str__(self):
        return self._text

    __repr__ = __str__

    def __format__(self, spec):
        return format(self._text, spec)

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Auto(attr)


def to_ns(v):
    if isinstance(v, dict):
        return NS(**{k: to_ns(x) for k, x in v.items()})
    return v


def asciitable(columns, rows):  # same algorithm as distributed.utils.asciitable
    rows = [tuple(str(i) for i in r) for r in rows]
    columns = tuple(str(i) for i in columns)
    widths = tuple(max(max(map(len, x)), len(c)) for x, c in zip(zip(*rows), columns))
    row_template = ("|" + (" %%-%ds |" * len(columns))) % widths
    header = row_template % tuple(columns)
    bar = "+{}+".format("+".join("-" * (w + 2) for w in widths))
    data = "\n".join(row_template % r for r in rows)
    return "\n".join([bar, header, bar, data, bar])


def versions_table(version):
    """The version-mismatch table as a worker's registration would show it (sample values)."""
    if vkey(version) >= (2022, 8, 1):  # error_message(..., source_name=str(ws.server_id))
        return asciitable(
            ["Package", "Worker-7d2f0f2e-3b2c-4a5e-9b7c-2f0a8f0c1d2e", "Scheduler", "Workers"],
            [("cloudpickle", "3.0.0", "3.1.1", "{'3.1.1', '3.0.0'}")],
        )
    return asciitable(  # 2.17.0 .. 2022.8.0: client_name="client"
        ["Package", "client", "scheduler", "workers"],
        [("cloudpickle", "1.6.0", "2.0.0", "{'2.0.0', '1.6.0'}")],
    )


def old_versions_table():
    """2.0.1 .. 2.16.0: one small table per mismatched package."""
    return "cloudpickle\n" + asciitable(
        ["", "version"], [("client", "1.3.0"), ("scheduler", "1.2.2"), (W, "1.2.2")]
    )


class WorkerStateReprs:
    """Renders the version's WorkerState repr from the catalog's worker-state-repr variants."""

    def __init__(self, catalog):
        self.variants = []
        for msg in catalog:
            if msg["id"] == "worker-state-repr":
                self.variants = msg["variants"]

    def render_variant(self, var, version):
        return self._render(var, version, "running", 3, 1)

    def render(self, version, status="running", memory=3, processing=1):
        main = None
        for var in self.variants:
            if var["template"].startswith("<") and version in var["_recs"]:
                main = var
        if main is None:
            return "<WorkerState %r>" % W
        return self._render(main, version, status, memory, processing)

    def _render(self, main, version, status, memory, processing):
        t = main["template"]
        if not t.startswith("<"):  # the ", name: {self.name}" fragment
            return render_fstring(t, {"self": NS(name=0)})
        if main["style"] == "f-string":
            self_ns = NS(
                address=W, _address=W, name=0,
                status=NS(name=status), _status=NS(name=status),
                has_what=[None] * memory, _has_what=[None] * memory,
                processing=[None] * processing, _processing=[None] * processing,
            )
            return render_fstring(t, {"self": self_ns, "name": ", name: 0", "len": len})
        args = [W]
        if "name: %s" in t:
            args.append(0)
        if "status: %s" in t:
            args.append(status)
        args += [memory, processing]
        return t % tuple(args)


_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(?:\*|\d+)?(?:\.\d+)?[diouxXeEfFgGcrsa%]")


def count_specs(t):
    return sum(1 for m in _SPEC.finditer(t) if not m.group().endswith("%"))


def render_fstring(t, names):
    import string

    out = []
    for literal, field, spec, conv in string.Formatter().parse(t):
        out.append(literal)
        if field is None:
            continue
        expr = field
        prefix = ""
        if expr.rstrip().endswith("="):
            prefix = expr
            expr = expr.rstrip()[:-1]
            if conv is None and not spec:
                conv = "r"
        try:
            val = eval(expr, {"__builtins__": builtins}, names)
        except Exception:
            val = Auto(expr)
        if conv == "r":
            val = repr(val)
        elif conv == "s":
            val = str(val)
        elif conv == "a":
            val = ascii(val)
        try:
            out.append(prefix + format(val, spec or ""))
        except Exception:
            out.append(prefix + str(val))
    return "".join(out)


class Names(dict):
    def __missing__(self, key):
        return Auto(key)


def sample_names(m, version, wsr):
    ws_text = wsr.render(version, **(m.get("sample", {}).get("ws") or {}))
    names = Names(
        pid=PID, exitcode=1, address=W, addr=W, worker_address=W,
        nanny=NS(worker_address=W), process=NS(pid=PID),
        self=NS(address=W, memory_terminate_fraction=0.95, name=0, worker_address=W),
        ws=Text(ws_text, address=W, name=0, nanny=N, memory_limit=2 * 1024**3),
        stimulus_id="handle-worker-cleanup-1763718799.5348115",
        timeout=10, wait_timeout=5.0, last_seen=302.6, now=1763718799.5348115,
        key="inc-5f3c1b1d1c5e3e0a", name="my-plugin", msg="<msg>",
        e="<exception text>", report=True, signum=15, exc=TimeoutError(),
        method=NS(__name__="handle_stimulus"), err_table=versions_table(version),
        len=len, list=list, set=set, str=str, type=type,
        time=lambda: 1763718799.5348115,
        format_bytes=lambda n: "2.00 GiB", format_time=lambda s: "10.00 s",
    )
    for k, v in (m.get("sample", {}).get("names") or {}).items():
        if v is not None:
            names[k] = to_ns(v)
    return names, ws_text


def render_message(m, var, version, wsr, msg_entry=None):
    sample = m.get("sample", {})
    t = var["template"]
    names, ws_text = sample_names(m, version, wsr)
    wsc_text = wsr.render(version, status="closed", memory=0, processing=1)

    def sub(x):
        if isinstance(x, str) and x.startswith("$RAW:"):
            return Text(x[len("$RAW:"):])
        if x == "$OLDTABLE":
            return old_versions_table()
        if x == "$WS":
            return ws_text
        if x == "$WSC":
            return wsc_text
        return x

    text_map = sample.get("text") or {}
    if t in text_map:
        txt = text_map[t]
        if txt == "$VERSIONS_TABLE":
            txt = "Mismatched versions found\n\n" + (
                old_versions_table() if vkey(version) < (2, 17, 0) else versions_table(version)
            )
        if txt.startswith("$DEDENT:") and msg_entry is not None:
            import textwrap

            pat = txt[len("$DEDENT:"):]
            for other in msg_entry["variants"]:
                if other is not var and re.search(pat, other["template"]) and version in other.get("_recs", {}):
                    return textwrap.dedent(other["template"])
        return txt
    if var.get("is_expr"):
        return t  # an expression: the text depends on the runtime value
    if var.get("kind", "").startswith("repr (WorkerState"):
        return wsr.render_variant(var, version)
    style = var.get("style", "%")
    if var.get("style") == "repr":  # KilledWorker args tuple
        task = "inc-5f3c1b1d1c5e3e0a"
        if "allowed_failures" in t:
            return repr((task, Text(wsc_text), 3))
        return repr((task, Text(wsc_text)))
    if sample.get("dedent") and var.get("kind", "log") != "log":
        import textwrap

        t = textwrap.dedent(t)
    if style == "f-string":
        t = render_fstring(t, names)
        apply_pct = bool(var.get("args"))
    elif style == "str.format":
        fa = sample.get("format_args") or []
        try:
            t = t.format(*fa)
        except Exception:
            pass
        apply_pct = False
    else:
        apply_pct = True
    n = count_specs(t) if apply_pct else 0
    if n:
        args = None
        for k, v in (sample.get("vargs") or {}).items():
            if re.search(k, var["template"]):
                args = v
        if args is None:
            args = list(sample.get("args") or [])
            by_src = sample.get("by_src") or {}
            recs = var.get("_recs", {}).get(version) or []
            src = recs[0].get("args_src") if recs else None
            if by_src and src:
                for i, expr in enumerate(src):
                    if expr in by_src:
                        while len(args) <= i:
                            args.append("...")
                        args[i] = by_src[expr]
        args = [sub(a) for a in args][:n]
        while len(args) < n:
            args.append("...")
        try:
            t = t % tuple(args)
        except (TypeError, ValueError):
            fixed = []
            for a in args:
                fixed.append(a)
            try:
                t = t % tuple(str(a) if not isinstance(a, (int, float)) else a for a in fixed)
            except Exception:
                pass
    return t


def fake_time(version):
    parts = version.split(".")
    if int(parts[0]) >= 2020:
        return "%s-%02d-15 10:31:07,123" % (parts[0], int(parts[1]))
    return "2020-06-15 10:31:07,123"


def layout(fmt, logger, level, msg, version):
    if not fmt:
        fmt = "%(name)s - %(levelname)s - %(message)s"
    return fmt % {"asctime": fake_time(version), "name": logger, "levelname": level, "message": msg}


def example_lines(m, var, version, config, wsr, msg_entry=None):
    msg = render_message(m, var, version, wsr, msg_entry)
    kind = var.get("kind", "log")
    if kind == "log":
        level = var["level"]
        if level and not level.isupper():
            level = level.upper()
        logger = var["logger"] or "distributed"
        if logger.startswith("("):
            logger = "distributed.worker.memory"
        line = layout(config.get("log_format"), logger, level, msg, version)
    elif "KilledWorker" in kind:
        line = "distributed.scheduler.KilledWorker: " + msg
    elif kind.startswith("exception text (exception ") or kind.startswith("exception text (raise"):
        exc = kind.split("(", 1)[1].split()[-1].rstrip(")").split(".")[-1]
        line = "%s: %s" % (exc, msg)
    else:
        line = msg
    return line


# =============================================================================
# Main
# =============================================================================


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", default=",".join(DEFAULT_VERSIONS), help="comma-separated primary versions (pip download)")
    ap.add_argument("--bracket-git", metavar="GIT_DIR", help="a git directory of dask/distributed; every release tag between the first and last primary version is scanned too, to bracket first/last appearances")
    ap.add_argument("--no-pypi-filter", action="store_true", help="with --bracket-git, do not drop tags that are not PyPI releases")
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a new temp dir)")
    ap.add_argument("--out", default=here, help="output directory (default: this script's folder)")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)))
    ap.add_argument("--print-config", action="store_true", help="print the per-version log format / levels table (markdown)")
    args = ap.parse_args(argv)

    workdir = args.workdir or tempfile.mkdtemp(prefix="wording-")
    cache = os.path.join(workdir, "scan-cache")
    os.makedirs(cache, exist_ok=True)
    primary = [normalize(v) for v in args.versions.split(",") if v.strip()]
    jobs = {}
    for v in primary:
        print("pip: distributed==%s" % v, file=sys.stderr)
        jobs[v] = fetch_pip(v, workdir)
    if args.bracket_git:
        tags = git_tags(args.bracket_git)
        lo, hi = min(primary, key=vkey), max(primary, key=vkey)
        wanted = [v for v in tags if vkey(lo) <= vkey(v) <= vkey(hi) and v not in jobs]
        if not args.no_pypi_filter:
            released = pypi_versions()
            if released:
                wanted = [v for v in wanted if v in released]
        for v in sorted(wanted, key=vkey):
            jobs[v] = fetch_git(v, tags[v], args.bracket_git, workdir)
    scans = {}
    with ProcessPoolExecutor(args.jobs) as ex:
        for v, data in ex.map(_scan_job, [(v, root, cache) for v, root in jobs.items()]):
            scans[v] = data
    all_versions = sorted(scans, key=vkey)
    catalog = build_catalog(scans, set(primary), all_versions)
    wsr = WorkerStateReprs(catalog)

    # examples
    ex_lines = [
        "# Example log lines for every variant in catalog.json, built by filling the real",
        "# templates with plausible values in that version's default line layout.",
        "# They were NOT produced by running Dask. Values (addresses, pids, keys) are made up;",
        "# the wording, logger names, levels and layout come from the source of each version.",
        "# Multi-line messages continue on the next lines without a prefix, as Dask prints them.",
        "",
    ]
    for msg in catalog:
        m = next(x for x in MESSAGES if x["id"] == msg["id"])
        for var in msg["variants"]:
            first, last = var["versions"]
            for v in dict.fromkeys([first, last]):
                where = var["where"].get(v) or var["where"][next(iter(var["where"]))]
                ex_lines.append("# %s | distributed %s | %s | from source (not run)" % (msg["id"], v, where.split(", ")[0]))
                if var.get("traceback"):
                    ex_lines.append("#   (%s: a traceback follows this line in a real log)" % var["call"])
                if var.get("is_expr") and var["template"] not in (m.get("sample", {}).get("text") or {}):
                    ex_lines.append("#   (the message is the runtime value of %s)" % var["template"][1:-1])
                ex_lines.append(example_lines(m, var, v, scans[v]["config"], wsr, msg))
            ex_lines.append("")
    for msg in catalog:
        for var in msg["variants"]:
            for k in ("_recs", "style", "func", "is_expr"):
                var.pop(k, None)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "catalog.json"), "w") as f:
        json.dump(catalog, f, indent=1, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(args.out, "examples.txt"), "w") as f:
        f.write("\n".join(ex_lines).rstrip("\n") + "\n")
    nvar = sum(len(m["variants"]) for m in catalog)
    print("%d messages, %d variants, %d versions scanned (%d primary)" % (len(catalog), nvar, len(all_versions), len(primary)), file=sys.stderr)
    if args.print_config:
        print("| version | log-format | default logger levels (config.py) | LocalCluster silence_logs |")
        print("| --- | --- | --- | --- |")
        for v in all_versions:
            if v not in primary:
                continue
            c = scans[v]["config"]
            print("| %s | `%s` (%s) | %s | `%s` |" % (v, c["log_format"], c["log_format_at"], ", ".join("%s: %s" % kv for kv in (c["logger_levels"] or {}).items()), c["silence_logs"]))
        print()
        print("Changes over all scanned versions:")
        prev = None
        for v in all_versions:
            c = scans[v]["config"]
            cur = (c["log_format"], json.dumps(c["logger_levels"], sort_keys=True), (c["silence_logs"] or "").split(" (")[0])
            if cur != prev:
                print("- from %s: format `%s`, levels %s, silence_logs `%s`" % (v, cur[0], cur[1], cur[2]))
            prev = cur


if __name__ == "__main__":
    main()
