"""Running a shell command on a node: the task function behind :func:`skyward.shell`.

:func:`run_command` is an ordinary task function (the executors run it like any other), so
a command is dispatched, streamed, cancelled and timed out through the same code path as a
Python task. It starts the command under a guardian process (:mod:`skyward.runtime._reaper`,
a script run with ``python -I -S``, in a session of its own) and reads its output line by
line into the task's output (``OUTPUT`` frames, prefixed by node on the console).

Guarantees:

1. Every process the command starts ends with it: when the command exits, whatever it left
   running in the background is stopped; nothing is left behind, in any session.
2. Stopping the task (a CANCEL: timeout, cancelled future, failed broadcast, Ctrl-C on the
   client, the pool closing) kills the command's whole tree (SIGTERM, then SIGKILL after
   :data:`KILL_GRACE` seconds) and waits until the guardian confirms that none is left.
3. If the worker itself dies (even by SIGKILL), the guardian sees its control pipe close and
   kills the tree the same way.
4. Nothing here blocks for long in C code: the task's thread looks at least every 0.1 s
   whether it was asked to stop.
"""

from __future__ import annotations

import codecs
import collections
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from skyward import _procs
from skyward.protocol import MAX_LINE, cut_marker
from skyward.runtime import instance as runtime_instance, output as runtime_output
from skyward.errors import CommandFailed, ConfigError

__all__ = ["KILL_GRACE", "CommandResult", "ShellCommand", "run_command"]

#: Lines of output a result (or a CommandFailed) keeps.
TAIL_LINES = 50

#: Which nodes stream the command's output to the console: every node ("all", the default),
#: the head only ("head"), those a predicate of InstanceInfo accepts, or none (None).
Only = Literal["all", "head"] | Callable[[Any], bool] | None


@dataclass(frozen=True, slots=True)
class ShellCommand:
    """What a node needs to run one command (built and checked by :func:`skyward.shell`)."""

    command: str
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    check: bool = True
    only: Only = "all"


@dataclass(frozen=True, slots=True)
class CommandResult:
    """How a command ended on one node.

    ``returncode`` is the exit code, or minus the signal number if a signal ended it;
    ``output`` holds the last lines of its stdout and stderr (in arrival order).
    """

    node: int
    returncode: int
    output: str
    command: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def __repr__(self) -> str:
        return f"CommandResult(node={self.node}, returncode={self.returncode}, output=<{len(self.output)} chars>)"


#: Seconds a stopped command's processes get after SIGTERM before SIGKILL (kept well below the
#: 2 s a failed broadcast gives the other nodes, and the worker's shutdown grace).
KILL_GRACE = 1.0
#: How long to wait for the guardian to confirm a stop before giving up on it.
_CONFIRM_WITHIN = KILL_GRACE + 10.0
_REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reaper.py")
#: The /proc reader the guardian loads by path (it imports nothing of skyward).
_PROCS = os.path.abspath(_procs.__file__)


def run_command(spec: ShellCommand) -> CommandResult:
    """Run ``spec`` on this node; see the module docstring. Raises CommandFailed (check)."""
    info = runtime_instance.instance_info()
    cwd = None
    if spec.cwd is not None:
        cwd = os.path.expandvars(os.path.expanduser(spec.cwd))
        if not os.path.isdir(cwd):
            raise ConfigError("cwd", f"a directory that exists on node {info.node}", spec.cwd)
    env = {**os.environ, **dict(spec.env)}
    shell = shutil.which("bash") or "/bin/sh"
    script = write_script(spec.command, env.get("TMPDIR"))
    try:
        return _run(spec, info, script, shell, cwd, env)
    finally:
        os.close(script)


def write_script(command: str, tmpdir: str | None) -> int:
    """``command`` in a file of its own, as an open descriptor: written with mode 0600 in a
    private folder made for it (in the command's TMPDIR), then removed with its folder at once,
    so that no exit path (a cancel, a worker killed with SIGKILL) can leave it behind. The
    guardian runs the command from the descriptor: a command of any size runs, where one
    command-line argument holds at most 128 KiB."""
    folder = tempfile.mkdtemp(prefix="skyward-cmd-", dir=tmpdir if tmpdir and os.path.isdir(tmpdir) else None)
    path = os.path.join(folder, "command.sh")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            data = memoryview(command.encode("utf-8", "surrogateescape"))
            while data:
                data = data[os.write(fd, data):]
        except BaseException:
            os.close(fd)
            raise
    finally:
        for remove, what in ((os.unlink, path), (os.rmdir, folder)):
            try:
                remove(what)
            except OSError:
                pass
    return fd


def _run(spec: ShellCommand, info: runtime_instance.InstanceInfo, script: int, shell: str, cwd: str | None,
         env: dict[str, str]) -> CommandResult:
    status_r, status_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", _REAPER, _PROCS, str(KILL_GRACE), shell, str(script), str(status_w)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(status_w, script),
            cwd=cwd, env=env, start_new_session=True,
        )
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)
    lines = _Lines(_printing(spec.only, info))
    try:
        status = lines.pump(proc, status_r)
    except BaseException:
        # Stopped (StopTask on a worker, KeyboardInterrupt here): closing the guardian's input
        # is the stop signal; wait for its confirmation, even through a second interruption.
        _stop(proc, status_r, lines)
        raise
    finally:
        os.close(status_r)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    returncode, _stopped, left = status
    if left:
        lines.add("stderr", f"skyward: {left} process(es) of the command could not be killed")
    result = CommandResult(info.node, returncode, "\n".join(lines.tail), spec.command)
    if spec.check and returncode != 0:
        raise CommandFailed(spec.command, info.node, returncode, list(lines.tail)[-20:])
    return result


def _printing(only: Any, info: runtime_instance.InstanceInfo) -> bool:
    if only == "all":
        return True
    if only is None:
        return False
    if only == "head":
        return info.is_head
    return bool(only(info))


def _stop(proc: subprocess.Popen[bytes], status_r: int, lines: _Lines) -> None:
    deadline = time.monotonic() + _CONFIRM_WITHIN
    for _ in range(100):
        try:
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()
            lines.pump(proc, status_r, deadline)
            return
        except TimeoutError:
            lines.add("stderr", "skyward: the command's guardian did not confirm the stop; killing it")
            proc.kill()
            return
        except BaseException:  # noqa: BLE001, S112 (interrupted again while stopping: keep stopping)
            continue


class _Lines:
    """The command's output: sent as the task's output line by line, the last lines kept.

    Memory stays bounded whatever the command prints: a line longer than :data:`MAX_LINE`
    characters goes on as pieces (the task's sink sends them, never cut), and the kept tail
    holds at most its first :data:`MAX_LINE` characters."""

    def __init__(self, printing: bool):
        self.printing = printing
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._partial = {"stdout": "", "stderr": ""}
        self._long: dict[str, list] = {}  # stream -> [the start of a long line, characters after it]
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")}
        self._status = b""
        self._open: dict[int, str] = {}

    def add(self, stream: str, line: str) -> None:
        """The end of a line (all of it, or what is left after its pieces)."""
        long = self._long.pop(stream, None)
        self.tail.append(line if long is None else long[0] + cut_marker(long[1] + len(line)))
        self._print(stream, line + "\n")

    def _piece(self, stream: str, text: str) -> None:
        """A piece of a line longer than MAX_LINE (its start is kept for the tail)."""
        if stream in self._long:
            self._long[stream][1] += len(text)
        else:
            self._long[stream] = [text, 0]
        self._print(stream, text)

    def _print(self, stream: str, text: str) -> None:
        if not self.printing:
            return
        sink = runtime_output.task_sink.get()
        if sink is not None:
            sink(stream, text)
        else:  # run here (``.local()``): our own stdout/stderr
            print(text, end="", file=sys.stdout if stream == "stdout" else sys.stderr, flush=True)

    def _feed(self, stream: str, data: bytes) -> None:
        text = self._decoders[stream].decode(data, final=not data)
        if not data:  # end of the stream: a last line without a newline counts too
            rest, self._partial[stream] = self._partial[stream] + text, ""
            if rest or stream in self._long:
                self.add(stream, rest)
            return
        *whole, rest = (self._partial[stream] + text).split("\n")
        for line in whole:
            self.add(stream, line.removesuffix("\r"))
        while len(rest) > MAX_LINE:  # (reads are at most 64 KiB: this holds at most twice that)
            self._piece(stream, rest[:MAX_LINE])
            rest = rest[MAX_LINE:]
        self._partial[stream] = rest

    def pump(self, proc: subprocess.Popen[bytes], status_r: int,
             deadline: float | None = None) -> tuple[int, bool, int]:
        """Read output until the guardian has reported and every stream has ended; returns
        ``(returncode, stopped, processes left)``. Resumable after an interruption."""
        assert proc.stdout is not None and proc.stderr is not None
        if not self._open and not self._status:
            self._open = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr", status_r: "status"}
        while self._open:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError
            ready, _, _ = select.select(list(self._open), [], [], 0.1)  # short: a stop lands soon
            for fd in ready:
                data = os.read(fd, 1 << 16)
                stream = self._open[fd]
                if not data:
                    del self._open[fd]
                if stream == "status":
                    self._status += data
                else:
                    self._feed(stream, data)
        proc.wait()
        fields = self._status.split()
        if len(fields) != 3:  # the guardian died without a word (killed from outside)
            return (proc.returncode if proc.returncode else -9), True, 0
        return int(fields[0]), fields[1] == b"1", int(fields[2])
