"""The answers to a batch of tasks (a TASKS frame), sent back in few REPLIES frames.

A gather sends a worker its tasks many to a frame (:mod:`skyward.pool.batch`); answering each
in a frame of its own would cost the client a wake-up per task. So the RESULT or ERROR of a
batched task waits here, and goes with the others in one REPLIES frame as soon as every
batched task has answered, or :data:`HOLD` seconds after the first waiting one at the latest
(a slow task of the batch holds the others' answers back that long, no longer). Output is
never held: a task's lines still reach the client before its answer. Tasks sent alone (TASK)
are answered at once, as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from skyward.protocol import Kind, Payload

#: Seconds the first held answer waits at most for the rest of its batch.
HOLD = 0.005


class Replies:
    """Holds the answers of batched tasks; ``write(control, payload)`` sends a frame."""

    def __init__(self, write: Callable[[tuple, Payload | None], None]):
        self._write = write
        self._lock = threading.Lock()
        self._owed: set[int] = set()  # batched tasks not answered yet
        self._entries: list[tuple[Any, ...]] = []
        self._parts: list[Any] = []
        self._held = threading.Event()  # something is held: the flusher's cue
        self._flusher: threading.Thread | None = None

    def expect(self, task_ids: Iterable[int]) -> None:
        """These tasks came in a batch: hold their answers."""
        with self._lock:
            self._owed.update(task_ids)
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_loop, name="skyward-replies", daemon=True)
                self._flusher.start()

    def hold(self, control: tuple, payload: Payload | None) -> bool:
        """Hold a RESULT or ERROR of a batched task (True), or leave it to be sent now (False)."""
        task_id = control[1]
        if not self._owed:  # (no batch owed: a batch's ids are owed before any of its tasks runs)
            return False
        with self._lock:
            if task_id not in self._owed:
                return False
            self._owed.discard(task_id)
            if control[0] == Kind.RESULT:
                assert payload is not None
                mine = payload.parts
                self._entries.append((Kind.RESULT, task_id, len(mine)))
                self._parts.extend(mine)
            else:
                self._entries.append(control)
            last = not self._owed
        if last:
            self.flush()
        else:
            self._held.set()
        return True

    def forget(self, task_id: int) -> None:
        """A batched task was cancelled: it may never answer (one that had not started)."""
        with self._lock:
            if task_id not in self._owed:
                return
            self._owed.discard(task_id)
            last = not self._owed
        if last:
            self.flush()

    def flush(self) -> None:
        """Send what is held, in one frame."""
        with self._lock:
            entries, parts = self._entries, self._parts
            self._entries, self._parts = [], []
        if entries:
            self._write((Kind.REPLIES, tuple(entries)), Payload(parts[0], parts[1:]) if parts else None)

    def _flush_loop(self) -> None:
        while True:
            self._held.wait()
            self._held.clear()
            time.sleep(HOLD)
            self.flush()
