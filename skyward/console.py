"""What the user sees while a pool runs: a subscriber of the pool's typed events.

``ComputePool(console=True)`` (the default) attaches a :class:`Console`; it knows nothing of
the pool's internals and is built only from :mod:`skyward.events`. It has three modes:

``live``
    A table at the bottom of the terminal, redrawn about 8 times a second, with one row per
    node: its stage, the time in that stage and since the pool started, the last line of its
    bootstrap/diagnostic log and, once the pool is ready, its running/done/failed tasks.
    Task output scrolls above the table. When the pool stops the table is replaced by a
    one-line summary. Chosen when stdout is a terminal (and ``TERM`` is not ``dumb``).
``plain``
    Line by line, for logs and CI: a line when a node is provisioning, bootstrapping, ready,
    lost or stopped, a summary when the pool is ready and when it stops (on stderr), and the
    task output. Chosen when stdout is not a terminal.
``off``
    Only the task output.

In every mode task output is printed as ``[node N] line``, to stdout or stderr as the task
wrote it. The environment variable ``SKYWARD_CONSOLE=off|plain|live|auto`` overrides the
automatic choice, and ``SKYWARD_CONSOLE_VERBOSE=1`` also prints every bootstrap/diagnostic
line (normally shown only for a node that fails).

``rich`` is imported only when a live view is actually shown.
"""

from __future__ import annotations

import atexit
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
    running: set[int] = field(default_factory=set)
    done: int = 0
    failed: int = 0


# (channel, text) messages the state update produces; how each is shown depends on the mode.
#   "stdout"/"stderr": output lines ([node N] ...), shown in every mode
#   "stage": a per-node stage line (plain mode only)
#   "status": a pool-level line (plain and live)
_Msg = tuple[Literal["stdout", "stderr", "stage", "status"], str]


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
        self._live: Any = None  # rich.live.Live while the view is shown
        self._live_console: RichConsole | None = None
        self._stderr_on_screen = False  # stderr lines go through the view (same terminal)
        self._reset(time.monotonic())

    # -- state -----------------------------------------------------------------------------------
    def _reset(self, now: float) -> None:
        self._started = now
        self._pool_id = ""
        self._provider = ""
        self._expected = 0
        self._ready_after: float | None = None
        self._stopping = False
        self._nodes: dict[int, _Node] = {}

    def _node(self, n: int, now: float) -> _Node:
        node = self._nodes.get(n)
        if node is None:
            node = self._nodes[n] = _Node(since=now, first=now)
        return node

    def _apply(self, event: ev.Event, now: float) -> list[_Msg]:
        """Update the state with ``event``; return the lines it makes visible. Under the lock."""
        msgs: list[_Msg] = []
        if isinstance(event, ev.TaskOutput):
            msgs.append((event.stream, f"[node {event.node}] {event.line}"))
        elif isinstance(event, ev.NodeLog):
            node = self._node(event.node, now)
            node.last_log = event.line
            # After a node is ready its diagnostics are stray writes of the tasks themselves
            # (e.g. C code printing to fd 1/2): output, not chatter.
            if self.verbose or node.stage == "ready":
                msgs.append(("stderr", f"[node {event.node}] {event.line}"))
            else:
                node.unshown.append(event.line)
        elif isinstance(event, ev.NodeStage):
            node = self._node(event.node, now)
            if event.stage in ("stopped", "lost"):
                node.failed += len(node.running)  # the pool failed them; no TaskFinished follows
                node.running.clear()
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
            self._node(event.node, now).running.add(event.task_id)
        elif isinstance(event, ev.TaskFinished):
            node = self._node(event.node, now)
            node.running.discard(event.task_id)
            if event.ok:
                node.done += 1
            else:
                node.failed += 1
        elif isinstance(event, ev.PoolStarting):
            self._reset(now)
            self._pool_id, self._provider, self._expected = event.pool_id, event.provider, event.nodes
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
                if not node.was_ready:  # it never came up: its log says why
                    msgs += self._flush_tail(n, node)
            msgs.append(("status", self._summary(event, now)))
        return msgs

    def _flush_tail(self, n: int, node: _Node) -> list[_Msg]:
        lines: list[_Msg] = [("stderr", f"[node {n}] {line}") for line in node.unshown]
        node.unshown.clear()
        return lines

    def _summary(self, event: ev.PoolStopped, now: float) -> str:
        done = sum(n.done for n in self._nodes.values())
        failed = sum(n.failed for n in self._nodes.values())
        total = done + failed
        tasks = f"{_plural(total, 'task')} ({done} done, {failed} failed)" if total else "no tasks"
        parts = [f"skyward: pool {event.pool_id or self._pool_id} stopped: {tasks}", f"up {_seconds(now - self._started)}"]
        lost = [n for n, node in sorted(self._nodes.items()) if node.was_lost]
        if lost:
            parts.append(f"{'node' if len(lost) == 1 else 'nodes'} {', '.join(map(str, lost))} lost")
        if not event.clean:
            parts.append("teardown incomplete")
        return ", ".join(parts)

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
        with self._lock:
            msgs = self._apply(event, now)
        # Never call rich while holding self._lock: the view's refresh thread takes it to render.
        if isinstance(event, ev.PoolStopped):
            self._stop_live()
        for channel, text in msgs:
            self._show(channel, text)

    def _write_plain(self, channel: str, text: str) -> None:
        if channel == "stdout":
            out = sys.stdout
        elif channel == "stderr":
            out = sys.stderr
        elif self.mode == "off":
            return
        else:
            out = self._file if self._file is not None else sys.stderr
        out.write(text + "\n")
        out.flush()

    def _show(self, channel: str, text: str) -> None:
        """Live mode: print a line above the view (or to a stream that is not on screen)."""
        rc = self._live_console
        if rc is None or (channel == "stderr" and not self._stderr_on_screen):
            with self._lock:
                self._write_plain(channel, text)
            return
        if channel == "stage":  # the table shows stages
            return
        from rich.text import Text

        if channel in ("stdout", "stderr") and text.startswith("[node "):
            prefix, _, line = text.partition("] ")
            styled = Text(prefix + "] ", style="dim" if channel == "stdout" else "red")
            styled.append_text(Text.from_ansi(line, end=""))
        else:
            styled = Text(text, style="dim")
        rc.print(styled, soft_wrap=True, highlight=False, markup=False, emoji=False)

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
            atexit.register(self._stop_live)

    def _stop_live(self) -> None:
        with self._live_lock:
            live, self._live = self._live, None
            if live is None:
                return
            try:
                live.stop()
            finally:
                _live_slot.release()
                atexit.unregister(self._stop_live)

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
                (n, nd.stage, nd.detail, nd.host, now - nd.since, now - nd.first, nd.last_log,
                 len(nd.running), nd.done, nd.failed)
                for n, nd in sorted(self._nodes.items())
            ]
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
            header.append(", ", style="dim")
            header.append(f"{done} done", style="green" if done else "dim")
            header.append(", ", style="dim")
            header.append(f"{failed} failed", style="bold red" if failed else "dim")

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
        return Group(header, table, Text(""))
