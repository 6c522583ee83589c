"""The event format: encoding, decoding and the per-line writer (pure, no processes)."""

import json

import pytest

from kwdiag.events import FORMAT_VERSION, Event, EventDecodeError, EventWriter, Origin, from_json_line, to_json_line


def test_round_trip_keeps_every_field():
    event = Event(ts=1763718799.534211, source="nanny", kind="worker-exit", worker="w-1",
                  fields={"exitcode": -9, "samples": [[1.0, 2]], "tasks": ("a", "b")}, level="warning",
                  message="Worker process 1 was killed by signal 9", pid=10, host="h")
    line = to_json_line(event)
    assert "\n" not in line
    back = from_json_line(line, origin=Origin("f.jsonl", 3))
    assert back.kind == "worker-exit" and back.worker == "w-1" and back.level == "warning"
    assert back.fields == {"exitcode": -9, "samples": [[1.0, 2]], "tasks": ["a", "b"]}
    assert back.ts == pytest.approx(event.ts) and back.pid == 10 and str(back.origin) == "f.jsonl:3"
    assert json.loads(line)["time"] == "2025-11-21T09:53:19.534Z"


def test_unencodable_values_never_lose_the_event():
    line = to_json_line(Event(ts=1.0, source="worker", kind="x", fields={"obj": object(), "nan": float("nan"),
                                                                          "b": b"\xff"}))
    fields = json.loads(line)["fields"]
    assert fields["nan"] is None and fields["b"] == "\ufffd" and fields["obj"].startswith("<object")


@pytest.mark.parametrize("line, why", [
    ("not json", "not JSON"),
    ("[1,2]", "not a JSON object"),
    ('{"ts": 1, "source": "s", "kind": "k"}', "format version"),
    ('{"v": 99, "ts": 1, "source": "s", "kind": "k"}', "unsupported event format version 99"),
    ('{"v": 1, "ts": "x", "source": "s", "kind": "k"}', "'ts' must be a number"),
    ('{"v": 1, "ts": 1, "source": "s", "kind": "k", "fields": []}', "'fields' must be an object"),
])
def test_decode_errors_say_why(line, why):
    with pytest.raises(EventDecodeError, match=why):
        from_json_line(line)


def test_writer_flushes_each_line(tmp_path):
    path = tmp_path / "sub" / "x.jsonl"
    writer = EventWriter(str(path), source="scheduler")
    writer.emit("scheduler-start", message="hi", address="tcp://127.0.0.1:1")
    # Readable at once, before close: a process that dies now loses nothing.
    lines = path.read_text().splitlines()
    assert len(lines) == 1 and from_json_line(lines[0]).fields["address"] == "tcp://127.0.0.1:1"
    assert json.loads(lines[0])["v"] == FORMAT_VERSION
    writer.close()
