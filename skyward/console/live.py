"""The live view: a header and one row per node, redrawn about 8 times a second at the bottom of
the terminal, and the batches of output lines printed above it (see :mod:`skyward.console` for
what is shown when). Drawing only: the state comes from :mod:`skyward.console.state`.

rich is imported inside the functions, when a view is actually drawn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from skyward.console.state import ConsoleState, Msg, plural, seconds

if TYPE_CHECKING:
    from rich.console import Console as RichConsole
    from rich.console import RenderableType

__all__ = ["REFRESH_PER_SECOND", "Batch", "render", "restore_logging", "route_logging"]

REFRESH_PER_SECOND = 8
_BAR_MIN_TASKS = 8  # a batch of at least this many tasks gets a progress bar in the live view
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


class Batch:
    """Lines to print above the live view, rendered straight to segments: no wrapping, no
    markup, no per-line ``Text`` (tens of thousands of lines a second stay cheap)."""

    def __init__(self, lines: list[Msg], carry: dict[str, str] | None = None):
        self.lines = lines
        #: channel -> the ``[node N] `` prefix of its line still open (pieces): kept from batch to
        #: batch, so the rest of a line broken off (by the view drawn below it, or another
        #: channel's line) starts its new row with its node, as every row does.
        self.carry = {} if carry is None else carry

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.segment import Segment
        from rich.style import Style
        from rich.text import Text

        styles = {"stdout": Style(dim=True), "stderr": Style(color="red"), "notice": Style(bold=True),
                  "status": Style(dim=True)}
        newline = Segment.line()
        going_on = ""  # the channel of the last line printed, when it is a piece of a line that goes on
        for channel, text in self.lines:
            piece = channel.endswith("+")
            channel = channel.rstrip("+")
            if going_on and going_on != channel:  # something else comes between: the line breaks off
                yield newline
                going_on = ""
            line = text
            if channel in ("stdout", "stderr"):
                if text.startswith("[node ") and not going_on:
                    prefix, _, line = text.partition("] ")
                    yield Segment(prefix + "] ", styles[channel])
                    self.carry.pop(channel, None)
                    if piece:
                        self.carry[channel] = prefix + "] "
                elif not going_on and channel in self.carry:  # the rest of a line broken off: a new row
                    yield Segment(self.carry[channel], styles[channel])
                if not piece:
                    self.carry.pop(channel, None)
            elif channel in styles:
                yield Segment(line, styles[channel])
                yield newline
                continue
            if "\x1b" in line:  # the task's own colours
                yield from Text.from_ansi(line, end="").render(console)
            else:
                yield Segment(line)
            going_on = channel if piece else ""
            if not piece:
                yield newline
        if going_on:  # the view is drawn below: the line goes on on the next row
            yield newline


class _LogSink:
    """The stream a logging handler writes to while the live view is shown: each whole line
    goes to ``line`` (the console's next batch, above the view)."""

    def __init__(self, line: Callable[[str], None]):
        self._line = line
        self._partial = ""

    def write(self, text: str) -> int:
        data = self._partial + text
        *lines, self._partial = data.split("\n")
        for line in lines:
            self._line(line)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def route_logging(screens: tuple[Any, ...], line: Callable[[str], None]) -> list[tuple[Any, Any]]:
    """Point every logging handler that writes to one of ``screens`` at ``line``; return
    (handler, its own stream) pairs for :func:`restore_logging`."""
    import logging

    handlers: list[Any] = []
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        handlers += getattr(logger, "handlers", [])
    sink = _LogSink(line)
    routed = []
    for handler in dict.fromkeys(handlers):
        stream = getattr(handler, "stream", None)
        if isinstance(handler, logging.StreamHandler) and any(stream is s for s in screens):
            routed.append((handler, handler.setStream(sink)))
    return routed


def restore_logging(routed: list[tuple[Any, Any]]) -> None:
    for handler, stream in reversed(routed):
        handler.setStream(stream)


def render(state: ConsoleState, lock: threading.Lock, rc: RichConsole | None) -> RenderableType:
    """The live view of ``state`` as it is now: a header line and one row per node. ``lock``
    guards ``state`` (held only to copy it); ``rc`` is the terminal drawn on (None: 40 lines)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    now = time.monotonic()
    with lock:  # copy what is drawn; render outside the lock
        started, ready_after, stopping = state.started, state.ready_after, state.stopping
        pool_id, provider, expected = state.pool_id, state.provider, state.expected
        rows = [
            (n, nd.stage, nd.detail, nd.host, now - nd.since, now - nd.first, nd.progress or nd.last_log,
             state.running_queued(nd)[0], nd.done, nd.failed)
            for n, nd in sorted(state.nodes.items())
        ]
        queued = sum(state.running_queued(nd)[1] for nd in state.nodes.values())
        cancelled = sum(nd.cancelled for nd in state.nodes.values())
        batch = (state.batch_done, state.batch_total, now - state.batch_started)
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
    bits.append(plural(expected or len(rows), "node"))
    if stopping:
        bits.append("stopping")
    elif ready_after is None:
        bits.append(f"starting {seconds(now - started)}")
    else:
        bits.append(f"{n_ready}/{len(rows)} ready in {seconds(ready_after)}")
    bits.append(f"up {seconds(now - started)}")
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
        cells: list[Any] = [str(n), Text(f"{icon} {stage}", style=style), f"{seconds(in_stage)} / {seconds(total)}"]
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


def _bar(done: int, total: int, elapsed: float, utf8: bool, width: int) -> Any:
    """``tasks ━━━━━━──── 1,234/10,000 · 820/s · ETA 11s`` for the current batch of tasks."""
    from rich.text import Text

    rate = done / elapsed if elapsed > 0 else 0.0
    left = total - done
    eta = f"ETA {seconds(left / rate)}" if rate > 0 and left else ("done" if not left else "ETA -")
    figures = f" {done:,}/{total:,} · {rate:,.0f}/s · {eta}"
    size = max(10, min(40, width - len(figures) - 8))
    full = int(size * done / total) if total else size
    on, off = ("━", "─") if utf8 else ("#", "-")
    bar = Text("tasks ", style="dim")
    bar.append(on * full, style="green" if not left else "cyan")
    bar.append(off * (size - full), style="dim")
    bar.append(figures, style="dim")
    return bar
