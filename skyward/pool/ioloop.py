"""One thread that serves the streams of every worker this process talks to.

A pool of N nodes used to hold a reader thread, a stderr reader and a pinger per worker, so a
thousand nodes meant three thousand threads. Instead, one loop (a ``selectors`` selector on a
thread of its own, started with the first pool and shared by every pool of the process) watches
the file descriptor of each stream, and calls back the stream's owner when it is readable.

Guarantees:

1. Callbacks run on the loop's thread, one at a time, and must not block on anything but the
   stream they were called for: work that waits (a lost worker's exit code) goes to a thread of
   its own.
2. :meth:`IOLoop.call_soon` may be called from any thread; the callable runs on the loop soon
   after (the loop is woken by a byte on a pipe).
3. :meth:`IOLoop.park` marks a stream's owner as idle: its ``retake()`` is called on the loop at
   least every :data:`PARK_CHECK` seconds until it returns True (the owner took its stream back).
4. An exception in a callback is printed on stderr and ends nothing but that callback.

What a stream's owner cannot expect: a frame that arrives in pieces is read whole, so a worker
stopped half-way through writing a frame holds the loop until it is declared silent and killed
(its frames are written whole, so this needs a stop in the middle of one large frame).
"""

from __future__ import annotations

import collections
import heapq
import os
import selectors
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

#: How often the loop asks parked owners whether they want their stream back (seconds).
PARK_CHECK = 0.05


class Parked(Protocol):
    def retake(self) -> bool: ...


class IOLoop:
    """The selector, its thread, callables queued from other threads, and parked owners."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._parked: set[Any] = set()
        self._parked_lock = threading.Lock()  # (also guards the timers)
        self._timers: list[Timer] = []
        self.thread = threading.Thread(target=self._run, name="skyward-io", daemon=True)
        self.thread.start()

    # -- any thread ------------------------------------------------------------------------------
    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop's thread soon."""
        self._queue.append(fn)
        self._wake()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        """Run ``fn`` on a new thread after ``delay`` seconds, unless the Timer is cancelled."""
        timer = Timer(time.monotonic() + delay, fn)
        with self._parked_lock:
            heapq.heappush(self._timers, timer)
        self._wake()
        return timer

    def park(self, owner: Parked) -> None:
        """Ask ``owner.retake()`` on the loop every :data:`PARK_CHECK` s until it returns True."""
        if owner in self._parked:  # (the usual case, checked without the lock: only the loop,
            return  # whose retake() says the owner's stream is read again, takes it out)
        with self._parked_lock:
            if owner in self._parked:
                return
            self._parked.add(owner)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"!")
        except BlockingIOError:  # the pipe is full of wake-ups already
            pass

    # -- the loop's thread only ------------------------------------------------------------------
    def watch(self, fd: int, on_ready: Callable[[], None]) -> None:
        """Call ``on_ready`` whenever ``fd`` is readable (or has ended)."""
        try:
            self._selector.register(fd, selectors.EVENT_READ, on_ready)
        except KeyError:  # watched already (or a closed descriptor of that number was: forget it)
            self.unwatch(fd)
            self._selector.register(fd, selectors.EVENT_READ, on_ready)

    def unwatch(self, fd: int) -> None:
        try:
            self._selector.unregister(fd)
        except (KeyError, ValueError):
            pass

    def _run(self) -> None:
        while True:
            timeout = PARK_CHECK if self._parked else None
            if self._timers:
                due = max(0.0, self._timers[0].when - time.monotonic())
                timeout = due if timeout is None else min(timeout, due)
            try:
                events = self._selector.select(timeout)
            except OSError:  # a descriptor closed under us: drop the closed ones and go on
                self._drop_closed()
                continue
            for key, _ in events:
                if key.data is None:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                else:
                    _safely(key.data)
            while self._queue:
                _safely(self._queue.popleft())
            if self._parked:
                self._check_parked()
            if self._timers:
                self._fire_timers()

    def _check_parked(self) -> None:
        with self._parked_lock:
            owners = list(self._parked)
        for owner in owners:
            took = True
            try:
                took = owner.retake()
            except Exception:
                _report()
            if took:
                with self._parked_lock:
                    self._parked.discard(owner)

    def _fire_timers(self) -> None:
        now = time.monotonic()
        due = []
        with self._parked_lock:
            while self._timers and (self._timers[0].when <= now or self._timers[0].cancelled):
                due.append(heapq.heappop(self._timers))
        for timer in due:
            if not timer.cancelled:
                threading.Thread(target=timer.fn, name="skyward-timer", daemon=True).start()

    def _drop_closed(self) -> None:
        for key in list(self._selector.get_map().values()):
            try:
                os.fstat(key.fd)
            except OSError:
                self.unwatch(key.fd)


def _safely(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:
        _report()


def _report() -> None:
    print("skyward: an error in the I/O loop (the loop goes on):\n" + traceback.format_exc(),
          file=sys.__stderr__)


_loop: IOLoop | None = None
_loop_pid = 0
_loop_lock = threading.Lock()


def get() -> IOLoop:
    """This process's loop (started on first use; a forked child starts its own)."""
    global _loop, _loop_pid
    loop = _loop
    if loop is not None and _loop_pid == os.getpid():
        return loop
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid():
            _loop, _loop_pid = IOLoop(), os.getpid()
        return _loop


class Timer:
    """A callable run once, on a thread of its own, after a delay, unless cancelled first: the
    loop keeps the deadline (no thread waits for it), so a thousand tasks with a timeout cost
    no thread until one expires."""

    __slots__ = ("when", "fn", "cancelled")

    def __init__(self, when: float, fn: Callable[[], None]):
        self.when = when
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: Timer) -> bool:
        return self.when < other.when
