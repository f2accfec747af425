"""Opening one SSH connection for :class:`~skyward.transport.ssh.SSHTransport` (see
:func:`open_client`): the host-key checks, authentication, the way there (directly, through a
ProxyCommand, or through a jump host), the keepalive, and Nagle's algorithm off (:func:`_tcp`).

Host keys are checked against the ``known_hosts`` files given, and an unknown or changed key
refuses the connection (:func:`~skyward.transport._ssh_errors.reject_policy`), unless
``verify_host_keys=False``: then any key is accepted and kept in memory only. With an explicit
key file, only that key is offered (no agent, no ``~/.ssh`` keys). Every failure raises
:class:`~skyward.errors.BootstrapError` with ``step="connect"`` and a sentence saying why
(:func:`~skyward.transport._ssh_errors.explain`); the jump host's own failure names that hop.
paramiko is imported inside functions only.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

from skyward._optional import require
from skyward.errors import BootstrapError
from skyward.transport._ssh_channel import hear_exit_signals
from skyward.transport._ssh_errors import _UnknownHostKey, explain, reject_policy

__all__ = ["open_client"]

_KEEPALIVE_S = 30

#: known_hosts files as read: path -> ((inode, size, mtime), paramiko HostKeys).
_read: dict[str, tuple[tuple[int, int, int], Any]] = {}
_read_lock = threading.Lock()


def _quiet_paramiko() -> None:
    # A library should not print through logging's last-resort handler; with a NullHandler
    # paramiko's records still reach the user's own logging configuration, if any.
    logger = logging.getLogger("paramiko")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())


def open_client(target: Any, node: int | None, log_tail: Sequence[str]) -> tuple[Any, Any]:
    """A connected paramiko ``SSHClient`` for ``target`` (an ``SSHTransport``: its address,
    port, user, key, known_hosts, timeouts and way there), and the transport of the jump host it
    goes through (None without one; the caller closes it with the connection).

    Raises BootstrapError(step="connect") saying why (``node`` and ``log_tail`` go into it).
    """
    paramiko = require("paramiko", "an SSH connection")

    _quiet_paramiko()
    client = paramiko.SSHClient()
    if target.verify_host_keys:
        _known_keys(client, target)
        client.set_missing_host_key_policy(reject_policy())
    else:
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # in memory only
    explicit = target.key_filename is not None
    jump = None
    try:
        sock, jump = _tunnel(target, node, log_tail)
        if sock is None:
            sock = _tcp(target)
        client.connect(
            target.address, port=target.port, username=target.user,
            key_filename=target.key_filename, allow_agent=not explicit, look_for_keys=not explicit,
            timeout=target.connect_timeout, banner_timeout=target.connect_timeout,
            auth_timeout=target.connect_timeout, sock=sock,
        )
    except BaseException as exc:
        client.close()
        if jump is not None:
            jump.close()
        if isinstance(exc, BootstrapError) or not isinstance(exc, Exception):
            raise  # (the jump host's own failure says where it happened)
        # A key that is unknown or does not match stays so: retrying cannot help.
        raise BootstrapError(target.host, "connect", explain(target, exc), node=node,
                             log_tail=[*log_tail, f"{type(exc).__name__}: {exc}"],
                             permanent=isinstance(exc, (_UnknownHostKey, paramiko.BadHostKeyException))
                             ) from exc
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(_KEEPALIVE_S)
        hear_exit_signals(transport)
    return client, jump


def _tcp(target: Any) -> socket.socket:
    """A TCP connection to the host's SSH port with Nagle's algorithm off (``TCP_NODELAY``, as
    OpenSSH sets for interactive sessions). With it on (paramiko's sockets), a small packet sent
    while the last one is unacknowledged waits for the host's delayed ACK, up to 40 ms: the
    handshake took 70-120 ms instead of 20-40, and each command's exec 45 ms instead of 3
    (measured on the test hosts)."""
    sock = socket.create_connection((target.address, target.port), timeout=target.connect_timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _known_keys(client: Any, target: Any) -> None:
    """Give ``client`` the keys its known_hosts files hold for ``target`` (only read, never
    written back), as if it had read the files: the first file's key of a type wins.

    Each file is parsed once per version (inode, size, mtime) in this process, not once per
    connection: a pool's hosts are usually all in one file, so each connection parsed every
    host's line (25 µs a line; 3 ms a connection for a file of 64 hosts, 0.2 s of a 64-host
    start, growing with the square of the pool's size).
    """
    name = target.address if target.port == 22 else f"[{target.address}]:{target.port}"
    known = client.get_host_keys()
    for path in target.known_hosts:
        had = known.lookup(name) or {}
        for keytype, key in (_parsed(path).lookup(name) or {}).items():
            if keytype not in had:
                known.add(name, keytype, key)


def _parsed(path: str) -> Any:
    """known_hosts file ``path`` as a paramiko HostKeys (empty if it is no file)."""
    paramiko = require("paramiko", "an SSH connection")
    try:
        st = os.stat(path)
    except OSError:
        return paramiko.HostKeys()
    version = (st.st_ino, st.st_size, st.st_mtime_ns)
    with _read_lock:
        found = _read.get(path)
    if found is not None and found[0] == version:
        return found[1]
    keys = paramiko.HostKeys()
    if os.path.isfile(path):
        keys.load(path)
    with _read_lock:
        _read[path] = (version, keys)
    return keys


def _tunnel(target: Any, node: int | None, log_tail: Sequence[str]) -> tuple[Any, Any]:
    """(the socket to connect over, the jump host's transport): ProxyCommand: the command's
    stdin/stdout; ProxyJump: a channel from the jump host to the target's SSH port; neither:
    (None, None), connect directly.

    The jump host is reached by a transport of its own (itself possibly through another jump),
    with the same host-key checks; BootstrapError names the hop that failed.
    """
    if target.proxy_command is not None:
        paramiko = require("paramiko", "an SSH connection")
        try:
            return paramiko.ProxyCommand(target.proxy_command), None
        except Exception as exc:
            raise BootstrapError(target.host, "connect", f"the ProxyCommand {target.proxy_command!r} could not "
                                 f"start: {exc}", node=node, log_tail=list(log_tail)) from exc
    if target.jump is None:
        return None, None
    jump = type(target).to(target.jump)
    jump.connect(node=node, log_tail=log_tail)
    try:
        return jump._client.get_transport().open_channel(
            "direct-tcpip", (target.address, target.port), ("127.0.0.1", 0), timeout=target.connect_timeout), jump
    except Exception as exc:
        jump.close()
        raise BootstrapError(target.host, "connect", f"the jump host {jump.host} cannot open a connection to "
                             f"{target.address}:{target.port}: {exc}", node=node,
                             log_tail=[*log_tail, f"{type(exc).__name__}: {exc}"]) from exc
