"""SSH transport (paramiko): one connection per machine for commands, files and the worker.

Everything goes over a single authenticated SSH connection per host: short commands and the
bootstrap script run in exec channels, files travel by SFTP, and the worker's framed byte
stream is the stdin/stdout of one more exec channel. Nothing listens on the network for the
worker; no port is forwarded.

Guarantees, in addition to those of :mod:`skyward.transport.base`:

1. Host keys are checked against the ``known_hosts`` files given (by default
   ``~/.ssh/known_hosts`` and ``/etc/ssh/ssh_known_hosts``) and an unknown or changed key
   refuses the connection, unless ``verify_host_keys=False`` (then any key is accepted and
   kept in memory only; nothing is written to a known_hosts file).
2. Errors from paramiko and the socket layer never escape raw: connecting raises
   :class:`~skyward.errors.BootstrapError` with ``step="connect"`` and a message saying what
   went wrong (unreachable, refused, unknown host key, key refused...); later failures raise
   ``BootstrapError`` or ``OSError`` (a broken stream, as a pipe would).
3. The worker's process group is known: the launch command prints a marker line with its
   process id on stdout before it ``exec``s the worker (which leads its own process group),
   and the channel swallows everything up to that marker — so noise from a login script can
   never corrupt the protocol stream. :meth:`SSHChannel.kill` closes the channel *and*
   ``kill -9``s that group over a separate exec; :meth:`SSHChannel.confirm_gone` asks the host
   (``kill -0``) until the group is gone.

paramiko is imported here, when an SSH pool starts — never by ``import skyward``.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import io
import logging
import os
import shlex
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from skyward._retry import Backoff
from skyward.errors import BootstrapError
from skyward.providers.base import SSHAddress
from skyward.transport.base import Channel, CommandResult, Transport, WorkerLaunch, guarded

__all__ = ["SSHChannel", "SSHTransport"]

#: Printed (with the worker's pid) on stdout right before the worker is exec'd.
START_MARKER = b"::skyward-worker:: "
_PID_MARKER = "::skyward-pid:: "
# paramiko's default window is 2 MiB; a larger one keeps big task payloads flowing on links
# with some latency (the window is credit, not memory allocated up front).
_WINDOW = 16 * 1024 * 1024
_MAX_READ = 1024 * 1024
_RECV_ALL = 1 << 30  # "everything buffered": paramiko never holds more than the window
_BUFFER = 256 * 1024
_KEEPALIVE_S = 30


def _quiet_paramiko() -> None:
    # A library should not print through logging's last-resort handler; with a NullHandler
    # paramiko's records still reach the user's own logging configuration, if any.
    logger = logging.getLogger("paramiko")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())


def _fingerprint(key: Any) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _UnknownHostKey(Exception):
    def __init__(self, name: str, key: Any):
        super().__init__(f"unknown host key for {name}")
        self.name = name
        self.key = key


def _reject_policy() -> Any:
    import paramiko

    class RejectUnknown(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            raise _UnknownHostKey(hostname, key)

    return RejectUnknown()


def _hear_exit_signals(transport: Any) -> None:
    """Make ``transport``'s channels record a remote process killed by a signal.

    sshd reports such a death with an ``exit-signal`` request (RFC 4254, 6.10: the signal's
    name without "SIG"), which paramiko ignores, leaving ``exit_status`` at -1. For this
    transport only, that request sets ``exit_status`` to minus the signal's number, as
    ``subprocess`` reports it. Every other request goes to paramiko's own handler.
    """
    import paramiko

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


class _ChannelReader(io.RawIOBase):
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


class _ChannelWriter(io.RawIOBase):
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


class SSHChannel(Channel):
    """A worker started over SSH. ``pgid`` is its process group on the host (None if unknown)."""

    def __init__(self, transport: SSHTransport, chan: Any, pgid: int | None, stdout_prefix: bytes,
                 stderr_prefix: bytes):
        self._transport = transport
        self._chan = chan
        self.pgid = pgid
        self.stdin = io.BufferedWriter(_ChannelWriter(chan), _BUFFER)  # type: ignore[assignment]
        self.stdout = _ChannelReader(chan.recv, stdout_prefix)  # type: ignore[assignment]  # the frame reader buffers
        self.stderr = io.BufferedReader(_ChannelReader(chan.recv_stderr, stderr_prefix), _BUFFER)  # type: ignore[assignment]

    def poll_fd(self) -> int:
        # paramiko keeps a pipe that is readable exactly while the channel holds unread stdout
        # (or has ended), so a waiting caller polls it like a local pipe (the frame reader
        # counts what _ChannelReader already took).
        return int(self._chan.fileno())

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._chan.status_event.wait(timeout):
            return None
        # -1: the channel closed without an exit status (killed by a signal, or closed by us).
        return int(self._chan.exit_status)

    def kill(self) -> None:
        if self.pgid is not None:
            # The keeper first (see LocalChannel.kill): on SIGTERM it kills the worker and every
            # process below it, detached ones included; then whatever is left of the group.
            pgid = self.pgid
            command = (f"kill -TERM {pgid} 2>/dev/null; i=0; "
                       f"while kill -0 {pgid} 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; "
                       f"kill -9 -{pgid} 2>/dev/null; true")
            with contextlib.suppress(Exception):
                self._transport.run(command, timeout=10)
            self._chan.status_event.wait(2.0)
        with contextlib.suppress(Exception):
            self._chan.close()

    def confirm_gone(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        self.wait(max(0.0, min(1.0, deadline - time.monotonic())))
        if self.pgid is None:
            # It never reported a pid, so it never reached the worker: gone once the channel is.
            return self.wait(max(0.0, deadline - time.monotonic())) is not None
        gone = self._transport.kill_group(self.pgid, max(0.0, deadline - time.monotonic()))
        if gone:
            with contextlib.suppress(Exception):
                self._chan.close()
        return gone


# -- the transport ---------------------------------------------------------------------------------


class SSHTransport(Transport):
    """Reaches one host over one paramiko connection (opened by :meth:`connect`, or on first use).

    ``host`` (the attribute) is how messages name the machine: ``user@address[:port]``.
    """

    @classmethod
    def to(cls, address: SSHAddress) -> SSHTransport:
        """A transport for an instance's SSH address (nothing is opened yet)."""
        return cls(address.host, port=address.port, user=address.user, key_filename=address.key,
                   known_hosts=address.known_hosts, verify_host_keys=address.verify_host_keys,
                   connect_timeout=address.connect_timeout)

    def __init__(self, address: str, *, port: int = 22, user: str, key_filename: str | None = None,
                 known_hosts: Sequence[str] = (), verify_host_keys: bool = True,
                 connect_timeout: float = 10.0):
        self.address = address
        self.port = port
        self.user = user
        self.key_filename = key_filename
        self.known_hosts = tuple(known_hosts)
        self.verify_host_keys = verify_host_keys
        self.connect_timeout = connect_timeout
        shown = f"[{address}]" if ":" in address else address
        self.host = f"{user}@{shown}" + (f":{port}" if port != 22 else "")
        self._client: Any = None
        self._sftp: Any = None
        self._home: str | None = None
        self._lock = threading.Lock()
        self._sftp_lock = threading.Lock()

    # -- connection --------------------------------------------------------------------------
    def connect(self, *, node: int | None = None, log_tail: Sequence[str] = ()) -> None:
        """Open the connection if it is not open.

        Raises BootstrapError(step="connect") saying why (``node`` and ``log_tail`` go into it).
        """
        with self._lock:
            if self._client is not None:
                return
            import paramiko

            _quiet_paramiko()
            client = paramiko.SSHClient()
            if self.verify_host_keys:
                for path in self.known_hosts:
                    if os.path.isfile(path):
                        # "system" keys are only read, never written back.
                        client.load_system_host_keys(path)
                client.set_missing_host_key_policy(_reject_policy())
            else:
                client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # in memory only
            explicit = self.key_filename is not None
            try:
                client.connect(
                    self.address, port=self.port, username=self.user,
                    key_filename=self.key_filename, allow_agent=not explicit, look_for_keys=not explicit,
                    timeout=self.connect_timeout, banner_timeout=self.connect_timeout,
                    auth_timeout=self.connect_timeout,
                )
            except Exception as exc:
                client.close()
                error = BootstrapError(self.host, "connect", self._explain(exc), node=node,
                                       log_tail=[*log_tail, f"{type(exc).__name__}: {exc}"])
                # A key that is unknown or does not match stays so: retrying cannot help.
                error.permanent = isinstance(exc, (_UnknownHostKey, paramiko.BadHostKeyException))
                raise error from exc
            transport = client.get_transport()
            if transport is not None:
                transport.set_keepalive(_KEEPALIVE_S)
                _hear_exit_signals(transport)
            self._client = client

    def _explain(self, exc: BaseException) -> str:
        """A precise, actionable sentence for a failed connect."""
        import paramiko

        where = f"{self.address}:{self.port}"
        files = ", ".join(self.known_hosts) or "no known_hosts file"
        if isinstance(exc, _UnknownHostKey):
            return (f"the host key of {exc.name} ({exc.key.get_name()} {_fingerprint(exc.key)}) is not in "
                    f"{files}; add it (e.g. `ssh-keyscan -p {self.port} {self.address} >> ~/.ssh/known_hosts` "
                    f"after checking the fingerprint) or, for throw-away machines only, pass verify_host_keys=False")
        if isinstance(exc, paramiko.BadHostKeyException):
            return (f"the host key of {where} ({_fingerprint(exc.key)}) does not match the one in {files} "
                    f"({_fingerprint(exc.expected_key)}): the host was reinstalled, or someone is in between; "
                    f"if you trust the new key, remove the old one (`ssh-keygen -R {self.address}`)")
        if isinstance(exc, paramiko.PasswordRequiredException):
            return (f"the private key {self.key_filename or '(from ~/.ssh)'} is protected by a passphrase; "
                    f"load it into ssh-agent (`ssh-add`) and leave key unset")
        if isinstance(exc, paramiko.AuthenticationException):
            tried = f"the key {self.key_filename}" if self.key_filename else "the SSH agent's keys and ~/.ssh/id_*"
            return (f"authentication as {self.user!r} was refused (tried {tried}); check that the matching "
                    f"public key is in ~{self.user}/.ssh/authorized_keys on the host")
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            errors = list(exc.errors.values())
            first = errors[0] if errors else exc
            if isinstance(first, ConnectionRefusedError) or getattr(first, "errno", None) == errno.ECONNREFUSED:
                return f"connection refused by {where} (no SSH server listening on port {self.port}?)"
            return f"cannot reach {where}: {getattr(first, 'strerror', None) or first}"
        if isinstance(exc, socket.gaierror):
            return f"cannot resolve the host name {self.address!r}: {exc.strerror}"
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return (f"no answer from {where} within {self.connect_timeout:g}s "
                    f"(host down or unreachable, or the port is filtered)")
        if isinstance(exc, ConnectionRefusedError):
            return f"connection refused by {where} (no SSH server listening on port {self.port}?)"
        if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
            return f"cannot reach {where}: {exc.strerror}"
        if isinstance(exc, paramiko.SSHException):
            return f"the SSH handshake with {where} failed: {exc}"
        if isinstance(exc, EOFError):
            return f"{where} closed the connection during the SSH handshake"
        if isinstance(exc, OSError):
            return f"cannot connect to {where}: {exc.strerror or exc}"
        return f"cannot connect to {where}: {type(exc).__name__}: {exc}"

    def _transport(self) -> Any:
        self.connect()
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionResetError(f"the SSH connection to {self.host} is closed")
        return transport

    def _session(self) -> Any:
        import paramiko

        try:
            return self._transport().open_session(window_size=_WINDOW, timeout=self.connect_timeout)
        except (paramiko.SSHException, EOFError) as exc:
            raise ConnectionResetError(f"cannot open a channel to {self.host}: {exc}") from exc

    # -- commands ----------------------------------------------------------------------------
    def run(self, command: str, *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        """Run a shell command to completion (``stdin``, if given, is its whole input)."""
        out: list[bytes] = []
        err: list[bytes] = []
        code = self._exec(command, out.append, err.append, timeout=timeout, lines=False, stdin=stdin)
        return CommandResult(code, b"".join(out).decode("utf-8", "replace"), b"".join(err).decode("utf-8", "replace"))

    def stream(self, command: str, on_line: Callable[[str, str], None], *, timeout: float | None = None) -> int:
        """Run ``command``, calling ``on_line(stream, line)`` for each output line as it comes.

        ``stream`` is "stdout" or "stderr"; calls are serialised. Returns the exit code (-1 if
        the command ended without one). After ``timeout`` seconds the command's whole process
        group is killed on the host and TimeoutError is raised; if the client vanishes, the
        command's process group dies with the connection (:func:`~skyward.transport.base.guarded`).
        """
        lock = threading.Lock()
        pid: list[int] = []

        def emit(stream: str) -> Callable[[bytes], None]:
            def call(raw: bytes) -> None:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                with lock:
                    if stream == "stdout" and not pid and line.startswith(_PID_MARKER):
                        number = line[len(_PID_MARKER):].strip()
                        if number.isdigit():
                            pid.append(int(number))
                            return
                    on_line(stream, line)
            return call

        # sshd makes each session its own process group: "$$" names it. Its stdin stays open
        # while the command runs: the dead man's switch (the connection dropping ends it).
        wrapped = f"printf '%s%s\\n' {shlex.quote(_PID_MARKER)} \"$$\" && {guarded(command)}"
        try:
            code = self._exec(wrapped, emit("stdout"), emit("stderr"), timeout=timeout, lines=True, hold_stdin=True)
        except TimeoutError:
            if pid:
                with contextlib.suppress(ConnectionError):
                    self.kill_group(pid[0], 10.0)
            raise
        # The command is over, but its dead man's switch (and whatever the command left in its
        # group) ends only once the closed channel's end of input reaches the host: see to it
        # that nothing of it is left when this returns.
        if pid:
            with contextlib.suppress(ConnectionError):
                self.kill_group(pid[0], 10.0)
        return code

    def kill_group(self, pgid: int, timeout: float = 5.0) -> bool:
        """``kill -9`` process group ``pgid`` on the host until it is gone; False if it is still
        there after ``timeout``. Raises ConnectionError if the host cannot be asked."""
        deadline = time.monotonic() + timeout
        # `kill -9 -PGID`, not `kill -9 -- -PGID`: dash's kill does not take "--".
        check = f"if kill -0 -{pgid} 2>/dev/null; then kill -9 -{pgid} 2>/dev/null; echo alive; else echo gone; fi"
        for _ in Backoff(timeout=timeout, delay=0.05, factor=1.0):
            try:
                result = self.run(check, timeout=max(1.0, deadline - time.monotonic()))
            except Exception as exc:
                raise ConnectionError(f"cannot ask {self.host} whether the worker is gone: "
                                      f"{type(exc).__name__}: {exc}") from exc
            words = result.stdout.split()  # a login script may have printed before us
            if words and words[-1] == "gone":
                return True
        return False

    def _exec(self, command: str, on_out: Callable[[bytes], None], on_err: Callable[[bytes], None], *,
              timeout: float | None, lines: bool, stdin: bytes | None = None, hold_stdin: bool = False) -> int:
        chan = self._session()
        try:
            # Whatever the login shell (bash, zsh, fish...), the command is POSIX sh.
            chan.exec_command("exec /bin/sh -c " + shlex.quote(command))
            if stdin is not None:
                _ChannelWriter(chan).write(stdin)  # paramiko's sendall can spin on a closed channel
            if not hold_stdin:
                chan.shutdown_write()
            deadline = None if timeout is None else time.monotonic() + timeout

            def pump(recv: Callable[[int], bytes], sink: Callable[[bytes], None]) -> None:
                reader = io.BufferedReader(_ChannelReader(recv), 64 * 1024)
                if lines:
                    for raw in iter(reader.readline, b""):
                        sink(raw)
                else:
                    while chunk := reader.read1(64 * 1024):
                        sink(chunk)

            err_thread = threading.Thread(target=pump, args=(chan.recv_stderr, on_err), daemon=True,
                                          name=f"skyward-ssh-stderr-{self.address}")
            err_thread.start()
            expired = threading.Event()

            def expire() -> None:
                expired.set()
                chan.close()  # ends both pumps

            timer = None
            if deadline is not None:
                timer = threading.Timer(max(0.0, deadline - time.monotonic()), expire)
                timer.daemon = True
                timer.start()
            try:
                pump(chan.recv, on_out)
                err_thread.join()
                chan.status_event.wait()  # set by the exit status, or by the close
            finally:
                if timer is not None:
                    timer.cancel()
            if expired.is_set() and chan.exit_status == -1:  # closed by us before it finished
                raise TimeoutError(f"`{command[:60]}` on {self.host} did not finish within {timeout:g}s")
            return int(chan.exit_status)
        finally:
            chan.close()

    # -- files -------------------------------------------------------------------------------
    def _sftp_client(self) -> Any:
        if self._sftp is None:
            self.connect()
            self._sftp = self._client.open_sftp()
        return self._sftp

    def home(self) -> str:
        """The login directory on the host (absolute)."""
        if self._home is None:
            with self._sftp_lock:
                self._home = str(self._sftp_client().normalize("."))
        return self._home

    def expand(self, path: str) -> str:
        """``path`` with a leading ``~`` replaced by the login directory."""
        if path == "~":
            return self.home()
        if path.startswith("~/"):
            return self.home().rstrip("/") + path[1:]
        return path

    def exists(self, remote_path: str, size: int | None = None) -> bool:
        """True if ``remote_path`` exists (and has ``size`` bytes, when given)."""
        with self._sftp_lock:
            try:
                st = self._sftp_client().stat(self.expand(remote_path))
            except OSError:
                return False
        return size is None or st.st_size == size

    def put(self, local_path: str, remote_path: str, *, mode: int | None = None) -> None:
        """Copy a file; it appears at ``remote_path`` whole (written aside, then renamed)."""
        with open(local_path, "rb") as f:
            self._put(f, remote_path, mode)

    def put_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        """Write ``data`` to ``remote_path``; the file has ``mode`` before any byte is written."""
        self._put(io.BytesIO(data), remote_path, mode)

    def _put(self, source: io.RawIOBase | io.BufferedIOBase | Any, remote_path: str, mode: int | None) -> None:
        remote = self.expand(remote_path)
        tmp = f"{remote}.{uuid.uuid4().hex[:8]}.part"
        with self._sftp_lock:
            sftp = self._sftp_client()
            try:
                with sftp.open(tmp, "wb") as f:
                    if mode is not None:
                        f.chmod(mode)  # before the content: a secret is never readable by others
                    f.set_pipelined(True)
                    while chunk := source.read(1024 * 1024):
                        f.write(chunk)
                try:
                    sftp.posix_rename(tmp, remote)
                except OSError:
                    with contextlib.suppress(OSError):
                        sftp.remove(remote)
                    sftp.rename(tmp, remote)
            except BaseException:
                with contextlib.suppress(Exception):
                    sftp.remove(tmp)
                raise

    # -- the worker --------------------------------------------------------------------------
    def start(self, launch: WorkerLaunch) -> SSHChannel:
        """Start ``launch`` on the host; its stdin/stdout are the channel's streams.

        The remote command is ``exec /bin/sh -c '<prints the marker>; export ...; cd ...;
        exec <argv>'``, every value shell-quoted. Values in ``launch.env`` are visible in the
        host's process list for an instant: put secrets in the image's env file instead.
        """
        parts = ["printf '\\n%s%s\\n' " + shlex.quote(START_MARKER.decode()) + ' "$$"']
        parts += [f"export {k}={shlex.quote(v)}" for k, v in launch.env.items()]
        if launch.cwd:
            parts.append("cd " + shlex.quote(self.expand(launch.cwd)))
        parts.append("exec " + shlex.join(launch.argv))
        command = "exec /bin/sh -c " + shlex.quote(" && ".join(parts))
        try:
            chan = self._session()
        except OSError as exc:
            raise BootstrapError(self.host, "starting worker", str(exc)) from exc
        try:
            chan.exec_command(command)
            pgid, stdout_rest, noise = self._read_marker(chan)
        except BaseException as exc:
            chan.close()
            if isinstance(exc, BootstrapError) or not isinstance(exc, Exception):
                raise
            raise BootstrapError(self.host, "starting worker", f"{type(exc).__name__}: {exc}") from exc
        # Anything a login script printed before the marker goes to diagnostics, not the protocol.
        return SSHChannel(self, chan, pgid, stdout_rest, noise)

    def _read_marker(self, chan: Any) -> tuple[int | None, bytes, bytes]:
        """Read stdout up to the start marker: (pid, bytes after it, bytes before it)."""
        deadline = time.monotonic() + max(30.0, 3 * self.connect_timeout)
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
                    raise BootstrapError(self.host, "starting worker", "the launch command never started",
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
                    raise BootstrapError(self.host, "starting worker", "the launch command exited early",
                                         exit_code=status, log_tail=tail)
                buf += data
        finally:
            chan.settimeout(None)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            sftp, self._sftp = self._sftp, None
        with contextlib.suppress(Exception):
            if sftp is not None:
                sftp.close()
        with contextlib.suppress(Exception):
            if client is not None:
                client.close()

    def __repr__(self) -> str:
        return f"SSHTransport({self.host!r})"
