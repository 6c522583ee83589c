"""A long-running Dask cluster's logs, as a scheduler and its workers really print them, at any size.

The lines are the corpus's own (``sample_logs/corpus/cases/2026.8.0/``), nothing written here:

* the skeleton is a whole real case (three workers; one of them SIGKILLed six times, each time restarted by its
  nanny; then the cluster closed): ``scheduler.log``, ``w0.log``, ``w1.log``, ``w2.log``;
* into its quiet middle (after the workers registered, before the first kill) go cycles of what a scheduler
  that serves for weeks prints: a client session (``Receive client connection``, ``Starting established
  connection``, two ``Remove client``, ``Received 'close-stream'``, ``Close client connection``), and every
  ``ADAPTIVE_EVERY`` cycles a worker an adaptive cluster starts and retires (``Register worker``, ``Starting
  worker compute stream``, ``Retire worker addresses``, ``Retiring worker``, ``Remove worker``, ``Retired
  worker``, ``Received 'close-stream'``); the three workers print ``Starting established connection`` as peers
  and clients connect to them. Each cycle is a real sequence of case 047-retire-cli-nonanny-random-mid with
  its own client id, worker name, address, ports and time; the skeleton's later lines move later by the time
  inserted.

What the logs hold is known: the skeleton's deaths (as kwdiag finds them in the skeleton alone) plus one
retirement (``chose_to_exit/retired``) per adaptive worker.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

CASES = Path(__file__).resolve().parent.parent / "sample_logs" / "corpus" / "cases" / "2026.8.0"
SKELETON = CASES / "067-repeatkill-cli-nn-fixed-mid"
CYCLES_FROM = CASES / "047-retire-cli-nonanny-random-mid"
ADAPTIVE_EVERY = 1000
CYCLE_SECONDS = 2.0
STAMP = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")


def _ts(line: bytes) -> float | None:
    m = STAMP.match(line)
    if not m:
        return None
    return time.mktime(time.strptime(m.group(1).decode(), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000


def _stamp(ts: float) -> bytes:
    return (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) + f",{int(round(ts * 1000)) % 1000:03d}").encode()


def _templates() -> tuple[list[bytes], list[bytes], bytes]:
    """The cycles' real lines with their identities as placeholders (timestamps cut off): a client session's
    scheduler lines, a retired worker's scheduler lines, and a worker's ``Starting established connection``."""
    lines = (CYCLES_FROM / "scheduler.log").read_bytes().splitlines(keepends=True)
    text = b"".join(lines)
    client = re.search(rb"Receive client connection: (Client-[\w-]+)", text).group(1)
    client_port = re.search(rb"Receive client connection.*\n.*Starting established connection to tcp://[\d.]+:(\d+)",
                            text).group(1)
    address = re.search(rb"Retire worker addresses .*\('(tcp://[\d.:]+)',\)", text).group(1)
    name = re.search(rb"Register worker addr: " + re.escape(address) + rb" name: (\S+)", text).group(1)
    worker_port = re.search(rb"compute stream, " + re.escape(address) + rb"\n.*Starting established connection to "
                            rb"tcp://[\d.]+:(\d+)", text).group(1)
    stimulus = re.search(rb"retire-workers-([\d.]+)", text).group(1)

    def ends_with_port(line: bytes, port: bytes) -> bool:
        return re.search(rb":" + port + rb"\b", line) is not None

    session, worker = [], []
    for line in lines:
        body = line[23:]
        if client in line or ends_with_port(line, client_port):
            session.append(body.replace(client, b"{CLIENT}").replace(b":" + client_port, b":{CPORT}"))
        elif address in line or ends_with_port(line, worker_port):
            worker.append(body.replace(address, b"{ADDR}").replace(b":" + worker_port, b":{WPORT}")
                          .replace(b"name: " + name, b"name: {NAME}").replace(stimulus, b"{STIM}"))
    peer = next(line[23:] for line in (SKELETON / "w0.log").read_bytes().splitlines(keepends=True)
                if b"Starting established connection" in line)
    peer = re.sub(rb":\d+\n", b":{CPORT}\n", peer)
    return session, worker, peer


def build(folder: Path, size: int) -> Counter:
    """Write the logs (about ``size`` bytes in all) into ``folder``; return the adaptive workers' retirements
    as a Counter of (worker, cause, detail) (the skeleton's deaths are what kwdiag finds in the skeleton alone)."""
    session, adaptive, peer = _templates()
    files = {p.name: p.read_bytes().splitlines(keepends=True) for p in SKELETON.glob("*.log")}
    sched = files["scheduler.log"]
    registered = [i for i, line in enumerate(sched) if b"Register worker" in line]
    insert_at = registered[2] + 3  # after the third worker's registration and its connection
    t_insert = _ts(sched[insert_at - 1]) + 0.01
    cycle_bytes = sum(len(x) + 23 for x in session) + 2 * (len(peer) + 23)
    n_cycles = max(1, size // cycle_bytes)
    shift = n_cycles * CYCLE_SECONDS
    expected: Counter = Counter()
    inserted: dict[str, list[bytes]] = {"scheduler.log": [], "w0.log": [], "w2.log": []}
    for c in range(n_cycles):
        t = t_insert + c * CYCLE_SECONDS
        client, port = f"Client-{c:08x}-e792-11f1-b551-02fc00000001".encode(), f"{20000 + c % 40000}".encode()
        for k, body in enumerate(session):
            inserted["scheduler.log"].append(_stamp(t + k * 0.001) + body.replace(b"{CLIENT}", client)
                                             .replace(b"{CPORT}", port))
        for k, name in enumerate(("w0.log", "w2.log")):
            inserted[name].append(_stamp(t + 0.5 + k * 0.01) + peer.replace(b"{CPORT}", port))
        if c % ADAPTIVE_EVERY == ADAPTIVE_EVERY - 1:
            n = c // ADAPTIVE_EVERY
            name, address = f"adaptive-{n}".encode(), f"tcp://10.1.{n // 250}.{n % 250 + 1}:40000".encode()
            for k, body in enumerate(adaptive):
                inserted["scheduler.log"].append(
                    _stamp(t + 1.0 + k * 0.001) + body.replace(b"{NAME}", name).replace(b"{ADDR}", address)
                    .replace(b"{WPORT}", f"{60000 - n % 5000}".encode()).replace(b"{STIM}", f"{t + 1:.7f}".encode()))
            expected[(name.decode(), "chose_to_exit", "retired")] += 1
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in files.items():
        with open(folder / name, "wb", buffering=1 << 22) as f:
            placed = name not in inserted
            for i, line in enumerate(lines):
                ts = _ts(line)
                if not placed and ((name == "scheduler.log" and i == insert_at)
                                   or (name != "scheduler.log" and ts is not None and ts > t_insert)):
                    f.writelines(inserted[name])
                    placed = True
                if ts is not None and ts > t_insert:
                    line = _stamp(ts + shift) + line[23:]
                f.write(line)
            if not placed:
                f.writelines(inserted[name])
    return expected
