"""Workers forked from a warm template (:mod:`skyward.worker.template`) instead of started afresh.

A Local worker started as ``python -m skyward.worker`` costs an interpreter start and the
worker's imports (about 100 ms of CPU); a 1,000-node pool started that way keeps 2 cores busy
for minutes and holds a copy of every module in every worker. Instead, the first Local worker
of a client process starts the template (one more process, which has imported the worker),
and every worker after it is one ``fork()`` of it: a node costs a few milliseconds, and the
workers share the template's pages copy on write.

Guarantees:

1. A forked worker runs exactly what ``python -m skyward.worker`` runs (the template calls
   the same entry), with the environment, directory and standard streams the command would
   have had, in a session of its own.
2. :class:`Forked` stands for the worker's process as ``subprocess.Popen`` would: ``pid``,
   ``stdin``/``stdout``/``stderr``, ``poll()``, ``wait(timeout)`` and ``returncode`` (the
   template, its parent, reaps it and reports the exit).
3. The template ends with its socket: when the client closes it or dies, however (Ctrl-C,
   SIGKILL). Workers already forked then end as any worker does when the client is gone (end
   of their stdin). A template that died meanwhile is replaced by the next start; workers it
   had forked are then waited for by their pid (exit code unknown: :data:`UNKNOWN_EXIT`).
4. A template lives while it has workers: once the last one it forked has ended, it is ended
   too, before that worker's ``wait()`` returns (the next worker starts a new one).
5. One thread per running template reads its reports, whatever the pool's size.

Only workers on this machine, in the client's own interpreter (``WorkerLaunch.forkable``),
are forked; anything else (a launcher such as ``srun``) is started as a command.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO, Any

#: The exit code reported for a worker whose template died before it (its status is lost).
UNKNOWN_EXIT = 255

#: Environment variables read as an interpreter starts: a template serves only requests made
#: with the same values (another set starts another template).
STARTUP_PREFIXES = ("PYTHON", "LD_")


def available() -> bool:
    return sys.platform.startswith("linux") and hasattr(socket, "send_fds")


class Forked:
    """A worker forked by the template, as a ``subprocess.Popen`` would stand for it."""

    def __init__(self, template: Template, stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]):
        self.pid = 0  # (known once the template has forked it: ``forked`` is set)
        self.forked = threading.Event()
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._template = template
        self._ended = threading.Event()

    def ended(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        if self.returncode is None and self._template.dead:
            self._orphaned()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ended.wait(0.05 if self._template.dead else 0.5 if deadline is None
                                   else max(0.0, min(0.5, deadline - time.monotonic()))):
            if self.poll() is not None:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def _orphaned(self) -> None:
        # Its parent is gone: it was handed to init (or a subreaper), which reaps it.
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            self.ended(UNKNOWN_EXIT)
        except PermissionError:  # (its pid is someone else's now)
            self.ended(UNKNOWN_EXIT)


class Template:
    """One running template and the workers it forked (see the module docstring)."""

    def __init__(self, python: str, env: Mapping[str, str], cwd: str | None, key: tuple[Any, ...]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen([python, "-m", "skyward.worker.template"], stdin=theirs,
                                            stdout=subprocess.DEVNULL, env=dict(env), cwd=cwd,
                                            start_new_session=True)  # (Ctrl-C reaches the client only)
        finally:
            theirs.close()
        self._key = key
        self._sock = ours
        self._asking = threading.Lock()  # one request written at a time: the answers come in order
        self._answered = threading.Lock()
        self._pending: collections.deque[Forked] = collections.deque()  # asked for, not yet forked
        self._workers: dict[int, Forked] = {}
        #: Workers alive or being forked; at 0 the template is ended (under ``_lock``).
        self.users = 0
        self.dead = False
        threading.Thread(target=self._read, name="skyward-template", daemon=True).start()

    def fork(self, argv: list[str], env: Mapping[str, str], cwd: str | None, pipes: tuple[IO[bytes], ...],
             ends: tuple[int, int, int]) -> Forked:
        """Fork a worker with ``ends`` (its stdin, stdout, stderr) and return it; ``pipes`` are
        the client's ends of the same pipes. Needs a use taken by :func:`template_for`, which
        this gives back when it fails (raising OSError) or once the worker has ended."""
        request = json.dumps({"argv": argv, "env": dict(env), "cwd": cwd}).encode()
        worker = Forked(self, *pipes)
        try:
            # Requests are not waited on one by one: the template forks them back to back
            # while the client's start threads go on (a round trip each cost 24 ms at load 25).
            with self._asking:
                if self.dead:
                    raise OSError("the worker template has ended")
                with self._answered:
                    self._pending.append(worker)
                try:
                    socket.send_fds(self._sock, [request], list(ends))
                except BaseException:
                    with self._answered:
                        self._pending.remove(worker)
                    raise
            while not worker.forked.wait(1.0):
                if self.dead:
                    raise OSError("the worker template ended before it forked the worker")
        except BaseException:
            self._release()
            raise
        return worker

    def _ended(self, worker: Forked, code: int) -> None:
        self._release()
        worker.ended(code)  # (after the template's own end, if it was its last worker)

    def _release(self) -> None:
        with _lock:
            self.users -= 1
            last = self.users == 0
            if last and _templates.get(self._key) is self:
                del _templates[self._key]
        if last:
            # Its last worker is gone: end it now, and wait for it, so that a pool that has
            # confirmed its workers gone leaves no process of its own behind.
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)
            try:
                self.process.wait(END_LIMIT)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def _read(self) -> None:
        try:
            while True:
                message = self._sock.recv(4096)
                if not message:
                    break
                report = json.loads(message)
                with self._answered:
                    if "pid" in report:
                        worker = self._pending.popleft()
                        worker.pid = report["pid"]
                        self._workers[worker.pid] = worker
                        worker.forked.set()
                        continue
                    worker = self._workers.pop(report["exit"])  # (its pid came first)
                self._ended(worker, report["code"])
        except OSError:
            pass
        self.dead = True
        self._sock.close()
        self.process.wait()


#: Seconds a template whose socket has ended gets to exit before it is killed.
END_LIMIT = 5.0

_templates: dict[tuple[Any, ...], Template] = {}
_lock = threading.Lock()


def _forget_in_child() -> None:
    # A process forked from the client (multiprocessing's fork) must not hold the client's
    # end of a template's socket: the template would then outlive the client.
    global _lock
    for template in _templates.values():
        with contextlib.suppress(OSError):
            os.close(template._sock.detach())
    _templates.clear()
    _lock = threading.Lock()  # (another thread may have held it at the fork)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def template_for(python: str, env: Mapping[str, str], cwd: str | None) -> Template:
    """This process's template for workers of ``python`` started with ``env`` and ``cwd`` (a
    new one if none is running; a process forked from the client starts its own), one use of
    it taken: give it back through :meth:`Template.fork`."""
    key = (python, cwd, tuple(sorted((k, v) for k, v in env.items() if k.startswith(STARTUP_PREFIXES))))
    with _lock:
        found = _templates.get(key)
        if found is None or found.dead:
            found = _templates[key] = Template(python, env, cwd, key)
        found.users += 1
        return found
