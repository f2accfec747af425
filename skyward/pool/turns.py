"""Who reads a worker's stream: the connection's reader thread, or a caller waiting in ``>>``.

One thread at a time reads the stream and handles each frame (the connection's ``pump``):

* the reader thread, which serves futures (``>``, ``@``, ``&``, ``gather``) and keeps
  listening (heartbeats, output, the end of the stream) whenever nobody else does;
* a caller blocked in ``>>``, which, when nothing else is in flight, reads its own reply.
  Handing a reply from the reader thread to a blocked caller costs a thread wake-up, which on
  a small VM is more than the whole pipe round trip (docs/benchmarks.md); the caller reading
  itself gives the trip the floor's shape: one write and one read on each side.

The reader thread stands down when a caller asks (a byte on a wake-up pipe) and nothing is in
flight, and takes the stream back after ``LINGER`` seconds without a caller, or at once when a
future needs serving. This works for every transport: a channel's ``poll_fd`` polls readable
exactly when its stream has bytes.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from skyward import _signals
from skyward.protocol import FrameReader, spinner

#: The reader thread takes the stream back after this long without a caller reading it.
LINGER = 0.05
#: A caller reading its own reply re-checks its reply this often (timers, loss, cancel).
_RECHECK_MS = 250
_THREAD = "reader-thread"


class Reply:
    """What a caller that reads its own reply waits on: the part of a Future that the
    connection uses (set_result, set_exception, done), without a Future's locks and condition
    (nobody blocks on it: the caller reads until it is done)."""

    __slots__ = ("_done", "_value", "_error")

    def __init__(self) -> None:
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def set_result(self, value: Any) -> None:
        self._value = value
        self._done = True

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._done = True

    def done(self) -> bool:
        return self._done

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class Turns:
    """The turn-taking on one stream. ``lock`` is the connection's (it also guards the tasks
    in flight, which decide whether the reader thread may stand down); ``pump`` reads and
    handles one frame, False at the end of the stream."""

    def __init__(self, fd: int, reader: FrameReader, lock: threading.Lock, pump: Callable[[], bool],
                 spin: float):
        self._lock = lock
        self._reader = reader
        self._pump = pump
        self.fd: int | None = fd  # None once the stream has ended: callers no longer read it
        # Who reads now (guarded by ``lock``): _THREAD, a caller's thread id, or None (nobody:
        # the reader thread is parked and no task is in flight).
        self._reading: object = _THREAD
        self._stand_down = False  # a caller asked the reader thread to hand over the stream
        self._resume = threading.Event()  # the parked reader thread must read again
        self._last_caller = 0.0
        self._wake_r, self._wake_w = os.pipe()
        self._caller_poll: Any = None  # a caller's poll object for the stream, made once
        self._spin = spinner(fd, spin)

    # -- callers ---------------------------------------------------------------------------
    def claim(self, main: bool) -> int | None:
        """The stream's fd if the calling thread may now read its own reply, else None (and
        the reader thread is asked to stand down, so that the next call finds it free)."""
        if main and not _signals.safe_to_hold():
            return None  # a signal handler that could tear a frame: let the thread read
        with self._lock:
            if self.fd is None:
                return None
            if self._reading is None:
                self._reading = threading.get_ident()
                return self.fd
            if self._reading is _THREAD and not self._stand_down:
                self._stand_down = True
                os.write(self._wake_w, b"!")
        return None

    def read_until(self, reply: Reply, fd: int, main: bool, broke: Callable[[str], None]) -> None:
        """Read and handle frames until ``reply`` is resolved (by its answer or otherwise).

        On the main thread, while a frame is read, Ctrl-C and SIGTERM wait (:mod:`_signals`)."""
        poller = self._caller_poll
        if poller is None:
            poller = self._caller_poll = select.poll()
            poller.register(fd, select.POLLIN)
        while not reply.done():
            if not self._reader.buffered() and not (self._spin and self._spin()) and not poller.poll(_RECHECK_MS):
                continue
            try:
                if main:
                    _signals.hold()  # a Ctrl-C now is raised once this frame is handled
                try:
                    if not self._pump():
                        return  # the end of the stream: the reader thread takes it from here
                except Exception as exc:  # a corrupt stream is as bad as a dead one
                    broke(f"stream broke: {type(exc).__name__}: {exc}")
                    return
            finally:
                if main:
                    _signals.release()

    def release(self, busy: Callable[[], bool]) -> None:
        """If the calling thread holds the stream, let it go: park the stream, or hand it to the
        reader thread if ``busy()`` (evaluated under the lock: tasks in flight, or the worker
        gone). Safe to call whether or not :meth:`claim` gave this thread the stream."""
        with self._lock:
            if self._reading != threading.get_ident():
                return
            self._last_caller = time.monotonic()
            if busy():
                self._reading = _THREAD
                self._resume.set()
            else:
                self._reading = None

    def need_thread(self) -> None:
        """Have the reader thread read now if nobody does. Call with the lock held."""
        if self._reading is None:
            self._reading = _THREAD
            self._resume.set()

    # -- the reader thread -----------------------------------------------------------------
    def run_thread(self, busy: Callable[[], bool]) -> None:
        """The reader thread's life: read, stand down when asked and not ``busy()``, park,
        resume; return at the end of the stream (raise if it broke). Callers stop reading it."""
        try:
            while self._read_as_thread(busy):
                self._park()
        finally:
            with self._lock:
                self.fd = None
                os.close(self._wake_r)
                os.close(self._wake_w)

    def _read_as_thread(self, busy: Callable[[], bool]) -> bool:
        """Read until the stream ends (False) or a caller takes it (True)."""
        assert self.fd is not None  # (cleared only by this thread, after this loop)
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            if self._stand_down and self._hand_over(busy):
                return True
            if not self._reader.buffered():
                ready = poller.poll()
                if any(fd == self._wake_r for fd, _ in ready):
                    os.read(self._wake_r, 64)
                    continue
            if not self._pump():
                return False

    def _hand_over(self, busy: Callable[[], bool]) -> bool:
        """Stand down if nothing is in flight (a caller asked); True if the stream is free now."""
        with self._lock:
            if busy() or self._reader.buffered():
                return False
            self._stand_down = False
            self._reading = None
            self._last_caller = time.monotonic()
            return True

    def _park(self) -> None:
        """Wait, without reading, until the stream needs the reader thread again."""
        while True:
            self._resume.wait(LINGER)
            with self._lock:
                if self._reading is None and time.monotonic() - self._last_caller >= LINGER:
                    self._reading = _THREAD
                if self._reading is _THREAD:
                    self._resume.clear()
                    return
                self._resume.clear()  # a caller holds the stream; it will set us when done
