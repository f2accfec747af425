"""The worker's end of an SSH connection: :class:`SSHChannel` and the file-like channel ends.

A worker started by :meth:`skyward.transport.ssh.SSHTransport.start` prints
:data:`START_MARKER` and its process id on stdout before it ``exec``s the worker;
:func:`read_start_marker` swallows everything before that line, so noise from a login script
never reaches the protocol stream. :class:`ChannelReader` and :class:`ChannelWriter` make a
paramiko channel's stdout/stderr and stdin file-like; :func:`hear_exit_signals` lets a channel
report a worker killed by a signal.

paramiko is imported inside functions only.
"""

from __future__ import annotations

import contextlib
import io
import signal
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from skyward._optional import require
from skyward.errors import BootstrapError
from skyward.transport.base import Channel, CommandResult

__all__ = [
    "START_MARKER",
    "ChannelReader",
    "ChannelWriter",
    "Host",
    "SSHChannel",
    "hear_exit_signals",
    "read_start_marker",
]

#: Printed (with the worker's pid) on stdout right before the worker is exec'd.
START_MARKER = b"::skyward-worker:: "
_MAX_READ = 1024 * 1024
_RECV_ALL = 1 << 30  # "everything buffered": paramiko never holds more than the window
_BUFFER = 256 * 1024


def hear_exit_signals(transport: Any) -> None:
    """Make ``transport``'s channels record a remote process killed by a signal.

    sshd reports such a death with an ``exit-signal`` request (RFC 4254, 6.10: the signal's
    name without "SIG"), which paramiko ignores, leaving ``exit_status`` at -1. For this
    transport only, that request sets ``exit_status`` to minus the signal's number, as
    ``subprocess`` reports it. Every other request goes to paramiko's own handler.
    """
    paramiko = require("paramiko", "an SSH connection")

    table = getattr(type(transport), "_channel_handler_table", None)
    request = getattr(paramiko.common, "MSG_CHANNEL_REQUEST", None)
    if not isinstance(table, dict) or request not in table:
        return  # another paramiko: exit codes of killed workers read -1, as before
    handle = table[request]

    def handle_request(chan: Any, m: Any) -> None:
        start = m.packet.tell()
        if m.get_text() == "exit-signal":
            m.get_boolean()  # want reply: never, for exit-signal
            name = m.get_text()
            try:
                chan.exit_status = -int(signal.Signals["SIG" + name])
            except KeyError:
                chan.exit_status = -1
            chan.status_event.set()
            return
        m.packet.seek(start)
        handle(chan, m)

    transport._channel_handler_table = {**table, request: handle_request}


# -- file-like ends of a paramiko channel ----------------------------------------------------------


class ChannelReader(io.RawIOBase):
    """A raw reader over ``recv``-like callables (stdout or stderr of a paramiko channel).

    paramiko has no ``recv_into``, and its ``recv(n)`` with less than everything buffered
    copies the rest of its buffer down each time. So every ``recv`` takes all that is
    buffered, and what does not fit the caller's buffer waits here for the next read.
    """

    def __init__(self, recv: Callable[[int], bytes], prefix: bytes = b""):
        self._recv = recv
        self._pending = memoryview(prefix)

    def readable(self) -> bool:
        return True

    def pending(self) -> int:
        """Bytes received from the channel and not yet read (the channel's fd can't show them)."""
        return len(self._pending)

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        if not self._pending:
            try:
                self._pending = memoryview(self._recv(_RECV_ALL))
            except (OSError, EOFError):
                return 0
        n = min(len(view), len(self._pending))
        view[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


class ChannelWriter(io.RawIOBase):
    """A raw writer onto a paramiko channel; ``close`` sends EOF (the worker sees end of input)."""

    def __init__(self, chan: Any):
        self._chan = chan

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        total = len(view)
        while view:
            sent = self._chan.send(view)  # raises OSError once the channel is closed
            if sent == 0:
                raise BrokenPipeError("the SSH channel to the worker is closed")
            view = view[sent:]
        return total

    def close(self) -> None:
        if not self.closed:
            with contextlib.suppress(Exception):
                self._chan.shutdown_write()
        super().close()


# -- the worker's channel --------------------------------------------------------------------------


def read_start_marker(chan: Any, host: str, timeout: float) -> tuple[int | None, bytes, bytes]:
    """Read stdout up to the start marker: (pid, bytes after it, bytes before it).

    Raises BootstrapError (naming ``host``) when the marker does not come within ``timeout``
    seconds or the command exits first (with what it printed).
    """
    deadline = time.monotonic() + timeout
    buf = b""
    chan.settimeout(0.5)
    try:
        while True:
            idx = buf.find(START_MARKER)
            if idx >= 0:
                end = buf.find(b"\n", idx)
                if end >= 0:
                    pid = buf[idx + len(START_MARKER):end].strip()
                    noise = buf[:idx].strip()
                    return (int(pid) if pid.isdigit() else None), buf[end + 1:], noise + b"\n" if noise else b""
            if time.monotonic() > deadline:
                raise BootstrapError(host, "starting worker", "the launch command never started",
                                     log_tail=buf.decode("utf-8", "replace").splitlines()[-20:])
            try:
                data = chan.recv(_MAX_READ)
            except (socket.timeout, TimeoutError):
                continue
            if not data:  # it exited before starting the worker: keep its words
                status = chan.exit_status if chan.status_event.wait(2.0) else None
                err = b""
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(_MAX_READ)
                tail = (buf + err).decode("utf-8", "replace").splitlines()[-20:]
                raise BootstrapError(host, "starting worker", "the launch command exited early",
                                     exit_code=status, log_tail=tail)
            buf += data
    finally:
        chan.settimeout(None)


class Host(Protocol):
    """What a channel asks of its transport (an :class:`~skyward.transport.ssh.SSHTransport`)."""

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult: ...

    def kill_group(self, pgid: int, timeout: float = 5.0, tree: str = "") -> bool: ...


class SSHChannel(Channel):
    """A worker started over SSH. ``pgid`` is its process group on the host (None if unknown)."""

    def __init__(self, transport: Host, chan: Any, pgid: int | None, stdout_prefix: bytes,
                 stderr_prefix: bytes, tree: str = ""):
        self._transport = transport
        self._chan = chan
        self.pgid = pgid
        self.tree = tree  # SKYWARD_TREE of every process the worker's tree holds
        self.stdin = io.BufferedWriter(ChannelWriter(chan), _BUFFER)  # type: ignore[assignment]
        self.stdout = ChannelReader(chan.recv, stdout_prefix)  # type: ignore[assignment]  # the frame reader buffers
        self.stderr = io.BufferedReader(ChannelReader(chan.recv_stderr, stderr_prefix), _BUFFER)  # type: ignore[assignment]

    def poll_fd(self) -> int:
        # paramiko keeps a pipe that is readable exactly while the channel holds unread stdout
        # (or has ended), so a waiting caller polls it like a local pipe (the frame reader
        # counts what ChannelReader already took).
        return int(self._chan.fileno())

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._chan.status_event.wait(timeout):
            return None
        # -1: the channel closed without an exit status (killed by a signal, or closed by us).
        return int(self._chan.exit_status)

    def kill(self, timeout: float = 10.0) -> None:
        if self.pgid is not None:
            # The guard first (see LocalChannel.kill): on SIGTERM it kills the worker and every
            # process below it, detached ones included; then whatever is left of the group.
            pgid = self.pgid
            command = (f"kill -TERM {pgid} 2>/dev/null; i=0; "
                       f"while kill -0 {pgid} 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; "
                       f"kill -9 -{pgid} 2>/dev/null; true")
            deadline = time.monotonic() + timeout
            try:  # (a host that does not answer within ``timeout`` is not waited for again)
                self._transport.run(command, timeout=timeout)
            except Exception:
                pass
            else:
                self._chan.status_event.wait(max(0.0, min(2.0, deadline - time.monotonic())))
        with contextlib.suppress(Exception):
            self._chan.close()

    def confirm_gone(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        self.wait(max(0.0, min(1.0, deadline - time.monotonic())))
        if self.pgid is None:
            # It never reported a pid, so it never reached the worker: gone once the channel is.
            return self.wait(max(0.0, deadline - time.monotonic())) is not None
        gone = self._transport.kill_group(self.pgid, max(0.0, deadline - time.monotonic()), self.tree)
        if gone:
            with contextlib.suppress(Exception):
                self._chan.close()
        return gone
