"""Authenticated, framed TCP connections: the only module of the runtime that knows tornado.

Covers: listening and connecting on TCP (TCP_NODELAY), the shared-secret challenge-response
handshake that every connection passes *before* any frame is read, and frames of the form
``4-byte big-endian length + msgpack`` whose payload is a list of message dicts. Every way a
connection can end surfaces as one ``CommClosedError`` (or its subclasses ``AuthError`` and
``ProtocolError``, which say why it was ended on purpose).

Does not cover: what messages mean (``runtime.core`` dispatches them), pickling (task
payloads travel as opaque ``bytes`` inside msgpack; they are unpickled only by code that
received them over an authenticated comm), or TLS.

Handshake (mutual, HMAC-SHA256 over fresh nonces; the secret never crosses the wire)::

    server -> client   b"KWD1" + server_nonce(32)
    client -> server   client_nonce(32) + HMAC(secret, b"C" + server_nonce + client_nonce)
    server -> client   HMAC(secret, b"S" + client_nonce + server_nonce)
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import socket
import struct
from typing import Any, Awaitable, Callable

import msgpack
from tornado.iostream import IOStream, StreamClosedError
from tornado.netutil import bind_sockets
from tornado.tcpclient import TCPClient
from tornado.tcpserver import TCPServer

MAGIC = b"KWD1"
NONCE_BYTES = 32
MAC_BYTES = 32
HEADER = struct.Struct("!I")
DEFAULT_MAX_FRAME = 1 << 30  # 1 GiB: a frame claiming more closes the connection
HANDSHAKE_TIMEOUT = 5.0


class CommClosedError(IOError):
    """The connection is gone (peer closed, reset, timed out, or we closed it)."""


class AuthError(CommClosedError):
    """The peer failed the shared-secret handshake."""


class ProtocolError(CommClosedError):
    """The peer sent a frame that is not a kwdiag frame (garbage, oversized, wrong shape)."""


def _mac(secret: bytes, tag: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, tag + first + second, hashlib.sha256).digest()


def parse_address(address: str) -> tuple[str, int]:
    """``tcp://host:port`` (or ``host:port``) -> ``(host, port)``."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"not a tcp address: {address!r}")
    return host.strip("[]"), int(port)


def format_address(host: str, port: int) -> str:
    return f"tcp://{host}:{port}" if ":" not in host else f"tcp://[{host}]:{port}"


class Comm:
    """One authenticated connection carrying frames, each a list of message dicts."""

    def __init__(self, stream: IOStream, peer: str, local: str, max_frame: int = DEFAULT_MAX_FRAME):
        self.stream = stream
        self.peer = peer
        self.local = local
        self.max_frame = max_frame

    @property
    def closed(self) -> bool:
        return self.stream.closed()

    async def read(self) -> list[dict]:
        try:
            header = await self.stream.read_bytes(HEADER.size)
            (size,) = HEADER.unpack(header)
            if size > self.max_frame:
                raise ProtocolError(f"frame of {size} bytes exceeds the limit of {self.max_frame}")
            body = await self.stream.read_bytes(size) if size else b""
        except StreamClosedError as exc:
            raise CommClosedError(f"connection to {self.peer} closed: {exc.real_error or 'EOF'}") from None
        try:
            messages = msgpack.unpackb(body, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several types for garbage
            raise ProtocolError(f"malformed frame ({type(exc).__name__})") from None
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ProtocolError("frame is not a list of messages")
        return messages

    def write(self, messages: list[dict]) -> Awaitable[None]:
        """Queue one frame; tornado writes it as the socket allows. Returns a future for the
        moment it has been handed to the kernel. Raises CommClosedError."""
        body = msgpack.packb(messages, use_bin_type=True)
        if len(body) > self.max_frame:
            raise ProtocolError(f"refusing to send a frame of {len(body)} bytes (limit {self.max_frame})")
        try:
            if len(body) < 1 << 16:
                return self.stream.write(HEADER.pack(len(body)) + body)
            self.stream.write(HEADER.pack(len(body)))  # avoid copying large payloads
            return self.stream.write(body)
        except StreamClosedError:
            raise CommClosedError(f"connection to {self.peer} closed") from None

    def abort(self) -> None:
        self.stream.close()


def _peer_name(stream: IOStream, fallback: Any) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
        return format_address(host, port)
    except (OSError, AttributeError):
        return str(fallback)


async def _server_handshake(stream: IOStream, secret: bytes) -> None:
    nonce = os.urandom(NONCE_BYTES)
    await stream.write(MAGIC + nonce)
    reply = await stream.read_bytes(NONCE_BYTES + MAC_BYTES)
    client_nonce, mac = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
    if not hmac.compare_digest(mac, _mac(secret, b"C", nonce, client_nonce)):
        raise AuthError("peer does not know the shared secret")
    await stream.write(_mac(secret, b"S", client_nonce, nonce))


async def _client_handshake(stream: IOStream, secret: bytes) -> None:
    head = await stream.read_bytes(len(MAGIC) + NONCE_BYTES)
    if head[: len(MAGIC)] != MAGIC:
        raise AuthError("peer is not a kwdiag server")
    server_nonce = head[len(MAGIC):]
    client_nonce = os.urandom(NONCE_BYTES)
    await stream.write(client_nonce + _mac(secret, b"C", server_nonce, client_nonce))
    try:
        proof = await stream.read_bytes(MAC_BYTES)
    except StreamClosedError:
        raise AuthError("the server closed the connection on our credentials (wrong shared secret?)") from None
    if not hmac.compare_digest(proof, _mac(secret, b"S", client_nonce, server_nonce)):
        raise AuthError("server failed to prove it knows the shared secret")


OnComm = Callable[[Comm], Awaitable[None]]
OnRefused = Callable[[str, str], None]


class Listener:
    """Accepts connections, authenticates each, then hands the ``Comm`` to ``on_comm``."""

    def __init__(self, secret: bytes, on_comm: OnComm, on_refused: OnRefused,
                 max_frame: int = DEFAULT_MAX_FRAME, handshake_timeout: float = HANDSHAKE_TIMEOUT):
        self.secret = secret
        self.on_comm = on_comm
        self.on_refused = on_refused
        self.max_frame = max_frame
        self.handshake_timeout = handshake_timeout
        self._server: TCPServer | None = None
        self.address = ""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        listener = self

        class _Server(TCPServer):
            async def handle_stream(self, stream: IOStream, address: Any) -> None:
                await listener._accept(stream, address)

        sockets = bind_sockets(port, address=host, family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                               reuse_port=False)
        self._server = _Server(max_buffer_size=self.max_frame + HEADER.size)
        self._server.add_sockets(sockets)
        bound_host, bound_port = sockets[0].getsockname()[:2]
        advertised = bound_host if bound_host not in ("0.0.0.0", "::") else socket.gethostname()
        self.address = format_address(advertised, bound_port)
        return self.address

    async def _accept(self, stream: IOStream, address: Any) -> None:
        peer = _peer_name(stream, address)
        stream.set_nodelay(True)
        try:
            await asyncio.wait_for(_server_handshake(stream, self.secret), self.handshake_timeout)
        except AuthError as exc:
            self.on_refused(peer, str(exc))
            stream.close()
            return
        except asyncio.TimeoutError:
            self.on_refused(peer, f"no handshake within {self.handshake_timeout:g}s")
            stream.close()
            return
        except (StreamClosedError, OSError):
            self.on_refused(peer, "closed during the handshake")
            stream.close()
            return
        await self.on_comm(Comm(stream, peer, self.address, self.max_frame))

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()


async def connect(address: str, secret: bytes, *, timeout: float = 10.0,
                  max_frame: int = DEFAULT_MAX_FRAME) -> Comm:
    """Open an authenticated comm to ``address``; raise CommClosedError if that fails in time."""
    host, port = parse_address(address)

    async def _open() -> IOStream:
        stream = await TCPClient().connect(host, port, max_buffer_size=max_frame + HEADER.size)
        stream.set_nodelay(True)
        try:
            await _client_handshake(stream, secret)
        except BaseException:
            stream.close()
            raise
        return stream

    try:
        stream = await asyncio.wait_for(_open(), timeout)
    except AuthError:
        raise
    except asyncio.TimeoutError:
        raise CommClosedError(f"timed out connecting to {address} after {timeout:g}s") from None
    except (StreamClosedError, OSError) as exc:
        raise CommClosedError(f"could not connect to {address}: {exc}") from None
    local = _peer_name(stream, "")
    try:
        lhost, lport = stream.socket.getsockname()[:2]
        local = format_address(lhost, lport)
    except OSError:
        pass
    return Comm(stream, address, local, max_frame)
