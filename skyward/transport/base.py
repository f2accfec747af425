"""The transport contract: everything the pool needs to reach one machine.

A provider hands back instances that one of these reaches, so bootstrap and dispatch have a
single code path whatever the machine is.

Guarantees a transport gives:

1. ``start`` returns a :class:`Channel` whose ``stdin``/``stdout`` carry the framed protocol
   byte for byte, and whose ``stderr`` carries the process's own diagnostics.
2. ``Channel.kill`` stops the process *and everything it started*; ``Channel.confirm_gone``
   returns only when no such process is left (or says it could not confirm).
3. Errors from libraries underneath are translated to :mod:`skyward.errors` types.
"""

from __future__ import annotations

import contextlib
import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO


@dataclass(frozen=True, slots=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """How to start a worker: a command line and extra environment variables.

    ``files`` (path, bytes) are written on the machine (mode 0600) before each start: the
    image's env, which the command reads and deletes. ``cleanup``: files that hold secrets and
    are deleted when the pool closes, if still there (a preparation that failed half-way)."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    cleanup: tuple[str, ...] = ()
    files: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)  # secrets: never shown
    #: The interpreter the worker runs in (a named cluster's bridge runs it too).
    python: str = ""
    #: ``argv`` is ``python -m skyward.worker`` in the client's own interpreter: on this machine
    #: the worker may be forked from a warm template instead (:mod:`skyward.transport.forked`).
    forkable: bool = False


class Channel(ABC):
    """A started process whose stdin/stdout is a byte stream."""

    stdin: IO[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]

    @abstractmethod
    def poll_fd(self) -> int:
        """A file descriptor that polls readable exactly when ``stdout`` has bytes to read (or
        has ended). Bytes ``stdout`` took from its source and still holds must be reported by
        a ``pending()`` method on it: the frame reader counts them as buffered."""

    def stderr_fd(self) -> int | None:
        """A file descriptor to read ``stderr``'s bytes from directly, with ``os.read``, when it
        polls readable; None where there is none (the pool then reads ``stderr`` on a thread)."""
        return None

    def write_ready(self) -> bool | None:
        """Whether a small message (a ping) can be written to ``stdin`` now without blocking;
        None where that cannot be told (the pool then pings from a thread of its own)."""
        return None

    @abstractmethod
    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, or None if the process is still running after ``timeout``."""

    def begin_kill(self) -> None:  # noqa: B027 - optional
        """Ask the process to stop, without waiting (so that a pool stopping many workers has
        them all stop at once); :meth:`kill` follows. Transports that cannot do it do nothing."""

    @abstractmethod
    def kill(self, timeout: float = 10.0) -> None:
        """Stop the process and everything it started, at once, taking at most about
        ``timeout`` seconds (a machine that does not answer in that time is left to
        :meth:`confirm_gone` to report)."""

    @abstractmethod
    def confirm_gone(self, timeout: float = 5.0) -> bool:
        """Wait until no process started through this channel is left; False if some still are.
        Raises ConnectionError when the machine cannot be asked (it is unreachable)."""

    def close(self, *, stderr: bool = True) -> None:
        """Close this end of ``stdin``, ``stdout`` and (``stderr`` True) ``stderr``, once nobody
        writes or reads them any more: the process is gone and its streams read to their end."""
        for stream in self._streams() if stderr else self._streams()[:2]:
            with contextlib.suppress(OSError, ValueError):  # (a write to a gone reader: closed anyway)
                stream.close()

    def _streams(self) -> tuple[IO[bytes], IO[bytes], IO[bytes]]:
        return self.stdin, self.stdout, self.stderr


class Transport(ABC):
    """Reaches one machine: everything host preparation and the worker need, nothing more."""

    #: How the user would name the machine in an error message.
    host: str
    #: Whether the machine is this one, its files and Unix sockets this process's own (a worker's
    #: control socket is then asked directly, without starting a process there).
    this_machine: bool = False

    def connect(self, *, node: int | None = None) -> None:  # noqa: B027 - optional
        """Open the connection if it is not open (transports that need none do nothing).

        Raises BootstrapError(step="connect") saying why; one with ``permanent=True`` (a host
        key that does not match, say) must not be retried."""

    @abstractmethod
    def start(self, launch: WorkerLaunch) -> Channel:
        """Start ``launch`` and return its channel."""

    @abstractmethod
    def run(self, command: str, *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        """Run a POSIX shell command to completion (``stdin``, if given, is its whole input)."""

    @abstractmethod
    def stream(self, command: str, on_line: Callable[[str, str], None], *, timeout: float | None = None,
               confirm_gone: bool = True) -> int:
        """Run ``command``, calling ``on_line(stream, line)`` ("stdout"/"stderr") per output line,
        serialised; return its exit code (-1: it ended without one). After ``timeout`` seconds
        the command and everything it started are killed and TimeoutError is raised. Nothing it
        started is left when this returns, confirmed where that takes a round trip (SSH) unless
        ``confirm_gone`` is false: for a command known to start nothing (skyward's own job
        follower), whose process group the dead man's switch ends as the stream closes."""

    @abstractmethod
    def put(self, local_path: str, remote_path: str, *, mode: int | None = None) -> None:
        """Copy a file; it appears at ``remote_path`` whole (written aside, then renamed)."""

    @abstractmethod
    def put_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        """Write ``data`` to ``remote_path``; the file has ``mode`` before any byte is written."""

    @abstractmethod
    def exists(self, remote_path: str, size: int | None = None) -> bool:
        """True if ``remote_path`` exists (and has ``size`` bytes, when given)."""

    @abstractmethod
    def expand(self, path: str) -> str:
        """``path`` with a leading ``~`` replaced by the login user's home directory."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release the connection (if any)."""


def guarded(command: str) -> str:
    """Shell text that runs ``command`` under a dead man's switch: when the shell's stdin ends
    (the client closed the stream, or vanished: its end of the pipe or connection closed), the
    whole process group is killed, so nothing it started outlives the client.

    The shell must lead its own process group (sshd makes each session one; Local starts it in
    a new session), and the caller keeps its stdin open until the command is over. ``command``
    itself reads nothing (its stdin is /dev/null)."""
    return ("exec 3<&0; "
            "(cat <&3 >/dev/null 2>&1; kill -9 -$$ 2>/dev/null) >/dev/null 2>&1 & "
            f"exec /bin/sh -c {shlex.quote(command)} </dev/null 3<&-")
