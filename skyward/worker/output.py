"""Where a worker's Python-level output goes: whole lines, attributed to the task that wrote them."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from skyward.runtime import output as runtime_output
from skyward.protocol import MAX_LINE

#: (task id or None, stream, text, more): ``text`` is a whole line, or with ``more`` a piece of
#: one that goes on in the next call for the same stream.
SendOutput = Callable[[int | None, str, str, bool], None]
_FIRST_WRITE = threading.Lock()


class LineSink:
    """Collects a task's (or the worker's) writes and sends them line by line, never cut: a
    line longer than :data:`MAX_LINE` characters goes in pieces of that size (``more``), so
    neither the worker nor the client ever holds a whole huge line. ``flush()`` sends the
    pending part of a line at once, as a piece (a progress bar redrawn with ``\r``, a prompt);
    the end of the task ends it."""

    __slots__ = ("_send", "_task_id", "_buffers", "_lock")

    def __init__(self, send: Any, task_id: int | None):
        self._send = send
        self._task_id = task_id
        # Made on the first write: most tasks print nothing, and this runs once per task.
        self._buffers: dict[str, str] | None = None
        self._lock: threading.Lock | None = None

    def __call__(self, stream: str, text: str, *, end: bool = False) -> None:
        lock = self._lock
        if lock is None:
            with _FIRST_WRITE:
                if self._lock is None:
                    self._buffers = {"stdout": "", "stderr": ""}
                    self._lock = threading.Lock()
            lock = self._lock
        buffers = self._buffers
        assert lock is not None and buffers is not None
        out: list[tuple[str, bool]] = []
        with lock:
            if text == "":  # flush(): the pending part of the line goes now (and the line ends, at ``end``)
                pending, buffers[stream] = buffers[stream], ""
                if pending:
                    out.append((pending, not end))
            else:
                *lines, rest = (buffers[stream] + text).split("\n")
                for line in lines:
                    while len(line) > MAX_LINE:
                        out.append((line[:MAX_LINE], True))
                        line = line[MAX_LINE:]
                    out.append((line, False))
                while len(rest) > MAX_LINE:
                    out.append((rest[:MAX_LINE], True))
                    rest = rest[MAX_LINE:]
                buffers[stream] = rest
            # Sent under the lock: two threads of one task cannot reorder the pieces of a line.
            for piece, more in out:
                self._send(self._task_id, stream, piece, more)

    def close(self) -> None:
        if self._lock is None:
            return  # nothing was written
        self("stdout", "", end=True)
        self("stderr", "", end=True)


class _WorkerStream:
    """The fallthrough target of the routers: output not attributed to a task."""

    def __init__(self, name: str, sink: LineSink):
        self._name = name
        self._sink = sink

    def write(self, text: str) -> int:
        self._sink(self._name, text)
        return len(text)

    def flush(self) -> None:
        self._sink(self._name, "")

    def fileno(self) -> int:
        # The worker's fd 1 is a copy of its fd 2 (the protocol has a descriptor of its own):
        # what is written to either reaches the client's log, never the protocol stream.
        return 1 if self._name == "stdout" else 2


def route_output(send_output: SendOutput) -> None:
    """Route this process's sys.stdout/sys.stderr: a task's writes go to its own sink (set per
    task by :func:`skyward.worker.executors.base.run_task`), anything else is sent as worker output."""
    sys.stdout = runtime_output.Router("stdout", _WorkerStream("stdout", LineSink(send_output, None)))
    sys.stderr = runtime_output.Router("stderr", _WorkerStream("stderr", LineSink(send_output, None)))
