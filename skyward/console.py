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
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Literal

from skyward import events as ev

if TYPE_CHECKING:
    from rich.console import Console as RichConsole
    from rich.console import RenderableType

__all__ = ["ENV_MODE", "ENV_VERBOSE", "Console", "Mode"]

Mode = Literal["auto", "live", "plain", "off"]
ENV_MODE = "SKYWARD_CONSOLE"
ENV_VERBOSE = "SKYWARD_CONSOLE_VERBOSE"
_MODES = ("auto", "live", "plain", "off")

REFRESH_PER_SECOND = 8
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
_DROPPABLE = ("stdout", "stderr", "log")
PLAIN_PROGRESS_EVERY = 5.0  # seconds between two prints of a node's progress line in plain mode
_BAR_MIN_TASKS = 8  # a batch of at least this many tasks gets a progress bar in the live view
_STEP_PREFIX = "::step:: "  # skyward.bootstrap.STEP_PREFIX (not imported: bootstrap is heavier)
_WARM_PREFIX = "::warm::"
_TAIL_LINES = 10  # log lines kept per node, shown when it fails
_PLAIN_STAGES = frozenset({"provisioning", "bootstrapping", "ready", "lost", "stopped"})
_TRANSIENT = frozenset({"pending", "provisioning", "connecting", "bootstrapping", "starting", "stopping"})
_STAGE_STYLE = {
    "pending": "dim",
    "provisioning": "yellow",
    "connecting": "yellow",
    "bootstrapping": "yellow",
    "starting": "cyan",
    "ready": "green",
    "stopping": "dim yellow",
    "stopped": "dim",
    "lost": "bold red",
}
_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

# One live view per process: two would fight over the same lines of the terminal. A second
# pool opened while one is live logs in plain mode (through the first view's stdout proxy).
_live_slot = threading.Lock()


def _seconds(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def readable_log_line(line: str) -> str:
    """A bootstrap log line as a user should read it: step markers become ``step NAME``."""
    if line.startswith(_STEP_PREFIX):
        return "step " + line[len(_STEP_PREFIX):].strip()
    if line.startswith(_WARM_PREFIX):
        return line[len(_WARM_PREFIX):].strip() or "environment reused"
    return line


def _carriage(line: str) -> str | None:
    """What a terminal would show for a line redrawn with carriage returns (a progress bar),
    or None for an ordinary line (a trailing ``\r`` of a CRLF line end does not count)."""
    if "\r" not in line.rstrip("\r"):
        return None
    shown = [part for part in line.split("\r") if part.strip()]
    return shown[-1] if shown else ""


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


@dataclass
class _Node:
    since: float  # when the current stage began
    first: float  # when this node first appeared
    stage: str = "pending"
    detail: str = ""
    host: str = ""
    was_ready: bool = False
    was_lost: bool = False  # lost since it was last ready (teardown then marks it stopped)
    last_log: str = ""
    unshown: deque[str] = field(default_factory=lambda: deque(maxlen=_TAIL_LINES))  # log lines not printed yet
    running: set[int] = field(default_factory=set)  # sent to the node, not finished
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    progress: str = ""  # the latest state of a progress line (tqdm) of a running task
    progress_task: int | None = None
    progress_stream: str = "stderr"
    progress_shown: float = 0.0  # plain mode: when it was last printed
    progress_dirty: bool = False  # plain mode: changed since it was last printed


# (channel, text) messages the state update produces; how each is shown depends on the mode.
#   "stdout"/"stderr": output lines ([node N] ...), shown in every mode
#   "stage": a per-node stage line (plain mode only)
#   "status": a pool-level line (plain and live)
#   "notice": a pool-level line shown in every mode, off included (the Ctrl-C line)
#   "log": a record of the client's own logging, already formatted (live only)
_Msg = tuple[Literal["stdout", "stderr", "stage", "status", "notice", "log"], str]


class _Batch:
    """Lines to print above the live view, rendered straight to segments: no wrapping, no
    markup, no per-line ``Text`` (tens of thousands of lines a second stay cheap)."""

    def __init__(self, lines: list[_Msg]):
        self.lines = lines

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.segment import Segment
        from rich.style import Style
        from rich.text import Text

        styles = {"stdout": Style(dim=True), "stderr": Style(color="red"), "notice": Style(bold=True),
                  "status": Style(dim=True)}
        newline = Segment.line()
        for channel, text in self.lines:
            if channel in ("stdout", "stderr") and text.startswith("[node "):
                prefix, _, line = text.partition("] ")
                yield Segment(prefix + "] ", styles[channel])
            else:
                line = text
                if channel in styles:
                    yield Segment(line, styles[channel])
                    yield newline
                    continue
            if "\x1b" in line:  # the task's own colours
                yield from Text.from_ansi(line, end="").render(console)
            else:
                yield Segment(line)
            yield newline


class _LogSink:
    """The stream a logging handler writes to while the live view is shown: whole lines go to
    the console's next batch, above the view."""

    def __init__(self, console: Console):
        self._console = console
        self._partial = ""

    def write(self, text: str) -> int:
        data = self._partial + text
        *lines, self._partial = data.split("\n")
        for line in lines:
            self._console._log(line)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


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
        self._pending: list[_Msg] = []  # live: lines waiting for the next batch (under _lock)
        self._pending_bytes = 0
        self._drained = threading.Condition(self._lock)  # notified when a chunk has been taken
        self._taken_at = 0.0  # when the flusher last took a chunk (progress of the terminal)
        self._dropping = False  # a stalled terminal: output is dropped until it takes a chunk
        self._flusher: threading.Thread | None = None
        self._flusher_stop = threading.Event()
        self._log_streams: list[tuple[Any, Any]] = []  # (logging handler, its own stream) while live
        self._reset(time.monotonic())

    # -- state -----------------------------------------------------------------------------------
    def _reset(self, now: float) -> None:
        self._started = now
        self._pool_id = ""
        self._provider = ""
        self._expected = 0
        self._slots: int | None = None  # task slots per node, when the pool said
        self._ready_after: float | None = None
        self._stopping = False
        self._nodes: dict[int, _Node] = {}
        self._dropped_run = 0  # live: output lines dropped since the last marker on screen
        self._dropped_total = 0  # live: the pool's dropped lines that a marker has counted
        # The current batch of tasks (from the moment none was in flight): for the progress bar.
        self._in_flight = 0
        self._batch_total = 0
        self._batch_done = 0
        self._batch_started = now

    def _node(self, n: int, now: float) -> _Node:
        node = self._nodes.get(n)
        if node is None:
            node = self._nodes[n] = _Node(since=now, first=now)
        return node

    def _running_queued(self, node: _Node) -> tuple[int, int]:
        """Tasks running on ``node`` and tasks waiting there for a slot."""
        sent = len(node.running)
        if self._slots is None:
            return sent, 0
        return min(sent, self._slots), max(0, sent - self._slots)

    def _apply(self, event: ev.Event, now: float) -> list[_Msg]:
        """Update the state with ``event``; return the lines it makes visible. Under the lock."""
        msgs: list[_Msg] = []
        if isinstance(event, ev.TaskOutput):
            shown = _carriage(event.line)
            if shown is None:
                node = self._nodes.get(event.node)
                if not event.line and node is not None and node.progress and node.progress_task == event.task_id:
                    return msgs  # the newline that ends a progress line (tqdm's close)
                msgs.append((event.stream, f"[node {event.node}] {event.line}"))
                return msgs
            if not shown:
                return msgs
            node = self._node(event.node, now)
            node.progress, node.progress_task, node.progress_stream = shown, event.task_id, event.stream
            node.progress_dirty = True
            if self.mode != "live" and now - node.progress_shown >= PLAIN_PROGRESS_EVERY:
                msgs += self._progress_line(event.node, node, now)
        elif isinstance(event, ev.NodeLog):
            node = self._node(event.node, now)
            line = readable_log_line(event.line)
            node.last_log = line
            # After a node is ready its diagnostics are stray writes of the tasks themselves
            # (e.g. C code printing to fd 1/2): output, not chatter.
            if self.verbose or node.stage == "ready":
                msgs.append(("stderr", f"[node {event.node}] {line}"))
            else:
                node.unshown.append(line)
        elif isinstance(event, ev.NodeStage):
            node = self._node(event.node, now)
            if event.stage in ("stopped", "lost"):
                # The pool ended them; no TaskFinished follows. Stopping on purpose cancels them.
                if event.stage == "stopped" and self._stopping:
                    node.cancelled += len(node.running)
                else:
                    node.failed += len(node.running)
                self._in_flight -= len(node.running)
                node.running.clear()
                node.progress = ""
            if event.stage in ("stopping", "starting"):  # workers restart: starting again
                self._stopping = event.stage == "stopping"
            node.stage, node.detail, node.since = event.stage, event.detail, now
            if event.stage == "ready":
                node.was_ready, node.was_lost = True, False
            elif event.stage == "lost":
                node.was_lost = True
            if event.detail and event.stage != "lost":
                node.host = event.detail
            t = f"({_seconds(now - self._started)})"
            if event.stage == "lost":
                msgs.append(("status", f"skyward: node {event.node} lost {t}" + (f": {event.detail}" if event.detail else "")))
                msgs += self._flush_tail(event.node, node)
            elif event.stage in _PLAIN_STAGES:
                detail = f" {event.detail}" if event.detail else ""
                msgs.append(("stage", f"skyward: node {event.node} {event.stage}{detail} {t}"))
        elif isinstance(event, ev.TaskStarted):
            node = self._node(event.node, now)
            if self._in_flight <= 0:  # a new batch begins
                self._in_flight, self._batch_total, self._batch_done, self._batch_started = 0, 0, 0, now
            node.running.add(event.task_id)
            self._in_flight += 1
            self._batch_total += 1
        elif isinstance(event, ev.TaskFinished):
            node = self._node(event.node, now)
            if event.task_id in node.running:
                node.running.discard(event.task_id)
                self._in_flight -= 1
                self._batch_done += 1
            if event.ok:
                node.done += 1
            elif event.cancelled or self._stopping:
                node.cancelled += 1
            else:
                node.failed += 1
            if node.progress and node.progress_task == event.task_id:
                msgs += self._progress_line(event.node, node, now, final=True)
        elif isinstance(event, ev.PoolStarting):
            self._reset(now)
            self._pool_id, self._provider, self._expected = event.pool_id, event.provider, event.nodes
            self._slots = getattr(event, "concurrency", None)
            for n in range(event.nodes):
                self._node(n, now)
        elif isinstance(event, ev.PoolReady):
            self._ready_after = event.seconds
            where = f" on {self._provider}" if self._provider else ""
            msgs.append((
                "status",
                f"skyward: pool {event.pool_id} ready: {_plural(event.nodes, 'node')}{where} in {_seconds(event.seconds)}",
            ))
        elif isinstance(event, ev.PoolStopped):
            for n, node in sorted(self._nodes.items()):
                if node.progress:
                    msgs += self._progress_line(n, node, now, final=True)
                if not node.was_ready:  # it never came up: its log says why
                    msgs += self._flush_tail(n, node)
            if getattr(event, "interrupted", False):
                msgs.append(("notice", self._interrupted(event)))
            else:
                msgs.append(("status", self._summary(event, now)))
        return msgs

    def _progress_line(self, n: int, node: _Node, now: float, *, final: bool = False) -> list[_Msg]:
        """The node's progress line, to print now (once more at the end, if it changed)."""
        line = node.progress
        shown = node.progress_dirty or (final and self.mode == "live")
        if final:
            node.progress, node.progress_task = "", None
        if not shown:
            return []
        node.progress_shown, node.progress_dirty = now, False
        return [(node.progress_stream, f"[node {n}] {line}")]  # type: ignore[list-item]

    def _flush_tail(self, n: int, node: _Node) -> list[_Msg]:
        lines: list[_Msg] = [("stderr", f"[node {n}] {line}") for line in node.unshown]
        node.unshown.clear()
        return lines

    def _summary(self, event: ev.PoolStopped, now: float) -> str:
        done = sum(n.done for n in self._nodes.values())
        failed = sum(n.failed for n in self._nodes.values())
        cancelled = sum(n.cancelled for n in self._nodes.values())
        total = done + failed + cancelled
        counts = f"{done} done, {failed} failed" + (f", {cancelled} cancelled" if cancelled else "")
        tasks = f"{_plural(total, 'task')} ({counts})" if total else "no tasks"
        parts = [f"skyward: pool {event.pool_id or self._pool_id} stopped: {tasks}", f"up {_seconds(now - self._started)}"]
        lost = [n for n, node in sorted(self._nodes.items()) if node.was_lost]
        if lost:
            parts.append(f"{'node' if len(lost) == 1 else 'nodes'} {', '.join(map(str, lost))} lost")
        dropped = self._dropped_total + self._dropped_run
        if dropped:
            parts.append(f"{dropped:,} output {'line' if dropped == 1 else 'lines'} not shown (the terminal stalled)")
        if not event.clean:
            parts.append("teardown incomplete")
        return ", ".join(parts)

    def _interrupted(self, event: ev.PoolStopped) -> str:
        cancelled = sum(n.cancelled + len(n.running) for n in self._nodes.values())
        left = "nothing left running" if event.clean else "teardown incomplete (see above)"
        tail = f" ({_plural(cancelled, 'task')} cancelled)" if cancelled else ""
        return f"skyward: interrupted: pool {event.pool_id or self._pool_id} stopped, {left}{tail}"

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

    def _queue(self, msgs: list[_Msg]) -> None:
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
            self._dropped_run += len(msgs) - len(kept)
            msgs = kept
        if self._dropped_run and any(channel != "stage" for channel, _ in msgs):
            n, self._dropped_run = self._dropped_run, 0
            self._dropped_total += n
            msgs.insert(0, ("notice", f"skyward: {n:,} {'line' if n == 1 else 'lines'} of output not shown "
                                      f"here: the terminal took nothing for {STALL_SECONDS:g}s"))
        self._pending.extend(msgs)
        self._pending_bytes += sum(len(text) for _, text in msgs)

    def _draining(self) -> bool:
        """Whether the flusher is there to take lines (not past the view's end). Under the lock."""
        flusher = self._flusher
        return (self._live is not None and flusher is not None and flusher.is_alive()
                and flusher is not threading.current_thread())

    def _take(self, most: int) -> list[_Msg]:
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

    def _print_batch(self, batch: list[_Msg]) -> None:
        """Print one chunk above the view (a stream not on screen gets its lines as they are)."""
        rc = self._live_console
        screen: list[_Msg] = []
        for channel, text in batch:
            if channel == "stage":  # the table shows stages
                continue
            if rc is None or (channel == "stderr" and not self._stderr_on_screen):
                with self._lock:  # a stream that is not on screen gets the line as it is
                    self._write_plain(channel, text)
            else:
                screen.append((channel, text))
        if screen and rc is not None:
            rc.print(self._batch_text(screen), soft_wrap=True, highlight=False, markup=False, emoji=False,
                     end="")

    @staticmethod
    def _batch_text(lines: list[_Msg]) -> Any:
        return _Batch(lines)

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
        import logging

        handlers: list[Any] = []
        for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
            handlers += getattr(logger, "handlers", [])
        sink = _LogSink(self)
        for handler in dict.fromkeys(handlers):
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and any(stream is s for s in screens):
                self._log_streams.append((handler, handler.setStream(sink)))

    def _restore_logging(self) -> None:
        streams, self._log_streams = self._log_streams, []
        for handler, stream in reversed(streams):
            handler.setStream(stream)

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

    def renderable(self) -> RenderableType:
        """The live view as it is now: a header line and one row per node (uses rich)."""
        from rich import box
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        now = time.monotonic()
        with self._lock:  # copy what is drawn; render outside the lock
            started, ready_after, stopping = self._started, self._ready_after, self._stopping
            pool_id, provider, expected = self._pool_id, self._provider, self._expected
            rows = [
                (n, nd.stage, nd.detail, nd.host, now - nd.since, now - nd.first, nd.progress or nd.last_log,
                 self._running_queued(nd)[0], nd.done, nd.failed)
                for n, nd in sorted(self._nodes.items())
            ]
            queued = sum(self._running_queued(nd)[1] for nd in self._nodes.values())
            cancelled = sum(nd.cancelled for nd in self._nodes.values())
            batch = (self._batch_done, self._batch_total, now - self._batch_started)
        rc = self._live_console or self._rich
        utf8 = rc is None or (rc.encoding or "").lower().startswith("utf")
        height = rc.size.height if rc is not None else 40
        frame = _SPINNER[int(now * REFRESH_PER_SECOND) % len(_SPINNER)] if utf8 else "-\\|/"[int(now * 4) % 4]
        icons = {"ready": "●", "stopped": "○", "lost": "✗"} if utf8 else {"ready": "*", "stopped": "o", "lost": "x"}

        running = sum(r[7] for r in rows)
        done = sum(r[8] for r in rows)
        failed = sum(r[9] for r in rows)
        n_ready = sum(1 for r in rows if r[1] == "ready")
        header = Text.assemble(("skyward", "bold"), " ", (f"pool {pool_id}" if pool_id else "pool", "bold cyan"))
        bits = [provider] if provider else []
        bits.append(_plural(expected or len(rows), "node"))
        if stopping:
            bits.append("stopping")
        elif ready_after is None:
            bits.append(f"starting {_seconds(now - started)}")
        else:
            bits.append(f"{n_ready}/{len(rows)} ready in {_seconds(ready_after)}")
        bits.append(f"up {_seconds(now - started)}")
        header.append(" · " + " · ".join(bits), style="dim")
        show_tasks = ready_after is not None or running or done or failed
        if show_tasks:
            header.append(" · tasks ", style="dim")
            header.append(f"{running} running", style="cyan" if running else "dim")
            if queued:
                header.append(f", {queued} queued", style="yellow")
            header.append(", ", style="dim")
            header.append(f"{done} done", style="green" if done else "dim")
            header.append(", ", style="dim")
            header.append(f"{failed} failed", style="bold red" if failed else "dim")
            if cancelled:
                header.append(f", {cancelled} cancelled", style="yellow")

        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=True, header_style="bold")
        table.add_column("node", justify="right", no_wrap=True)
        table.add_column("stage", no_wrap=True)
        table.add_column("time", no_wrap=True, justify="right")
        hosts = {r[3] for r in rows if r[3]}
        show_host = len(hosts) > 1
        if show_host:
            table.add_column("host", no_wrap=True, overflow="ellipsis", max_width=24)
        if show_tasks:
            table.add_column("run", justify="right", no_wrap=True)
            table.add_column("done", justify="right", no_wrap=True)
            table.add_column("failed", justify="right", no_wrap=True)
        table.add_column("log", no_wrap=True, overflow="ellipsis", ratio=1, style="dim")

        cap = max(3, height - 6)
        shown, hidden = (rows, []) if len(rows) <= cap else (rows[: cap - 1], rows[cap - 1:])
        for n, stage, detail, host, in_stage, total, log, run, dn, fl in shown:
            style = _STAGE_STYLE.get(stage, "")
            icon = frame if stage in _TRANSIENT else icons.get(stage, " ")
            cells: list[Any] = [str(n), Text(f"{icon} {stage}", style=style), f"{_seconds(in_stage)} / {_seconds(total)}"]
            if show_host:
                cells.append(host)
            if show_tasks:
                cells += [
                    Text(str(run), style="cyan" if run else "dim"),
                    Text(str(dn), style="green" if dn else "dim"),
                    Text(str(fl), style="bold red" if fl else "dim"),
                ]
            if stage == "lost" and detail:
                cells.append(Text(detail, style="red"))
            else:
                cells.append(Text.from_ansi(log, end="").plain if log else "")
            table.add_row(*cells)
        if hidden:
            counts: dict[str, int] = {}
            for r in hidden:
                counts[r[1]] = counts.get(r[1], 0) + 1
            more = ", ".join(f"{c} {s}" for s, c in sorted(counts.items(), key=lambda kv: -kv[1]))
            cells = ["…" if utf8 else "...", Text(f"{len(hidden)} more", style="dim"), ""]
            cells += [""] * (int(show_host) + 3 * int(bool(show_tasks)))
            cells.append(more)
            table.add_row(*cells)
        # End on an empty line: the table's rows fill the terminal's width, and a key the user
        # types (Ctrl-C echoes "^C") would otherwise wrap past them and shift the view by a line.
        parts: list[Any] = [header]
        done_in_batch, total_in_batch, batch_seconds = batch
        if total_in_batch >= _BAR_MIN_TASKS and show_tasks:
            parts.append(_bar(done_in_batch, total_in_batch, batch_seconds, utf8, rc.size.width if rc is not None else 100))
        return Group(*parts, table, Text(""))


def _bar(done: int, total: int, seconds: float, utf8: bool, width: int) -> Any:
    """``tasks ━━━━━━──── 1,234/10,000 · 820/s · ETA 11s`` for the current batch of tasks."""
    from rich.text import Text

    rate = done / seconds if seconds > 0 else 0.0
    left = total - done
    eta = f"ETA {_seconds(left / rate)}" if rate > 0 and left else ("done" if not left else "ETA -")
    figures = f" {done:,}/{total:,} · {rate:,.0f}/s · {eta}"
    size = max(10, min(40, width - len(figures) - 8))
    full = int(size * done / total) if total else size
    on, off = ("━", "─") if utf8 else ("#", "-")
    bar = Text("tasks ", style="dim")
    bar.append(on * full, style="green" if not left else "cyan")
    bar.append(off * (size - full), style="dim")
    bar.append(figures, style="dim")
    return bar
