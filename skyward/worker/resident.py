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
   (:data:`~skyward.protocol.bridge.BRIDGE`, started through the pool's transport like any worker) that copies the
   client's stream to the socket and back;
3. serves one client at a time (:class:`Resident`). A client that leaves (DETACH), whose
   stream ends, or that goes silent for the pool's ``idle_timeout`` ends its session: the
   tasks it started are cancelled and their late results dropped, never delivered to the next
   client. A new connection while a session is open takes over (the client side lets only one
   client hold a cluster at a time, so the open session is one whose client is gone);
4. answers ``skyward status``, ``skyward autostop`` and the dashboard's looks at its node on a
   second socket, ``SOCKET.ctl`` (:meth:`Resident.answer`: one line asked, one answered, each in
   a thread of its own), without opening a session: looking
   at a cluster is no use of it, so it never delays the autostop; ``autostop SECONDS|none``
   there sets the idle limit live (the idle clock starts again from then);
5. enforces the cluster's autostop itself: after ``autostop`` seconds with no client attached
   and no detached run going on it exits, and its keepers end everything its tasks started
   (``autostop`` 0, a cluster made with ``down`` alone: as soon as the last client leaves and
   the last detached run ends; a new worker always waits a while for its first client). A
   machine that must power off when idle (AWS) watches a heartbeat file that the worker
   touches while it is in use.

Task ids are numbered by each client from 1, so a session's ids are kept apart from an older
session's (:meth:`Resident.inner`); results of a cancelled session's tasks go nowhere.
"""

from __future__ import annotations

import contextlib
import json
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

from skyward.runtime.cluster import CLUSTER_DIR, CONTROL_SUFFIX
from skyward.runtime.jobqueue import jobs_in_use
from skyward.runtime.nodelook import NodeLook
from skyward.worker.log import log

#: Task ids on the wire are a session's own; inside the worker they carry the session number
#: above this bit, so that an old session's late results can be told apart.
_SESSION_SHIFT = 40
#: Seconds the starting command waits for the worker to listen.
LISTEN_TIMEOUT = 60.0
#: Seconds between touches of the heartbeat file (the AWS watchdog's idle limit is minutes).
TOUCH_INTERVAL = 10.0
#: Seconds a new worker waits for its first client whatever its autostop (0 for a cluster
#: made with ``down`` alone): the client that started it connects right after.
FIRST_CLIENT_WAIT = LISTEN_TIMEOUT
#: Seconds between looks at the detached runs that keep an idle worker up.
JOB_POLL = 1.0



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
        # (None: the autostop was changed, look at the clock again)
        self._incoming: queue.Queue[socket.socket | None] = queue.Queue()
        self._lock = threading.Lock()
        self.link: Link | None = None
        self._sessions = 0
        self._look = NodeLook()
        self.detached_since: float | None = time.monotonic()
        directory = os.path.dirname(path)
        os.environ[CLUSTER_DIR] = directory  # (tasks start detached runs under it: jobs_dir)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)
        self._server = _listen(path)
        self._control = _listen(path + CONTROL_SUFFIX)
        threading.Thread(target=self._accept_loop, name="skyward-resident-accept", daemon=True).start()
        threading.Thread(target=self._control_loop, name="skyward-resident-control", daemon=True).start()
        if heartbeat_file:
            threading.Thread(target=self._touch_loop, name="skyward-resident-touch", daemon=True).start()

    # -- connections ---------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:  # (looked at before the hand-over: the agent may take the new
                link = self.link  # client at once, and that session must not be the one cut)
            self._incoming.put(conn)
            if link is not None:  # a new client: the one before it is gone (see the module doc)
                log("a new client attached; ending the previous session", "resident")
                link.cut()

    def _control_loop(self) -> None:
        while True:
            try:
                conn, _ = self._control.accept()
            except OSError:
                return
            # (a look reads the job queue, which may wait on its database: in a thread of its
            # own, so that a status ask meanwhile is answered at once)
            threading.Thread(target=self._reply, args=(conn,), name="skyward-resident-ask", daemon=True).start()

    def _reply(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.settimeout(2.0)
            asked = conn.makefile("rb").readline(200).decode("ascii", "replace")
            conn.settimeout(60.0)
            conn.sendall(self.answer(asked).encode() + b"\n")

    def answer(self, asked: str) -> str:
        """The control socket's answer to one line: ``status`` -> ``up``; ``autostop SECONDS``
        or ``autostop none`` -> ``ok`` (see :meth:`set_autostop`); ``look NODE`` -> the node's
        figures and its part of the job queue, one JSON line (:mod:`skyward.runtime.nodelook`);
        anything else -> ``error``. Asking is no use of the cluster: the idle clock goes on."""
        words = asked.split()
        if words == ["status"]:
            return "up"
        if len(words) == 2 and words[0] == "look" and words[1].isdigit():
            return json.dumps(self._look.look(os.path.dirname(self.path), int(words[1])), separators=(",", ":"))
        if len(words) == 2 and words[0] == "autostop":
            try:
                seconds = None if words[1] == "none" else float(words[1])
            except ValueError:
                return "error"
            if seconds is None or seconds >= 0:
                self.set_autostop(seconds)
                return "ok"
        return "error"

    def set_autostop(self, seconds: float | None) -> None:
        """A new idle limit (None: none), in force at once: an idle worker's clock starts again
        now and its wait for the next client is looked at again."""
        with self._lock:
            self.autostop = seconds
            if self.detached_since is not None:
                self.detached_since = time.monotonic()
        self._incoming.put(None)
        log(f"autostop set to {'none' if seconds is None else f'{seconds:g}s'}", "resident")

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
        floor = 0.0
        while True:
            limit = self._idle_limit()
            timeout = None if limit is None else max(floor, since + limit - time.monotonic())
            try:
                conn = self._incoming.get(timeout=timeout)
            except queue.Empty:
                if not jobs_in_use():
                    return None
                since = time.monotonic()  # a detached run is still going: not idle yet
                floor = JOB_POLL  # (and it is looked at again a second later at the soonest)
                continue
            if conn is None:  # the autostop changed (set_autostop): its clock too
                with self._lock:
                    since = max(since, self.detached_since or since)
                floor = 0.0
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
        for server in (self._server, self._control):
            with contextlib.suppress(OSError):
                server.close()
        for path in (self.path, self.path + CONTROL_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

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
        limit = self._idle_limit()
        return since is None or limit is None or time.monotonic() - since < limit or jobs_in_use()

    def _idle_limit(self) -> float | None:
        """Seconds without a client before autostop: ``autostop``, at least FIRST_CLIENT_WAIT
        before the first client came."""
        if self.autostop is None:
            return None
        return self.autostop if self._sessions else max(self.autostop, FIRST_CLIENT_WAIT)

    def _touch_loop(self) -> None:
        assert self.heartbeat_file
        while True:
            if self.in_use():
                with contextlib.suppress(OSError):
                    os.utime(self.heartbeat_file)
            time.sleep(TOUCH_INTERVAL)


def _listen(path: str) -> socket.socket:
    """A Unix socket listening on ``path`` (mode 0600; one left by an earlier worker replaced)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        server.bind(path)
    finally:
        os.umask(old)
    server.listen(8)
    return server


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
        _stdio_to(log_path)
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


def stay(path: str) -> None:
    """Stay in the foreground, for a worker that is a batch scheduler's job step (``--in-step``:
    Slurm ends a step's processes when the step's first one exits, so it must not detach):
    output to ``path + '.log'``, and the byte :func:`listening` writes goes to the original
    stdout, which the process that started the step reads."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    ready = os.dup(1)
    _stdio_to(path + ".log")
    os.environ["SKYWARD_RESIDENT_READY_FD"] = str(ready)


def _stdio_to(log_path: str) -> None:
    """stdin from /dev/null, stdout and stderr appended to ``log_path`` (made private)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(devnull)


def listening() -> None:
    """Tell the command that started this worker (see :func:`daemonize`) that it listens."""
    fd = os.environ.pop("SKYWARD_RESIDENT_READY_FD", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.write(int(fd), b"!")
            os.close(int(fd))


def options(argv: list[str]) -> dict[str, Any]:
    """``--resident PATH [--autostop SECONDS] [--heartbeat-file PATH] [--in-step]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m skyward.worker")
    parser.add_argument("--resident", dest="path", required=True)
    parser.add_argument("--autostop", type=float, default=None)
    parser.add_argument("--heartbeat-file", default=None)
    parser.add_argument("--in-step", action="store_true")
    args = parser.parse_args(argv)
    return {"path": os.path.expanduser(args.path), "autostop": args.autostop,
            "heartbeat_file": args.heartbeat_file, "in_step": args.in_step}
