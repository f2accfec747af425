"""What the user sees while a pool runs: a subscriber of the pool's events.

It prints every task output line with a ``[node N]`` prefix, to the client's stdout or
stderr as the task wrote it. It is attached by ``ComputePool(console=True)`` (the default)
and knows nothing of the pool's internals.
"""

from __future__ import annotations

import sys
import threading

from skyward import events as ev


class Console:
    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, event: ev.Event) -> None:
        if isinstance(event, ev.TaskOutput):
            out = sys.stdout if event.stream == "stdout" else sys.stderr
            with self._lock:
                out.write(f"[node {event.node}] {event.line}\n")
                out.flush()
