"""What the user sees while a pool runs: a subscriber of the pool's typed events.

``ComputePool(console=True)`` (the default) attaches a :class:`Console`; it knows nothing of
the pool's internals and is built only from :mod:`skyward.events`. It has three modes:

``live``
    A table at the bottom of the terminal, redrawn about 8 times a second, with one row per
    node: its stage, the time in that stage and since the pool started, the last line of its
    bootstrap/diagnostic log (or its task's progress bar) and, once the pool is ready, its
    running/done/failed tasks; above the rows a header with queued tasks and, for a batch of
    many tasks, a progress bar with done/total, rate and ETA. Task output scrolls above the
    table. When the pool stops the table is replaced by a one-line summary. Chosen when
    stdout is a terminal (and ``TERM`` is not ``dumb``).
``plain``
    Line by line, for logs and CI: a line when a node is provisioning, bootstrapping, ready,
    lost or stopped, a summary when the pool is ready and when it stops (on stderr), and the
    task output. Chosen when stdout is not a terminal.
``off``
    Only the task output.

In every mode task output is printed as ``[node N] line``, to stdout or stderr as the task
wrote it.

Keeping up (the live view never slows the tasks): events only update state and queue lines
under a leaf lock; the lines are printed above the view in one batch per refresh (about 10
times a second) by the console's own thread, so tens of thousands of lines a second cost the
pool's reader threads nothing but an append. The queue is bounded: past ``MAX_PENDING_BYTES`` a
reader waits for the terminal, and a terminal that takes nothing for ``STALL_SECONDS`` gets
task output dropped, counted on screen and in the summary, rather than a reader that stops
hearing its worker. While the view is shown, the client's own
``logging`` records (handlers that write to the terminal) go through the same batches, above
the view, instead of being drawn over. A progress line a task redraws with carriage returns
(tqdm and friends) is one updating line per node: in the view's row while it runs, printed once
when the task ends (in plain mode, at most every few seconds). Bootstrap step markers are
shown as ``step NAME``, never raw. A pool left by Ctrl-C prints one line:
``skyward: interrupted: pool ... stopped, nothing left running (N tasks cancelled)``. The environment variable ``SKYWARD_CONSOLE=off|plain|live|auto`` overrides the
automatic choice, and ``SKYWARD_CONSOLE_VERBOSE=1`` also prints every bootstrap/diagnostic
line (normally shown only for a node that fails).

``rich`` is imported only when a live view is actually shown.

This module chooses the mode, writes plain lines and queues lines for the live view; what the
console knows of the pool (and the summary) is :mod:`skyward.console.state`, and the drawing
of the live view is :mod:`skyward.console.live`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Any, Literal

from skyward import events as ev
from skyward.console.live import REFRESH_PER_SECOND, Batch, render, restore_logging, route_logging
from skyward.console.state import ConsoleState, Msg

if TYPE_CHECKING:
    from rich.console import Console as RichConsole
    from rich.console import RenderableType

__all__ = ["ENV_MODE", "ENV_VERBOSE", "Console", "Mode"]

Mode = Literal["auto", "live", "plain", "off"]
ENV_MODE = "SKYWARD_CONSOLE"
ENV_VERBOSE = "SKYWARD_CONSOLE_VERBOSE"
_MODES = ("auto", "live", "plain", "off")

FLUSH_PER_SECOND = 10  # batches of output lines printed above the live view
#: Characters of lines the live view may hold waiting for the terminal. Past this, whoever adds
#: lines (a connection's reader) waits until the terminal has taken some (the task's own output
#: then waits in its pipe), so client memory stays bounded and a slow terminal loses nothing.
MAX_PENDING_BYTES = 4 << 20
#: The flusher prints the queue in chunks of about this size: each one taken is progress.
FLUSH_CHUNK_BYTES = 256 << 10
#: Seconds a full queue waits for a terminal that takes no chunk at all (frozen, Ctrl-S) before
#: output lines are dropped instead: a reader blocked longer would stop reading the worker's
#: results and heartbeats (and the worker would be declared lost). Dropped lines are counted,
#: on screen where they were dropped and in the pool's summary.
STALL_SECONDS = 2.0
#: The channels whose lines may be dropped (the pool's own lines never are).
_DROPPABLE = ("stdout", "stderr", "stdout+", "stderr+", "log")

# One live view per process: two would fight over the same lines of the terminal. A second
# pool opened while one is live logs in plain mode (through the first view's stdout proxy).
_live_slot = threading.Lock()


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Console:
    """Shows a pool's lifecycle and its tasks' output; call it with each event.

    Parameters:
        mode: ``"live"``, ``"plain"``, ``"off"`` or ``"auto"``. ``None`` (the default) reads
            ``SKYWARD_CONSOLE`` and falls back to ``"auto"``: live when stdout is a terminal
            and ``TERM`` is not ``dumb``, plain otherwise.
        file: where the console's own lines go (the live view, or plain mode's status lines);
            by default the live view is drawn on stdout and plain status lines go to stderr.
            Task output always goes to ``sys.stdout`` / ``sys.stderr``.
        verbose: also print every bootstrap/diagnostic line (``NodeLog``) as it arrives.
            ``None`` reads ``SKYWARD_CONSOLE_VERBOSE``.
        rich_console: draw the live view on this ``rich.console.Console`` (implies live mode
            unless ``mode`` says otherwise).

    Raises :class:`~skyward.ConfigError` for a mode (or ``SKYWARD_CONSOLE`` value) it does
    not know.
    """

    def __init__(
        self,
        mode: Mode | None = None,
        *,
        file: IO[str] | None = None,
        verbose: bool | None = None,
        rich_console: RichConsole | None = None,
    ) -> None:
        from skyward.errors import ConfigError

        forced = False
        if mode is None:
            raw = os.environ.get(ENV_MODE, "")
            value = raw.strip().lower() or "auto"
            if value not in _MODES:
                raise ConfigError(ENV_MODE, " or ".join(repr(m) for m in _MODES), raw)
            mode = value  # type: ignore[assignment]
            if mode == "auto" and rich_console is not None:
                mode = "live"
        elif mode not in _MODES:
            raise ConfigError("mode", " or ".join(repr(m) for m in _MODES), mode)
        if mode == "live":
            forced = rich_console is None
        elif mode == "auto":
            screen = file if file is not None else sys.stdout
            dumb = os.environ.get("TERM", "").strip().lower() == "dumb"
            mode = "live" if _isatty(screen) and not dumb else "plain"
        self.mode: Literal["live", "plain", "off"] = mode  # type: ignore[assignment]
        self.verbose = _truthy(os.environ.get(ENV_VERBOSE)) if verbose is None else bool(verbose)
        self._file = file
        self._rich = rich_console
        self._force_terminal = forced  # live asked for explicitly: draw even if not a tty

        self._lock = threading.Lock()  # guards the state below and plain-mode writes; a leaf lock
        self._live_lock = threading.Lock()  # serializes starting and stopping the live view
        self._flush_lock = threading.Lock()  # one batch printed at a time, in order
        self._live: Any = None  # rich.live.Live while the view is shown
        self._live_console: RichConsole | None = None
        self._stderr_on_screen = False  # stderr lines go through the view (same terminal)
        self._pending: list[Msg] = []  # live: lines waiting for the next batch (under _lock)
        self._pending_bytes = 0
        self._carry: dict[str, str] = {}  # (the live view's open lines: see Batch)
        self._drained = threading.Condition(self._lock)  # notified when a chunk has been taken
        self._taken_at = 0.0  # when the flusher last took a chunk (progress of the terminal)
        self._dropping = False  # a stalled terminal: output is dropped until it takes a chunk
        self._flusher: threading.Thread | None = None
        self._flusher_stop = threading.Event()
        self._log_streams: list[tuple[Any, Any]] = []  # (logging handler, its own stream) while live
        self._state = ConsoleState(live=self.mode == "live", verbose=self.verbose, now=time.monotonic(),
                                   tty={"stdout": _isatty(sys.stdout), "stderr": _isatty(sys.stderr)})

    # -- state -----------------------------------------------------------------------------------
    def _apply(self, event: ev.Event, now: float) -> list[Msg]:
        """Update the state with ``event``; return the lines it makes visible. Under the lock."""
        return self._state.apply(event, now)

    # -- events ----------------------------------------------------------------------------------
    def __call__(self, event: ev.Event) -> None:
        now = time.monotonic()
        if self.mode == "live" and isinstance(event, ev.PoolStarting):
            self._start_live()
        if self.mode != "live" or self._live is None:
            with self._lock:  # plain: write under the lock, so lines never interleave
                msgs = self._apply(event, now)
                for channel, text in msgs:
                    self._write_plain(channel, text)
            return
        with self._lock:  # live: only state and a queue; the flusher thread prints
            msgs = self._apply(event, now)
            if msgs:
                self._queue(msgs)
        # Never call rich while holding self._lock: the view's refresh thread takes it to render.
        if isinstance(event, ev.PoolStopped):
            self._stop_live()

    def _queue(self, msgs: list[Msg]) -> None:
        """Add lines for the flusher, within the bound (under the lock, which waiting releases).

        Past ``MAX_PENDING_BYTES`` this waits while the terminal takes chunks; once it has taken
        none for ``STALL_SECONDS``, output lines are dropped and counted until it takes one.
        """
        size = sum(len(text) for _, text in msgs)
        waited_from = time.monotonic()
        # (An empty queue takes anything: a batch bigger than the bound is not a stall.)
        while (self._pending and self._pending_bytes + size > MAX_PENDING_BYTES and not self._dropping
               and self._draining()):
            if time.monotonic() - max(waited_from, self._taken_at) >= STALL_SECONDS:
                self._dropping = True
                break
            self._drained.wait(0.1)
        if self._dropping:
            kept = [m for m in msgs if m[0] not in _DROPPABLE]
            self._state.dropped_run += len(msgs) - len(kept)
            msgs = kept
        if self._state.dropped_run and any(channel != "stage" for channel, _ in msgs):
            n, self._state.dropped_run = self._state.dropped_run, 0
            self._state.dropped_total += n
            msgs.insert(0, ("notice", f"skyward: {n:,} {'line' if n == 1 else 'lines'} of output not shown "
                                      f"here: the terminal took nothing for {STALL_SECONDS:g}s"))
        self._pending.extend(msgs)
        self._pending_bytes += sum(len(text) for _, text in msgs)

    def _draining(self) -> bool:
        """Whether the flusher is there to take lines (not past the view's end). Under the lock."""
        flusher = self._flusher
        return (self._live is not None and flusher is not None and flusher.is_alive()
                and flusher is not threading.current_thread())

    def _take(self, most: int) -> list[Msg]:
        """The first queued lines, about ``most`` characters (at least one line). Under the lock."""
        size = count = 0
        for _, text in self._pending:
            if count and size + len(text) > most:
                break
            size += len(text)
            count += 1
        chunk = self._pending[:count]
        del self._pending[:count]
        self._pending_bytes -= size
        if chunk:
            self._taken_at = time.monotonic()
            self._dropping = False
            self._drained.notify_all()
        return chunk

    def _write_plain(self, channel: str, text: str) -> None:
        if channel in ("stdout+", "stderr+"):  # a piece of a line that goes on
            out = sys.stdout if channel == "stdout+" else sys.stderr
            out.write(text)
            out.flush()
            return
        if channel == "stdout":
            out = sys.stdout
        elif channel == "stderr":
            out = sys.stderr
        elif channel == "notice":
            out = self._file if self._file is not None else sys.stderr
        elif self.mode == "off":
            return
        else:
            out = self._file if self._file is not None else sys.stderr
        out.write(text + "\n")
        out.flush()

    def _flush(self) -> None:
        """Live mode: print the queued lines above the view, a chunk at a time (what was queued
        when it began: a steady stream of new lines cannot keep it here)."""
        with self._flush_lock:
            with self._lock:
                left = self._pending_bytes
            while True:
                with self._lock:
                    batch = self._take(FLUSH_CHUNK_BYTES)
                if not batch:
                    return
                left -= sum(len(text) for _, text in batch)
                self._print_batch(batch)
                if left <= 0:
                    return

    def _print_batch(self, batch: list[Msg]) -> None:
        """Print one chunk above the view (a stream not on screen gets its lines as they are)."""
        rc = self._live_console
        screen: list[Msg] = []
        for channel, text in batch:
            if channel == "stage":  # the table shows stages
                continue
            if rc is None or (channel.startswith("stderr") and not self._stderr_on_screen):
                with self._lock:  # a stream that is not on screen gets the line as it is
                    self._write_plain(channel, text)
            else:
                screen.append((channel, text))
        if screen and rc is not None:
            rc.print(self._batch_text(screen), soft_wrap=True, highlight=False, markup=False, emoji=False,
                     end="")

    def _batch_text(self, lines: list[Msg]) -> Any:
        return Batch(lines, self._carry)

    def _flush_loop(self) -> None:
        while not self._flusher_stop.wait(1 / FLUSH_PER_SECOND):
            try:
                self._flush()
            except Exception as exc:  # a broken terminal must not end the pool's output for good
                with contextlib.suppress(Exception):
                    sys.__stderr__.write(f"skyward: console: {exc!r}\n")

    # -- the client's own logging, above the view -------------------------------------------------
    def _route_logging(self, screens: tuple[Any, ...]) -> None:
        """Point the terminal-writing logging handlers at the view while it is shown."""
        self._log_streams = route_logging(screens, self._log)

    def _restore_logging(self) -> None:
        streams, self._log_streams = self._log_streams, []
        restore_logging(streams)

    def _log(self, line: str) -> None:
        with self._lock:
            self._queue([("log", line)])

    # -- the live view ---------------------------------------------------------------------------
    def _start_live(self) -> None:
        with self._live_lock:
            if self._live is not None or not _live_slot.acquire(blocking=False):
                return  # already shown, or another view holds the terminal: log plainly
            try:
                from rich.console import Console as RichConsole
                from rich.live import Live

                own = self._rich is None
                rc = self._rich if self._rich is not None else RichConsole(file=self._file, force_terminal=True if self._force_terminal else None)
                # stderr shares the screen only if it is the same terminal; otherwise (2> file)
                # task stderr goes to it directly, untouched by the view.
                self._stderr_on_screen = own and self._file is None and _isatty(sys.stderr) and rc.is_terminal
                # Logging handlers made before the view write to the terminal's own streams:
                # those that share its screen are pointed at the view while it is shown.
                screens = (sys.stdout, sys.__stdout__)
                if self._stderr_on_screen:
                    screens += (sys.stderr, sys.__stderr__)
                live = Live(
                    console=rc,
                    get_renderable=self.renderable,
                    refresh_per_second=REFRESH_PER_SECOND,
                    transient=True,
                    redirect_stdout=own and self._file is None,
                    redirect_stderr=self._stderr_on_screen,
                )
                live.start()
            except BaseException:
                _live_slot.release()
                raise
            self._live_console = rc
            self._live = live
            if own and self._file is None:
                self._route_logging(screens)
            self._flusher_stop.clear()
            self._flusher = threading.Thread(target=self._flush_loop, name="skyward-console", daemon=True)
            self._flusher.start()
            atexit.register(self._stop_live)

    def _stop_live(self) -> None:
        with self._live_lock:
            live = self._live
            if live is None:
                return
            self._flusher_stop.set()
            if self._flusher is not None and self._flusher is not threading.current_thread():
                self._flusher.join(5)
            self._flusher = None
            try:
                self._flush()  # whatever is still queued, above the view, before it goes
            finally:
                self._restore_logging()
                self._live = None
                try:
                    live.stop()
                finally:
                    _live_slot.release()
                    atexit.unregister(self._stop_live)
                    with self._lock:  # lines queued while the view was going: printed plainly
                        late = self._take(self._pending_bytes)
                        for channel, text in late:
                            if channel not in ("stage", "log"):
                                self._write_plain(channel, text)

    def close(self) -> None:
        """Take the live view down (the pool's ``PoolStopped`` does this by itself)."""
        self._stop_live()

    @property
    def showing(self) -> bool:
        """True while the live view is on the screen (from the pool's start to its stop)."""
        live = self._live
        return live is not None and live.is_started
    def renderable(self) -> RenderableType:
        """The live view as it is now: a header line and one row per node (uses rich)."""
        return render(self._state, self._lock, self._live_console or self._rich)
