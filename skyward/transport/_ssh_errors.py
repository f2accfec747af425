"""Why an SSH connection failed, as one precise, actionable sentence (see :func:`explain`).

:func:`reject_policy` refuses a host whose key is in no known_hosts file with
:class:`_UnknownHostKey`, so that the message can show the key's fingerprint. paramiko is
imported inside functions only.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import socket
from typing import Any, Protocol

from skyward._optional import require

__all__ = ["Target", "explain", "fingerprint", "reject_policy"]


class Target(Protocol):
    """What a connect was aimed at (an :class:`~skyward.transport.ssh.SSHTransport`'s settings)."""

    address: str
    port: int
    user: str
    key_filename: str | None
    known_hosts: tuple[str, ...]
    connect_timeout: float


def fingerprint(key: Any) -> str:
    """A key's fingerprint as OpenSSH shows it: ``SHA256:<base64, unpadded>``."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _UnknownHostKey(Exception):
    """A host key in no known_hosts file. The name is kept from before the split: it shows in
    a failed connect's last output ("_UnknownHostKey: unknown host key for ...")."""

    def __init__(self, name: str, key: Any):
        super().__init__(f"unknown host key for {name}")
        self.name = name
        self.key = key


def reject_policy() -> Any:
    """A paramiko host key policy that refuses an unknown host with :class:`_UnknownHostKey`."""
    paramiko = require("paramiko", "an SSH connection")

    class RejectUnknown(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            raise _UnknownHostKey(hostname, key)

    return RejectUnknown()


def explain(t: Target, exc: BaseException) -> str:
    """A precise, actionable sentence for ``t``'s failed connect."""
    paramiko = require("paramiko", "an SSH connection")

    where = f"{t.address}:{t.port}"
    files = ", ".join(t.known_hosts) or "no known_hosts file"
    if isinstance(exc, _UnknownHostKey):
        return (f"the host key of {exc.name} ({exc.key.get_name()} {fingerprint(exc.key)}) is not in "
                f"{files}; add it (e.g. `ssh-keyscan -p {t.port} {t.address} >> ~/.ssh/known_hosts` "
                f"after checking the fingerprint) or, for throw-away machines only, pass verify_host_keys=False")
    if isinstance(exc, paramiko.BadHostKeyException):
        return (f"the host key of {where} ({fingerprint(exc.key)}) does not match the one in {files} "
                f"({fingerprint(exc.expected_key)}): the host was reinstalled, or someone is in between; "
                f"if you trust the new key, remove the old one (`ssh-keygen -R {t.address}`)")
    if isinstance(exc, paramiko.PasswordRequiredException):
        return (f"the private key {t.key_filename or '(from ~/.ssh)'} is protected by a passphrase; "
                f"load it into ssh-agent (`ssh-add`) and leave key unset")
    if isinstance(exc, paramiko.AuthenticationException):
        tried = f"the key {t.key_filename}" if t.key_filename else "the SSH agent's keys and ~/.ssh/id_*"
        return (f"authentication as {t.user!r} was refused (tried {tried}); check that the matching "
                f"public key is in ~{t.user}/.ssh/authorized_keys on the host")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        errors = list(exc.errors.values())
        first = errors[0] if errors else exc
        if isinstance(first, ConnectionRefusedError) or getattr(first, "errno", None) == errno.ECONNREFUSED:
            return f"connection refused by {where} (no SSH server listening on port {t.port}?)"
        return f"cannot reach {where}: {getattr(first, 'strerror', None) or first}"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host name {t.address!r}: {exc.strerror}"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return (f"no answer from {where} within {t.connect_timeout:g}s "
                f"(host down or unreachable, or the port is filtered)")
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused by {where} (no SSH server listening on port {t.port}?)"
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
        return f"cannot reach {where}: {exc.strerror}"
    if isinstance(exc, paramiko.SSHException):
        return f"the SSH handshake with {where} failed: {exc}"
    if isinstance(exc, EOFError):
        return f"{where} closed the connection during the SSH handshake"
    if isinstance(exc, OSError):
        return f"cannot connect to {where}: {exc.strerror or exc}"
    return f"cannot connect to {where}: {type(exc).__name__}: {exc}"
