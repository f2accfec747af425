"""The warm template: one process that has imported the worker, and forks a worker on request.

``python -m skyward.worker`` costs an interpreter start and the worker's imports (about 100 ms
of CPU); a thousand of them at once starve the machine, and each holds its own copy of every
module. So the Local transport (:mod:`skyward.transport.forked`) starts this module once per
client process, ``python -m skyward.worker.template``, with a ``SOCK_SEQPACKET`` Unix socket as
its stdin, and asks it for each worker instead. The template imports the worker's modules once;
a worker then costs a ``fork()`` and shares those pages with every other, copy on write.

The conversation on the socket, one message a datagram, JSON:

* client → template: ``{"argv": [...], "env": {...}, "cwd": "..." | null}`` with three file
  descriptors attached (``SCM_RIGHTS``): the worker's stdin, stdout and stderr.
* template → client: ``{"pid": N}`` once the worker is forked (in the order asked), and
  ``{"exit": N, "code": C}`` when it has ended (``C`` as ``Popen.returncode``: negative for a
  signal). The template is the workers' parent: it reaps them.

The forked child becomes exactly what ``python -m skyward.worker`` would have been: it leaves
the template's session (a session of its own, as ``start_new_session``), takes the three
descriptors as fds 0, 1, 2, the environment and directory given, and then runs the worker's
own entry (:func:`skyward.worker.entry.run`), the one ``__main__`` runs, returning through the
interpreter's ordinary exit. Nothing else of the template stays open in it.

The template ends when its socket ends: the client has closed it or died (Ctrl-C, SIGKILL).
Its workers then go on as a fresh interpreter's would, each ending when its own stdin ends.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
from typing import Any

from skyward.worker import agent, entry, keeper  # noqa: F401  (imported once, shared by every fork)

#: The largest request (bytes): the environment a worker is given is most of it.
REQUEST_LIMIT = 1 << 20


def serve(sock: socket.socket) -> dict[str, Any] | None:
    """Fork a worker for each request on ``sock`` until it ends (then None); in a forked
    child, return its request, the template's own descriptors closed."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # (a handler, so that the wake-up byte is written)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sock:
                try:
                    message, fds, _flags, _addr = socket.recv_fds(sock, REQUEST_LIMIT, 3)
                except ConnectionError:
                    message, fds = b"", []
                if not message:
                    return None  # the client is gone
                request = json.loads(message)
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    sock.close()
                    become(request, fds)
                    return request
                for fd in fds:
                    os.close(fd)
                _send(sock, {"pid": pid})
            else:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                _reap(sock)


def become(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: what ``Popen(argv, stdin=, stdout=, stderr=, env=, cwd=,
    start_new_session=True)`` would have given the worker."""
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    try:
        if request.get("cwd"):
            os.chdir(request["cwd"])
    except OSError as exc:
        os.write(2, f"skyward worker: cannot enter {request['cwd']}: {exc}\n".encode())
        os._exit(1)
    os.environ.clear()
    os.environ.update(request["env"])
    # As ``python -m skyward.worker`` sets it: the module's file, then its arguments.
    sys.argv = [os.path.join(os.path.dirname(entry.__file__), "__main__.py"), *request["argv"][3:]]


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:  # the client is gone: the next read says so
        pass


def main() -> None:
    sock = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.close(devnull)
    request = serve(sock)
    if request is None:
        return
    raise SystemExit(entry.run(sys.argv[1:]))


if __name__ == "__main__":  # (not in a process executor's child, which imports this as __mp_main__)
    main()
