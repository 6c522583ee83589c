"""TLS: every connection encrypted and mutually authenticated by certificate, with certificates made here.

A cluster with TLS computes as usual; a plain-TCP peer, a peer with no certificate and a peer whose
certificate another CA signed are all refused and logged, and the wire never carries kwdiag's plaintext.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess

import pytest

from conftest import read_events, wait_until
from kwdiag.runtime import Client, CommClosedError, LocalCluster, Security
from kwdiag.runtime.comm import AuthError, parse_address

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def inc(x):
    return x + 1


def make_ca(folder, name):
    key, cert = folder / f"{name}-ca.key", folder / f"{name}-ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", f"/CN={name} test CA"], check=True, capture_output=True)
    return key, cert


def make_cert(folder, name, ca_key, ca_cert):
    key, csr, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.pem"
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
                    "-subj", f"/CN={name}"], check=True, capture_output=True)
    ext = folder / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
    subprocess.run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
                    "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext)],
                   check=True, capture_output=True)
    return str(cert), str(key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert = make_ca(folder, "cluster")
    rogue_key, rogue_cert = make_ca(folder, "rogue")
    return {"cluster": Security(*make_cert(folder, "node", ca_key, ca_cert), str(ca_cert)),
            "rogue": Security(*make_cert(folder, "intruder", rogue_key, rogue_cert), str(ca_cert)),
            "ca": str(ca_cert)}


@pytest.fixture(scope="module")
def cluster(pki, tmp_path_factory):
    log_dir = str(tmp_path_factory.mktemp("tls-logs"))
    with LocalCluster(n_workers=2, memory_limit=None, log_dir=log_dir, security=pki["cluster"]) as cluster:
        yield cluster


def test_a_tls_cluster_computes_and_recovers(cluster):
    assert cluster.scheduler_address.startswith("tls://")
    with Client(cluster) as client:
        workers = client.scheduler_info()["workers"]
        assert all(a.startswith("tls://") and w["nanny"].startswith("tls://") for a, w in workers.items())
        futures = client.map(inc, range(50))
        assert client.submit(sum, futures).result(timeout=30) == sum(range(1, 51))  # peers fetch over TLS too
        assert client.run(lambda: 1) == {a: 1 for a in workers}


def test_peers_without_the_right_certificate_are_refused(cluster, pki):
    secret = cluster.secret  # even knowing the shared secret is not enough without a certificate
    with pytest.raises(CommClosedError, match="uses TLS"):
        Client(cluster.scheduler_address, secret=secret, timeout=30)
    with pytest.raises(AuthError):
        Client(cluster.scheduler_address, secret=secret, security=pki["rogue"], timeout=30)
    host, port = parse_address(cluster.scheduler_address)
    anonymous = ssl.create_default_context(cafile=pki["ca"])
    anonymous.check_hostname = False
    with socket.create_connection((host, port), timeout=10) as raw:
        try:
            with anonymous.wrap_socket(raw) as tls:   # no client certificate
                got = tls.recv(36)
        except (ssl.SSLError, OSError):   # the refusal's alert, when it arrives before the close
            got = b""
        assert got == b"", got   # closed before a byte of kwdiag's own handshake
    def reasons():
        return " | ".join(e.fields["reason"] for e in read_events(cluster.log_dir, "auth-refused", source="scheduler"))
    # The certificate from another CA, and no certificate at all: both refused and logged as such.
    wait_until(lambda: "CERTIFICATE_VERIFY_FAILED" in reasons() and "DID_NOT_RETURN_A_CERTIFICATE" in reasons(),
               what="both TLS refusals logged")


def test_the_wire_carries_no_plaintext(cluster):
    host, port = parse_address(cluster.scheduler_address)
    with socket.create_connection((host, port), timeout=10) as raw:
        raw.settimeout(8)
        received = b""
        try:
            while True:
                chunk = raw.recv(4096)
                if not chunk:
                    break
                received += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    assert b"KWD1" not in received   # a plain server greets with its magic; a TLS server waits for a ClientHello


def test_a_tls_client_refuses_a_plain_server(pki, tmp_path):
    with LocalCluster(n_workers=1, memory_limit=None, log_dir=str(tmp_path / "plain")) as plain:
        with pytest.raises(CommClosedError, match="refusing a plain connection"):
            Client(plain.scheduler_address, secret=plain.secret, security=pki["cluster"], timeout=30)


def test_tls_options_are_checked():
    with pytest.raises(ValueError, match="all three"):
        Security.from_options("a.pem", None, None)
    with pytest.raises(ValueError, match="no such file"):
        Security("/nonexistent.pem", "/nonexistent.key", "/nonexistent-ca.pem")


def test_a_tls_handshake_that_fails_is_refused_at_once_as_a_tls_failure(pki):
    """Regression (first seen with tornado under load): a TLS handshake that failed before the server's accept
    coroutine ran was logged 5 s late, as a handshake timeout. Garbage instead of a ClientHello on a real
    socket must be refused at once, and as what it is."""
    import asyncio

    from kwdiag.runtime.comm import Credentials, Listener

    async def scenario():
        refused = []
        listener = Listener(Credentials(b"s" * 32, pki["cluster"]), on_comm=None,
                            on_refused=lambda peer, reason: refused.append(reason), handshake_timeout=30)
        host, port = parse_address(await listener.start("127.0.0.1", 0))
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET / HTTP/1.1\r\n\r\n" * 8)
        try:
            for _ in range(1000):   # a condition, 20 s at most: well under the 30 s handshake timeout
                if refused:
                    break
                await asyncio.sleep(0.02)
        finally:
            writer.close()
            listener.stop()
        return refused

    refused = asyncio.run(scenario())
    assert len(refused) == 1 and refused[0].startswith("TLS handshake failed"), refused
