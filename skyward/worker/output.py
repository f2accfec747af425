"""Where a worker's Python-level output goes: whole lines, attributed to the task that wrote them."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from skyward import runtime

SendOutput = Callable[[int | None, str, str], None]  # (task id or None, stream, line)


class LineSink:
    """Collects a task's (or the worker's) writes and sends them as whole lines."""

    def __init__(self, send: Any, task_id: int | None):
        self._send = send
        self._task_id = task_id
        self._buffers = {"stdout": "", "stderr": ""}
        self._lock = threading.Lock()
        self._used = False  # nothing written yet: close() has nothing to flush

    def __call__(self, stream: str, text: str) -> None:
        self._used = True
        with self._lock:
            if text == "":  # flush(): send a partial line too
                pending, self._buffers[stream] = self._buffers[stream], ""
                lines = [pending] if pending else []
            else:
                data = self._buffers[stream] + text
                *lines, self._buffers[stream] = data.split("\n")
        for line in lines:
            self._send(self._task_id, stream, line)

    def close(self) -> None:
        if not self._used:
            return
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
    task by :func:`skyward.worker.slots.run_task`), anything else is sent as worker output."""
    sys.stdout = runtime._Router("stdout", _WorkerStream("stdout", LineSink(send_output, None)))
    sys.stderr = runtime._Router("stderr", _WorkerStream("stderr", LineSink(send_output, None)))
