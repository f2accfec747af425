"""Python signal handlers that wait while the main thread is inside a frame.

A caller blocked in ``>>`` reads its own reply (see :mod:`skyward.pool.connection`). Python runs signal
handlers in the main thread between any two bytecodes, so a handler that raises (Ctrl-C's
KeyboardInterrupt, the pool's SIGTERM handler) could leave a frame half read and the stream
torn for every later call. While a pool is open, its SIGINT and SIGTERM handlers are wrapped
in :class:`Guard`: inside :func:`hold` ... :func:`release` a signal is only noted, and its
handler runs as soon as the frame is done.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import _signal  # type: ignore[import-not-found]  # signal.getsignal is slow for a callable handler

#: The main thread is inside a frame (set and read only on the main thread).
held = False
_pending: list[tuple[Callable[[int, Any], Any], int]] = []
GUARDED = (signal.SIGINT, signal.SIGTERM)


class Guard:
    """A handler that defers to ``handler``, later if the main thread holds signals."""

    def __init__(self, handler: Callable[[int, Any], Any]):
        self.handler = handler

    def __call__(self, signum: int, frame: Any) -> None:
        if held:
            _pending.append((self.handler, signum))
            return
        self.handler(signum, frame)


def hold() -> None:
    global held
    held = True


def release() -> None:
    """Stop holding; run the handlers of the signals that came meanwhile (they may raise)."""
    global held
    held = False
    while _pending:
        handler, signum = _pending.pop(0)
        handler(signum, None)


def safe_to_hold() -> bool:
    """True if no handler that could interrupt a frame is installed unguarded."""
    for signum in GUARDED:
        h = _signal.getsignal(signum)
        if callable(h) and not isinstance(h, Guard):
            return False
    return True


def install(signum: int, handler: Callable[[int, Any], Any] | None = None) -> Callable[[], None]:
    """Guard ``signum``'s current handler (or ``handler``); returns what puts the old one back.

    Main thread only. Nothing changes for a handler that is not a Python function (SIG_DFL,
    SIG_IGN) unless ``handler`` is given.
    """
    old = signal.getsignal(signum)
    target = handler if handler is not None else old
    if not callable(target) or isinstance(target, Guard):
        return lambda: None
    guard = Guard(target)
    signal.signal(signum, guard)

    def restore() -> None:
        if signal.getsignal(signum) is guard:
            signal.signal(signum, old)

    return restore
