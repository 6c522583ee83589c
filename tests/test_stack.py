"""The crashing thread's stack from real faulthandler dumps (``kwdiag.analysis.stack``): processes that really
crash, their stderr read back, as kwdiag's nanny keeps it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from kwdiag.analysis.stack import crash_stack, user_frame

CRASH = textwrap.dedent('''
    import ctypes, faulthandler, sys, threading, time

    faulthandler.enable(all_threads=sys.argv[1] == "all")

    def idle():
        time.sleep(60)

    def crash_here():
        ctypes.string_at(0)

    def caller():
        crash_here()

    if sys.argv[1] == "all":
        threading.Thread(target=idle, daemon=True).start()
    print("before the crash", file=sys.stderr, flush=True)
    caller()
''')


def crashed(tmp_path, threads: str) -> list[str]:
    script = tmp_path / "job.py"
    script.write_text(CRASH)
    done = subprocess.run([sys.executable, str(script), threads], capture_output=True, timeout=60)
    assert done.returncode == -11   # a real SIGSEGV
    return done.stderr.decode().splitlines()


def test_the_crashing_threads_frames_innermost_first_with_the_tasks_own_code_picked(tmp_path):
    lines = crashed(tmp_path, "all")
    assert any(x.startswith("Thread 0x") for x in lines)   # another thread's stack is in the dump too
    stack = crash_stack(lines)
    assert [(f.function, f.library) for f in stack] == [
        ("string_at", True), ("crash_here", False), ("caller", False), ("<module>", False)]
    assert stack[0].file == "ctypes/__init__.py"             # the standard library's folder cut off
    assert stack[1].file == str(tmp_path / "job.py") and stack[1].line == CRASH.splitlines().index("    ctypes.string_at(0)") + 1
    assert user_frame(stack) == stack[1] and str(stack[1]).startswith("crash_here (")


def test_a_dump_of_one_thread_reads_the_same(tmp_path):
    stack = crash_stack(crashed(tmp_path, "one"))   # "Stack (most recent call first):", no thread ids
    assert [f.function for f in stack] == ["string_at", "crash_here", "caller", "<module>"]


def test_no_dump_no_stack():
    assert crash_stack(["Traceback (most recent call last):", '  File "x.py", line 3, in f', "ValueError: x"]) == ()
    assert crash_stack(["Fatal Python error: Segmentation fault", "", "Thread 0x1 (most recent call first):",
                        "  <no Python frame>"]) == ()
    assert crash_stack([]) == () and user_frame(()) is None


def test_site_packages_frames_are_package_frames_and_shortened():
    lines = ["Fatal Python error: Aborted", "", "Current thread 0x00007f1 (most recent call first):",
             '  File "/opt/venv/lib/python3.12/site-packages/numpy/core/a.py", line 5 in f',
             '  File "C:\\env\\Lib\\site-packages\\pandas\\b.py", line 6 in g',
             '  File "/home/me/etl.py", line 7 in main', "", "Extension modules: numpy"]
    stack = crash_stack(lines)
    assert [(f.file, f.line, f.origin) for f in stack] == [
        ("numpy/core/a.py", 5, "package"), ("pandas\\b.py", 6, "package"), ("/home/me/etl.py", 7, "own")]
    assert user_frame(stack) == stack[2] and user_frame(stack[:2]) == stack[0]   # the job's code, else a package


ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def _segfaults(paths) -> dict:
    from kwdiag.pipeline import analyze

    return {(d.worker, d.incarnation): d for d in analyze([str(p) for p in paths]).deaths if d.detail == "segfault"}


def test_a_dask_worker_log_gives_the_stack_under_its_fatal_python_error_line():
    """Real Dask 2026.8 logs: w1 ran with PYTHONFAULTHANDLER=1 (its dump is under the line the rule read), w2
    without (no dump, no stack)."""
    deaths = _segfaults([ROOT / "sample_logs" / "dask-segfault"])
    assert set(deaths) == {("w1", 1), ("w2", 1)}
    w1 = deaths[("w1", 1)]
    assert [(f.function, f.file.endswith("dask-segfault/make.py"), f.line) for f in w1.stack[:2]] == [
        ("string_at", False, 519), ("crash", True, 13)]
    assert "It crashed in crash (dask-segfault/make.py:13)" in w1.hints[0].text
    assert deaths[("w2", 1)].stack == ()


def test_in_a_merged_stream_the_dump_is_the_crashing_processs_own(tmp_path):
    """compose-style prefixes, the two workers' lines interleaved: w1's frames only, prefixes removed."""
    w1 = (ROOT / "sample_logs" / "dask-segfault" / "w1.log").read_text().splitlines()
    w2 = (ROOT / "sample_logs" / "dask-segfault" / "w2.log").read_text().splitlines()
    merged = []
    for i in range(max(len(w1), len(w2))):
        merged += [f"w1  | {x}" for x in w1[i:i + 1]] + [f"w2  | {x}" for x in w2[i:i + 1]]
    (tmp_path / "compose.log").write_text("\n".join(merged) + "\n")
    deaths = [d for d in _segfaults([tmp_path / "compose.log"]).values() if d.stack]
    assert len(deaths) == 1 and [f.function for f in deaths[0].stack] == [
        f.function for f in _segfaults([ROOT / "sample_logs" / "dask-segfault"])[("w1", 1)].stack]


def test_gzip_and_stdin_are_not_read_twice(tmp_path):
    import gzip

    (tmp_path / "w1.log.gz").write_bytes(gzip.compress((ROOT / "sample_logs" / "dask-segfault" / "w1.log").read_bytes()))
    deaths = _segfaults([tmp_path / "w1.log.gz"])
    assert deaths and all(d.stack == () for d in deaths.values())


def test_the_lines_from_a_line_on_are_found_whatever_the_block_size(tmp_path, monkeypatch):
    """``kwdiag.readers.dumps`` counts whole blocks and splits only those that hold a window: lines cut by a block
    boundary, CRLF, a last line without its newline, lines longer than a block and windows that overlap give what
    a plain line loop gives."""
    import random

    from kwdiag.readers import dumps

    rng = random.Random(7)
    path = tmp_path / "log.txt"
    for _ in range(300):
        lines = [("x" * rng.choice([0, 1, 5, 50, 300])) + str(i) for i in range(rng.randint(1, 200))]
        newline = rng.choice(["\n", "\r\n"])
        path.write_bytes((newline.join(lines) + rng.choice(["", newline])).encode())
        monkeypatch.setattr(dumps, "BLOCK", rng.choice([1, 3, 7, 64, 4096]))
        monkeypatch.setattr(dumps, "MAX_DUMP_LINES", rng.choice([1, 3, 80]))
        monkeypatch.setattr(dumps, "MAX_LINE", rng.choice([20, 4096]))
        targets = sorted(rng.sample(range(1, len(lines) + 1), min(3, len(lines))))
        found = dumps._lines_from(str(path), targets)
        assert found == {t: [x[:dumps.MAX_LINE] for x in lines[t - 1:t + dumps.MAX_DUMP_LINES]] for t in targets}


MANY_THREADS = textwrap.dedent('''
    import ctypes, faulthandler, threading, time

    faulthandler.enable(all_threads=True)

    def idle():
        time.sleep(60)

    def crash_here():
        ctypes.string_at(0)

    for _ in range(15):   # started after the main thread: the dump lists them first, the crashing one last
        threading.Thread(target=idle, daemon=True).start()
    time.sleep(0.2)
    crash_here()
''')


def test_a_worker_of_many_threads_still_gives_the_crashing_threads_frames(tmp_path):
    """16 threads: the crashing (oldest) thread's block comes ~100 lines after 'Fatal Python error'. A text log
    holding the dump, and a nanny's 100-line stderr tail that lost the dump's first line, both give its frames."""
    script = tmp_path / "job.py"
    script.write_text(MANY_THREADS)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60)
    assert done.returncode == -11
    lines = done.stderr.decode().splitlines()
    current = next(i for i, x in enumerate(lines) if x.startswith("Current thread"))
    assert current > 80   # beyond the window and the tail kwdiag used to keep
    assert [f.function for f in crash_stack(lines[-100:])] == ["string_at", "crash_here", "<module>"]
    (tmp_path / "worker.log").write_text("\n".join(lines) + "\n")
    [death] = _segfaults([tmp_path / "worker.log"]).values()
    assert [f.function for f in death.stack] == ["string_at", "crash_here", "<module>"]


def test_two_crashes_in_one_stream_each_keep_their_own_dump(tmp_path):
    """Two real Dask worker logs one after the other in one file (two workers writing to one terminal): each
    'Fatal Python error' gets the dump under it, not the next one's."""
    from kwdiag.engine import load_rules
    from kwdiag.readers import read_events

    first = (ROOT / "sample_logs" / "dask-segfault" / "w1.log").read_text()
    second = (ROOT / "sample_logs" / "dask-2024-memory-segfault" / "w2.log").read_text()
    (tmp_path / "both.log").write_text(first + second)
    events, _, _ = read_events([str(tmp_path / "both.log")], load_rules())
    fatal = [e for e in events if "Fatal Python error" in e.message]
    stacks = [crash_stack([e.message, *e.fields["dump"]]) for e in fatal]
    assert [(s[1].function, s[1].line, s[1].file.rsplit("/", 2)[-2]) for s in stacks] == [
        ("crash", 13, "dask-segfault"), ("crash", 24, "dask-2024-memory-segfault")]
    assert all(not any("Fatal Python error" in x for x in e.fields["dump"]) for e in fatal)


def test_where_a_file_is_says_whose_code_it_is():
    from kwdiag.analysis.stack import _frame

    cases = {
        "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py": ("threading.py", "stdlib"),
        "/usr/lib64/python3.11/ctypes/__init__.py": ("ctypes/__init__.py", "stdlib"),
        "/usr/lib/pypy3.10/os.py": ("os.py", "stdlib"),
        "C:\\Python311\\Lib\\ctypes\\__init__.py": ("ctypes\\__init__.py", "stdlib"),
        "<frozen runpy>": ("<frozen runpy>", "stdlib"),
        "/opt/venv/lib/python3.12/site-packages/kwdiag/run/demo_job.py": ("kwdiag/run/demo_job.py", "package"),
        "/usr/lib/python3/dist-packages/numpy/a.py": ("numpy/a.py", "package"),
        "/home/me/lib/python3/project/job.py": ("/home/me/lib/python3/project/job.py", "own"),
        "<dynamic-code>": ("<dynamic-code>", "own"),
        "<string>": ("<string>", "stdlib"),   # a spawned worker's main module
        "/usr/lib/python3.13t/threading.py": ("threading.py", "stdlib"),   # a free-threaded build
        "/home/me/clone/kwdiag/runtime/worker.py": ("kwdiag/runtime/worker.py", "package"),   # kwdiag runs tasks
        "C:/Users/me/proj/lib/job.py": ("C:/Users/me/proj/lib/job.py", "own"),
    }
    assert {p: (_frame("f", p, 1).file, _frame("f", p, 1).origin) for p in cases} == cases
    assert str(_frame("f", "/home/me/lib/python3/project/job.py", 3)) == "f (project/job.py:3)"


def test_the_frame_a_fix_names_is_always_shown():
    """Twelve frames of a package above the job's own: the report shows the first two, an elision and the job's
    frame, the one the fix names; with nothing of the job's own, a package's."""
    from kwdiag.analysis.stack import Frame
    from kwdiag.report.terminal import _crashed_in
    from kwdiag.report.text import crash_frames

    pandas = [Frame(f"p{i}", f"pandas/m{i}.py", i, "package") for i in range(12)]
    etl = Frame("etl", "/home/me/proj/etl.py", 7, "own")
    assert user_frame([*pandas, etl]) == etl
    assert crash_frames([*pandas, etl], brief=True) == ([pandas[0], pandas[1], None, etl], etl)
    assert _crashed_in([*pandas, etl], brief=True) == "crashed in p0 ← p1 ← ... ← etl (proj/etl.py:7)"
    assert _crashed_in([*pandas, etl]).endswith("← ... ← etl (proj/etl.py:7)")
    string_at = Frame("string_at", "ctypes/__init__.py", 519, "stdlib")
    assert _crashed_in([string_at, pandas[0], *pandas[1:3]], brief=True) == \
        "crashed in string_at ← p0 (pandas/m0.py:0) ← ..."
    assert _crashed_in([string_at], brief=True) == "crashed in string_at (ctypes/__init__.py:519)"



def test_a_process_its_nanny_saw_killed_by_another_signal_gets_no_stack(tmp_path):
    """The real kwdiag segfault sample with one worker's exit record turned into a SIGKILL, its stderr still
    holding a dump (a forked child's, say): that death is not told it crashed in the dump's frames."""
    import json as _json
    import shutil

    src = ROOT / "sample_logs" / "kwdiag-segfault-killedworker"
    dst = tmp_path / "run"
    shutil.copytree(src, dst)
    lines = []
    for line in (dst / "nanny-worker-0.jsonl").read_text().splitlines():
        rec = _json.loads(line)
        if rec["kind"] == "worker-exit" and rec["fields"].get("signal") == 11:
            rec["fields"].update(signal=9, signal_name="SIGKILL", exitcode=-9)
            rec["message"] = rec["message"].replace("signal 11 (SIGSEGV)", "signal 9 (SIGKILL)")
            assert "Fatal Python error: Segmentation fault" in rec["fields"]["stderr_tail"]
        lines.append(_json.dumps(rec))
    (dst / "nanny-worker-0.jsonl").write_text("\n".join(lines) + "\n")
    from kwdiag.pipeline import analyze

    by_worker = {(d.worker, d.incarnation): d for d in analyze([str(dst)]).deaths}
    assert by_worker[("worker-0", 1)].stack == ()
    assert [f.function for f in by_worker[("worker-1", 1)].stack[:2]] == ["string_at", "segfault"]


def test_a_dump_collected_with_kubectl_timestamps_still_gives_the_stack(tmp_path):
    """``kubectl logs --prefix --timestamps`` puts the pod and an RFC 3339 stamp before every line, the dump's
    too: taken off, the frames read as in the worker's own log."""
    lines = (ROOT / "sample_logs" / "dask-segfault" / "w1.log").read_text().splitlines()
    stamped = [f"[pod/dask-worker-1/worker] 2026-11-21T10:57:{i % 60:02d}.570123456Z {x}" for i, x in enumerate(lines)]
    (tmp_path / "kubectl.log").write_text("\n".join(stamped) + "\n")
    stacks = [d.stack for d in _segfaults([tmp_path / "kubectl.log"]).values()]
    assert [[f.function for f in s[:2]] for s in stacks] == [["string_at", "crash"]]


def test_a_recursion_of_one_frame_is_shown_without_a_false_elision():
    from kwdiag.analysis.stack import Frame
    from kwdiag.report.text import crash_frames

    f = Frame("walk", "/home/me/proj/tree.py", 3, "own")
    assert crash_frames([f] * 10) == ([f] * 10, f)              # all ten shown, nothing left out
    assert crash_frames([f] * 12) == ([f] * 10 + [None], f)
    assert crash_frames([f] * 3, brief=True) == ([f, None], f)
