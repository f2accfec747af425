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

from abc import ABC, abstractmethod
from collections.abc import Mapping
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
    """How to start a worker: a command line and extra environment variables."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None


class Channel(ABC):
    """A started process whose stdin/stdout is a byte stream."""

    stdin: IO[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]

    def poll_fd(self) -> int | None:
        """A file descriptor that polls readable exactly when ``stdout`` has bytes to read, or
        None. Only a channel whose ``stdout`` does no buffering of its own may give one: a
        caller blocked in ``>>`` then reads its own reply instead of waiting for a thread."""
        return None

    @abstractmethod
    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, or None if the process is still running after ``timeout``."""

    @abstractmethod
    def kill(self) -> None:
        """Stop the process and everything it started, at once."""

    @abstractmethod
    def confirm_gone(self, timeout: float = 5.0) -> bool:
        """Wait until no process started through this channel is left; False if some are."""


class Transport(ABC):
    """Reaches one machine."""

    #: How the user would name the machine in an error message.
    host: str

    @abstractmethod
    def start(self, launch: WorkerLaunch) -> Channel:
        """Start ``launch`` and return its channel."""

    @abstractmethod
    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        """Run a shell command to completion."""

    @abstractmethod
    def put(self, local_path: str, remote_path: str) -> None:
        """Copy a file to the machine."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release the connection (if any)."""

