"""The journal's file format and replay, without processes: records, torn and corrupt tails, the lock, and
appends kept for a loop turn (written before the turn's messages leave, over a real loopback connection).

The real-process side (a scheduler killed and restarted on its journal) is tests/test_runtime_recovery.py.
"""

from __future__ import annotations

import asyncio
import os
import zlib

import pytest

from kwdiag.runtime import journal
from kwdiag.runtime.comm import Listener, connect
from kwdiag.runtime.core import Stream, at_turn_end
from kwdiag.runtime.journal import FRAME, Journal, JournalLocked, encode, read


def _write(path, records, tail=b""):
    with open(path, "wb") as f:
        f.write(b"".join(encode(r) for r in records) + tail)


RECORDS = [
    ["hello", {"cluster": "abc", "pid": 1, "address": "tcp://127.0.0.1:1", "started": 1.0, "version": 1}],
    ["worker", "w1", "tcp://127.0.0.1:2", True],
    ["worker", "w2", "tcp://127.0.0.1:3", True],
    ["task", "x", b"spec-x", [], 0, None, False],
    ["task", "y", b"spec-y", ["x"], 5, ["w1"], True],
    ["task", "s", None, [], 0, None, False],
    ["want", "c1", ["x", "y", "s"]],
    ["has", "x", "w1", 10],
    ["has", "s", "w2", 3],
    ["blame", "y", 2, ["w1", "w2"]],
]


def test_records_fold_into_the_state_a_successor_needs(tmp_path):
    path = tmp_path / "j"
    _write(path, RECORDS)
    r = read(str(path))
    assert r.records == len(RECORDS) and r.skipped_bytes == 0 and r.problem is None
    assert r.hello["cluster"] == "abc" and r.closed is None
    assert list(r.tasks) == ["x", "y", "s"]
    y = r.tasks["y"]
    assert (y.spec, y.deps, y.priority, y.restrictions, y.loose) == (b"spec-y", ["x"], 5, ["w1"], True)
    assert y.deaths == 2 and y.death_workers == ["w1", "w2"] and y.wanted_by == {"c1"}
    assert r.tasks["x"].holders == {"w1": 10} and r.tasks["s"].spec is None
    assert r.workers == {"w1": "tcp://127.0.0.1:2", "w2": "tcp://127.0.0.1:3"}


def test_a_worker_that_left_takes_its_results_with_it_and_forgotten_tasks_are_gone(tmp_path):
    path = tmp_path / "j"
    _write(path, RECORDS + [["worker", "w1", "tcp://127.0.0.1:2", False], ["unwant", "c1", ["s"]],
                            ["forget", ["s"]], ["err", "y", {"type": "exception"}]])
    r = read(str(path))
    assert r.tasks["x"].holders == {} and "s" not in r.tasks and r.workers == {"w2": "tcp://127.0.0.1:3"}
    assert r.tasks["y"].error == {"type": "exception"}
    _write(path, RECORDS + [["close", "signal-15"]])
    assert read(str(path)).closed == "signal-15"
    _write(path, RECORDS + [["flush"]])
    assert read(str(path)).tasks == {}


@pytest.mark.parametrize("tail, problem", [
    (FRAME.pack(100, 0)[:5], "header is incomplete"),                 # the header itself was cut
    (FRAME.pack(100, 0) + b"only part of it", "shorter than its header"),   # the body was cut
    (FRAME.pack(3, zlib.crc32(b"abc") ^ 1) + b"abc", "checksum mismatch"),   # a corrupt record
])
def test_a_torn_or_corrupt_tail_is_skipped_and_reported(tmp_path, tail, problem):
    path = tmp_path / "j"
    _write(path, RECORDS, tail)
    r = read(str(path))
    assert r.records == len(RECORDS) and r.skipped_bytes == len(tail)
    assert problem in r.problem
    assert r.tasks["x"].holders == {"w1": 10}   # everything before it is replayed


def test_nothing_after_a_corrupt_record_is_trusted(tmp_path):
    path = tmp_path / "j"
    bad = FRAME.pack(3, 0) + b"abc"
    _write(path, RECORDS[:4], bad + b"".join(encode(r) for r in RECORDS[4:]))
    r = read(str(path))
    assert r.records == 4 and "y" not in r.tasks and "checksum" in r.problem


def test_appends_snapshots_and_the_run_directory_lock(tmp_path):
    errors = []
    j = Journal(str(tmp_path / "run"), errors.append)
    j.lock()
    assert j.snapshot(RECORDS[:3])
    j.append(["task", "z", b"z", [], 0, None, False], ["has", "z", "w1", 1])
    assert read(j.path).tasks["z"].holders == {"w1": 1}
    other = Journal(str(tmp_path / "run"), errors.append)
    with pytest.raises(JournalLocked, match=f"pid {os.getpid()}"):
        other.lock()
    assert j.snapshot(RECORDS)            # compaction replaces the file: only the snapshot remains
    assert read(j.path).records == len(RECORDS)
    os.unlink(j.path)                     # deleted under a live scheduler: noticed, and rewritten
    assert j.needs_snapshot(10) and errors and "deleted" in errors[0]
    assert j.snapshot(RECORDS) and read(j.path).records == len(RECORDS) and not j.needs_snapshot(10)
    j.close()
    other.lock()                          # the lock goes with its holder
    other.close()


def test_unknown_records_stop_the_replay_rather_than_being_guessed(tmp_path):
    path = tmp_path / "j"
    payload = b"\xc1"  # never valid msgpack
    _write(path, RECORDS[:2], FRAME.pack(1, zlib.crc32(payload)) + payload)
    r = read(str(path))
    assert r.records == 2 and "unreadable record" in r.problem


def test_the_journal_file_is_not_read_as_a_log_by_explain(tmp_path):
    from kwdiag.readers.inputs import expand_inputs

    for name in (journal.FILE_NAME, journal.LOCK_NAME, "scheduler.jsonl"):
        (tmp_path / name).write_bytes(b"x")
    inputs, _ = expand_inputs([str(tmp_path)])
    assert [os.path.basename(i.path) for i in inputs] == ["scheduler.jsonl"]


def test_appends_kept_for_the_turn_are_on_disk_before_the_turns_messages_leave(tmp_path):
    """As the scheduler uses it (``defer=at_turn_end``): appends in one loop turn reach the file in one write,
    at the turn's end, and before any message queued in that turn is sent (the peer reads the message, then
    the file: the record must be there). A snapshot taken meanwhile writes them first, into the file it replaces."""
    secret = os.urandom(32)

    async def scenario():
        on_disk_when_sent = []
        arrived = asyncio.Event()
        j = Journal(str(tmp_path / "run"), lambda reason: None, defer=at_turn_end)
        j.lock()
        assert j.snapshot(RECORDS[:3])

        async def on_comm(comm):
            await comm.read()
            arrived.set()

        listener = Listener(secret, on_comm, on_refused=lambda peer, reason: None)
        address = await listener.start("127.0.0.1", 0)
        stream = Stream(await connect(address, secret), {})
        write = stream.comm.write

        def write_and_look(batch):   # what the file holds at the instant the frame goes to the kernel
            on_disk_when_sent.append(read(j.path).tasks.get("z"))
            return write(batch)

        stream.comm.write = write_and_look
        j.append(["task", "z", b"z", [], 0, None, False])
        j.append(["has", "z", "w1", 1])
        stream.send({"op": "z-is-in-memory"})
        assert "z" not in read(j.path).tasks          # kept until the turn ends
        await asyncio.wait_for(arrived.wait(), 10)
        assert [t.holders for t in on_disk_when_sent] == [{"w1": 1}]
        j.append(["has", "z", "w2", 1])               # a stream flushed by hand, mid-turn (a drain, a close)
        stream.send({"op": "z-is-on-w2-too"})
        stream.flush()
        assert on_disk_when_sent[-1].holders == {"w1": 1, "w2": 1}
        j.append(["has", "z", "w3", 1])               # kept; then, in the same turn, w3 lost it again and a
        assert j.snapshot(RECORDS[:3] + [["task", "z", b"z", [], 0, None, False], ["has", "z", "w1", 1],
                                         ["has", "z", "w2", 1]])
        # snapshot of that state replaced the file: the kept record must not land after it
        await asyncio.sleep(0)
        assert read(j.path).tasks["z"].holders == {"w1": 1, "w2": 1}
        stream.close()
        j.close()

    asyncio.run(scenario())
