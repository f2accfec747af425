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
   (``kill -0``, zombies aside) until the group is gone.

The worker's channel (:class:`SSHChannel`, the marker, the file-like channel ends) lives in
:mod:`skyward.transport._ssh_channel`; opening the connection (host keys, authentication,
ProxyCommand and ProxyJump), in :mod:`skyward.transport._ssh_connect`; what a failed connect
says, in :mod:`skyward.transport._ssh_errors`; the file operations (SFTP), in
:mod:`skyward.transport._ssh_files`. paramiko is imported here, when an SSH pool starts —
never by ``import skyward``.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from skyward._optional import require
from skyward._procs import TREE_VARIABLE
from skyward._retry import Backoff
from skyward.errors import BootstrapError
from skyward.machine import SSHAddress
from skyward.transport._ssh_channel import (
    START_MARKER,
    ChannelReader,
    ChannelWriter,
    SSHChannel,
    read_start_marker,
)
from skyward.transport._ssh_connect import open_client
from skyward.transport._ssh_files import SFTPFiles
from skyward.transport.base import CommandResult, Transport, WorkerLaunch, guarded

__all__ = ["SSHChannel", "SSHTransport"]

_PID_MARKER = "::skyward-pid:: "
_END_MARKER = "::skyward-exit:: "
# paramiko's default window is 2 MiB; a larger one keeps big task payloads flowing on links
# with some latency (the window is credit, not memory allocated up front).
_WINDOW = 16 * 1024 * 1024


def _kill_running_members(pgid: int) -> str:
    """Shell text that ``kill -9``s group ``pgid`` and sets ``a=1`` if a member still runs.

    ``kill -0 -PGID`` also answers for zombies, and an ended command's group keeps one for a
    while: its dead man's switch kills itself with the group, and the init that adopts it may
    reap it only seconds later (measured: 1.5-2 s per streamed command on the test hosts). A
    zombie runs nothing, so the group is gone when every member is a zombie (state Z, or X):
    one pass over ``/proc/*/stat`` with shell builtins only. Where there is no ``/proc``,
    ``kill -0`` alone decides."""
    # `kill -9 -PGID`, not `kill -9 -- -PGID`: dash's kill does not take "--". The state and
    # the group follow the last ") " of a stat line (the command name may hold either).
    return (f"kill -9 -{pgid} 2>/dev/null; "
            "if [ -r /proc/self/stat ]; then for f in /proc/[0-9]*/stat; do "
            '{ read -r s < "$f"; } 2>/dev/null || continue; s=${s##*) }; set -- $s; '
            f'if [ "$3" = {pgid} ] && [ "$1" != Z ] && [ "$1" != X ]; then a=1; break; fi; done; '
            "else a=1; fi")


# -- the transport ---------------------------------------------------------------------------------


class SSHTransport(Transport):
    """Reaches one host over one paramiko connection (opened by :meth:`connect`, or on first use).

    ``host`` (the attribute) is how messages name the machine: ``user@address[:port]``.
    """

    @classmethod
    def to(cls, address: SSHAddress, launcher: Sequence[str] = ()) -> SSHTransport:
        """A transport for an instance's SSH address (nothing is opened yet). ``launcher``: the
        command on the host that starts workers on another machine, their stdio carried back
        (Slurm's ``srun --jobid=J -w NODE``, run on a login node)."""
        made = cls(address.host, port=address.port, user=address.user, key_filename=address.key,
                   known_hosts=address.known_hosts, verify_host_keys=address.verify_host_keys,
                   connect_timeout=address.connect_timeout, jump=address.jump,
                   proxy_command=address.proxy_command)
        made.launcher = tuple(launcher)
        return made

    def __init__(self, address: str, *, port: int = 22, user: str, key_filename: str | None = None,
                 known_hosts: Sequence[str] = (), verify_host_keys: bool = True,
                 connect_timeout: float = 10.0, jump: SSHAddress | None = None,
                 proxy_command: str | None = None):
        self.address = address
        self.proxy_command = proxy_command
        self.jump = jump  # ProxyJump: the connection is tunnelled through this host's
        self._jump: SSHTransport | None = None
        self.port = port
        self.user = user
        self.key_filename = key_filename
        self.known_hosts = tuple(known_hosts)
        self.verify_host_keys = verify_host_keys
        self.connect_timeout = connect_timeout
        shown = f"[{address}]" if ":" in address else address
        self.host = f"{user}@{shown}" + (f":{port}" if port != 22 else "")
        self._client: Any = None
        self._closed = False
        self._unanswered: str | None = None  # why this host is not asked again (see _session)
        self._lock = threading.Lock()
        self._files = SFTPFiles(self._open_sftp)
        #: Workers start through this command on the host (see :meth:`to`); empty: on the host.
        self.launcher: tuple[str, ...] = ()

    # -- connection --------------------------------------------------------------------------
    def connect(self, *, node: int | None = None, log_tail: Sequence[str] = ()) -> None:
        """Open the connection if it is not open.

        Raises BootstrapError(step="connect") saying why (``node`` and ``log_tail`` go into it).
        """
        with self._lock:
            if self._closed:  # closed for good: a late call must not open a new connection
                raise ConnectionResetError(f"the SSH connection to {self.host} was closed")
            if self._unanswered:
                raise ConnectionResetError(self._unanswered)
            if self._client is not None:
                return
            self._client, self._jump = open_client(self, node, log_tail)

    def _close_jump(self) -> None:
        jump, self._jump = self._jump, None
        if jump is not None:
            jump.close()

    def _transport(self) -> Any:
        self.connect()
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionResetError(f"the SSH connection to {self.host} is closed")
        return transport

    def _session(self, answer_within: float | None = None) -> Any:
        """A new channel on the connection; the host gets ``answer_within`` seconds (at most
        ``connect_timeout``) to answer. A live sshd answers at once: one that does not has
        been cut off, and the connection is closed and never asked again (each later call
        raises at once instead of waiting out its own timeout: teardown stays quick)."""
        paramiko = require("paramiko", "an SSH connection")

        budget = self.connect_timeout if answer_within is None else max(0.1, min(answer_within, self.connect_timeout))
        transport = self._transport()
        began = time.monotonic()
        try:
            return transport.open_session(window_size=_WINDOW, timeout=budget)
        except (paramiko.SSHException, EOFError) as exc:
            if transport.is_active() and time.monotonic() - began >= budget:
                self._unanswered = f"{self.host} stopped answering (no reply to opening a channel within {budget:g}s)"
                with contextlib.suppress(Exception):
                    self._client.close()
                raise ConnectionResetError(self._unanswered) from exc
            raise ConnectionResetError(f"cannot open a channel to {self.host}: {exc}") from exc

    # -- commands ----------------------------------------------------------------------------
    def run(self, command: str, *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        """Run a shell command to completion (``stdin``, if given, is its whole input)."""
        out: list[bytes] = []
        err: list[bytes] = []
        code = self._exec(command, out.append, err.append, timeout=timeout, lines=False, stdin=stdin)
        return CommandResult(code, b"".join(out).decode("utf-8", "replace"), b"".join(err).decode("utf-8", "replace"))

    def stream(self, command: str, on_line: Callable[[str, str], None], *, timeout: float | None = None,
               confirm_gone: bool = True) -> int:
        """Run ``command``, calling ``on_line(stream, line)`` for each output line as it comes.

        ``stream`` is "stdout" or "stderr"; calls are serialised. Returns the exit code (-1 if
        the command ended without one). After ``timeout`` seconds the command's whole process
        group is killed on the host and TimeoutError is raised; if the client vanishes, the
        command's process group dies with the connection (:func:`~skyward.transport.base.guarded`).
        """
        lock = threading.Lock()
        pid: list[int] = []
        ended: list[int] = []  # the command's exit code, said by the group as it killed itself

        def emit(stream: str) -> Callable[[bytes], None]:
            def call(raw: bytes) -> None:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                with lock:
                    for marker, found in ((_PID_MARKER, pid), (_END_MARKER, ended)):
                        if stream == "stdout" and not found and line.startswith(marker):
                            number = line[len(marker):].strip()
                            if number.isdigit():
                                found.append(int(number))
                                return
                    on_line(stream, line)
            return call

        # sshd makes each session its own process group: "$$" names it. Its stdin stays open
        # while the command runs: the dead man's switch (the connection dropping ends it). Once
        # the command is over, the group says its exit code and kills itself, the switch with it:
        # nothing of it is left, and no second command (a walk over the host's /proc) must
        # confirm that; past a timeout or an interruption, that command does (and, unless
        # confirm_gone=False, after a command that ended without saying its code).
        ending = f"{command}\nr=$?; printf '%s%s\\n' {shlex.quote(_END_MARKER)} \"$r\"; kill -9 -$$"
        wrapped = f"printf '%s%s\\n' {shlex.quote(_PID_MARKER)} \"$$\" && {guarded(ending)}"
        done = False
        try:
            code = self._exec(wrapped, emit("stdout"), emit("stderr"), timeout=timeout, lines=True, hold_stdin=True)
            done = True
            return ended[0] if ended else code
        finally:
            if pid and not ended and (confirm_gone or not done):
                with contextlib.suppress(ConnectionError):
                    self.kill_group(pid[0], 10.0)

    def kill_group(self, pgid: int, timeout: float = 5.0, tree: str = "") -> bool:
        """``kill -9`` process group ``pgid`` on the host until it is gone, and every process
        whose environment carries ``SKYWARD_TREE=<tree>`` (detached ones the worker's keepers
        could not clear: both were killed at once); False if any is still there after ``timeout``.
        Raises ConnectionError if the host cannot be asked."""
        deadline = time.monotonic() + timeout
        check = f"a=; if kill -0 -{pgid} 2>/dev/null; then {_kill_running_members(pgid)}; fi; "
        if tree:  # one grep over every environ (NUL-separated lines): the pids of the tree's processes
            check += (f"p=$(grep -lzx {shlex.quote(f'{TREE_VARIABLE}={tree}')} /proc/[0-9]*/environ 2>/dev/null "
                      f"| cut -d/ -f3); if [ -n \"$p\" ]; then kill -9 $p 2>/dev/null; a=1; fi; ")
        check += 'if [ -n "$a" ]; then echo alive; else echo gone; fi'

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
        chan = self._session(timeout)
        try:
            # Whatever the login shell (bash, zsh, fish...), the command is POSIX sh.
            chan.exec_command("exec /bin/sh -c " + shlex.quote(command))
            if stdin is not None:
                ChannelWriter(chan).write(stdin)  # paramiko's sendall can spin on a closed channel
            if not hold_stdin:
                chan.shutdown_write()
            deadline = None if timeout is None else time.monotonic() + timeout

            def pump(recv: Callable[[int], bytes], sink: Callable[[bytes], None]) -> None:
                reader = io.BufferedReader(ChannelReader(recv), 64 * 1024)
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
            # Closed by us before it finished. The command may still report an exit status (the
            # close ends it: its dead man's switch), which a loaded machine delivers first.
            if expired.is_set() and chan.exit_status != 0:
                raise TimeoutError(f"`{command[:60]}` on {self.host} did not finish within {timeout:g}s")
            return int(chan.exit_status)
        finally:
            chan.close()

    # -- files (SFTP: skyward.transport._ssh_files) ---------------------------------------------
    def _open_sftp(self) -> Any:
        self.connect()
        return self._client.open_sftp()

    def home(self) -> str:
        """The login directory on the host (absolute)."""
        return self._files.home()

    def expand(self, path: str) -> str:
        return self._files.expand(path)

    def exists(self, remote_path: str, size: int | None = None) -> bool:
        return self._files.exists(remote_path, size)

    def put(self, local_path: str, remote_path: str, *, mode: int | None = None) -> None:
        self._files.put(local_path, remote_path, mode=mode)

    def put_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        self._files.put_bytes(data, remote_path, mode=mode)

    # -- the worker --------------------------------------------------------------------------
    def start(self, launch: WorkerLaunch) -> SSHChannel:
        """Start ``launch`` on the host; its stdin/stdout are the channel's streams.

        The remote command is ``exec /bin/sh -c '<prints the marker>; export ...; cd ...;
        exec <argv>'``, every value shell-quoted. Values in ``launch.env`` are visible in the
        host's process list for an instant: put secrets in the image's env file instead.
        """
        parts = ["printf '\\n%s%s\\n' " + shlex.quote(START_MARKER.decode()) + ' "$$"']
        tree = uuid.uuid4().hex  # every process of the worker's tree inherits it (see kill_group)
        parts += [f"export {k}={shlex.quote(v)}" for k, v in {**launch.env, TREE_VARIABLE: tree}.items()]
        if launch.cwd:
            parts.append("cd " + shlex.quote(self.expand(launch.cwd)))
        parts.append("exec " + shlex.join([*self.launcher, *launch.argv]))
        command = "exec /bin/sh -c " + shlex.quote(" && ".join(parts))
        try:
            chan = self._session()
        except OSError as exc:
            raise BootstrapError(self.host, "starting worker", str(exc)) from exc
        try:
            chan.exec_command(command)
            pgid, stdout_rest, noise = read_start_marker(chan, self.host, max(30.0, 3 * self.connect_timeout))
        except BaseException as exc:
            chan.close()
            if isinstance(exc, BootstrapError) or not isinstance(exc, Exception):
                raise
            raise BootstrapError(self.host, "starting worker", f"{type(exc).__name__}: {exc}") from exc
        # Anything a login script printed before the marker goes to diagnostics, not the protocol.
        return SSHChannel(self, chan, pgid, stdout_rest, noise, tree)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
        self._files.close()
        with contextlib.suppress(Exception):
            if client is not None:
                client.close()
        self._close_jump()

    def __repr__(self) -> str:
        return f"SSHTransport({self.host!r})"
