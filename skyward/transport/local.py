"""Local transport: subprocesses on this machine, each worker in its own session."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from typing import Any

from skyward._procs import group_members
from skyward.transport.base import Channel, CommandResult, Transport, WorkerLaunch


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
    def __init__(self, process: subprocess.Popen[bytes]):
        self.process = process
        assert process.stdin and process.stdout and process.stderr
        self.stdin = process.stdin
        self.stdout = process.stdout.raw  # type: ignore[attr-defined]  # unbuffered: the frame reader buffers
        self.stderr = process.stderr
        self.pgid = process.pid  # start_new_session: the worker leads its own group

    def poll_fd(self) -> int | None:
        return self.stdout.fileno()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.wait(5)

    def confirm_gone(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        self.wait(max(0.0, deadline - time.monotonic()))
        while True:
            members = _group_members(self.pgid)
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


class LocalTransport(Transport):
    host = "localhost"

    def start(self, launch: WorkerLaunch) -> Channel:
        env = dict(os.environ)
        env.update(launch.env)
        process = subprocess.Popen(
            list(launch.argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=launch.cwd,
            start_new_session=True,  # Ctrl-C in the terminal reaches the client only
        )
        for stream in (process.stdin, process.stdout):
            _widen_pipe(stream)
        return LocalChannel(process)

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=timeout)
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def put(self, local_path: str, remote_path: str) -> None:
        import shutil

        shutil.copyfile(local_path, remote_path)
