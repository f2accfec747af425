"""Retries: a task whose node was lost runs again on another node (``@sky.compute(retries=N)``).

Only a loss is retried — :class:`~skyward.errors.ConnectionLost` and its
:class:`~skyward.errors.WorkerLost`, while the pool is open: the task may not have run to its
end, through no fault of its own. A task that raised in user code, timed out or was cancelled
is never sent again. Each retry is a :class:`~skyward.events.TaskRetried` event.

Tasks without retries never come here (the dispatch fast path is untouched). The next attempt
is sent from a thread of its own: it may wait for a replacement node, and the thread that
noticed the loss (a connection's reader) must not wait on anything.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

from skyward import events as ev
from skyward.errors import ConnectionLost


def retrying(send: Callable[[], Future[Any]], retries: int, name: str, emit: Callable[[ev.Event], None],
             still_open: Callable[[], bool]) -> Future[Any]:
    """A future for a task sent with ``send()`` and sent again (``send()`` once more) each time
    it fails with a loss, ``retries`` times at most. Cancelling it cancels the current attempt.
    ``send`` may block (waiting for a worker); an error it raises fails the future."""
    outer: Future[Any] = Future()
    current: list[Future[Any]] = []
    attempts = retries + 1

    def attempt(number: int) -> None:
        try:
            inner = send()
        except BaseException as exc:
            _settle(outer, exc)
            return
        current[:] = [inner]
        if outer.cancelled():
            inner.cancel()
            return
        inner.add_done_callback(lambda f: finished(f, number))

    def finished(inner: Future[Any], number: int) -> None:
        if outer.done():
            return
        if inner.cancelled():
            outer.cancel()
            return
        error = inner.exception()
        if error is None:
            _settle(outer, None, inner.result())
        elif isinstance(error, ConnectionLost) and number < attempts and still_open():
            emit(ev.TaskRetried(name, error.node, number + 1, attempts))
            threading.Thread(target=attempt, args=(number + 1,), name="skyward-retry", daemon=True).start()
        else:
            _settle(outer, error)

    def cancelled(f: Future[Any]) -> None:
        if f.cancelled():
            for inner in current:
                inner.cancel()

    outer.add_done_callback(cancelled)
    attempt(1)
    return outer


def _settle(future: Future[Any], error: BaseException | None, value: Any = None) -> None:
    with contextlib.suppress(InvalidStateError):
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
