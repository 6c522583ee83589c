"""Run ONE corpus case for real, inside the virtual environment of the Dask version under test.

Started by generate.py as ``<venv>/bin/python runner.py SPEC.json`` (under ``flock /tmp/heavy.lock``).
Its stderr IS a corpus log: ``client.log`` for the ``cli`` launch (then the scheduler and every
``dask worker`` process write their own ``<name>.log``), ``cluster.log`` for the LocalCluster
launches (the script, its in-process scheduler and the nanny/worker processes share that stderr).
So this script never writes to stderr itself: its own progress goes to stdout (runner.out, kept
outside the corpus) and what it did goes to SPEC's result file as JSON. The only text it lets
reach stderr is what Dask logs and, where a user's script would have crashed or shown it, the
traceback Python formats for a real exception (KilledWorker, a task's ValueError, a cluster
start-up failure).

Must run on every Python from 3.8 (distributed 2.9.3 and 2.30.1) on, and on every distributed from 2.9.3.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path


def dbg(*a):
    print("%.3f" % time.time(), *a, flush=True)


# ---------------------------------------------------------------- task code (runs in workers)

def work(i, dt=0.15):
    import time as _t
    _t.sleep(dt)
    return i


def _marker(path, **kw):
    import json as _j, os as _o, time as _t
    name = None
    try:
        from distributed import get_worker
        name = str(get_worker().name)
    except Exception:
        pass
    d = dict(kw, pid=_o.getpid(), worker=name, t=_t.time())
    if path.endswith("/"):
        path = path + "%d-%f" % (_o.getpid(), _t.time())
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(_j.dumps(d))
    _o.replace(tmp, path)


def hold(path, secs):
    """A task that runs until its worker is hit (or secs pass)."""
    import os as _o, time as _t
    if _o.path.exists(path):
        return "rerun"  # rescheduled after its worker was hit: do not hold again
    _marker(path)
    t0 = _t.time()
    while _t.time() - t0 < secs and not _o.path.exists(path + ".release"):
        _t.sleep(0.05)
    return "held"


def fault(path, kind):
    """A task that ends its own worker process the way `kind` says."""
    import ctypes, os as _o, sys as _s, time as _t, signal as _sig
    if not path.endswith("/") and _o.path.exists(path):
        return "rerun"  # rescheduled after the fault: fault once only
    _marker(path, kind=kind)
    if kind == "segfault":
        ctypes.string_at(0)
    elif kind == "sigabrt":
        _o.abort()
    elif kind == "sys_exit":
        _s.exit(3)
    elif kind == "os_exit":
        _o._exit(1)
    elif kind == "sigkill_self":
        _o.kill(_o.getpid(), _sig.SIGKILL)
    _t.sleep(5)
    return "survived"


def bad_value(i):
    raise ValueError("task %d got a bad value" % i)


def hog(path, limit_bytes):
    """Allocate (and touch) memory step by step, far past the worker's memory limit."""
    import os as _o, time as _t
    if _o.path.exists(path):
        return "rerun"
    _marker(path)
    chunks = []
    step = 16 * 2 ** 20
    while len(chunks) * step < 3 * limit_bytes:
        chunks.append(b"\x01" * step)
        _t.sleep(0.04)
    n = len(chunks) * step
    del chunks
    return n


def pause_hold(path, limit_bytes, frac=0.87, hold_s=6.0):
    """Hold memory above the pause fraction (0.8) but below terminate (0.95) until the worker pauses."""
    import time as _t
    import psutil
    from distributed import get_worker
    p = psutil.Process()
    chunks = []
    step = 8 * 2 ** 20
    while p.memory_info().rss + step < frac * limit_bytes:
        chunks.append(b"\x01" * step)
    _marker(path, rss=p.memory_info().rss)
    w = get_worker()
    t0 = _t.time()
    paused = False
    while _t.time() - t0 < hold_s:
        st = str(getattr(w, "status", ""))
        if "paused" in st or getattr(w, "paused", False) is True:
            paused = True
            break
        _t.sleep(0.05)
    _t.sleep(1.0)
    rss = p.memory_info().rss
    del chunks
    return {"paused": paused, "rss": rss}


def inject_async_exc(path):
    """client.run on one worker: start a thread that raises an exception in the worker's main
    (event-loop) thread, outside any task."""
    import ctypes, os as _o, threading as _th, time as _t, json as _j
    main = _th.main_thread()

    class BackgroundThreadError(RuntimeError):
        pass

    def go():
        _t.sleep(0.3)
        with open(path + ".tmp", "w") as f:
            f.write(_j.dumps({"pid": _o.getpid(), "t": _t.time()}))
        _o.replace(path + ".tmp", path)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main.ident),
                                                   ctypes.py_object(BackgroundThreadError))

    _th.Thread(target=go, daemon=True, name="corpus-injector").start()
    return _o.getpid()


# ---------------------------------------------------------------- helpers

def _sched_tasks(dask_scheduler=None):
    return {str(k): str(ts.state) for k, ts in dask_scheduler.tasks.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def wait_for(cond, timeout, interval=0.05, what=""):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            v = cond()
        except Exception as e:  # noqa
            v = None
        if v:
            return v
        time.sleep(interval)
    dbg("timeout waiting for", what)
    return None


def pid_alive(pid) -> bool:
    import psutil
    if pid is None:
        return False
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ver_tuple(v: str):
    out = []
    for part in v.split(".")[:2]:
        try:
            out.append(int(part))
        except ValueError:
            out.append(0)
    return tuple(out)


# ---------------------------------------------------------------- collectors
# Dask's `logging` config (a dictConfig under `logging:`, read from DASK_CONFIG) for the collectors that change the
# layout of every line: JSON records as ELK/Datadog/Loki setups write them, and a custom text format.
_LOGGING = """\
logging:
  version: 1
  disable_existing_loggers: false
  formatters:
    custom:
      %s
  handlers:
    console:
      class: logging.StreamHandler
      formatter: custom
  loggers:
    distributed:
      level: INFO
      handlers: [console]
      propagate: false
"""
LOGGING_CONFIG = {
    "json": _LOGGING % '(): pythonjsonlogger.json.JsonFormatter\n      format: "%(asctime)s %(name)s %(levelname)s %(message)s"',
    "custom_format": _LOGGING % 'format: "[%(asctime)s] %(levelname)-8s %(name)s (pid %(process)d): %(message)s"',
}


# ---------------------------------------------------------------- the run

class Run:
    def __init__(self, spec):
        self.spec = spec
        self.case = spec["case"]
        self.death = self.case["death"]
        self.launch = self.case["launch"]
        self.nanny = self.case["nanny"] == "nanny"
        self.fixed = self.case["ports"] == "fixed"
        self.timing = self.case["timing"]
        self.work = Path(spec["workdir"])
        self.logdir = Path(spec["logdir"])
        self.res = {"deaths": [], "notes": [], "task_errors": 0, "killed_workers": [], "closed_alive": None,
                    "facts": {}}
        import distributed
        self.dv = ver_tuple(distributed.__version__)
        self.local = self.launch != "cli"
        self.names = [0, 1, 2] if self.local else ["w0", "w1", "w2"]
        self.target = self.names[1]
        self.client = None
        self.procs = {}      # cli: name -> Popen
        self.files = []
        self.cluster = None
        self.n_marker = 0
        self.collector = self.case.get("collector", "text")
        self.t_journal = time.time()             # journald_json: the case's records are those from here on
        self.readers = []                       # threads copying a process's output as a collector would
        self.merge_lock = threading.Lock()
        self.merged = None                      # compose / journald: one file for every process
        self.config_env = {}
        if self.collector in LOGGING_CONFIG:    # Dask's own logging config (DASK_CONFIG) chooses the layout
            conf = self.work / "dask-config"
            conf.mkdir(exist_ok=True)
            (conf / "logging.yaml").write_text(LOGGING_CONFIG[self.collector])
            self.config_env = {"DASK_CONFIG": str(conf)}

    # ------------------------------------------------ recording
    def note(self, s):
        dbg("NOTE", s)
        self.res["notes"].append(s)

    def death_rec(self, worker, pid, did, cause, detail, t_before, t_after, **extra):
        d = {"worker": None if worker is None else str(worker), "pid": pid, "did": did, "cause": cause,
             "detail": detail, "t_before": t_before, "t_after": t_after}
        d.update(extra)
        dbg("DEATH", d)
        self.res["deaths"].append(d)

    def marker_path(self, tag):
        self.n_marker += 1
        return str(self.work / ("marker-%s-%d" % (tag, self.n_marker)))

    def release(self, path):
        with open(path + ".release", "w"):
            pass

    def read_marker(self, path, timeout=30):
        p = Path(path)
        if not wait_for(p.exists, timeout, what="marker " + path):
            try:
                dbg("processing:", self.client.processing(), "workers:", self.sched_workers())
                dbg("who_has:", self.client.who_has())
                dbg("tasks:", self.client.run_on_scheduler(_sched_tasks))
            except Exception as e:
                dbg("diag failed", e)
            return None
        return json.loads(p.read_text())

    # ------------------------------------------------ cluster views
    def sched_workers(self):
        """{name(str): address} of the workers registered with the scheduler, live."""
        c = self.client
        try:
            import inspect
            if "n_workers" in inspect.signature(c.scheduler_info).parameters:
                info = c.scheduler_info(n_workers=-1)
            else:
                info = c.scheduler_info()
        except Exception as e:
            dbg("scheduler_info failed", e)
            return {}
        return {str(w["name"]): a for a, w in info["workers"].items()}

    def addr(self, name):
        return self.sched_workers().get(str(name))

    def wait_registered(self, names, timeout=60):
        names = [str(n) for n in names]
        return wait_for(lambda: all(n in self.sched_workers() for n in names), timeout,
                        interval=0.1, what="registration of %s" % names)

    def worker_pid(self, name):
        """pid of the process that runs worker `name` (the nanny's child, or the worker itself)."""
        import psutil
        if self.local:
            if not self.nanny:
                return None  # in-process worker: a thread pool in this very process
            try:
                n = self.cluster.workers[name]
                pid = n.pid
                if pid:
                    return pid
            except Exception:
                pass
        else:
            p = self.procs.get(name)
            if p is None:
                return None
            if not self.nanny:
                return p.pid
            try:
                for ch in psutil.Process(p.pid).children():
                    if "spawn_main" in " ".join(ch.cmdline()):
                        return ch.pid
            except psutil.NoSuchProcess:
                return None
        a = self.addr(name)
        if a:
            try:
                return self.client.run(os.getpid, workers=[a])[a]
            except Exception:
                return None
        return None

    def cli_pid(self, name):
        p = self.procs.get(name)
        return p.pid if p else None

    # ------------------------------------------------ per-worker options
    def worker_opts(self, name):
        """Options for worker `name`, from the case (what is special about the target worker)."""
        d, o = self.death, {"memory_limit": "2GB"}
        if name != self.target:
            return o
        if d in ("nanny_memory", "memory_pause"):
            o["memory_limit"] = "600MB"
        if d == "startup_missing_preload":
            o["preload"] = "corpus_no_such_preload"
        if d == "startup_preload_raises":
            o["preload"] = "corpus_preload_raises"
        if d == "startup_worker_class":
            o["worker_class"] = ("corpus_worker_class.FailingInitWorker" if self.case.get("variant") == "init_raises"
                                 else "corpus_no_such_module.Worker")
        if d == "lifetime":
            o["lifetime"] = "4s"
            o["lifetime_restart"] = bool(self.case.get("lifetime_restart"))
        if d == "death_timeout":
            o["death_timeout"] = 4
            o["scheduler"] = "tcp://127.0.0.1:%d" % free_port()
        if d == "version_mismatch":
            o["python"] = self.spec["other"]["python"]
            o["other_version"] = self.spec["other"]["version"]
        return o

    # ------------------------------------------------ CLI launch
    def cli_cmd(self, what, python=None, version=None):
        py = Path(python or sys.executable)
        v = ver_tuple(version) if version else self.dv
        if v >= (2022, 10) and (py.parent / "dask").exists():
            return [str(py.parent / "dask"), what]
        return [str(py.parent / ("dask-" + what))]

    def popen(self, name, argv, env=None):
        e = dict(os.environ, **self.config_env, **(env or {}))
        if self.collector in ("text", "json", "custom_format"):
            f = open(str(self.logdir / ("%s.log" % name)), "wb")
            self.files.append(f)
            p = subprocess.Popen(argv, stdout=f, stderr=f, stdin=subprocess.DEVNULL, env=e, cwd=str(self.work))
        elif self.collector == "journald_json":
            # systemd-cat connects the process's stdout and stderr to the running systemd-journald and execs it
            # (so the journal's _PID is the process's); the journal is exported as JSON when the case ends
            ident = "dask-scheduler" if name == "scheduler" else "dask-worker"
            p = subprocess.Popen(["systemd-cat", "-t", ident, "--level-prefix=false"] + argv,
                                 stdin=subprocess.DEVNULL, env=e, cwd=str(self.work))
        else:
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=e, cwd=str(self.work))
            t = threading.Thread(target=self.collect, args=(name, p), daemon=True)
            t.start()
            self.readers.append(t)
        self.procs[name] = p
        dbg("started", name, p.pid, " ".join(argv))
        return p

    def collect(self, name, p):
        """Copy one process's output line by line as it arrives, the way the case's collector stores it:
        compose (one file, `worker-1  | ` prefixes, arrival order), kubectl (`--timestamps --prefix`, one file
        per pod), journald (`journalctl -o short-iso`: one file, arrival time, identifier and pid) or Docker's
        json-file driver (one JSON record per line, one file per container)."""
        service = "scheduler" if name == "scheduler" else "worker-%d" % (self.names.index(name) + 1)
        if self.collector in ("kubectl", "docker_json"):
            out = open(str(self.logdir / (("%s-json.log" if self.collector == "docker_json" else "%s.log") % name)), "wb")
            self.files.append(out)
        else:
            with self.merge_lock:
                if self.merged is None:
                    self.merged = open(str(self.logdir / ("%s.log" % self.collector)), "wb")
                    self.files.append(self.merged)
                out = self.merged
        for line in iter(p.stdout.readline, b""):
            now = time.time()
            if self.collector == "compose":
                head = ("%-12s| " % (service + "-1")).encode()
            elif self.collector == "kubectl":
                head = ("[pod/dask-%s-5c7d9f8b6-x2k4q/%s] %s.%09dZ " % (
                    service, "scheduler" if name == "scheduler" else "worker",
                    time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)), int(now % 1 * 1e9))).encode()
            elif self.collector == "docker_json":
                # Docker's json-file driver: one record per line, the line with its newline, RFC 3339 nano time
                text = line.decode("utf-8", "replace")
                record = json.dumps({"log": text if text.endswith("\n") else text + "\n", "stream": "stderr",
                                     "time": "%s.%09dZ" % (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)),
                                                           int(now % 1 * 1e9))}, separators=(",", ":"))
                with self.merge_lock:
                    out.write(record.encode() + b"\n")
                    out.flush()
                continue
            else:
                head = ("%s+0000 node-1 dask[%d]: " % (
                    time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)), p.pid)).encode()
            with self.merge_lock:
                out.write(head + line if line.endswith(b"\n") else head + line + b"\n")
                out.flush()

    def start_scheduler(self):
        self.sport = free_port()
        self.address = "tcp://127.0.0.1:%d" % self.sport
        self.popen("scheduler", self.cli_cmd("scheduler") + ["--host", "127.0.0.1", "--port", str(self.sport),
                                                             "--no-dashboard"])
        if not wait_for(lambda: port_open(self.sport), 60, 0.1, "scheduler port"):
            raise RuntimeError("scheduler did not start")

    def worker_argv(self, name, o):
        py = o.get("python")
        argv = self.cli_cmd("worker", py, o.get("other_version")) + [
            o.get("scheduler", self.address), "--name", str(name), "--nthreads", "1", "--host", "127.0.0.1",
            "--no-dashboard", "--memory-limit", str(o["memory_limit"])]
        argv.append("--nanny" if self.nanny else "--no-nanny")
        if self.fixed:
            argv += ["--worker-port", str(self.ports[name][0])]
            if self.nanny:
                argv += ["--nanny-port", str(self.ports[name][1])]
        if "preload" in o:
            argv += ["--preload", o["preload"]]
        if "worker_class" in o:
            argv += ["--worker-class", o["worker_class"]]
        if "lifetime" in o:
            argv += ["--lifetime", o["lifetime"], "--lifetime-stagger", "0s"]
            if o.get("lifetime_restart"):
                argv.append("--lifetime-restart")
        if "death_timeout" in o:
            argv += ["--death-timeout", str(o["death_timeout"])]
        return argv

    def start_cli_worker(self, name):
        o = self.worker_opts(name)
        return self.popen(str(name), self.worker_argv(name, o))

    # ------------------------------------------------ LocalCluster launch
    def start_local(self):
        import logging
        from distributed import LocalCluster
        kw = dict(n_workers=0, threads_per_worker=1, processes=self.nanny, dashboard_address=None,
                  memory_limit="2GB")
        if self.launch == "local_info":
            kw["silence_logs"] = logging.INFO
        if self.fixed and not self.nanny:
            kw["protocol"] = "tcp://"  # in-process workers talk inproc:// by default, which has no ports
        self.cluster = LocalCluster(**kw)
        return self.cluster

    def local_spec(self, name):
        o = self.worker_opts(name)
        spec = self.cluster.new_spec
        opts = dict(spec.get("options", {}))
        opts["memory_limit"] = o["memory_limit"]
        opts["name"] = name
        if self.fixed:
            if self.nanny:
                opts["worker_port"] = self.ports[name][0]
                opts["port"] = self.ports[name][1]
            else:
                opts["port"] = self.ports[name][0]
        if "preload" in o:
            opts["preload"] = [o["preload"]]
        if "worker_class" in o:
            import importlib
            mod, _, cls = o["worker_class"].rpartition(".")
            opts["worker_class"] = getattr(importlib.import_module(mod), cls)
        if "lifetime" in o:
            opts["lifetime"] = o["lifetime"]
            opts["lifetime_stagger"] = "0s"
            opts["lifetime_restart"] = o.get("lifetime_restart", False)
        return {"cls": spec["cls"], "options": opts}

    def start_local_workers(self, names):
        for n in names:
            self.cluster.worker_spec[n] = self.local_spec(n)
        try:
            self.cluster.sync(self.cluster._correct_state)
        except Exception:
            # what a user's LocalCluster(...) call would have raised
            traceback.print_exc()
            self.res["facts"]["cluster_start_error"] = traceback.format_exc().strip().splitlines()[-1]

    # ------------------------------------------------ start-up
    def start(self):
        from distributed import Client
        self.ports = {n: (free_port(), free_port()) for n in self.names} if self.fixed else {}
        if self.local:
            self.start_local()
            self.client = Client(self.cluster)
        else:
            self.start_scheduler()
            self.client = Client(self.address, timeout=60)
        if self.death == "startup_plugin_setup":
            self.register_failing_plugin()
        startup = self.death in ("startup_missing_preload", "startup_preload_raises", "startup_worker_class",
                                 "startup_plugin_setup", "death_timeout", "version_mismatch")
        sig_at_start = self.timing == "start" and not startup
        if self.local:
            t0 = time.time()
            self.start_local_workers(self.names)
            t1 = time.time()
        else:
            t0 = time.time()
            for n in self.names:
                self.start_cli_worker(n)
            if sig_at_start:
                self.hit_at_start(self.target)
            t1 = time.time()
        healthy = [n for n in self.names if not ((startup or sig_at_start) and n == self.target)]
        self.wait_registered(healthy, 90)
        if sig_at_start:
            p = self.procs[self.target]
            back = wait_for(lambda: p.poll() is not None or str(self.target) in self.sched_workers(), 30, 0.1,
                            "outcome of the start-up signal")
            self.res["facts"]["target_registered_after_start_hit"] = str(self.target) in self.sched_workers()
            self.res["facts"]["target_cli_exit_code"] = p.poll()
        if startup:
            self.settle_startup_target(t0, t1)

    def register_failing_plugin(self):
        from distributed.diagnostics.plugin import WorkerPlugin
        target = str(self.target)

        class FailingSetupPlugin(WorkerPlugin):
            name = "corpus-failing-setup"

            def __init__(self, target):
                self.target = target

            def setup(self, worker):
                if str(worker.name) == self.target:
                    raise RuntimeError("plugin setup failed on purpose on worker %s" % worker.name)

        p = FailingSetupPlugin(target)
        if hasattr(self.client, "register_plugin"):
            self.client.register_plugin(p)
        else:
            self.client.register_worker_plugin(p, name="corpus-failing-setup")
        self.note("worker plugin registered with the scheduler before any worker started; its setup raises "
                  "only on worker %s" % target)

    def settle_startup_target(self, t0, t1):
        """The target worker was started with a start-up fault: did its process end, or did it register?"""
        n = self.target
        d = self.death
        if self.local:
            registered = self.wait_registered([n], 20)
            obj = self.cluster.workers.get(n)
            pid = None
            if self.nanny and obj is not None:
                try:
                    pid = obj.pid
                except Exception:
                    pid = None
            status = str(getattr(obj, "status", None))
            self.res["facts"]["target_status"] = status
            if registered:
                self.note("the %s worker %s registered and kept running: Dask did not end it" % (d, n))
                return
            self.death_rec(n, pid, self.did_startup(), *self.cause_startup(), t0, time.time(),
                           process_exited=None if not self.nanny else (not pid_alive(pid)),
                           worker_status=status)
            return
        p = self.procs[n]
        # wait until it either registers or its CLI process exits
        got = wait_for(lambda: p.poll() is not None or (str(n) in self.sched_workers()), 45, 0.1,
                       "start-up outcome of %s" % n)
        if p.poll() is None and str(n) in self.sched_workers():
            if d == "version_mismatch":
                return  # decided later, when it is sent a task
            # registered: give a failure a moment to surface, then decide
            time.sleep(1.0)
            if p.poll() is None and str(n) in self.sched_workers():
                self.note("the %s worker %s registered and kept running: Dask did not end it" % (d, n))
                return
        if p.poll() is None:
            # not registered, still alive: a nanny that keeps a failed worker around, or still trying
            ex = wait_for(lambda: p.poll() is not None, 30, 0.1, "exit of %s" % n)
            if p.poll() is None:
                self.note("the %s worker %s neither registered nor exited within 75 s; its process is ended by "
                          "the final close" % (d, n))
                self.res["facts"]["startup_hung"] = True
                return
        self.death_rec(n, p.pid, self.did_startup(), *self.cause_startup(), t0, time.time(),
                       process_exited=True, exit_code=p.returncode)

    def did_startup(self):
        d = self.death
        o = self.worker_opts(self.target)
        how = "dask worker CLI" if not self.local else "LocalCluster worker spec"
        return {
            "startup_missing_preload": "started worker %s (%s) with --preload %s, a module that does not exist"
                                       % (self.target, how, o.get("preload")),
            "startup_preload_raises": "started worker %s (%s) with preload %s whose dask_setup raises RuntimeError"
                                      % (self.target, how, o.get("preload")),
            "startup_worker_class": "started worker %s (%s) with worker class %s (%s)"
                                    % (self.target, how, o.get("worker_class"),
                                       "its __init__ raises RuntimeError"
                                       if self.case.get("variant") == "init_raises" else "its module does not exist"),
            "startup_plugin_setup": "started worker %s (%s) while a worker plugin whose setup raises RuntimeError "
                                    "on it was registered with the scheduler" % (self.target, how),
            "death_timeout": "started worker %s with --death-timeout 4 pointing at a port where no scheduler listens"
                             % self.target,
            "version_mismatch": "started worker %s from the distributed %s venv (Python %s) against this %s scheduler"
                                % (self.target, o.get("other_version"), self.spec.get("other", {}).get("python_version"),
                                   self.spec["version"]),
        }[d]

    def cause_startup(self):
        d = self.death
        if d == "startup_missing_preload":
            return ("unrecoverable_exception", "missing_module")
        if d == "startup_preload_raises":
            return ("unrecoverable_exception", "preload_exception")
        if d == "startup_worker_class":
            return ("unrecoverable_exception",
                    "worker_init_exception" if self.case.get("variant") == "init_raises" else "missing_module")
        if d == "startup_plugin_setup":
            return ("unrecoverable_exception", "plugin_setup_exception")
        if d == "death_timeout":
            return ("chose_to_exit", "death_timeout")
        if d == "version_mismatch":
            return ("version_mismatch", "distributed_version")
        raise KeyError(d)

    # ------------------------------------------------ start-up signals (cli)
    def hit_at_start(self, n):
        """Signal worker n while it starts: once its process listens, before/while it registers."""
        import psutil
        p = self.procs[n]
        sig = {"sigkill": signal.SIGKILL, "sigterm_worker_cli": signal.SIGTERM,
               "sigint_worker_cli": signal.SIGINT}[self.death]

        def listening_pid():
            if self.death == "sigkill" and self.nanny:
                # the nanny's worker process, as soon as it exists
                # (spawn: the nanny's child runs spawn_main; forkserver, distributed 2.9's default:
                # the worker is a child of the forkserver the nanny started)
                try:
                    for ch in psutil.Process(p.pid).children(recursive=True):
                        parent = ch.parent()
                        if "spawn_main" in " ".join(ch.cmdline()) or (
                                parent is not None and parent.pid != p.pid and "forkserver" in " ".join(parent.cmdline())):
                            return ch.pid
                except psutil.NoSuchProcess:
                    pass
                return None
            pid = p.pid
            try:
                pr = psutil.Process(pid)
                conns = pr.net_connections("tcp") if hasattr(pr, "net_connections") else pr.connections("tcp")
            except psutil.NoSuchProcess:
                return None
            return pid if any(c.status == psutil.CONN_LISTEN for c in conns) else None

        pid = wait_for(listening_pid, 60, 0.02, "worker %s listening" % n)
        if pid is None:
            pid = self.worker_pid(n) if (self.death == "sigkill" and self.nanny) else p.pid
        registered = str(n) in self.sched_workers()
        tb = time.time()
        os.kill(pid, sig)
        ta = time.time()
        self.res["facts"]["registered_at_injection"] = registered
        what = {"sigkill": "SIGKILL to the worker process", "sigterm_worker_cli": "SIGTERM to the dask worker CLI",
                "sigint_worker_cli": "SIGINT to the dask worker CLI"}[self.death]
        did = "sent %s (pid %d) of %s during start-up, as soon as it %s (%s)" % (
            what, pid, n, "existed" if (self.death == "sigkill" and self.nanny) else "listened",
            "already registered" if registered else "before it registered")
        cause = {"sigkill": ("sudden_exit", "sigkill"), "sigterm_worker_cli": ("chose_to_exit", "sigterm"),
                 "sigint_worker_cli": ("chose_to_exit", "sigint")}[self.death]
        exited = wait_for(lambda: not pid_alive(pid), 30, 0.05, "exit of %d" % pid)
        self.death_rec(n, pid, did, cause[0], cause[1], tb, ta, process_exited=bool(exited),
                       exit_code=p.poll() if pid == p.pid else None)

    # ------------------------------------------------ the job
    def batch(self, n=12, tag="b"):
        return self.client.map(work, range(n), key=["%s-%d" % (tag, i) for i in range(n)])

    def gather(self, futs, timeout=90):
        from distributed import wait
        wait(futs, timeout=timeout)
        out = []
        for f in futs:
            if f.status == "error":
                continue
            out.append(f.result())
        return out

    def survivors(self):
        return [n for n in self.names if str(n) != str(self.target)]

    def run_job(self):
        d = self.death
        handler = getattr(self, "job_" + d, None)
        if handler is None:
            handler = self.job_default
        handler()

    def job_default(self):
        """clean run and every start-up kind: one batch of tasks"""
        self.gather(self.batch(12, "clean"))

    # --- kills from outside / faults inside a task, mid or end
    def _around(self, inject, after_wait=None):
        """Run a batch; inject the fault mid-batch or just before the end; then finish the job."""
        if self.timing == "end":
            self.gather(self.batch(12, "job"))
            inject()
            return  # the close follows at once (inject returns as soon as the process is gone)
        futs = self.batch(24, "job")
        inject()
        if after_wait:
            after_wait(60)
        self.gather(futs, 120)
        self.gather(self.batch(6, "after"))

    def _recover(self, timeout):
        """After a death: with a nanny, wait until the worker is back."""
        n = self.target
        if self.nanny:
            self.wait_registered([n], timeout)

    def job_sigkill(self):
        if self.timing == "start":
            self.gather(self.batch(12, "job"))
            return
        n = self.target
        a = self.addr(n)

        def inject():
            m = self.marker_path("hold")
            self.keep = self.client.submit(hold, m, 30, key="hold-%s" % n, workers=[a], pure=False)
            mk = self.read_marker(m)
            pid = mk["pid"]
            gone_before = str(n) in self.sched_workers()
            tb = time.time()
            os.kill(pid, signal.SIGKILL)
            ta = time.time()
            self.release(m)
            exited = wait_for(lambda: not pid_alive(pid), 20, 0.02, "exit")
            self.death_rec(n, pid, "sent SIGKILL to the worker process of %s from outside while it ran task hold-%s"
                           % (n, n), "sudden_exit", "sigkill", tb, ta, process_exited=bool(exited))

        self._around(inject, self._recover)

    def _infault(self, kind, cause, detail, did):
        n = self.target
        a = self.addr(n)

        def inject():
            m = self.marker_path(kind)
            key = "%s-%s" % (kind.replace("_", ""), n)
            self.fault_future = self.client.submit(fault, m, kind, key=key, workers=[a], pure=False,
                                                   allow_other_workers=False)
            mk = self.read_marker(m)
            pid = mk["pid"]
            exited = wait_for(lambda: not pid_alive(pid), 20, 0.02, "exit")
            ta = time.time()
            if exited:
                self.death_rec(n, pid, did + " (task %s)" % key, cause, detail, mk["t"], ta, process_exited=True)
            else:
                self.note("%s in task %s did NOT end worker %s's process (pid %d); no death" % (kind, key, n, pid))
                self.res["facts"]["survived"] = True

        def after(timeout):
            self._recover(timeout)
        self._around(inject, after)
        # the task itself: did it end in error? (sys.exit in a thread may just fail the task)
        f = getattr(self, "fault_future", None)
        if f is not None and f.done() and f.status == "error":
            self.res["task_errors"] += 1
            self.res["facts"]["fault_task_error"] = repr(f.exception())

    def job_segfault(self):
        self._infault("segfault", "sudden_exit", "segfault", "a task called ctypes.string_at(0) (segfault)")

    def job_sigabrt(self):
        self._infault("sigabrt", "sudden_exit", "signal_6", "a task called os.abort() (SIGABRT)")

    def job_sys_exit(self):
        self._infault("sys_exit", "unrecoverable_exception", "system_exit", "a task called sys.exit(3)")

    def job_os_exit(self):
        self._infault("os_exit", "unrecoverable_exception", "os_exit", "a task called os._exit(1)")

    def job_nanny_memory(self):
        from dask.utils import parse_bytes
        n = self.target
        a = self.addr(n)
        limit = parse_bytes(self.worker_opts(n)["memory_limit"])

        def inject():
            m = self.marker_path("hog")
            self.hog_future = self.client.submit(hog, m, limit, key="hog-%s" % n, workers=[a], pure=False)
            mk = self.read_marker(m)
            pid = mk["pid"]
            exited = wait_for(lambda: not pid_alive(pid), 60, 0.02, "exit")
            ta = time.time()
            if exited:
                self.death_rec(n, pid, "task hog-%s allocated memory step by step past the worker's %s memory limit"
                               % (n, self.worker_opts(n)["memory_limit"]), "nanny_memory_restart", "memory_limit",
                               mk["t"], ta, process_exited=True)
            else:
                self.note("memory hog did not end the worker process")
        self._around(inject, self._recover)

    def job_uncaught_exception_outside_task(self):
        n = self.target
        a = self.addr(n)

        def inject():
            m = self.marker_path("asyncexc")
            pid = self.worker_pid(n)
            hold_m = self.marker_path("hold")
            self.keep = self.client.submit(hold, hold_m, 3, key="hold-%s" % n, workers=[a], pure=False)
            self.read_marker(hold_m)
            tb = time.time()
            self.client.run(inject_async_exc, m, workers=[a])
            mk = self.read_marker(m, 10)
            ta = time.time()
            self.release(hold_m)
            exited = wait_for(lambda: not pid_alive(pid), 15, 0.05, "exit")
            if exited:
                self.death_rec(n, pid, "client.run started a thread in worker %s that raised BackgroundThreadError "
                               "(a RuntimeError) in the worker's main event-loop thread via "
                               "PyThreadState_SetAsyncExc, outside any task" % n,
                               "unrecoverable_exception", "exception", mk["t"] if mk else tb, ta, process_exited=True)
            else:
                self.note("an exception raised in worker %s's event-loop thread (PyThreadState_SetAsyncExc from a "
                          "client.run thread) did NOT end its process (pid %s) within 15 s; no death" % (n, pid))
                self.res["facts"]["survived"] = True
        self._around(inject, self._recover)

    def job_heartbeat_timeout(self):
        n = self.target
        a = self.addr(n)
        ttl = self.spec["env"].get("DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL")

        def inject():
            pid = self.worker_pid(n)
            m = self.marker_path("hold")
            self.keep = self.client.submit(hold, m, 4, key="hold-%s" % n, workers=[a], pure=False)
            self.read_marker(m)
            tb = time.time()
            os.kill(pid, signal.SIGSTOP)
            removed = wait_for(lambda: a not in self.sched_workers().values(), 90, 0.1, "ttl removal")
            t_removed = time.time()
            time.sleep(0.5)
            os.kill(pid, signal.SIGCONT) if pid_alive(pid) else None
            ta = time.time()
            self.release(m)
            exited = wait_for(lambda: not pid_alive(pid), 20, 0.05, "exit after SIGCONT")
            self.res["facts"]["scheduler_removed_after_s"] = round(t_removed - tb, 2) if removed else None
            self.death_rec(n, pid, "sent SIGSTOP to the worker process of %s while it ran a task, kept it stopped "
                           "past the scheduler's worker-ttl (%s) until the scheduler removed it, then SIGCONT"
                           % (n, ttl), "sudden_exit", "heartbeat_timeout", tb, ta,
                           process_exited=bool(exited), scheduler_removed=bool(removed), t_removed=t_removed)
            if not exited:
                self.note("after SIGCONT the hung worker process %d of %s was still alive 20 s later" % (pid, n))
        self._around(inject, self._recover)

    def job_sigterm_worker_cli(self):
        self._cli_signal(signal.SIGTERM, "sigterm")

    def job_sigint_worker_cli(self):
        self._cli_signal(signal.SIGINT, "sigint")

    def _cli_signal(self, sig, detail):
        if self.timing == "start":
            self.gather(self.batch(12, "job"))
            return
        n = self.target
        a = self.addr(n)
        p = self.procs[n]

        def inject():
            m = self.marker_path("hold")
            self.keep = self.client.submit(hold, m, 3, key="hold-%s" % n, workers=[a], pure=False)
            self.read_marker(m)
            tb = time.time()
            p.send_signal(sig)
            ta = time.time()
            exited = wait_for(lambda: p.poll() is not None, 30, 0.05, "exit")
            self.death_rec(n, p.pid, "sent %s to the dask worker CLI process of %s (pid %d) while it ran a task"
                           % (signal.Signals(sig).name, n, p.pid), "chose_to_exit", detail, tb, ta,
                           process_exited=bool(exited), exit_code=p.poll())
        self._around(inject)

    def job_retire(self):
        n = self.target
        a = self.addr(n)

        def inject():
            pid = self.worker_pid(n) if (self.nanny or not self.local) else None
            tb = time.time()
            self.client.retire_workers(workers=[a])
            ta = time.time()
            exited = wait_for(lambda: not pid_alive(pid), 30, 0.05, "exit") if pid else None
            self.death_rec(n, pid, "client.retire_workers([%s]) (worker %s)" % (a, n), "chose_to_exit", "retired",
                           tb, ta, process_exited=None if pid is None else bool(exited))
        self._around(inject)

    def job_client_restart(self):
        def inject():
            before = self.sched_workers()
            pids = {nm: self.worker_pid(nm) for nm in before}
            tb = time.time()
            try:
                self.client.restart(timeout=60) if self._has_kw(self.client.restart, "timeout") else \
                    self.client.restart()
            except Exception:
                traceback.print_exc()
            ta = time.time()
            time.sleep(0.2)
            after = self.sched_workers()
            for nm, addr in sorted(before.items()):
                pid = pids.get(nm)
                if pid is not None:
                    exited = wait_for(lambda: not pid_alive(pid), 20, 0.05, "exit")
                    if not exited:
                        self.note("after client.restart() the process of worker %s (pid %d) was still alive" % (nm, pid))
                        continue
                elif after.get(nm) == addr:
                    self.note("after client.restart() in-process worker %s is still registered at the same address; "
                              "no death" % nm)
                    continue
                self.death_rec(nm, pid, "client.restart() while worker %s was alive" % nm, "chose_to_exit",
                               "restart", tb, ta, process_exited=None if pid is None else True)
        if self.timing == "end":
            self.gather(self.batch(12, "job"))
            inject()
            return
        futs = self.batch(24, "job")
        time.sleep(0)  # restart cancels them: that is what restart does
        wait_for(lambda: any(f.status == "finished" for f in futs), 30, 0.05, "first result")
        inject()
        if self.nanny:
            self.wait_registered(self.names, 60)
        self.gather(self.batch(6, "after"))

    def _has_kw(self, f, kw):
        import inspect
        try:
            return kw in inspect.signature(f).parameters
        except Exception:
            return False

    def job_scale_down(self):
        def inject():
            before = self.sched_workers()
            pids = {nm: self.worker_pid(nm) for nm in before}
            tb = time.time()
            self.cluster.scale(len(self.names) - 1)
            gone = wait_for(lambda: set(before) - set(self.sched_workers()), 60, 0.05, "scale down")
            ta = time.time()
            for nm in sorted(gone or []):
                pid = pids.get(nm)
                exited = wait_for(lambda: not pid_alive(pid), 20, 0.05, "exit") if pid else None
                self.death_rec(nm, pid, "LocalCluster.scale(%d) with %d workers; Dask picked worker %s to remove"
                               % (len(self.names) - 1, len(before), nm), "chose_to_exit", "retired", tb, ta,
                               process_exited=None if pid is None else bool(exited))
        self._around(inject)

    def job_lifetime(self):
        n = self.target
        t_start = time.time()
        # the target worker was started with lifetime 4s: watch it leave (and come back, with restart)
        a = self.addr(n)
        pid = self.worker_pid(n) if (self.nanny or not self.local) else None
        futs = self.batch(24 if self.timing == "mid" else 12, "job")
        seen = {"t": time.time()}

        def left():
            cur = self.sched_workers().get(str(n))
            if cur != a:
                return True
            seen["t"] = time.time()
            return False
        ok = wait_for(left, 60, 0.05, "lifetime")
        ta = time.time()
        exited = wait_for(lambda: not pid_alive(pid), 20, 0.05, "exit") if pid else None
        if ok:
            self.death_rec(n, pid, "started worker %s with lifetime 4s%s; it reached it"
                           % (n, " and lifetime-restart" if self.case.get("lifetime_restart") else ""),
                           "chose_to_exit", "lifetime", seen["t"], ta,
                           process_exited=None if pid is None else bool(exited))
        if self.timing == "end":
            return
        self.gather(futs, 120)
        if self.case.get("lifetime_restart"):
            self.wait_registered([n], 60)
        self.gather(self.batch(6, "after"))
        # a restarted worker reaches its lifetime again after another 4 s: record that too if it happens
        self.lifetime_watch = (n, self.addr(n))

    def job_task_error(self):
        k = int(self.case.get("n_errors", 1))
        if self.timing == "end":
            self.gather(self.batch(12, "job"))
        futs = self.batch(12, "job2") if self.timing == "mid" else []
        errs = [self.client.submit(bad_value, i, key="bad-%d" % i) for i in range(k)]
        from distributed import wait
        wait(errs, timeout=60)
        for f in errs:
            try:
                f.result()
            except ValueError:
                traceback.print_exc()
                self.res["task_errors"] += 1
        if futs:
            self.gather(futs)

    def job_memory_pause(self):
        from dask.utils import parse_bytes
        n = self.target
        a = self.addr(n)
        limit = parse_bytes(self.worker_opts(n)["memory_limit"])

        def inject():
            m = self.marker_path("pause")
            f = self.client.submit(pause_hold, m, limit, key="pause-%s" % n, workers=[a], pure=False)
            r = f.result(timeout=60)
            self.res["facts"]["pause_result"] = r
            self.note("memory pause task on %s returned %r" % (n, r))
        self._around(inject)

    def job_version_mismatch(self):
        n = self.target
        p = self.procs[n]
        if str(n) not in self.sched_workers():
            self.gather(self.batch(12, "job"))
            return
        a = self.addr(n)
        pid = self.worker_pid(n)
        tb = time.time()
        f = self.client.submit(work, 100, key="sent-to-%s" % n, workers=[a], pure=False)
        fut_ok = wait_for(lambda: f.done() or p.poll() is not None or not pid_alive(pid), 20, 0.05, "mismatch")
        time.sleep(1.0)
        ended = p.poll() is not None or not pid_alive(pid)
        self.res["facts"]["mismatch_task_status"] = f.status
        if ended or str(n) not in self.sched_workers():
            wait_for(lambda: not pid_alive(pid), 20, 0.05, "exit")
            self.death_rec(n, pid, self.did_startup() + "; it registered and was sent task sent-to-%s" % n,
                           "version_mismatch", "distributed_version", tb, time.time(),
                           process_exited=not pid_alive(pid), cli_exit_code=p.poll())
        else:
            self.note("the mismatched worker %s ran task sent-to-%s (status %s) and stayed alive; no death"
                      % (n, n, f.status))
        self.gather(self.batch(12, "job"))

    def job_repeat_sigkill(self):
        n = self.target
        for k in range(int(self.case.get("repeat", 5))):
            a = self.addr(n)
            m = self.marker_path("hold")
            futs = self.batch(6, "rep%d" % k)
            self.keeps = getattr(self, "keeps", [])
            self.keeps.append(self.client.submit(hold, m, 30, key="hold-%s-%d" % (n, k), workers=[a], pure=False))
            mk = self.read_marker(m)
            pid = mk["pid"]
            tb = time.time()
            os.kill(pid, signal.SIGKILL)
            ta = time.time()
            self.release(m)
            exited = wait_for(lambda: not pid_alive(pid), 20, 0.02, "exit")
            self.death_rec(n, pid, "kill %d of %d: sent SIGKILL to the worker process of %s (fixed port %s) while "
                           "it ran task hold-%s-%d" % (k + 1, self.case.get("repeat"), n, self.ports[n][0], n, k),
                           "sudden_exit", "sigkill", tb, ta, process_exited=bool(exited))
            # back: a NEW worker process answers at w1's (fixed) address
            def new_incarnation():
                a2 = self.addr(n)
                if not a2:
                    return False
                got = self.client.run(os.getpid, workers=[a2]).get(a2)
                return got is not None and got != pid
            wait_for(new_incarnation, 60, 0.2, "new incarnation of %s" % n)
            self.gather(futs)
        self.gather(self.batch(6, "after"))

    def job_killed_worker(self):
        af = int(self.case["allowed_failures"])
        mdir = str(self.work / "kw") + "/"
        os.makedirs(mdir, exist_ok=True)
        futs = self.batch(12, "job")
        tb = time.time()
        f = self.client.submit(fault, mdir, "sigkill_self", key="suicide-task", pure=False)
        from distributed import wait
        wait([f], timeout=120)
        try:
            f.result()
        except Exception as e:
            traceback.print_exc()
            if type(e).__name__ == "KilledWorker":
                self.res["killed_workers"].append("suicide-task")
        self.gather(futs)
        for fn in sorted(os.listdir(mdir)):
            if fn.endswith(".tmp"):
                continue
            mk = json.loads(open(mdir + fn).read())
            exited = wait_for(lambda: not pid_alive(mk["pid"]), 20, 0.05, "exit")
            self.death_rec(mk["worker"], mk["pid"], "task suicide-task sent SIGKILL to its own worker process "
                           "(allowed-failures %d)" % af, "sudden_exit", "sigkill", mk["t"], None,
                           process_exited=bool(exited))
        # t_after: when the scheduler-side state settled is unknown per attempt; the pid was checked gone
        self.wait_registered(self.names, 60)

    # ------------------------------------------------ the close
    def alive_now(self):
        """Workers alive at this moment: registered with the scheduler AND their process still running."""
        out = []
        for name in sorted(self.sched_workers()):
            if not self.local:
                p = self.procs.get(name)
                if p is None or p.poll() is not None:
                    continue
            if self.nanny or not self.local:
                key = name if not self.local else int(name)
                pid = self.worker_pid(key)
                if pid is not None and not pid_alive(pid):
                    continue
            out.append(name)
        return out

    def close(self):
        alive = self.alive_now()
        self.res["closed_alive"] = alive
        self.res["t_close"] = time.time()
        dbg("closing; alive", alive)
        if self.local:
            return  # the caller leaves the with-block
        try:
            self.client.close()
        except Exception:
            traceback.print_exc()
        for name, p in self.procs.items():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 20
        killed = []
        for name, p in self.procs.items():
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                killed.append(name)
        if killed:
            self.note("still running 20 s after the final SIGTERM, SIGKILLed by the script: %s" % killed)
        self.res["facts"]["exit_codes"] = {n: p.returncode for n, p in self.procs.items()}
        for t in self.readers:   # the collector copies to its end what the processes printed
            t.join(30)
        for f in self.files:
            f.close()
        if self.collector == "journald_json":
            self.export_journal()

    def export_journal(self):
        """``journalctl -o json`` of this case into journal.jsonl: the records of its identifiers since the case
        began (cases run one at a time). journald names each line by the process that wrote it, a nanny's worker
        process by its own pid. It reads a stream after its writer exits, so wait until the count is still."""
        argv = ["journalctl", "-o", "json", "--no-pager", "-t", "dask-scheduler", "-t", "dask-worker"]
        since = int(self.t_journal * 1e6)
        kept, before, still_since = [], -1, time.time()
        deadline = time.time() + 60
        while time.time() < deadline:
            out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
            kept = [x for x in out.splitlines()
                    if int(json.loads(x.decode("utf-8", "replace")).get("__REALTIME_TIMESTAMP", 0)) >= since]
            if len(kept) != before:
                before, still_since = len(kept), time.time()
            elif time.time() - still_since > 2:
                break
            time.sleep(0.2)
        with open(str(self.logdir / "journal.jsonl"), "wb") as f:
            for x in kept:
                f.write(x + b"\n")


def main():
    spec = json.load(open(sys.argv[1]))
    result_path = spec["result"]
    sys.path.insert(0, spec["workdir"])
    t_start = time.time()
    run = Run(spec)
    ok = False
    try:
        if run.local:
            run.start()
            # the end of `with LocalCluster(...) as cluster, Client(cluster) as client:` (not entered
            # again: __enter__ would re-run the cluster's start-up, a second start of failed workers)
            try:
                run.run_job()
                run.close()
            finally:
                run.client.__exit__(None, None, None)
                try:
                    run.cluster.__exit__(None, None, None)
                except Exception:
                    # what a user's script would show: leaving the with-block raised
                    traceback.print_exc()
                    run.res["facts"]["cluster_close_error"] = traceback.format_exc().strip().splitlines()[-1]
                    run.hard_exit = True
            run.res["facts"]["local_closed"] = True
        else:
            try:
                run.start()
                run.run_job()
            finally:
                run.close()
        ok = True
    except BaseException:
        dbg("RUNNER FAILED\n" + traceback.format_exc())
        run.res["runner_error"] = traceback.format_exc()
        # make sure nothing we started outlives us
        for p in run.procs.values():
            if p.poll() is None:
                p.kill()
    finally:
        run.res["ok"] = ok
        run.res["runner_s"] = round(time.time() - t_start, 1)
        with open(result_path, "w") as f:
            json.dump(run.res, f, indent=1)
    # LocalCluster child processes are gone with the with-block; exit plainly
    sys.stdout.flush()
    if getattr(run, "hard_exit", False):
        # a cluster whose close raised can leave threads that block the interpreter's exit
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
