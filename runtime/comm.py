"""Authenticated, framed TCP connections: the only module of the runtime that knows sockets.

Covers: listening and connecting on TCP (TCP_NODELAY), the shared-secret challenge-response
handshake that every connection passes *before* any frame is read, and frames of the form
``4-byte big-endian length + msgpack`` whose payload is a list of message dicts. Every way a
connection can end surfaces as one ``CommClosedError`` (or its subclasses ``AuthError`` and
``ProtocolError``, which say why it was ended on purpose).

With ``Security`` (a certificate, its key and the CA that signed the cluster's certificates), every
connection is TLS (``tls://`` addresses), mutually authenticated by certificate, and the shared-secret
handshake still runs inside it.

Built on asyncio's transports and a protocol that decodes frames as bytes arrive. It was tornado's IOStream
until issue 18: a one-message frame there and back cost ~95 us against ~40 us here (two processes on loopback,
this module's framing both ways), and a task's round trip crosses four of them.

Does not cover: what messages mean (``runtime.core`` dispatches them), or pickling (task
payloads travel as opaque ``bytes`` inside msgpack; they are unpickled only by code that
received them over an authenticated comm).

Handshake (mutual, HMAC-SHA256 over fresh nonces; the secret never crosses the wire)::

    server -> client   b"KWD1" + server_nonce(32)
    client -> server   client_nonce(32) + HMAC(secret, b"C" + server_nonce + client_nonce)
    server -> client   HMAC(secret, b"S" + client_nonce + server_nonce)
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import logging
import os
import socket
import ssl
import struct
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import msgpack

logger = logging.getLogger("kwdiag.comm")

MAGIC = b"KWD1"
NONCE_BYTES = 32
MAC_BYTES = 32
HEADER = struct.Struct("!I")
DEFAULT_MAX_FRAME = 1 << 30  # 1 GiB: a frame claiming more closes the connection
HANDSHAKE_TIMEOUT = 5.0
CLOSE_GRACE = 10.0   # seconds a closed connection may take to hand its last frames to a slow peer
QUEUED_FRAMES_HIGH = 256   # frames decoded but not yet read: past this, stop reading the socket until they are


class CommClosedError(IOError):
    """The connection is gone (peer closed, reset, timed out, or we closed it)."""


class AuthError(CommClosedError):
    """The peer failed the shared-secret handshake."""


class ProtocolError(CommClosedError):
    """The peer sent a frame that is not a kwdiag frame (garbage, oversized, wrong shape)."""


@dataclass(frozen=True)
class Security:
    """TLS for every connection: this process's certificate and key, and the CA that signed the cluster's.

    Both sides present a certificate and verify the other's against the CA (mutual TLS). Host names are
    not checked — cluster certificates rarely name every worker's address; the CA is the trust anchor.
    """

    tls_cert: str
    tls_key: str
    tls_ca: str

    def __post_init__(self) -> None:
        for name in ("tls_cert", "tls_key", "tls_ca"):
            path = getattr(self, name)
            if not path or not os.path.isfile(path):
                raise ValueError(f"{name.replace('_', '-')}: no such file: {path!r}")

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.tls_ca)
        ctx.load_cert_chain(self.tls_cert, self.tls_key)
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        ctx.load_cert_chain(self.tls_cert, self.tls_key)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx

    def args(self) -> list[str]:
        """The command-line options that give a child process the same settings."""
        return ["--tls-cert", self.tls_cert, "--tls-key", self.tls_key, "--tls-ca", self.tls_ca]

    @classmethod
    def from_options(cls, cert: str | None, key: str | None, ca: str | None) -> "Security | None":
        if not (cert or key or ca):
            return None
        if not (cert and key and ca):
            raise ValueError("TLS needs all three of --tls-cert, --tls-key and --tls-ca")
        return cls(cert, key, ca)


class Credentials:
    """What a process proves itself with: the shared secret, and TLS contexts when ``security`` is given."""

    def __init__(self, secret: bytes, security: Security | None = None):
        self.secret = secret
        self.security = security
        self.server_ssl = security.server_context() if security else None
        self.client_ssl = security.client_context() if security else None

    @classmethod
    def of(cls, value: "Credentials | bytes") -> "Credentials":
        return value if isinstance(value, Credentials) else cls(value)


def _mac(secret: bytes, tag: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, tag + first + second, hashlib.sha256).digest()


def parse_address(address: str) -> tuple[str, int]:
    """``tcp://host:port`` (or ``host:port``) -> ``(host, port)``."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"not a tcp address: {address!r}")
    return host.strip("[]"), int(port)


def format_address(host: str, port: int, scheme: str = "tcp") -> str:
    return f"{scheme}://{host}:{port}" if ":" not in host else f"{scheme}://[{host}]:{port}"


class _FrameProtocol(asyncio.Protocol):
    """The bytes of one connection: read by exact sizes during the handshake, then decoded into frames as they
    arrive (so a reader awaits once per burst, not twice per frame), queued for ``Comm.read``."""

    def __init__(self, max_frame: int):
        self.max_frame = max_frame
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.framing = False
        self.frames: collections.deque[list[dict]] = collections.deque()
        self.error: CommClosedError | None = None   # why it ended; raised once the frames before it are read
        self.lost = False
        self.lost_because: Exception | None = None
        self.peer = ""
        # Set by Comm.deliver: decoded frames go straight to it, in the read callback (no task wakes per frame).
        self.receiver: Callable[[list[list[dict]]], None] | None = None
        self._waiter: asyncio.Future | None = None
        self._drain_waiters: list[asyncio.Future] = []
        self._reading_paused = False
        self.made = asyncio.get_running_loop().create_future()
        self.tls_pending = False   # a TLS listener's connection: nothing is read before TLS takes the socket

    # -- asyncio's callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Paused whenever a byte is left over: resume_writing then means "all of it is with the kernel".
        transport.set_write_buffer_limits(high=0)  # type: ignore[attr-defined]
        if self.tls_pending:
            transport.pause_reading()  # type: ignore[attr-defined]
        if not self.made.done():
            self.made.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.framing:
            self._decode()
        if self.receiver is None or self.error is not None:
            self._wake()

    def eof_received(self) -> bool:
        return False   # the transport closes; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.lost_because = exc
        if self.error is None:
            self.error = CommClosedError(f"connection to {self.peer or 'peer'} closed: {exc or 'EOF'}")
        self._wake()
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)   # it never will be written; whoever waits sees the comm closed
        self._drain_waiters.clear()

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- decoding
    def _decode(self) -> None:
        buffer = self.buffer
        offset, size = 0, len(buffer)
        frames = []
        while size - offset >= HEADER.size and self.error is None:
            (length,) = HEADER.unpack_from(buffer, offset)
            if length > self.max_frame:
                self._refuse(f"frame of {length} bytes exceeds the limit of {self.max_frame}")
                break
            end = offset + HEADER.size + length
            if end > size:
                break
            with memoryview(buffer) as view:   # released before the buffer is trimmed below
                try:
                    messages = msgpack.unpackb(view[offset + HEADER.size:end], raw=False, strict_map_key=False) \
                        if length else b""
                except Exception as exc:  # msgpack raises several types for garbage
                    messages = None
                    reason = f"malformed frame ({type(exc).__name__})"
            offset = end
            if messages is None:
                self._refuse(reason)
            elif not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                self._refuse("frame is not a list of messages")
            else:
                frames.append(messages)
        if offset:
            del buffer[:offset]
        if frames and self.receiver is not None:
            try:
                self.receiver(frames)
            except Exception:   # a bug in dispatch must not take the connection down with it
                logger.exception("Dispatching frames from %s failed", self.peer)
            return
        self.frames.extend(frames)
        if len(self.frames) > QUEUED_FRAMES_HIGH and not self._reading_paused and not self.lost:
            self._reading_paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]

    def _refuse(self, reason: str) -> None:
        """A frame that is not ours: no more is read from this peer, and the reader learns why."""
        self.error = ProtocolError(reason)
        self.buffer.clear()
        self.framing = False
        if self.transport is not None:
            self.transport.close()

    # -- for Comm and the handshake
    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter

    async def read_exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if self.lost:
                if isinstance(self.lost_because, ssl.SSLError):   # the peer's TLS refused us (an alert)
                    raise self.lost_because
                raise CommClosedError(f"connection to {self.peer or 'peer'} closed during the handshake")
            await self.wait()
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    def start_framing(self) -> None:
        self.framing = True
        if self.buffer:
            self._decode()

    def next_frame(self) -> list[dict] | None:
        if not self.frames:
            return None
        frame = self.frames.popleft()
        if self._reading_paused and len(self.frames) <= QUEUED_FRAMES_HIGH // 4 and not self.lost:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        return frame

    def drained(self) -> Awaitable[None]:
        if self.lost or self.transport is None or not self.transport.get_write_buffer_size():
            return _DONE
        waiter = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        return waiter


class _Done:
    """An awaitable that is already done: a write the kernel took at once."""

    def __await__(self) -> Any:
        return None
        yield  # pragma: no cover  (makes this a generator)


_DONE = _Done()


class Comm:
    """One authenticated connection carrying frames, each a list of message dicts."""

    def __init__(self, protocol: _FrameProtocol, peer: str, local: str, max_frame: int = DEFAULT_MAX_FRAME):
        self._protocol = protocol
        self.transport = protocol.transport
        self.peer = protocol.peer = peer
        self.local = local
        self.max_frame = max_frame
        protocol.start_framing()

    @property
    def closed(self) -> bool:
        return self._protocol.lost or self.transport is None or self.transport.is_closing()

    async def deliver(self, receiver: Callable[[list[list[dict]]], None]) -> None:
        """Hand every frame to ``receiver`` as it is decoded (frames decoded together, together) until the
        connection ends, then raise why it ended (``CommClosedError``, or ``ProtocolError`` for a bad frame)."""
        protocol = self._protocol
        queued = list(protocol.frames)
        protocol.frames.clear()
        if queued:
            receiver(queued)
        protocol.receiver = receiver
        try:
            while protocol.error is None:
                await protocol.wait()
        finally:
            protocol.receiver = None
        raise protocol.error

    async def read(self) -> list[dict]:
        protocol = self._protocol
        while True:
            frame = protocol.next_frame()
            if frame is not None:
                return frame
            if protocol.error is not None:
                raise protocol.error
            await protocol.wait()

    def write(self, messages: list[dict]) -> Awaitable[None]:
        """Queue one frame (the kernel usually takes it at once). Returns an awaitable for the moment all of
        it has been handed to the kernel. Raises CommClosedError."""
        if self.closed:
            raise CommClosedError(f"connection to {self.peer} closed")
        body = msgpack.packb(messages, use_bin_type=True)
        if len(body) > self.max_frame:
            raise ProtocolError(f"refusing to send a frame of {len(body)} bytes (limit {self.max_frame})")
        if len(body) < 1 << 16:
            self.transport.write(HEADER.pack(len(body)) + body)
        else:
            self.transport.writelines((HEADER.pack(len(body)), body))  # no copy of a large payload to join them
        return self._protocol.drained()

    def abort(self) -> None:
        """Close: what was already handed to the transport still goes out, nothing more is read; a peer that
        does not take it within ``CLOSE_GRACE`` seconds is cut off (no socket is held open by a stalled peer)."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()
            if transport.get_write_buffer_size():
                try:
                    asyncio.get_running_loop().call_later(CLOSE_GRACE, transport.abort)
                except RuntimeError:   # not on a loop (interpreter shutdown): cut it off now
                    transport.abort()


def _peer_name(transport: asyncio.BaseTransport | None, fallback: Any) -> str:
    try:
        host, port = transport.get_extra_info("peername")[:2]  # type: ignore[union-attr]
        return format_address(host, port)
    except (OSError, AttributeError, TypeError):
        return str(fallback)


async def _server_handshake(protocol: _FrameProtocol, secret: bytes) -> None:
    nonce = os.urandom(NONCE_BYTES)
    protocol.transport.write(MAGIC + nonce)  # type: ignore[union-attr]
    reply = await protocol.read_exactly(NONCE_BYTES + MAC_BYTES)
    client_nonce, mac = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
    if not hmac.compare_digest(mac, _mac(secret, b"C", nonce, client_nonce)):
        raise AuthError("peer does not know the shared secret")
    protocol.transport.write(_mac(secret, b"S", client_nonce, nonce))  # type: ignore[union-attr]


async def _client_handshake(protocol: _FrameProtocol, secret: bytes) -> None:
    head = await protocol.read_exactly(len(MAGIC) + NONCE_BYTES)
    if head[: len(MAGIC)] != MAGIC:
        raise AuthError("peer is not a kwdiag server")
    server_nonce = head[len(MAGIC):]
    client_nonce = os.urandom(NONCE_BYTES)
    protocol.transport.write(client_nonce + _mac(secret, b"C", server_nonce, client_nonce))  # type: ignore
    try:
        proof = await protocol.read_exactly(MAC_BYTES)
    except CommClosedError:
        raise AuthError("the server closed the connection on our credentials (wrong shared secret?)") from None
    if not hmac.compare_digest(proof, _mac(secret, b"S", client_nonce, server_nonce)):
        raise AuthError("server failed to prove it knows the shared secret")


OnComm = Callable[[Comm], Awaitable[None]]
OnRefused = Callable[[str, str], None]


class Listener:
    """Accepts connections, authenticates each, then hands the ``Comm`` to ``on_comm``."""

    def __init__(self, credentials: Credentials | bytes, on_comm: OnComm, on_refused: OnRefused,
                 max_frame: int = DEFAULT_MAX_FRAME, handshake_timeout: float = HANDSHAKE_TIMEOUT):
        self.credentials = Credentials.of(credentials)
        self.secret = self.credentials.secret
        self.on_comm = on_comm
        self.on_refused = on_refused
        self.max_frame = max_frame
        self.handshake_timeout = handshake_timeout
        self._server: asyncio.base_events.Server | None = None
        self._accepting: set[asyncio.Task] = set()
        self.address = ""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        loop = asyncio.get_running_loop()
        tls = self.credentials.server_ssl

        def accepted() -> _FrameProtocol:
            protocol = _FrameProtocol(self.max_frame)
            protocol.tls_pending = tls is not None
            task = loop.create_task(self._accept(protocol))
            self._accepting.add(task)
            task.add_done_callback(self._accepting.discard)
            return protocol

        self._server = await loop.create_server(accepted, host=host, port=port, reuse_address=True,
                                                family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        bound_host, bound_port = self._server.sockets[0].getsockname()[:2]
        advertised = bound_host if bound_host not in ("0.0.0.0", "::") else socket.gethostname()
        self.address = format_address(advertised, bound_port, "tls" if tls else "tcp")
        return self.address

    async def _accept(self, protocol: _FrameProtocol) -> None:
        await protocol.made
        peer = _peer_name(protocol.transport, "unknown peer")
        protocol.peer = peer
        try:
            await asyncio.wait_for(self._handshake(protocol), self.handshake_timeout)
        except AuthError as exc:
            self._refuse(protocol, peer, str(exc))
            return
        except ssl.SSLError as exc:
            self._refuse(protocol, peer, f"TLS handshake failed: {exc.reason or exc}")
            return
        except asyncio.TimeoutError:
            self._refuse(protocol, peer, f"no handshake within {self.handshake_timeout:g}s")
            return
        except (CommClosedError, OSError):
            self._refuse(protocol, peer, "closed during the handshake")
            return
        await self.on_comm(Comm(protocol, peer, self.address, self.max_frame))

    def _refuse(self, protocol: _FrameProtocol, peer: str, reason: str) -> None:
        self.on_refused(peer, reason)
        if protocol.transport is not None:
            protocol.transport.abort()

    async def _handshake(self, protocol: _FrameProtocol) -> None:
        if self.credentials.server_ssl is not None:
            # Reading was paused as the connection was made, so the ClientHello is still in the socket for TLS.
            loop = asyncio.get_running_loop()
            plain = protocol.transport
            protocol.transport = await loop.start_tls(plain, protocol, self.credentials.server_ssl,
                                                      server_side=True,
                                                      ssl_handshake_timeout=self.handshake_timeout)
            protocol.transport.set_write_buffer_limits(high=0)
        await _server_handshake(protocol, self.secret)

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()


async def connect(address: str, credentials: Credentials | bytes, *, timeout: float = 10.0,
                  max_frame: int = DEFAULT_MAX_FRAME) -> Comm:
    """Open an authenticated comm to ``address``; raise CommClosedError if that fails in time."""
    credentials = Credentials.of(credentials)
    host, port = parse_address(address)
    tls = address.startswith("tls://")
    if tls and credentials.client_ssl is None:
        raise CommClosedError(f"{address} uses TLS: give this process the cluster's TLS settings "
                              "(--tls-cert/--tls-key/--tls-ca, or security=)")
    if not tls and credentials.client_ssl is not None:
        raise CommClosedError(f"refusing a plain connection to {address}: this process is set up for TLS")
    loop = asyncio.get_running_loop()

    async def _open() -> _FrameProtocol:
        transport, protocol = await loop.create_connection(
            lambda: _FrameProtocol(max_frame), host, port,
            ssl=credentials.client_ssl if tls else None, server_hostname=host if tls else None)
        protocol.peer = address
        try:
            await _client_handshake(protocol, credentials.secret)
        except CommClosedError as exc:
            transport.abort()
            if tls:   # asyncio's TLS drops the alert a refusing server sends: a close here is that refusal
                raise AuthError(f"TLS handshake with {address} failed: the server closed the connection before "
                                "the handshake ended (it refused our certificate?)") from None
            raise exc
        except BaseException:
            transport.abort()
            raise
        return protocol

    try:
        protocol = await asyncio.wait_for(_open(), timeout)
    except AuthError:
        raise
    except asyncio.TimeoutError:
        raise CommClosedError(f"timed out connecting to {address} after {timeout:g}s") from None
    except ssl.SSLError as exc:
        raise AuthError(f"TLS handshake with {address} failed: {exc.reason or exc}") from None
    except (CommClosedError, OSError) as exc:
        raise CommClosedError(f"could not connect to {address}: {exc}") from None
    if protocol.lost:  # the peer closed the connection as soon as the handshake was done (it died)
        raise CommClosedError(f"connection to {address} closed as it opened")
    local = ""
    try:
        lhost, lport = protocol.transport.get_extra_info("sockname")[:2]  # type: ignore[union-attr]
        local = format_address(lhost, lport)
    except (OSError, AttributeError, TypeError):
        pass
    return Comm(protocol, address, local, max_frame)
