"""A gather's tasks to one worker in few frames, and its replies resolved many per wake-up.

A gather of the fixed pool's fast path picks each task's node as one at a time would
(:class:`skyward.pool.dispatch.Dispatcher`), then sends each node its tasks in TASKS frames of
at most :data:`BATCH` tasks (one ``TasksSent`` event each). Every task keeps its own id and
:class:`~concurrent.futures.Future`: a task is cancelled, timed out, failed by a lost worker and
answered exactly as one sent alone. The worker answers a batch's tasks in REPLIES frames
(:mod:`skyward.worker.replies`), each resolving several futures on one wake-up of the reader.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any

from skyward import events as ev
from skyward.errors import WorkerLost
from skyward.protocol import Kind, Payload, loads_payload

if TYPE_CHECKING:
    from skyward.messages import RemoteFailure

#: A :class:`skyward.pool.connection.NodeConnection` (which imports this module).
Connection = Any

#: Tasks in one TASKS frame at most: a batch's replies come when the worker has run it, so a
#: bound keeps the first results coming while the rest of the node's tasks run.
BATCH = 64


def submit_batch(conn: Connection, tasks: Sequence[tuple[Payload, str, float | None]]) -> list[Future[Any]]:
    """Send ``tasks`` (payload, name, timeout) to ``conn``'s worker in frames of at most
    :data:`BATCH`; a Future each, as :meth:`NodeConnection.submit` returns."""
    if len(tasks) == 1:
        return [conn.submit(*tasks[0])]
    futures: list[Future[Any]] = []
    for start in range(0, len(tasks), BATCH):
        chunk = tasks[start:start + BATCH]
        entries: list[tuple[int, str, int]] = []
        parts: list[Any] = []
        for payload, name, timeout in chunk:
            task_id, future = conn.register(name, timeout)
            futures.append(future)
            if task_id is not None:
                mine = payload.parts
                entries.append((task_id, name, len(mine)))
                parts.extend(mine)
        if not entries:
            continue
        if conn.listening:
            conn.emit(ev.TasksSent(conn.node, len(entries)))
        with contextlib.suppress(WorkerLost):  # (the loss failed the futures already)
            conn.send((Kind.TASKS, tuple(entries)), Payload(parts[0], parts[1:]))
    return futures


def resolve(conn: Connection, entries: Sequence[tuple[Any, ...]], parts: list[Any]) -> None:
    """A REPLIES frame: resolve each task's future (results, then errors as ERROR does)."""
    at = 0
    for entry in entries:
        kind, task_id = entry[0], entry[1]
        if kind == Kind.RESULT:
            result(conn, task_id, parts[at:at + entry[2]])
            at += entry[2]
        else:
            task = conn.finish(task_id, False)
            if task is not None:
                failure: RemoteFailure = entry[2]
                fail(task.future, failure.rebuild(conn.node))


def result(conn: Connection, task_id: int, parts: list[Any]) -> None:
    """A task's RESULT (a frame of its own, or one of a REPLIES frame's): resolve its future."""
    task = conn.finish(task_id, True)
    if task is None:
        return
    try:
        value = loads_payload(parts)
    except BaseException as exc:
        fail(task.future, exc)
    else:
        try:
            task.future.set_result(value)
        except InvalidStateError:  # cancelled meanwhile (a try, not suppress(): this is every result)
            pass


class TaskFuture(Future[Any]):
    """A task's future: cancelling it stops the task on its worker (``conn.cancel``)."""

    def __init__(self, conn: Connection):
        super().__init__()
        self._conn = conn

    def cancel(self) -> bool:
        if not super().cancel():
            return False
        self._conn.cancel(self)
        return True


def fail(future: Any, error: BaseException) -> None:
    """Fail ``future`` unless it is settled already (a user may cancel it at any moment)."""
    if not future.done():
        with contextlib.suppress(InvalidStateError):
            future.set_exception(error)
