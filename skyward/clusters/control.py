"""Asking a named cluster's workers on their control sockets (``SOCKET.ctl``: one line asked,
one answered; :meth:`skyward.worker.resident.Resident.answer`), as ``skyward status``,
``autostop`` and the dashboard do.

Every ask of a node goes at once: on this machine (Local) each socket is asked from this
process, starting nothing; elsewhere the node's Python runs :func:`ask` once for all of them
(its source is sent with the command). Asking is no use of the cluster: it never delays autostop.
"""

from __future__ import annotations

import inspect
import shlex
from typing import TYPE_CHECKING

from skyward.runtime.cluster import CONTROL_SUFFIX

if TYPE_CHECKING:
    from skyward.transport.base import Transport

__all__ = ["ask", "ask_node"]


def ask(line: str, path: str) -> str:
    """Worker ``path``'s answer to ``line`` (without its newline), ``down`` when none comes (in
    5 s; a look, which reads the job queue, 10 s); a worker from before control sockets is asked
    on its own socket, and only whether it is up (``up``; ``old`` for any other ask)."""
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10.0 if line.startswith("look") else 5.0)
    try:
        try:
            s.connect(path + CONTROL_SUFFIX)
        except FileNotFoundError:
            s.connect(path)
            return "up" if line == "status" else "old"
        s.sendall(line.encode() + b"\n")
        return s.makefile("rb").readline().decode().strip() or "down"
    except OSError:
        return "down"
    finally:
        s.close()


#: Run with a node's Python (argv: line, socket, line, socket...): each answer on a line.
_SCRIPT = (f"CONTROL_SUFFIX = {CONTROL_SUFFIX!r}\n{inspect.getsource(ask)}\nimport sys\n"
           "for i in range(1, len(sys.argv) - 1, 2):\n"
           "    print(ask(sys.argv[i], sys.argv[i + 1]))\n")


def ask_node(transport: Transport, python: str, asks: list[tuple[str, str]]) -> list[str]:
    """The answers of one node's workers to ``asks`` ((line, socket) each), in order; ``down``
    for one that did not answer. Raises what ``transport.run`` raises when the node cannot be
    reached."""
    if transport.this_machine:
        return [ask(line, path) for line, path in asks]
    command = shlex.join([python, "-I", "-c", _SCRIPT, *(part for pair in asks for part in pair)])
    answers = transport.run(command, timeout=30.0).stdout.splitlines()
    return answers[:len(asks)] + ["down"] * (len(asks) - len(answers))
