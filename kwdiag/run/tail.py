"""Follow the JSONL events a running cluster writes into the run directory.

Covers: ``EventTail.poll()`` — the events appended since the last poll (not kept here), across every ``*.jsonl`` file
(new files included), as ``kwdiag.events.Event`` with their origin (file, line); only complete lines
are read, so a line being written is picked up next time; undecodable lines are skipped. Does not
cover: interpreting the events.
"""

from __future__ import annotations

import os

from kwdiag.events import Event, EventDecodeError, Origin, from_json_line


class EventTail:
    def __init__(self, folder: str):
        self.folder = folder
        self._offsets: dict[str, tuple[int, int]] = {}  # path -> (byte offset, lines read)

    def poll(self) -> list[Event]:
        new: list[Event] = []
        try:
            names = sorted(n for n in os.listdir(self.folder) if n.endswith(".jsonl"))
        except OSError:
            return new
        for name in names:
            path = os.path.join(self.folder, name)
            offset, lineno = self._offsets.get(path, (0, 0))
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n")
            if end < 0:
                continue
            for raw in chunk[: end + 1].splitlines():
                lineno += 1
                if not raw.strip():
                    continue
                try:
                    new.append(from_json_line(raw, Origin(path, lineno)))
                except EventDecodeError:
                    continue
            self._offsets[path] = (offset + end + 1, lineno)
        new.sort(key=lambda e: e.ts)
        return new  # kept by the caller (the growing analysis), not here: a long run writes millions
