"""Where a worker's Python-level output goes: whole lines, attributed to the task that wrote them."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from skyward.runtime import output as runtime_output
from skyward.protocol import MAX_LINE, cut_marker

SendOutput = Callable[[int | None, str, str], None]  # (task id or None, stream, line)
_FIRST_WRITE = threading.Lock()


class LineSink:
    """Collects a task's (or the worker's) writes and sends them as whole lines, each at most
    :data:`MAX_LINE` characters (plus the marker of what was cut)."""

    __slots__ = ("_send", "_task_id", "_buffers", "_cut", "_lock")

    def __init__(self, send: Any, task_id: int | None):
        self._send = send
        self._task_id = task_id
        # Made on the first write: most tasks print nothing, and this runs once per task.
        self._buffers: dict[str, str] | None = None
        self._cut: dict[str, int] | None = None  # characters dropped from the pending line
        self._lock: threading.Lock | None = None

    def __call__(self, stream: str, text: str) -> None:
        lock = self._lock
        if lock is None:
            with _FIRST_WRITE:
                if self._lock is None:
                    self._buffers = {"stdout": "", "stderr": ""}
                    self._cut = {"stdout": 0, "stderr": 0}
                    self._lock = threading.Lock()
            lock = self._lock
        buffers, cuts = self._buffers, self._cut
        assert lock is not None and buffers is not None and cuts is not None
        with lock:
            if text == "":  # flush(): send a partial line too
                pending, buffers[stream] = buffers[stream], ""
                cut, cuts[stream] = cuts[stream], 0
                lines = [pending + cut_marker(cut) if cut else pending] if pending or cut else []
            elif "\n" not in text:  # a piece of a line
                pending = buffers[stream]
                room = MAX_LINE - len(pending)
                if len(text) <= room:
                    buffers[stream] = pending + text
                else:
                    buffers[stream] = pending + text[:room]
                    cuts[stream] += len(text) - room
                return
            else:
                *lines, rest = (buffers[stream] + text if len(buffers[stream]) < MAX_LINE else text).split("\n")
                if len(buffers[stream]) >= MAX_LINE:  # the pending line is full: all of text's first line is cut
                    cuts[stream] += len(lines[0])
                    lines[0] = buffers[stream]
                if cuts[stream] or len(lines[0]) > MAX_LINE:
                    first = lines[0]
                    cut = cuts[stream] + max(0, len(first) - MAX_LINE)
                    lines[0] = first[:MAX_LINE] + cut_marker(cut)
                for i in range(1, len(lines)):
                    if len(lines[i]) > MAX_LINE:
                        lines[i] = lines[i][:MAX_LINE] + cut_marker(len(lines[i]) - MAX_LINE)
                cuts[stream] = max(0, len(rest) - MAX_LINE)
                buffers[stream] = rest[:MAX_LINE]
        for line in lines:
            self._send(self._task_id, stream, line)

    def close(self) -> None:
        if self._lock is None:
            return  # nothing was written
        self("stdout", "")
        self("stderr", "")


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
