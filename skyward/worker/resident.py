"""A named cluster's worker: one that outlives its client and waits for the next.

An ordinary worker talks to the one client that started it, over that process's stdin and
stdout, and ends with it. A cluster's worker (``python -m skyward.worker --resident SOCKET``)
instead:

1. starts detached (:func:`daemonize`): a session of its own, its output in ``SOCKET.log``,
   and the command that started it returns once the worker listens, so the client that
   provisions a cluster waits for exactly what a later one attaches to;
2. listens on a Unix socket, ``SOCKET``, in a directory only its user can open (mode 0700,
   the socket 0600): no port on any interface, and reaching it from another machine takes
   the SSH login that reaches the user's files. A client attaches through a bridge process
   (:data:`BRIDGE`, started through the pool's transport like any worker) that copies the
   client's stream to the socket and back;
3. serves one client at a time (:class:`Resident`). A client that leaves (DETACH), whose
   stream ends, or that goes silent for the pool's ``idle_timeout`` ends its session: the
   tasks it started are cancelled and their late results dropped, never delivered to the next
   client. A new connection while a session is open takes over (the client side lets only one
   client hold a cluster at a time, so the open session is one whose client is gone);
4. enforces the cluster's autostop itself: after ``autostop`` seconds with no client attached
   it exits, and its keepers end everything its tasks started. A machine that must power off
   when idle (AWS) watches a heartbeat file that the worker touches while it is in use.

Task ids are numbered by each client from 1, so a session's ids are kept apart from an older
session's (:meth:`Resident.inner`); results of a cancelled session's tasks go nowhere.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

#: Task ids on the wire are a session's own; inside the worker they carry the session number
#: above this bit, so that an old session's late results can be told apart.
_SESSION_SHIFT = 40
#: Seconds the starting command waits for the worker to listen.
LISTEN_TIMEOUT = 60.0
#: Seconds between touches of the heartbeat file (the AWS watchdog's idle limit is minutes).
TOUCH_INTERVAL = 10.0

#: What a client's bridge runs (``python -I -c BRIDGE SOCKET``): copy stdin to the socket and
#: the socket to stdout until either ends. The standard library only, so it starts in tens of
#: milliseconds; stdin's end (the client is gone) closes the socket's sending side, which ends
#: the worker's session.
BRIDGE = r"""
import os, socket, sys, threading
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except OSError as e:
    sys.stderr.write("skyward: no cluster worker at %s: %s\n" % (sys.argv[1], e.strerror))
    sys.exit(17)
def up():
    try:
        while True:
            b = os.read(0, 1 << 20)
            if not b:
                break
            s.sendall(b)
    except OSError:
        pass
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
threading.Thread(target=up, daemon=True).start()
try:
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        v = memoryview(b)
        while v:
            v = v[os.write(1, v):]
except OSError:
    pass
os._exit(0)
"""
#: The bridge's exit code when nothing listens on the socket (the cluster's worker is gone).
NO_WORKER = 17


@dataclass(eq=False)
class Link:
    """One client's connection: the socket and the streams the protocol reads and writes."""

    sock: socket.socket
    reader_stream: Any
    writer_stream: Any
    session: int

    @classmethod
    def of(cls, sock: socket.socket, session: int) -> Link:
        return cls(sock, sock.makefile("rb", buffering=0), sock.makefile("wb", buffering=1 << 16), session)

    def cut(self) -> None:
        """End the session from any thread: the reader sees the end of its stream."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.cut()
        for f in (self.reader_stream, self.writer_stream):
            with contextlib.suppress(OSError, ValueError):
                f.close()
        with contextlib.suppress(OSError):
            self.sock.close()


class Resident:
    """The listening socket, the session in progress, and the autostop clock."""

    def __init__(self, path: str, autostop: float | None, heartbeat_file: str | None = None):
        self.path = path
        self.autostop = autostop
        self.heartbeat_file = heartbeat_file
        self._incoming: queue.Queue[socket.socket] = queue.Queue()
        self._lock = threading.Lock()
        self.link: Link | None = None
        self._sessions = 0
        self.detached_since: float | None = time.monotonic()
        directory = os.path.dirname(path)
        os.environ[CLUSTER_DIR] = directory  # (tasks start detached runs under it: jobs_dir)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self._server.bind(path)
        finally:
            os.umask(old)
        self._server.listen(8)
        threading.Thread(target=self._accept_loop, name="skyward-resident-accept", daemon=True).start()
        if heartbeat_file:
            threading.Thread(target=self._touch_loop, name="skyward-resident-touch", daemon=True).start()

    # -- connections ---------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._incoming.put(conn)
            with self._lock:
                link = self.link
            if link is not None:  # a new client: the one before it is gone (see the module doc)
                _log("a new client attached; ending the previous session")
                link.cut()

    def next_link(self) -> Link | None:
        """Wait for the next client (the previous link, if any, is closed first); None once no
        client has come for ``autostop`` seconds since the last one left."""
        with self._lock:
            old, self.link = self.link, None
            if old is not None or self.detached_since is None:
                self.detached_since = time.monotonic()
            since = self.detached_since
        if old is not None:
            old.close()
        while True:
            timeout = None if self.autostop is None else max(0.0, since + self.autostop - time.monotonic())
            try:
                conn = self._incoming.get(timeout=timeout)
            except queue.Empty:
                if not running_jobs():
                    return None
                since = time.monotonic()  # a detached run is still going: not idle yet
                continue
            with self._lock:
                self._sessions += 1
                self.link = Link.of(conn, self._sessions)
                self.detached_since = None
                return self.link

    def cut(self, session: int) -> None:
        """End session ``session`` if it is still the current one."""
        with self._lock:
            link = self.link
        if link is not None and link.session == session:
            link.cut()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    # -- task ids ------------------------------------------------------------------------------
    @staticmethod
    def inner(session: int, task_id: int) -> int:
        """The worker's own id for a session's task."""
        return (session << _SESSION_SHIFT) | task_id

    @staticmethod
    def outer(inner: int) -> tuple[int, int]:
        """(session, the client's task id) for an id made by :meth:`inner`."""
        return inner >> _SESSION_SHIFT, inner & ((1 << _SESSION_SHIFT) - 1)

    # -- the machine's heartbeat ---------------------------------------------------------------
    def in_use(self) -> bool:
        """A client is attached, or the last one left less than ``autostop`` seconds ago."""
        with self._lock:
            since = self.detached_since
        return (since is None or self.autostop is None or time.monotonic() - since < self.autostop
                or bool(running_jobs()))

    def _touch_loop(self) -> None:
        assert self.heartbeat_file
        while True:
            if self.in_use():
                with contextlib.suppress(OSError):
                    os.utime(self.heartbeat_file)
            time.sleep(TOUCH_INTERVAL)


#: The environment variable naming the directory of the cluster worker's socket (on the node).
CLUSTER_DIR = "SKYWARD_CLUSTER_DIR"


def jobs_dir(node: int) -> str:
    """Where node ``node``'s detached runs keep their logs and pid files
    (``<socket dir>/jobs/<node>``: the nodes of a Local cluster share one machine)."""
    base = os.environ.get(CLUSTER_DIR)
    if not base:
        raise RuntimeError("not in a named cluster's worker: detached runs need a cluster (-c NAME)")
    path = os.path.join(base, "jobs", str(node))
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def running_jobs() -> list[int]:
    """The pids of this cluster's detached runs still running on this machine."""
    import glob

    base = os.environ.get(CLUSTER_DIR)
    if not base:
        return []
    alive = []
    for pid_file in glob.glob(os.path.join(glob.escape(base), "jobs", "*", "*.pid")):
        try:
            with open(pid_file) as f:
                pid = int(f.read().strip())
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                    alive.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    return alive


def _log(msg: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"[skyward.resident {os.getpid()}] {msg}\n".encode())


def daemonize(path: str) -> None:
    """Detach (a new session, output to ``path + '.log'``) and return in the detached process;
    the calling process waits until :func:`listening` is called there and exits 0, or exits 1
    with the log's tail if the worker ended first or did not listen within LISTEN_TIMEOUT."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    log_path = path + ".log"
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(ready_r)
        os.setsid()
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(devnull)
        os.environ["SKYWARD_RESIDENT_READY_FD"] = str(ready_w)
        return
    os.close(ready_w)
    deadline = time.monotonic() + LISTEN_TIMEOUT
    poller = select.poll()
    poller.register(ready_r, select.POLLIN)
    while time.monotonic() < deadline:
        if poller.poll(100) and os.read(ready_r, 1):
            os._exit(0)
        pid, _ = os.waitpid(child, os.WNOHANG)
        if pid:
            break
    with contextlib.suppress(OSError), open(log_path, "rb") as f:
        sys.stderr.write(f.read()[-4000:].decode("utf-8", "replace"))
    sys.stderr.write(f"skyward: the cluster worker did not start listening on {path}\n")
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGTERM)
    os._exit(1)


def listening() -> None:
    """Tell the command that started this worker (see :func:`daemonize`) that it listens."""
    fd = os.environ.pop("SKYWARD_RESIDENT_READY_FD", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.write(int(fd), b"!")
            os.close(int(fd))


def options(argv: list[str]) -> dict[str, Any]:
    """``--resident PATH [--autostop SECONDS] [--heartbeat-file PATH]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m skyward.worker")
    parser.add_argument("--resident", dest="path", required=True)
    parser.add_argument("--autostop", type=float, default=None)
    parser.add_argument("--heartbeat-file", default=None)
    args = parser.parse_args(argv)
    return {"path": os.path.expanduser(args.path), "autostop": args.autostop,
            "heartbeat_file": args.heartbeat_file}
