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


def test_site_packages_frames_are_library_frames_and_shortened():
    lines = ["Fatal Python error: Aborted", "", "Current thread 0x00007f1 (most recent call first):",
             '  File "/opt/venv/lib/python3.12/site-packages/numpy/core/a.py", line 5 in f',
             '  File "C:\\env\\Lib\\site-packages\\pandas\\b.py", line 6 in g',
             '  File "/home/me/etl.py", line 7 in main', "", "Extension modules: numpy"]
    stack = crash_stack(lines)
    assert [(f.file, f.line, f.library) for f in stack] == [
        ("numpy/core/a.py", 5, True), ("pandas\\b.py", 6, True), ("/home/me/etl.py", 7, False)]
