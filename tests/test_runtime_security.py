"""Hostile peers: no secret, garbage frames, oversized frames, wrong shapes, stalls.

Each is aimed at a real scheduler or worker process; the target must log it, close only that
connection, keep serving the real client, and never unpickle what an unauthenticated peer sent.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import struct

import msgpack
import pytest

from conftest import read_events, wait_for_event, wait_until
from kwdiag.runtime import Client, LocalCluster
from kwdiag.runtime.comm import AuthError, connect, parse_address


class _Marker:
    """Unpickling this creates a file: proof that something was unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def inc(x):
    return x + 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    log_dir = str(tmp_path_factory.mktemp("security-logs"))
    with LocalCluster(n_workers=1, memory_limit=None, log_dir=log_dir) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster) as client:
        yield client


def raw_socket(address):
    host, port = parse_address(address)
    return socket.create_connection((host, port), timeout=10)


def closed_by_peer(sock):
    sock.settimeout(10)
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return True
    except ConnectionResetError:
        return True


def authenticated_raw(address, secret, payload: bytes):
    """Authenticate for real, then send raw bytes; return True if the server closed the connection."""
    async def go():
        comm = await connect(address, secret)
        await comm.stream.write(payload)
        try:
            await asyncio.wait_for(comm.stream.read_bytes(1), 10)
        except Exception:
            return True
        return False
    return asyncio.run(go())


def test_peer_without_the_secret_is_refused_logged_and_never_unpickled(cluster, client, tmp_path):
    marker = str(tmp_path / "unpickled")
    worker = next(iter(client.scheduler_info()["workers"]))
    frame = msgpack.packb([{"op": "put-data", "data": {"x": pickle.dumps(_Marker(marker))}}], use_bin_type=True)
    for target in (cluster.scheduler_address, worker):
        sock = raw_socket(target)
        assert sock.recv(36)[:4] == b"KWD1"
        sock.sendall(b"\0" * 64 + struct.pack("!I", len(frame)) + frame)
        assert closed_by_peer(sock)
    wait_for_event(cluster.log_dir, "auth-refused", source="scheduler")
    wait_for_event(cluster.log_dir, "auth-refused", source="worker")
    assert not os.path.exists(marker)
    with pytest.raises(AuthError):
        Client(cluster.scheduler_address, secret=b"wrong" * 8, timeout=5)
    assert client.submit(inc, 1).result(timeout=30) == 2


@pytest.mark.parametrize("name, payload, reason", [
    ("garbage", struct.pack("!I", 7) + b"\xc1garbag", "malformed frame"),
    ("huge", struct.pack("!I", 0xFFFFFFF0) + b"x" * 16, "exceeds the limit"),
    ("wrong-shape", struct.pack("!I", len(msgpack.packb({"op": 1.5}))) + msgpack.packb({"op": 1.5}),
     "not a list of messages"),
])
def test_bad_frames_close_one_connection_and_the_server_keeps_serving(cluster, client, name, payload, reason):
    before = len(read_events(cluster.log_dir, "bad-frame"))
    worker = next(iter(client.scheduler_info()["workers"]))
    for target in (cluster.scheduler_address, worker):
        assert authenticated_raw(target, cluster.secret, payload)
    wait_until(lambda: {e.source for e in read_events(cluster.log_dir, "bad-frame")
                        if reason in e.fields["reason"]} == {"scheduler", "worker"}, what=f"bad-frame {reason}")
    assert len(read_events(cluster.log_dir, "bad-frame")) == before + 2
    assert client.submit(inc, 2, pure=False).result(timeout=30) == 3


def test_a_stalled_connection_is_dropped_after_the_handshake_timeout(cluster, client):
    sock = raw_socket(cluster.scheduler_address)
    assert closed_by_peer(sock)          # we never answer the challenge
    event = wait_for_event(cluster.log_dir, "auth-refused", predicate=lambda e: "no handshake" in e.fields["reason"])
    assert event
    assert client.submit(inc, 3).result(timeout=30) == 4


def test_the_secret_never_reaches_logs_or_events(cluster, client):
    secret_hex = cluster.secret.hex()
    for name in os.listdir(cluster.log_dir):
        if name == "scheduler.json":
            continue
        with open(os.path.join(cluster.log_dir, name), errors="replace") as f:
            assert secret_hex not in f.read(), name
    assert oct(os.stat(cluster.scheduler_file).st_mode & 0o777) == "0o600"
