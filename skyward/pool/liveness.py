"""Whether a worker is still there: the client's pings, and the silence that declares it lost.

Guarantees:

1. Nothing is pinged before the worker's SETUP is written (:meth:`Liveness.arm`). SETUP is
   the first frame a worker reads, and it is what arms the worker's own dead man's switch: a
   ping before it has nothing to keep alive, and the worker refuses it (a 48-node Local pool
   could not start when the first heartbeat beat the last SETUP).
2. A ping never blocks the pool's heartbeat loop: where the channel tells whether its stdin
   can take a small message now (Local pipes), the ping is written at once if it can and
   nothing else is being written (a worker that is being written to hears the client), and
   skipped otherwise; elsewhere (SSH channels, whose window cannot be asked that way) pings
   are written by a thread of this worker's own, so a write that blocks (a link cut mid-send)
   stalls this worker only.
3. A worker that has sent a frame and then nothing for ``lost_after`` seconds is lost: its
   tasks fail at once with :class:`~skyward.errors.WorkerLost` (there is no exit code to wait
   for: its host may be unreachable), whoever waits for them, on whatever thread. It is then
   stopped on another thread, its host given :data:`SILENT_STOP_LIMIT` seconds to answer the
   kill and as many to confirm it, so a host that is cut off costs teardown that much at most
   (its transport does not ask it again). Before its first frame, ``start_timeout`` bounds
   the start instead: a busy machine may take longer than ``lost_after`` to start Python.
   Silence is the worker's only: while bytes from it wait unread (the client's I/O loop held
   up, or the client not given a CPU), it is not lost, however long ago it was last heard.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from skyward.protocol import FrameWriter, Kind
from skyward.transport.base import Channel

if TYPE_CHECKING:
    from skyward.errors import SkywardError, WorkerLost

#: Seconds the host of a worker that went silent gets to answer, for each of the kill and the
#: check that it is gone. A host that can be reached answers in milliseconds; one that
#: cannot is not asked again. Its worker, which cannot hear the client, stops itself after
#: idle_timeout.
SILENT_STOP_LIMIT = 3.0


class Liveness:
    """One worker's pings and silence. ``serving()`` is False once the worker is lost or being
    stopped (the pinger then ends); ``lose(reason)`` fails the worker's tasks at once."""

    def __init__(self, node: int, writer: FrameWriter, channel: Channel, serving: Callable[[], bool],
                 lose: Callable[[str], None]):
        self._node = node
        self._writer = writer
        self._channel = channel
        self._serving = serving
        self._lose = lose
        #: When the worker's last frame came; ``heard``: it has sent one (silence counts from then).
        self.last_heard = time.monotonic()
        self.heard = False
        self._armed = False  # SETUP is written: pings may follow
        self._ping_due = threading.Event()
        self._silent: threading.Thread | None = None  # declares the worker lost and stops it
        self._gone_problem: str | None = None  # what that could not confirm
        self._direct = channel.write_ready() is not None  # pinged at once, without a thread
        if not self._direct:
            threading.Thread(target=self._ping_loop, name=f"skyward-node{node}-ping", daemon=True).start()

    def arm(self) -> None:
        """SETUP has been written: from now on the worker may be pinged."""
        self._armed = True

    def heard_now(self) -> None:
        """A frame came from the worker."""
        self.last_heard = time.monotonic()
        self.heard = True

    def check(self, lost_after: float) -> None:
        """Have the worker pinged, and declare it lost if it has been silent for longer than
        ``lost_after`` seconds. Never blocks."""
        if not self._armed or not self._serving():
            return
        if self._direct:
            with contextlib.suppress(OSError, ValueError):
                if self._channel.write_ready():
                    self._writer.try_send((Kind.PING,))
        else:
            self._ping_due.set()
        silent = time.monotonic() - self.last_heard
        if silent > lost_after and self.heard and self._silent is None and not self._unread():
            self._silent = threading.Thread(target=self._lose_silent, args=(silent,), daemon=True,
                                            name=f"skyward-node{self._node}-lost")
            self._silent.start()

    def _unread(self) -> bool:
        """Bytes from the worker wait to be read: it spoke, and the client did not listen (its
        I/O loop held up, or not given a CPU): that is no silence of the worker's."""
        try:
            poller = select.poll()
            poller.register(self._channel.poll_fd(), select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):  # closed: the loop says what became of it
            return False

    def end(self) -> None:
        """Wake the pinger so that it ends (call once ``serving()`` is False)."""
        self._ping_due.set()

    @property
    def went_silent(self) -> bool:
        """The worker was declared lost for silence (its host may be unreachable)."""
        return self._silent is not None

    def stopped_silent(self) -> str | None:
        """For a worker that went silent: wait for its stop to be tried, and say what could not
        be confirmed (None: it is gone)."""
        silent = self._silent
        assert silent is not None
        silent.join(2 * SILENT_STOP_LIMIT + 1)
        if silent.is_alive():
            return (f"not confirmed gone (its host did not answer within {2 * SILENT_STOP_LIMIT:g}s); "
                    f"a worker that cannot hear the client stops itself after idle_timeout")
        return self._gone_problem

    def _ping_loop(self) -> None:
        while True:
            self._ping_due.wait()
            self._ping_due.clear()
            if not self._serving():
                return
            with contextlib.suppress(OSError, ValueError):
                self._writer.send((Kind.PING,))

    def _lose_silent(self, silent: float) -> None:
        self._lose(f"no heartbeat for {silent:.0f}s")
        self._channel.kill(SILENT_STOP_LIMIT)
        self._gone_problem = confirm_gone(self._channel, SILENT_STOP_LIMIT)


def confirm_gone(channel: Channel, timeout: float = 5.0) -> str | None:
    """Wait until nothing the worker started is left; what could not be confirmed, or None."""
    try:
        return None if channel.confirm_gone(timeout) else "worker processes still running after kill"
    except ConnectionError as exc:  # not the same thing as "still running": say which
        return (f"not confirmed gone ({exc}); a worker that cannot hear the client stops "
                f"itself after idle_timeout")


def exit_status(channel: Channel, *, closing: bool) -> int | None:
    """A lost worker's exit code: waited for briefly, the worker killed when it does not exit
    (not while the pool is closing: then only what is there already)."""
    if closing:
        return channel.wait(0)
    code = channel.wait(2.0)
    if code is None:
        channel.kill()
        code = channel.wait(1.0)
    return code


def explained(lost: WorkerLost, explain: Callable[[WorkerLost], SkywardError | None],
              what: str) -> tuple[SkywardError, str]:
    """What the provider says of a loss (a batch scheduler may know why: a time limit, a failed
    node), with its reason; the plain loss when it says nothing or cannot be asked."""
    from skyward.errors import WorkerLost as Lost

    try:
        better = explain(lost)
    except Exception:  # (asking is best effort: the loss stands as it is)
        return lost, what
    if better is None:
        return lost, what
    return better, better.reason if isinstance(better, Lost) else str(better)
