"""Who reads a worker's stream: the I/O loop, or a caller waiting in ``>>``.

One thread at a time reads the stream and handles each frame (the connection's ``pump``):

* the process's I/O loop (:mod:`skyward.pool.ioloop`, one thread for every worker), which
  serves futures (``>``, ``@``, ``&``, ``gather``) and keeps listening (heartbeats, output,
  the end of the stream) whenever nobody else does;
* a caller blocked in ``>>``, which, when nothing else is in flight, reads its own reply.
  Handing a reply from the reader thread to a blocked caller costs a thread wake-up, which on
  a small VM is more than the whole pipe round trip (docs/benchmarks.md); the caller reading
  itself gives the trip the floor's shape: one write and one read on each side.

The loop (still called "the reader thread" below) stands down when a caller asks and nothing is
in flight, and takes the stream back after ``LINGER`` seconds without a caller, or at once when
a future needs serving. This works for every transport: a channel's ``poll_fd`` polls readable
exactly when its stream has bytes.
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable
from typing import Any

from skyward import _signals
from skyward.pool import ioloop
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
    handles one frame, False at the end of the stream; ``busy()`` (called under ``lock``): tasks
    are in flight; ``ended(why)`` is called once, on the loop, when the stream has ended (``why``
    None) or broke; the stream is read by nobody after that."""

    def __init__(self, fd: int, reader: FrameReader, lock: threading.Lock, pump: Callable[[], bool],
                 spin: float, busy: Callable[[], bool], ended: Callable[[str | None], None]):
        self._lock = lock
        self._reader = reader
        self._pump = pump
        self._busy = busy
        self._ended = ended
        self.fd: int | None = fd  # None once the stream has ended: callers no longer read it
        # Who reads now (guarded by ``lock``): _THREAD (the loop), a caller's thread id, or None
        # (nobody: the stream is parked and no task is in flight). Only the loop moves it away
        # from _THREAD.
        self._reading: object = _THREAD
        self._stand_down = False  # a caller asked the loop to hand over the stream
        self._watched = False  # the loop's selector has the fd (loop thread only)
        self._last_caller = 0.0
        self._caller_poll: Any = None  # a caller's poll object for the stream, made once
        self._spin = spinner(fd, spin)
        self._loop = ioloop.get()
        self._loop.call_soon(self._watch)

    # -- callers ---------------------------------------------------------------------------
    def claim(self, main: bool) -> int | None:
        """The stream's fd if the calling thread may now read its own reply, else None (and
        the loop is asked to stand down, so that the next call finds it free)."""
        if main and not _signals.safe_to_hold():
            return None  # a signal handler that could tear a frame: let the loop read
        with self._lock:
            if self.fd is None:
                return None
            if self._reading is None:
                self._reading = threading.get_ident()
                return self.fd
            if self._reading is _THREAD and not self._stand_down:
                self._stand_down = True
                self._loop.call_soon(self._on_stand_down)
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
                        return  # the end of the stream: the loop takes it from here
                except Exception as exc:  # a corrupt stream is as bad as a dead one
                    broke(f"stream broke: {type(exc).__name__}: {exc}")
                    return
            finally:
                if main:
                    _signals.release()

    def release(self) -> None:
        """If the calling thread holds the stream, let it go: park the stream, or hand it to the
        loop if ``busy()`` (tasks in flight) or the stream is not done with (the worker gone).
        Safe to call whether or not :meth:`claim` gave this thread the stream."""
        with self._lock:
            if self._reading != threading.get_ident():
                return
            self._last_caller = time.monotonic()
            if self._busy() or self._reader.buffered():
                self._reading = _THREAD
                self._loop.call_soon(self._watch)
                return
            self._reading = None
        self._loop.park(self)  # (no wake-up when parked already: the fast path costs nothing)

    def need_thread(self) -> None:
        """Have the loop read now if nobody does. Call with the lock held."""
        if self._reading is None:
            self._reading = _THREAD
            self._loop.call_soon(self._watch)

    # -- the loop's side (called on the loop's thread) ---------------------------------------
    def _watch(self) -> None:
        with self._lock:
            if self.fd is None or self._reading is not _THREAD:
                return
        if not self._watched:
            self._loop.watch(self.fd, self._on_ready)
            self._watched = True
        if self._reader.buffered():  # frames a caller read along with its reply
            self._on_ready()

    def _unwatch(self) -> None:
        if self._watched and self.fd is not None:
            self._loop.unwatch(self.fd)
        self._watched = False

    def _on_stand_down(self) -> None:
        if self._stand_down and self._hand_over():
            self._unwatch()
            self._loop.park(self)

    def _on_ready(self) -> None:
        """The stream is readable: read what is there (whole frames), then stand down if asked."""
        with self._lock:
            if self._reading is not _THREAD:  # (handed over after select() saw the fd)
                return
        try:
            while True:
                if not self._pump():
                    self._end(None)
                    return
                if not self._reader.buffered():
                    break
        except Exception as exc:  # a corrupt stream is as bad as a dead one
            self._end(f"stream broke: {type(exc).__name__}: {exc}")
            return
        self._on_stand_down()

    def _hand_over(self) -> bool:
        """Stand down if nothing is in flight (a caller asked); True if the stream is free now."""
        with self._lock:
            if self._reading is not _THREAD or self._busy() or self._reader.buffered():
                return False
            self._stand_down = False
            self._reading = None
            self._last_caller = time.monotonic()
            return True

    def retake(self) -> bool:
        """(The loop, while parked.) Take the stream back after ``LINGER`` s without a caller;
        True once the loop reads it again (or it is over)."""
        with self._lock:
            if self.fd is None:
                return True
            if self._reading is None and time.monotonic() - self._last_caller >= LINGER:
                self._reading = _THREAD
            if self._reading is not _THREAD:
                return False  # a caller holds it: it hands it back when done
        self._watch()
        return True

    def _end(self, why: str | None) -> None:
        self._unwatch()
        with self._lock:
            self.fd = None
        self._ended(why)
