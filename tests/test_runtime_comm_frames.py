"""Frames cut anywhere by the network come out whole, in order, and a bad frame after good ones loses none of them.

Real sockets on loopback: a real ``Listener`` and ``connect`` (the handshake included), then raw bytes written in
pieces of 1 to 1,000 bytes with a loop turn between them, so that headers and bodies arrive split at every kind
of boundary. Both ways a comm hands frames on are checked: ``Comm.read`` (one frame per call) and
``Comm.deliver`` (what ``Stream`` uses: frames handed to a callback as they are decoded).
"""

from __future__ import annotations

import asyncio
import itertools
import os

import msgpack
import pytest

from kwdiag.runtime.comm import HEADER, CommClosedError, Listener, ProtocolError, connect

FRAMES = [[{"op": "a", "i": i, "blob": b"x" * n}] for i, n in enumerate([0, 1, 100, 70_000, 3])] + \
         [[{"op": "b"}, {"op": "c", "nested": {"k": [1, 2, 3]}}]]
GARBAGE = HEADER.pack(7) + b"\xc1garbag"


def _wire(frames) -> bytes:
    bodies = [msgpack.packb(f, use_bin_type=True) for f in frames]
    return b"".join(HEADER.pack(len(b)) + b for b in bodies)


async def _exchange(mode: str, payload: bytes) -> list:
    secret = os.urandom(32)
    got: list = []
    finished = asyncio.Event()

    async def on_comm(comm):
        try:
            if mode == "read":
                while True:
                    got.append(await comm.read())
            else:
                await comm.deliver(got.extend)
        except ProtocolError as exc:
            got.append(("bad frame", str(exc)))
        except CommClosedError:
            got.append(("closed",))
        finally:
            finished.set()

    listener = Listener(secret, on_comm, on_refused=lambda peer, reason: None)
    address = await listener.start("127.0.0.1", 0)
    comm = await connect(address, secret)
    sizes = itertools.cycle([1, 2, 3, 7, 64, 1000, 5])
    at = 0
    while at < len(payload):
        size = next(sizes)
        comm.transport.write(payload[at:at + size])
        at += size
        await asyncio.sleep(0)   # a loop turn: the server reads what has arrived so far
    await asyncio.sleep(0.05)
    comm.abort()
    await asyncio.wait_for(finished.wait(), 30)
    listener.stop()
    return got


@pytest.mark.parametrize("mode", ["read", "deliver"])
def test_frames_split_at_every_boundary_arrive_whole_and_in_order(mode):
    got = asyncio.run(_exchange(mode, _wire(FRAMES)))
    assert got == FRAMES + [("closed",)]


@pytest.mark.parametrize("mode", ["read", "deliver"])
def test_a_garbage_frame_after_good_ones_ends_the_connection_after_delivering_them(mode):
    got = asyncio.run(_exchange(mode, _wire(FRAMES) + GARBAGE + _wire(FRAMES[:1])))
    assert got[:-1] == FRAMES   # everything before the garbage, nothing after it
    assert got[-1][0] == "bad frame" and "malformed frame" in got[-1][1]


def test_a_message_that_cannot_be_sent_closes_its_connection_and_no_other():
    """Messages queued in one loop turn leave at its end, stream by stream: a message msgpack cannot encode
    (a handler's reply holding an object) closes that connection, and the other connection's message still
    leaves in the same turn."""
    from kwdiag.runtime.core import Stream

    async def scenario():
        secret = os.urandom(32)
        got: list = []
        arrived = asyncio.Event()

        async def on_comm(comm):
            try:
                while True:
                    got.append(await comm.read())
                    arrived.set()
            except CommClosedError:
                pass

        listener = Listener(secret, on_comm, on_refused=lambda peer, reason: None)
        address = await listener.start("127.0.0.1", 0)
        bad = Stream(await connect(address, secret), {})
        good = Stream(await connect(address, secret), {})
        bad.send({"op": "reply", "result": object()})
        good.send({"op": "still-here"})
        await asyncio.wait_for(arrived.wait(), 10)
        assert got == [[{"op": "still-here"}]]
        assert bad.closed and not good.closed
        good.close()

    asyncio.run(scenario())
