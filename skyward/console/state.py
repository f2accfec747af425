"""What the console knows about a pool, built from the pool's events alone: each node's stage,
its tasks and its progress line, and the lines each event makes visible (stage lines, task
output, a failing node's log tail, the summary when the pool stops).

No I/O and no rich: :mod:`skyward.console` decides where the lines go and when, and the live
view (:mod:`skyward.console.live`) draws this state. Every method is called under the
console's lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Literal

from skyward import events as ev

__all__ = ["ConsoleState", "Msg", "NodeState", "plural", "readable_log_line", "seconds"]

PLAIN_PROGRESS_EVERY = 5.0  # seconds between two prints of a node's progress line in plain mode
_STEP_PREFIX = "::step:: "  # skyward.bootstrap.STEP_PREFIX (not imported: bootstrap is heavier)
_WARM_PREFIX = "::warm::"
_TAIL_LINES = 10  # log lines kept per node, shown when it fails
_PLAIN_STAGES = frozenset({"provisioning", "bootstrapping", "ready", "lost", "stopped"})


def seconds(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def readable_log_line(line: str) -> str:
    """A bootstrap log line as a user should read it: step markers become ``step NAME``."""
    if line.startswith(_STEP_PREFIX):
        return "step " + line[len(_STEP_PREFIX):].strip()
    if line.startswith(_WARM_PREFIX):
        return line[len(_WARM_PREFIX):].strip() or "environment reused"
    return line


def preempting_line(event: ev.NodePreempting) -> str:
    """The one line a preemption notice gets on the console."""
    when = event.at.astimezone(timezone.utc).strftime("%H:%M:%S UTC")
    if event.kind == "rebalance":
        return f"skyward: node {event.node}: EC2 recommends a rebalance (at elevated risk of interruption, since {when})"
    left = (event.at - datetime.now(timezone.utc)).total_seconds()
    return (f"skyward: node {event.node}: spot interruption notice: {event.action or 'interruption'} at {when}"
            f" (in {seconds(left)})")


def _carriage(line: str) -> str | None:
    """What a terminal would show for a line redrawn with carriage returns (a progress bar),
    or None for an ordinary line (a trailing ``\r`` of a CRLF line end does not count)."""
    if "\r" not in line.rstrip("\r"):
        return None
    shown = [part for part in line.split("\r") if part.strip()]
    return shown[-1] if shown else ""


@dataclass
class NodeState:
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
    retrying: int = 0  # its running tasks the pool already sends again (TaskRetried came before the loss)
    progress: str = ""  # the latest state of a progress line (tqdm) of a running task
    progress_task: int | None = None
    progress_stream: str = "stderr"
    progress_shown: float = 0.0  # plain mode: when it was last printed
    progress_dirty: bool = False  # plain mode: changed since it was last printed


# (channel, text) messages the state update produces; how each is shown depends on the mode.
#   "stdout"/"stderr": output lines ([node N] ...), shown in every mode
#   "stdout+"/"stderr+": a piece of an output line that goes on (no newline after it)
#   "stage": a per-node stage line (plain mode only)
#   "status": a pool-level line (plain and live)
#   "notice": a pool-level line shown in every mode, off included (the Ctrl-C line)
#   "log": a record of the client's own logging, already formatted (live only)
Msg = tuple[Literal["stdout", "stderr", "stdout+", "stderr+", "stage", "status", "notice", "log"], str]


class ConsoleState:
    """The pool as the console sees it. ``live``: the live view shows progress lines in its
    rows (plain mode prints them every few seconds); ``verbose``: every log line is shown."""

    def __init__(self, live: bool, verbose: bool, now: float, tty: dict[str, bool] | None = None) -> None:
        self.live = live
        self.verbose = verbose
        self.tty = tty or {}  # stream -> whether it is a terminal (carriage-return frames go through)
        self.open: dict[str, tuple[int, int | None]] = {}  # stream -> (node, task) whose line goes on
        self.reset(now)

    def reset(self, now: float) -> None:
        self.started = now
        self.pool_id = ""
        self.provider = ""
        self.expected = 0
        self.slots: int | None = None  # task slots per node, when the pool said
        self.ready_after: float | None = None
        self.stopping = False
        self.retried = 0  # tasks sent again after their node was lost (each counted once, by its outcome)
        self.nodes: dict[int, NodeState] = {}
        self.dropped_run = 0  # live: output lines dropped since the last marker on screen
        self.dropped_total = 0  # live: the pool's dropped lines that a marker has counted
        # The current batch of tasks (from the moment none was in flight): for the progress bar.
        self.in_flight = 0
        self.batch_total = 0
        self.batch_done = 0
        self.batch_started = now

    def node(self, n: int, now: float) -> NodeState:
        node = self.nodes.get(n)
        if node is None:
            node = self.nodes[n] = NodeState(since=now, first=now)
        return node

    def running_queued(self, node: NodeState) -> tuple[int, int]:
        """Tasks running on ``node`` and tasks waiting there for a slot."""
        sent = len(node.running)
        if self.slots is None:
            return sent, 0
        return min(sent, self.slots), max(0, sent - self.slots)

    def apply(self, event: ev.Event, now: float) -> list[Msg]:
        """Update the state with ``event``; return the lines it makes visible. Under the lock."""
        msgs: list[Msg] = []
        if isinstance(event, ev.TaskOutput):
            return self.output(event, now)
        if isinstance(event, ev.NodeLog):
            node = self.node(event.node, now)
            line = readable_log_line(event.line)
            node.last_log = line
            # After a node is ready its diagnostics are stray writes of the tasks themselves
            # (e.g. C code printing to fd 1/2): output, not chatter.
            if self.verbose or node.stage == "ready":
                msgs.append(("stderr", f"[node {event.node}] {line}"))
            else:
                node.unshown.append(line)
        elif isinstance(event, ev.NodeStage):
            node = self.node(event.node, now)
            if event.stage in ("stopped", "lost"):
                # The pool ended them; no TaskFinished follows. Stopping on purpose cancels them.
                # A task the pool runs again is counted by its last attempt, not here.
                ended = max(0, len(node.running) - node.retrying)
                if event.stage == "stopped" and self.stopping:
                    node.cancelled += ended
                else:
                    node.failed += ended
                self.in_flight -= len(node.running)
                node.running.clear()
                node.retrying = 0
                node.progress = ""
            if event.stage in ("stopping", "starting"):  # workers restart: starting again
                self.stopping = event.stage == "stopping"
            node.stage, node.detail, node.since = event.stage, event.detail, now
            if event.stage == "ready":
                node.was_ready, node.was_lost = True, False
            elif event.stage == "lost":
                node.was_lost = True
            if event.detail and event.stage != "lost":
                node.host = event.detail
            t = f"({seconds(now - self.started)})"
            if event.stage == "lost":
                msgs.append(("status", f"skyward: node {event.node} lost {t}" + (f": {event.detail}" if event.detail else "")))
                msgs += self.flush_tail(event.node, node)
            elif event.stage in _PLAIN_STAGES:
                detail = f" {event.detail}" if event.detail else ""
                msgs.append(("stage", f"skyward: node {event.node} {event.stage}{detail} {t}"))
        elif isinstance(event, ev.TaskStarted):
            node = self.node(event.node, now)
            if self.in_flight <= 0:  # a new batch begins
                self.in_flight, self.batch_total, self.batch_done, self.batch_started = 0, 0, 0, now
            node.running.add(event.task_id)
            self.in_flight += 1
            self.batch_total += 1
        elif isinstance(event, ev.TaskFinished):
            node = self.node(event.node, now)
            if event.task_id in node.running:
                node.running.discard(event.task_id)
                self.in_flight -= 1
                self.batch_done += 1
            if event.ok:
                node.done += 1
            elif event.cancelled or self.stopping:
                node.cancelled += 1
            else:
                node.failed += 1
            if node.progress and node.progress_task == event.task_id:
                msgs += self.progress_line(event.node, node, now, final=True)
        elif isinstance(event, (ev.NodeAdded, ev.NodeRemoved, ev.TaskRetried)):
            msgs += self.membership(event, now)
        elif isinstance(event, ev.PoolStarting):
            self.reset(now)
            self.pool_id, self.provider, self.expected = event.pool_id, event.provider, event.nodes
            self.slots = getattr(event, "concurrency", None)
            for n in range(event.nodes):
                self.node(n, now)
        elif isinstance(event, ev.NodePreempting):
            msgs.append(("status", preempting_line(event)))
        elif isinstance(event, ev.PoolReady):
            self.ready_after = event.seconds
            where = f" on {self.provider}" if self.provider else ""
            msgs.append((
                "status",
                f"skyward: pool {event.pool_id} ready: {plural(event.nodes, 'node')}{where} in {seconds(event.seconds)}",
            ))
        elif isinstance(event, ev.PoolStopped):
            for n, node in sorted(self.nodes.items()):
                if node.progress:
                    msgs += self.progress_line(n, node, now, final=True)
                if not node.was_ready:  # it never came up: its log says why
                    msgs += self.flush_tail(n, node)
            if getattr(event, "interrupted", False):
                msgs.append(("notice", self.interrupted(event)))
            else:
                msgs.append(("status", self.summary(event, now)))
        return msgs

    def output(self, event: ev.TaskOutput, now: float) -> list[Msg]:
        """A line of task output, or a piece of one (``more``: printed as it comes, without a
        newline, so a line of any length goes through whole). A line redrawn with carriage
        returns goes through frame by frame where its stream is a terminal (each frame
        prefixed, so the terminal shows them as the task drew them); elsewhere, and for a
        progress line still being drawn (pieces), it is the node's progress line."""
        msgs: list[Msg] = []
        source, stream = (event.node, event.task_id), event.stream
        prefix = f"[node {event.node}] "
        going_on = self.open.get(stream) == source  # this line began with earlier pieces
        shown = _carriage(event.line)
        if shown is not None and not going_on and (event.more or not self.tty.get(stream)):
            if shown:
                node = self.node(event.node, now)
                node.progress, node.progress_task, node.progress_stream = shown, event.task_id, stream
                node.progress_dirty = True
                if not self.live and now - node.progress_shown >= PLAIN_PROGRESS_EVERY:
                    msgs += self.progress_line(event.node, node, now)
            return msgs
        node = self.nodes.get(event.node)
        if (not event.line and not event.more and not going_on and node is not None and node.progress
                and node.progress_task == event.task_id):
            return msgs  # the newline that ends a progress line (tqdm's close)
        if stream in self.open and not going_on:  # another's line is open there: it breaks off
            del self.open[stream]
            msgs.append((stream, ""))  # type: ignore[arg-type]
        text = event.line
        if shown is not None:  # a terminal: every frame, each with the node's prefix
            frames = text.rstrip("\r")  # (a CRLF line end is not a frame)
            text = frames.replace("\r", "\r" + prefix) + text[len(frames):]
        if not going_on:
            text = prefix + text
        if event.more:
            self.open[stream] = source
            msgs.append((f"{stream}+", text))  # type: ignore[arg-type]
        else:
            self.open.pop(stream, None)
            msgs.append((stream, text))
        return msgs

    def membership(self, event: ev.NodeAdded | ev.NodeRemoved | ev.TaskRetried, now: float) -> list[Msg]:
        """An elastic pool's changes: one line each. A node number may come back after its
        node was removed (its counts go on)."""
        t = f"({seconds(now - self.started)})"
        if isinstance(event, ev.TaskRetried):
            self.retried += 1
            lost = self.node(event.lost_node, now)
            if lost.running:  # its loss is still to come: not a failure then
                lost.retrying += 1
            elif lost.failed:  # its loss came first and counted the task as failed: it is not
                lost.failed -= 1
            return [("status", f"skyward: task {event.name} retried after node {event.lost_node} was lost "
                               f"(attempt {event.attempt} of {event.attempts}) {t}")]
        node = self.node(event.node, now)
        if isinstance(event, ev.NodeAdded):
            text = f"skyward: node {event.node} added ({event.reason}) {t}"
        else:
            self.stopping = False  # (its "stopping" stage was this node's, not the pool's)
            node.stage, node.detail, node.since = "removed", event.reason, now
            if event.reason.startswith("lost: "):
                text = f"skyward: node {event.node} lost" + ("; replacing" if event.reason.endswith("; replacing")
                                                              else "; removed") + f" {t}"
            else:
                text = f"skyward: node {event.node} removed ({event.reason}) {t}"
        self.expected = sum(1 for nd in self.nodes.values() if nd.stage != "removed")
        return [("status", text)]

    def progress_line(self, n: int, node: NodeState, now: float, *, final: bool = False) -> list[Msg]:
        """The node's progress line, to print now (once more at the end, if it changed)."""
        line = node.progress
        shown = node.progress_dirty or (final and self.live)
        if final:
            node.progress, node.progress_task = "", None
        if not shown:
            return []
        node.progress_shown, node.progress_dirty = now, False
        return [(node.progress_stream, f"[node {n}] {line}")]  # type: ignore[list-item]

    def flush_tail(self, n: int, node: NodeState) -> list[Msg]:
        lines: list[Msg] = [("stderr", f"[node {n}] {line}") for line in node.unshown]
        node.unshown.clear()
        return lines

    def summary(self, event: ev.PoolStopped, now: float) -> str:
        done = sum(n.done for n in self.nodes.values())
        failed = sum(n.failed for n in self.nodes.values())
        cancelled = sum(n.cancelled for n in self.nodes.values())
        total = done + failed + cancelled
        counts = f"{done} done, {failed} failed" + (f", {cancelled} cancelled" if cancelled else "")
        tasks = f"{plural(total, 'task')} ({counts})" if total else "no tasks"
        if self.retried:
            tasks += f", {self.retried} retried"
        ended = "detached" if event.detached else "stopped"  # (a cluster stays up)
        parts = [f"skyward: pool {event.pool_id or self.pool_id} {ended}: {tasks}", f"up {seconds(now - self.started)}"]
        lost = [n for n, node in sorted(self.nodes.items()) if node.was_lost]
        if lost:
            parts.append(f"{'node' if len(lost) == 1 else 'nodes'} {', '.join(map(str, lost))} lost")
        dropped = self.dropped_total + self.dropped_run
        if dropped:
            parts.append(f"{dropped:,} output {'line' if dropped == 1 else 'lines'} not shown (the terminal stalled)")
        if not event.clean:
            parts.append("teardown incomplete")
        return ", ".join(parts)

    def interrupted(self, event: ev.PoolStopped) -> str:
        cancelled = sum(n.cancelled + len(n.running) for n in self.nodes.values())
        left = "nothing left running" if event.clean else "teardown incomplete (see above)"
        tail = f" ({plural(cancelled, 'task')} cancelled)" if cancelled else ""
        if event.detached:
            return f"skyward: interrupted: pool {event.pool_id or self.pool_id} detached, its cluster stays up{tail}"
        return f"skyward: interrupted: pool {event.pool_id or self.pool_id} stopped, {left}{tail}"
