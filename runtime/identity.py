"""Who a cluster is: its shared secret, the scheduler file that carries it, and a cluster id.

Covers: reading and writing the scheduler file (JSON: address, secret, pid; mode 0600, replaced
atomically so a reader never sees half a file); which secret a scheduler uses (``--new-secret``,
else ``KWDIAG_SECRET``, else the secret already in its scheduler file, so a restarted scheduler
keeps its cluster's identity, else a fresh one); ``Follower``, with which a worker or client that
started from a scheduler file re-reads it on every reconnection attempt (a scheduler that comes
back on another port or host is found; a file that now names another cluster is not followed);
and ``cluster_id``, a fingerprint of the secret that names the cluster in journals without
revealing the secret.

Does not cover: authenticating connections (``runtime.comm``) or what a journal holds
(``runtime.journal``). Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time

FILE_TYPE = "kwdiag-scheduler"


class StartupError(Exception):
    """A process cannot start: one line for the user and an exit code (README "Exit codes").

    2: bad input (arguments, an unreadable scheduler file, a file of another cluster);
    3: the process could not start (a port in use, a scheduler file that cannot be written).
    """

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


class OtherClusterError(StartupError):
    """The scheduler file names another cluster than the secret this process was given."""


def cluster_id(secret: bytes) -> str:
    """A public name for the cluster of ``secret`` (an HMAC of a constant: the secret cannot be recovered)."""
    return hmac.new(secret, b"kwdiag-cluster-id", hashlib.sha256).hexdigest()[:16]


def read_scheduler_file(path: str) -> tuple[str, bytes | None]:
    """``(address, secret)`` from a scheduler file; ``StartupError`` (exit 2) saying what is wrong with it."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise StartupError(f"cannot read scheduler file {path}: {exc.strerror or exc}") from None
    try:
        info = json.loads(text)
        address = info["address"]
        secret = bytes.fromhex(info["secret"]) if info.get("secret") else None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise StartupError(f"cannot read scheduler file {path}: not a kwdiag scheduler file "
                           "(expected JSON with an address and a secret)") from None
    if info.get("type", FILE_TYPE) != FILE_TYPE or not isinstance(address, str):
        raise StartupError(f"cannot read scheduler file {path}: not a kwdiag scheduler file")
    return address, secret


def write_scheduler_file(path: str, address: str, secret: bytes) -> None:
    """Write the scheduler file readable by its owner only (0600), replacing any old one atomically."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"type": FILE_TYPE, "address": address, "secret": secret.hex(), "pid": os.getpid(),
                       "cluster": cluster_id(secret), "written": round(time.time(), 3)}, f)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except OSError as exc:
        raise StartupError(f"cannot write scheduler file {path}: {exc.strerror or exc}", 3) from None


def env_secret() -> bytes | None:
    """``KWDIAG_SECRET`` (hex), or None when it is unset or empty."""
    raw = os.environ.get("KWDIAG_SECRET")
    if not raw:
        return None
    try:
        return bytes.fromhex(raw)
    except ValueError:
        raise StartupError("KWDIAG_SECRET must be hex") from None


def scheduler_secret(scheduler_file: str | None, new_secret: bool = False) -> tuple[bytes, str]:
    """The secret a starting scheduler uses, and where it came from (``new``, ``env``, ``file``).

    A scheduler restarted with the same command finds its cluster's secret in its scheduler file, so
    the workers and clients that hold it are not refused. ``KWDIAG_SECRET`` names the cluster when set;
    a scheduler file holding another secret then belongs to another cluster and is not overwritten.
    """
    from_env = env_secret()
    if new_secret:
        if from_env:
            raise StartupError("--new-secret asks for a new cluster secret but KWDIAG_SECRET sets one: unset "
                               "KWDIAG_SECRET, or drop --new-secret")
        return secrets.token_bytes(32), "new"
    in_file = None
    if scheduler_file and os.path.lexists(scheduler_file):
        _, in_file = read_scheduler_file(scheduler_file)
    if from_env and in_file and not hmac.compare_digest(from_env, in_file):
        raise OtherClusterError(f"scheduler file {scheduler_file} belongs to another cluster (its secret is not "
                                "KWDIAG_SECRET): remove it, choose another --scheduler-file, or unset KWDIAG_SECRET "
                                "to rejoin that cluster")
    if from_env:
        return from_env, "env"
    if in_file:
        return in_file, "file"
    return secrets.token_bytes(32), "new"


def worker_identity(address: str | None, scheduler_file: str | None) -> tuple[str, bytes]:
    """``(address, secret)`` for a worker or nanny: from the scheduler file, else ``ADDRESS`` + ``KWDIAG_SECRET``."""
    secret = None
    from_env = env_secret()
    if scheduler_file:
        address, secret = read_scheduler_file(scheduler_file)
        if from_env and secret and not hmac.compare_digest(from_env, secret):
            raise OtherClusterError(f"scheduler file {scheduler_file} belongs to another cluster (its secret is not "
                                    "KWDIAG_SECRET)")
    if not address:
        raise StartupError("give the scheduler's ADDRESS or --scheduler-file")
    secret = secret or from_env
    if not secret:
        raise StartupError("no shared secret: pass --scheduler-file (written by `kwdiag scheduler`) or set "
                           "KWDIAG_SECRET to the scheduler's secret")
    return address, secret


class Follower:
    """Where the scheduler is now: re-reads the scheduler file (if any) each time it is asked.

    A file that cannot be read (being replaced, briefly absent) keeps the last address; a file that
    now holds another secret belongs to another cluster and is not followed (``other_cluster`` is set,
    so the caller can say so once).
    """

    def __init__(self, address: str, secret: bytes, scheduler_file: str | None = None):
        self.address = address
        self.secret = secret
        self.scheduler_file = scheduler_file
        self.other_cluster = False

    def current(self) -> str:
        if not self.scheduler_file:
            return self.address
        try:
            address, secret = read_scheduler_file(self.scheduler_file)
        except StartupError:
            return self.address
        if secret is not None and not hmac.compare_digest(secret, self.secret):
            self.other_cluster = True
            return self.address
        self.other_cluster = False
        self.address = address
        return address
