"""The worker's own stderr, as the client reads it: whole lines, each cut at the wire's limit.

What reaches a worker's descriptor 2 directly (C code, subprocesses, the agent's own
diagnostics) never passes the worker's line cap (:mod:`skyward.worker.output`): it is cut
here, with the same marker, keeping at most a line's worth, so a process printing one endless
line cannot exhaust the client's memory. Local channels' stderr is read by the I/O loop
(:class:`LineCutter` fed by :func:`watch`); channels without a descriptor for it (SSH), by a
thread of their own (:func:`read_lines`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import IO

from skyward.pool import ioloop
from skyward.protocol import MAX_LINE, cut_marker


class LineCutter:
    """Bytes in, whole lines out (each cut at :data:`MAX_LINE` bytes, plus the marker of what
    was cut): ``feed`` what was read, in any pieces, and ``end`` at the end of the stream."""

    def __init__(self, on_line: Callable[[str], None]):
        self._on_line = on_line
        self._kept = b""
        self._cut = 0

    def feed(self, data: bytes) -> None:
        while data:
            line, newline, data = data.partition(b"\n")
            room = MAX_LINE - len(self._kept)
            self._kept += line[:room]
            self._cut += max(0, len(line) - room)
            if newline:
                self._flush()

    def end(self) -> None:
        if self._kept or self._cut:
            self._flush()

    def _flush(self) -> None:
        text = _text(self._kept, self._cut)
        self._kept, self._cut = b"", 0
        self._on_line(text)


def read_lines(stream: IO[bytes], on_line: Callable[[str], None]) -> None:
    """Call ``on_line`` with each line of ``stream`` (at most :data:`MAX_LINE` bytes, plus the
    marker of what was cut) until the stream ends, reading at most a line's worth at a time."""
    cutter = LineCutter(on_line)
    for raw in iter(lambda: stream.readline(MAX_LINE + 1), b""):
        cutter.feed(raw)
    cutter.end()


def _text(raw: bytes, cut: int) -> str:
    return raw.decode("utf-8", "replace") + (cut_marker(cut, "bytes") if cut else "")


def watch(fd: int, on_line: Callable[[str], None], done: threading.Event) -> None:
    """Read ``fd`` (a worker's stderr) on the I/O loop, calling ``on_line`` per line; ``done``
    is set once the stream has ended and its last line was handed over."""
    loop = ioloop.get()
    cutter = LineCutter(on_line)

    def ready() -> None:
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        if data:
            cutter.feed(data)
            return
        loop.unwatch(fd)
        try:
            cutter.end()
        finally:
            done.set()

    loop.call_soon(lambda: loop.watch(fd, ready))
