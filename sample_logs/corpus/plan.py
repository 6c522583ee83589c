"""The case plan: a deterministic pairwise (all-pairs) covering design over the corpus factors.

Factors (levels) and constraints are below. The design is built greedily: among ALL valid full
assignments (the product is small, ~830), repeatedly take the one that covers the most
not-yet-covered valid pairs, ties broken by a random generator with a fixed seed. Every pair of
levels that some valid case can show is covered at least once; pairs that no valid case can show
(e.g. nanny_memory without a nanny) are never required. A few deliberate multi-death cases are
appended after the pairwise part.

Standard library only; runs under any Python >= 3.8.
"""

from __future__ import annotations

import itertools
import random
import zlib

SEED = 20261123

DEATHS = [
    "sigkill", "segfault", "sigabrt", "nanny_memory", "sys_exit", "os_exit",
    "uncaught_exception_outside_task", "heartbeat_timeout",
    "startup_missing_preload", "startup_preload_raises", "startup_worker_class", "startup_plugin_setup",
    "death_timeout", "version_mismatch", "sigterm_worker_cli", "sigint_worker_cli",
    "retire", "lifetime", "scale_down", "client_restart",
    "clean", "task_error", "memory_pause",
]
FACTORS = {
    "death": DEATHS,
    "nanny": ["nanny", "no-nanny"],
    "launch": ["cli", "local_warning", "local_info"],
    "ports": ["fixed", "random"],
    "timing": ["start", "mid", "end"],
}

STARTUP = {"startup_missing_preload", "startup_preload_raises", "startup_worker_class", "startup_plugin_setup",
           "death_timeout", "version_mismatch"}
# kinds that may also be injected during start-up (before/while the worker registers)
START_TOO = {"sigkill", "sigterm_worker_cli", "sigint_worker_cli"}
CLI_ONLY = {"death_timeout", "version_mismatch", "sigterm_worker_cli", "sigint_worker_cli",
            "startup_missing_preload"}
LOCAL_ONLY = {"scale_down"}
NEEDS_NANNY = {"nanny_memory"}
# A LocalCluster without a nanny runs its workers as threads of the script's own process
# (processes=False): a kind that ends a process would end the whole script, so only kinds that
# leave the process standing are run that way.
LOCAL_NO_NANNY_OK = {"retire", "scale_down", "client_restart", "lifetime", "clean", "task_error",
                     "startup_plugin_setup", "startup_preload_raises"}


def valid(c: dict) -> bool:
    d, nanny, launch, timing = c["death"], c["nanny"], c["launch"], c["timing"]
    local = launch != "cli"
    if d in CLI_ONLY and local:
        return False
    if d in LOCAL_ONLY and not local:
        return False
    if d in NEEDS_NANNY and nanny != "nanny":
        return False
    if local and nanny == "no-nanny" and d not in LOCAL_NO_NANNY_OK:
        return False
    if d in STARTUP:
        return timing == "start"
    if timing == "start":
        return d in START_TOO and not local
    return True


def _pairs(c: dict):
    names = list(FACTORS)
    for a, b in itertools.combinations(names, 2):
        yield (a, c[a], b, c[b])


def pairwise(seed: int = SEED) -> list[dict]:
    names = list(FACTORS)
    full = [dict(zip(names, vals)) for vals in itertools.product(*FACTORS.values())]
    full = [c for c in full if valid(c)]
    uncovered = set()
    for c in full:
        uncovered.update(_pairs(c))
    rng = random.Random(seed)
    rng.shuffle(full)
    chosen = []
    while uncovered:
        best, best_n = None, -1
        for c in full:
            n = sum(1 for p in _pairs(c) if p in uncovered)
            if n > best_n:
                best, best_n = c, n
        chosen.append(best)
        uncovered.difference_update(_pairs(best))
    # a stable, readable order: by death kind as listed, then by the rest
    order = {d: i for i, d in enumerate(DEATHS)}
    chosen.sort(key=lambda c: (order[c["death"]], c["launch"], c["nanny"], c["timing"], c["ports"]))
    return chosen


EXTRAS = [
    # the same worker SIGKILLed again and again on a fixed port; its nanny restarts it each time
    {"death": "repeat_sigkill", "nanny": "nanny", "launch": "cli", "ports": "fixed", "timing": "mid", "repeat": 6},
    {"death": "repeat_sigkill", "nanny": "nanny", "launch": "local_info", "ports": "fixed", "timing": "mid",
     "repeat": 5},
    # a task that kills every worker that runs it, until the scheduler gives up (KilledWorker)
    {"death": "killed_worker", "nanny": "nanny", "launch": "cli", "ports": "random", "timing": "mid",
     "allowed_failures": 1},
    {"death": "killed_worker", "nanny": "nanny", "launch": "local_warning", "ports": "fixed", "timing": "mid",
     "allowed_failures": 2},
]

# How the logs are collected, as a factor of its own: every case above is Dask's default text layout, one file per
# process. These cases run the same deaths with the processes' output collected another way, at capture time
# (runner.py; nothing is rewritten afterwards): JSON lines through Dask's `logging` config (python-json-logger), a
# custom `logging` format, one merged stream with compose-style prefixes in arrival order, kubectl's
# `--timestamps --prefix` lines, and journald's `short-iso` lines (arrival times, the process's pid). They are
# appended (not crossed into the pairwise part) so that the 70 cases of every version keep their ids and logs.
# Then (2026-11-28) two collectors that store each raw line in a JSON record: Docker's json-file driver (one file per
# container, `{"log": ..., "stream": ..., "time": ...}`) and the journal exported by `journalctl -o json` (a real
# systemd-journald fed by `systemd-cat`; one export for every process).
COLLECTORS = ["json", "custom_format", "compose", "kubectl", "journald", "docker_json", "journald_json"]
COLLECTOR_DEATHS = ["sigkill", "segfault", "nanny_memory", "sys_exit", "uncaught_exception_outside_task",
                    "retire", "sigterm_worker_cli", "heartbeat_timeout"]
COLLECTOR_SHORT = {"text": "", "json": "json", "custom_format": "fmt", "compose": "compose", "kubectl": "kubectl",
                   "journald": "journald", "docker_json": "docker", "journald_json": "journaljson"}


def collector_cases() -> list[dict]:
    out = []
    for i, col in enumerate(COLLECTORS):
        for j, death in enumerate(COLLECTOR_DEATHS):
            nanny = "nanny" if death in NEEDS_NANNY or (i + j) % 2 == 0 else "no-nanny"
            out.append({"death": death, "nanny": nanny, "launch": "cli", "ports": "random", "timing": "mid",
                        "collector": col})
    return out


SHORT = {"sigkill": "sigkill", "segfault": "segv", "sigabrt": "abrt", "nanny_memory": "nannymem",
         "sys_exit": "sysexit", "os_exit": "osexit", "uncaught_exception_outside_task": "uncaught",
         "heartbeat_timeout": "heartbeat", "startup_missing_preload": "nopreload",
         "startup_preload_raises": "preloadraise", "startup_worker_class": "workerclass",
         "startup_plugin_setup": "pluginsetup", "death_timeout": "deathtimeout",
         "version_mismatch": "versions", "sigterm_worker_cli": "sigterm", "sigint_worker_cli": "sigint",
         "retire": "retire", "lifetime": "lifetime", "scale_down": "scaledown", "client_restart": "restart",
         "clean": "clean", "task_error": "taskerror", "memory_pause": "pause",
         "repeat_sigkill": "repeatkill", "killed_worker": "killedworker"}
LAUNCH_SHORT = {"cli": "cli", "local_warning": "lw", "local_info": "li"}


def plan(version: str) -> list[dict]:
    cases = pairwise(SEED)
    cases = [dict(c) for c in cases] + [dict(c) for c in EXTRAS] + collector_cases()
    # sub-variants that alternate across the cases of one kind (deterministic)
    seen: dict[str, int] = {}
    rng = random.Random(SEED ^ zlib.crc32(b"variants"))
    for c in cases:
        k = seen.get(c["death"], 0)
        seen[c["death"]] = k + 1
        if c["death"] == "startup_worker_class":
            # an unimportable class can only be named on the dask worker command line
            c["variant"] = "missing_module" if c["launch"] == "cli" and k % 2 == 0 else "init_raises"
        if c["death"] == "lifetime":
            c["lifetime_restart"] = c["nanny"] == "nanny" and k % 2 == 0
        if c["death"] == "task_error":
            c["n_errors"] = 1 + k % 3
        if c["death"] == "version_mismatch":
            c["variant"] = "other_worker"
    for i, c in enumerate(cases, 1):
        nn = "nn" if c["nanny"] == "nanny" else "nonanny"
        c["id"] = f"{i:03d}-{SHORT[c['death']]}-{LAUNCH_SHORT[c['launch']]}-{nn}-{c['ports']}-{c['timing']}"
        if c.get("collector"):
            c["id"] += "-" + COLLECTOR_SHORT[c["collector"]]
    return cases


if __name__ == "__main__":
    ps = plan("any")
    for c in ps:
        print(c["id"], {k: v for k, v in c.items() if k not in ("id",) + tuple(FACTORS)})
    print(len(ps), "cases")
