"""The worker's own stderr, as the client reads it: whole lines, each cut at the wire's limit.

What reaches a worker's descriptor 2 directly (C code, subprocesses, the agent's own
diagnostics) never passes the worker's line cap (:mod:`skyward.worker.output`): it is cut
here, with the same marker, reading at most a line's worth at a time, so a process printing
one endless line cannot exhaust the client's memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO

from skyward.protocol import MAX_LINE, cut_marker


def read_lines(stream: IO[bytes], on_line: Callable[[str], None]) -> None:
    """Call ``on_line`` with each line of ``stream`` (at most :data:`MAX_LINE` bytes, plus the
    marker of what was cut) until the stream ends."""
    kept, cut = b"", 0
    for raw in iter(lambda: stream.readline(MAX_LINE + 1), b""):
        whole = raw.endswith(b"\n")
        body = raw[:-1] if whole else raw
        room = MAX_LINE - len(kept)
        kept += body[:room]
        cut += max(0, len(body) - room)
        if whole:
            on_line(_text(kept, cut))
            kept, cut = b"", 0
    if kept or cut:
        on_line(_text(kept, cut))


def _text(raw: bytes, cut: int) -> str:
    return raw.decode("utf-8", "replace") + (cut_marker(cut, "bytes") if cut else "")
