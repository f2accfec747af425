"""Local transport: subprocesses on this machine, each worker in its own session."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from skyward._files import write_atomically
from skyward._procs import TREE_VARIABLE, SharedTrees, group_members
from skyward.transport import forked
from skyward.transport.base import (
    Channel,
    CommandResult,
    Transport,
    WorkerLaunch,
    guarded,
)


def _group_members(pgid: int) -> list[int]:
    members = group_members(pgid)
    if members is not None:
        return members
    try:  # no /proc: all we can tell is whether the group exists
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    return [pgid]


class LocalChannel(Channel):
    def __init__(self, process: subprocess.Popen[bytes] | forked.Forked, tree: str = ""):
        self.process = process
        self.tree = tree  # SKYWARD_TREE of every process the worker's tree holds
        assert process.stdin and process.stdout and process.stderr
        self.stdin = process.stdin
        self.stdout = process.stdout.raw  # type: ignore[attr-defined]  # unbuffered: the frame reader buffers
        self.stderr = process.stderr
        self.pgid = process.pid  # start_new_session: the worker leads its own group

    def _streams(self) -> tuple[Any, Any, Any]:
        # (The process's own buffered objects: ``stdout`` is the raw file inside one of them.)
        return self.process.stdin, self.process.stdout, self.process.stderr

    def poll_fd(self) -> int:
        return self.stdout.fileno()

    def stderr_fd(self) -> int | None:
        return self.stderr.fileno()

    def write_ready(self) -> bool | None:
        # A pipe polls writable with a page free at least: a ping (tens of bytes) fits whole.
        try:
            poller = select.poll()
            poller.register(self.stdin.fileno(), select.POLLOUT)
            return any(ev & select.POLLOUT for _, ev in poller.poll(0))
        except (OSError, ValueError):  # closed
            return False

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def begin_kill(self) -> None:
        if self.process.poll() is None:  # (not yet collected: the pid is still the guard's, see kill())
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pgid, signal.SIGTERM)

    def kill(self, timeout: float = 10.0) -> None:
        # The process started leads the group: the worker's guard where there is one
        # (skyward.worker.keeper), which on SIGTERM kills the keeper below it and every process
        # below that, worker and detached ones included, and exits. Killing the group at once
        # would kill both keepers before they could do that. The group is killed afterwards:
        # whatever they left (nothing, normally), or everything, where the worker runs without.
        deadline = time.monotonic() + timeout
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pgid, signal.SIGTERM)
        self.wait(min(KEEPER_GRACE, timeout / 2))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.wait(max(0.0, deadline - time.monotonic()))

    def confirm_gone(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        self.wait(max(0.0, deadline - time.monotonic()))
        while True:
            # The group, and what left it (a detached process) but still carries the tree's tag:
            # normally the keepers have cleared both; not when both were killed at once.
            # (One reading of /proc shared by every channel confirming at the same time.)
            trees = _TREES.read()
            members = trees.left(self.pgid, self.tree) if trees.readable else _group_members(self.pgid)
            if not members:
                return True
            if time.monotonic() >= deadline:
                return False
            for pid in members:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)


_TREES = SharedTrees()

#: Seconds the worker's keeper gets to clear the worker's process tree after SIGTERM.
KEEPER_GRACE = 5.0

#: Linux pipes hold 64 KiB by default; 1 MiB moves large payloads several times faster
#: (measured: 2.8x for 64 MiB through a bare pipe) for 2 MiB of kernel memory per worker.
PIPE_SIZE = 1 << 20


def _widen_pipe(stream: Any) -> None:
    setpipe = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only
    if setpipe is None:
        return
    try:
        fcntl.fcntl(stream.fileno(), setpipe, PIPE_SIZE)
    except OSError:  # above /proc/sys/fs/pipe-max-size for an unprivileged user: keep the default
        pass


def _fork(launch: WorkerLaunch, env: dict[str, str]) -> forked.Forked:
    """The worker forked from this process's template, its stdio on three new pipes."""
    # (The template carries no worker's tree: stopping that worker's tree must not end it.)
    template = forked.template_for(launch.argv[0], {k: v for k, v in env.items() if k != TREE_VARIABLE}, launch.cwd)
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    theirs = (stdin_r, stdout_w, stderr_w)
    try:
        mine = (open(stdin_w, "wb"), open(stdout_r, "rb"), open(stderr_r, "rb"))
        for stream in mine[:2]:
            _widen_pipe(stream)
        try:
            return template.fork(list(launch.argv), env, launch.cwd, mine, theirs)
        except BaseException:
            for stream in mine:
                stream.close()
            raise
    finally:
        for fd in theirs:
            os.close(fd)


class LocalTransport(Transport):
    """This machine, through subprocesses: the same calls host preparation makes over SSH."""

    host = "localhost"

    def __init__(self, launcher: tuple[str, ...] = (), *, host: str = "localhost"):
        #: Workers and commands (run, stream) start through this command (``srun ... -w NODE``:
        #: on another machine, their stdio carried back here); files are this machine's, which
        #: that one shares (a login node and its compute nodes share the filesystem).
        self.launcher = launcher
        self.host = host
        self.this_machine = not launcher

    def start(self, launch: WorkerLaunch) -> Channel:
        env = dict(os.environ)
        env.update(launch.env)
        tree = env[TREE_VARIABLE] = uuid.uuid4().hex
        if launch.forkable and self.this_machine and forked.available():
            try:
                return LocalChannel(_fork(launch, env), tree)
            except OSError:  # (the template could not start, or ended: start the command instead)
                pass
        process = subprocess.Popen(
            [*self.launcher, *launch.argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=launch.cwd,
            start_new_session=True,  # Ctrl-C in the terminal reaches the client only
        )
        for stream in (process.stdin, process.stdout):
            _widen_pipe(stream)
        return LocalChannel(process, tree)

    def run(self, command: str, *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        out: list[str] = []
        err: list[str] = []
        code = self._spawn(command, lambda s, line: (out if s == "stdout" else err).append(line + "\n"),
                           timeout, stdin)
        return CommandResult(code, "".join(out), "".join(err))

    def stream(self, command: str, on_line: Callable[[str, str], None], *, timeout: float | None = None,
               confirm_gone: bool = True) -> int:  # (the session is killed and waited for here: no round trip)
        # Under the dead man's switch: if this process dies, the pipe's end closes with it.
        return self._spawn(guarded(command), on_line, timeout, None)

    def _spawn(self, command: str, on_line: Callable[[str, str], None], timeout: float | None,
               stdin: bytes | None) -> int:
        """Run ``command`` in a session of its own; on timeout (or an interrupt) kill the whole
        session, so nothing it started outlives it. Its stdin is a pipe kept open until it ends."""
        process = subprocess.Popen([*self.launcher, "/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, start_new_session=True)
        lock = threading.Lock()

        def pump(name: str, pipe: Any) -> None:
            for raw in iter(pipe.readline, b""):
                with lock:
                    on_line(name, raw.decode("utf-8", "replace").rstrip("\r\n"))

        pipes: list[tuple[str, Any]] = [("stdout", process.stdout), ("stderr", process.stderr)]
        threads = [threading.Thread(target=pump, args=pipe, daemon=True) for pipe in pipes]
        for t in threads:
            t.start()
        try:
            assert process.stdin is not None
            if stdin is not None:
                with contextlib.suppress(BrokenPipeError):
                    process.stdin.write(stdin)
                process.stdin.close()
            try:
                code = process.wait(timeout)
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"`{command[:60]}` did not finish within {timeout:g}s") from None
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)  # whatever it left behind, too
            process.wait()
            with contextlib.suppress(OSError):
                process.stdin.close()  # type: ignore[union-attr]
            for t, (_, pipe) in zip(threads, pipes):
                t.join(5)
                if not t.is_alive():  # (a pipe still read is left open: its close would wait for that read)
                    pipe.close()
        return code

    def put(self, local_path: str, remote_path: str, *, mode: int | None = None) -> None:
        with open(local_path, "rb") as f:
            self._write(f.read(), remote_path, mode)

    def put_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        self._write(data, remote_path, mode)

    def _write(self, data: bytes, remote_path: str, mode: int | None) -> None:
        write_atomically(self.expand(remote_path), data, 0o600 if mode is None else mode)

    def exists(self, remote_path: str, size: int | None = None) -> bool:
        try:
            st = os.stat(self.expand(remote_path))
        except OSError:
            return False
        return size is None or st.st_size == size

    def expand(self, path: str) -> str:
        return os.path.expanduser(path)
