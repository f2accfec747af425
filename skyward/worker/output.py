"""Where a worker's Python-level output goes: whole lines, attributed to the task that wrote them."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from skyward import runtime

SendOutput = Callable[[int | None, str, str], None]  # (task id or None, stream, line)
_FIRST_WRITE = threading.Lock()


class LineSink:
    """Collects a task's (or the worker's) writes and sends them as whole lines."""

    __slots__ = ("_send", "_task_id", "_buffers", "_lock")

    def __init__(self, send: Any, task_id: int | None):
        self._send = send
        self._task_id = task_id
        # Made on the first write: most tasks print nothing, and this runs once per task.
        self._buffers: dict[str, str] | None = None
        self._lock: threading.Lock | None = None

    def __call__(self, stream: str, text: str) -> None:
        lock = self._lock
        if lock is None:
            with _FIRST_WRITE:
                if self._lock is None:
                    self._buffers = {"stdout": "", "stderr": ""}
                    self._lock = threading.Lock()
            lock = self._lock
        buffers = self._buffers
        assert lock is not None and buffers is not None
        with lock:
            if text == "":  # flush(): send a partial line too
                pending, buffers[stream] = buffers[stream], ""
                lines = [pending] if pending else []
            else:
                data = buffers[stream] + text
                *lines, buffers[stream] = data.split("\n")
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
        return 2


def route_output(send_output: SendOutput) -> None:
    """Route this process's sys.stdout/sys.stderr: a task's writes go to its own sink (set per
    task by :func:`skyward.worker.executors.base.run_task`), anything else is sent as worker output."""
    sys.stdout = runtime._Router("stdout", _WorkerStream("stdout", LineSink(send_output, None)))
    sys.stderr = runtime._Router("stderr", _WorkerStream("stderr", LineSink(send_output, None)))
