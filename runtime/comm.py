"""Authenticated, framed TCP connections: the only module of the runtime that knows tornado.

Covers: listening and connecting on TCP (TCP_NODELAY), the shared-secret challenge-response
handshake that every connection passes *before* any frame is read, and frames of the form
``4-byte big-endian length + msgpack`` whose payload is a list of message dicts. Every way a
connection can end surfaces as one ``CommClosedError`` (or its subclasses ``AuthError`` and
``ProtocolError``, which say why it was ended on purpose).

With ``Security`` (a certificate, its key and the CA that signed the cluster's certificates), every
connection is TLS (``tls://`` addresses), mutually authenticated by certificate, and the shared-secret
handshake still runs inside it.

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
import hashlib
import hmac
import os
import socket
import ssl
import struct
from dataclasses import dataclass
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

    def __init__(self, credentials: Credentials | bytes, on_comm: OnComm, on_refused: OnRefused,
                 max_frame: int = DEFAULT_MAX_FRAME, handshake_timeout: float = HANDSHAKE_TIMEOUT):
        self.credentials = Credentials.of(credentials)
        self.secret = self.credentials.secret
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
        tls = self.credentials.server_ssl
        self._server = _Server(max_buffer_size=self.max_frame + HEADER.size, ssl_options=tls)
        self._server.add_sockets(sockets)
        bound_host, bound_port = sockets[0].getsockname()[:2]
        advertised = bound_host if bound_host not in ("0.0.0.0", "::") else socket.gethostname()
        self.address = format_address(advertised, bound_port, "tls" if tls else "tcp")
        return self.address

    async def _accept(self, stream: IOStream, address: Any) -> None:
        peer = _peer_name(stream, address)
        stream.set_nodelay(True)
        try:
            await asyncio.wait_for(self._handshake(stream), self.handshake_timeout)
        except AuthError as exc:
            self.on_refused(peer, str(exc))
            stream.close()
            return
        except ssl.SSLError as exc:
            self.on_refused(peer, f"TLS handshake failed: {exc.reason or exc}")
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

    async def _handshake(self, stream: IOStream) -> None:
        if self.credentials.server_ssl is not None:
            if stream.closed():
                # The TLS handshake already failed while this coroutine waited for its turn on the loop;
                # tornado resolves wait_for_handshake() only on a close that comes after it, so it would hang.
                if isinstance(stream.error, ssl.SSLError):
                    raise stream.error
                raise StreamClosedError(real_error=stream.error)
            try:
                await stream.wait_for_handshake()
            except StreamClosedError as exc:
                if isinstance(exc.real_error, ssl.SSLError):
                    raise exc.real_error from None
                raise
        await _server_handshake(stream, self.secret)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()


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

    async def _open() -> IOStream:
        stream = await TCPClient().connect(host, port, max_buffer_size=max_frame + HEADER.size,
                                           ssl_options=credentials.client_ssl if tls else None)
        stream.set_nodelay(True)
        try:
            await _client_handshake(stream, credentials.secret)
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
    except ssl.SSLError as exc:
        raise AuthError(f"TLS handshake with {address} failed: {exc.reason or exc}") from None
    except (StreamClosedError, OSError) as exc:
        real = getattr(exc, "real_error", None)
        if isinstance(real, ssl.SSLError):  # the server rejected our certificate (or we its)
            raise AuthError(f"TLS handshake with {address} failed: {real.reason or real}") from None
        raise CommClosedError(f"could not connect to {address}: {exc}") from None
    if stream.socket is None:  # the peer closed the connection as soon as the handshake was done (it died)
        raise CommClosedError(f"connection to {address} closed as it opened")
    local = _peer_name(stream, "")
    try:
        lhost, lport = stream.socket.getsockname()[:2]
        local = format_address(lhost, lport)
    except (OSError, AttributeError):
        pass
    return Comm(stream, address, local, max_frame)
