"""The client's end of one worker: its channel, its in-flight tasks, and the reader thread.

The reader thread is the only reader of the worker's stdout. It resolves each task's
:class:`~concurrent.futures.Future` as RESULT/ERROR frames arrive (no polling), turns OUTPUT
frames into events, and, when the stream ends unexpectedly, fails every in-flight task with
:class:`~skyward.errors.WorkerLost` carrying the exit code and the last lines of output.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from skyward import events as ev
from skyward._wire_errors import decode_exception
from skyward.errors import PluginError, WorkerLost
from skyward.protocol import FrameReader, FrameWriter, Kind, Payload, loads_payload
from skyward.transport.base import Channel

_task_ids = itertools.count(1)
LOG_TAIL = 30


@dataclass(eq=False)
class _Task:
    future: Future[Any]
    name: str
    started: float
    timer: threading.Timer | None = None


@dataclass(eq=False)
class NodeConnection:
    node: int
    host: str
    channel: Channel
    emit: Callable[[ev.Event], None]
    #: The pool's subscribers: events are only built when someone listens (hot path).
    listening: list[Any]
    tasks: dict[int, _Task] = field(default_factory=dict)
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_TAIL))
    ready: Future[int] = field(default_factory=Future)
    alive: bool = True
    closing: bool = False
    said_bye: bool = False
    last_heard: float = field(default_factory=time.monotonic)
    lost: WorkerLost | None = None

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.writer = FrameWriter(self.channel.stdin)
        self.reader = FrameReader(self.channel.stdout)
        self._threads = [
            threading.Thread(target=self._read_loop, name=f"skyward-node{self.node}-reader", daemon=True),
            threading.Thread(target=self._stderr_loop, name=f"skyward-node{self.node}-stderr", daemon=True),
        ]
        for t in self._threads:
            t.start()

    # -- sending ---------------------------------------------------------------------------
    @property
    def inflight(self) -> int:
        return len(self.tasks)

    def send(self, control: tuple, payload: Payload | None = None) -> None:
        try:
            self.writer.send(control, payload)
        except (OSError, ValueError) as exc:
            self._lose(f"could not write to the worker: {exc}")
            raise self.lost or WorkerLost(self.node, "connection closed") from exc

    def submit(self, payload: Payload, name: str, timeout: float | None) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()
        if not self.alive:
            future.set_exception(self.lost or WorkerLost(self.node, "worker is not running"))
            return future
        task_id = next(_task_ids)
        task = _Task(future, name, time.monotonic())
        with self.lock:
            self.tasks[task_id] = task
        if timeout is not None:
            task.timer = threading.Timer(timeout, self._expire, args=(task_id, timeout))
            task.timer.daemon = True
            task.timer.start()
        if self.listening:
            self.emit(ev.TaskStarted(task_id, self.node, name))
        try:
            self.send((Kind.TASK, task_id, name), payload)
        except WorkerLost:
            pass  # _lose() already failed the future
        return future

    def interrupt(self, future: Future[Any]) -> None:
        """Ask the worker to stop the task behind ``future``; its future resolves when it does."""
        with self.lock:
            ids = [tid for tid, t in self.tasks.items() if t.future is future]
        for tid in ids:
            with contextlib.suppress(OSError, ValueError):
                self.writer.send((Kind.CANCEL, tid))

    def cancel(self, future: Future[Any]) -> None:
        """Stop the task behind ``future`` on the worker (best effort) and forget it."""
        with self.lock:
            found = [(tid, t) for tid, t in self.tasks.items() if t.future is future]
            for tid, _ in found:
                del self.tasks[tid]
        for tid, t in found:
            if t.timer:
                t.timer.cancel()
            if self.alive:
                try:
                    self.writer.send((Kind.CANCEL, tid))
                except (OSError, ValueError):
                    pass

    def _expire(self, task_id: int, timeout: float) -> None:
        from skyward.errors import TaskTimeout

        with self.lock:
            task = self.tasks.pop(task_id, None)
        if task is None:
            return
        if self.alive:
            try:
                self.writer.send((Kind.CANCEL, task_id))
            except (OSError, ValueError):
                pass
        self.emit(ev.TaskFinished(task_id, self.node, task.name, False, time.monotonic() - task.started))
        if not task.future.done():
            task.future.set_exception(TaskTimeout(task.name, timeout, node=self.node))

    # -- receiving ---------------------------------------------------------------------------
    def _read_loop(self) -> None:
        reason = "worker exited"
        try:
            while True:
                frame = self.reader.recv()
                if frame is None:
                    break
                self.last_heard = time.monotonic()
                self._handle(*frame)
                frame = None  # don't keep the last payload alive while waiting for the next
        except Exception as exc:  # a corrupt stream is as bad as a dead one
            reason = f"stream broke: {type(exc).__name__}: {exc}"
        if self.said_bye:
            self.alive = False
            return
        self._lose(reason)

    def _handle(self, control: tuple, parts: list[Any]) -> None:
        kind = control[0]
        if kind == Kind.RESULT:
            task = self._finish(control[1], True)
            if task is not None:
                try:
                    value = loads_payload(parts)
                except BaseException as exc:
                    task.future.set_exception(exc)
                else:
                    task.future.set_result(value)
        elif kind == Kind.ERROR:
            task = self._finish(control[1], False)
            if task is not None:
                task.future.set_exception(decode_exception(control[2], self.node))
        elif kind == Kind.OUTPUT:
            _, task_id, stream, line = control
            self.tail.append(line)
            if self.listening:
                self.emit(ev.TaskOutput(self.node, task_id, stream, line))
        elif kind == Kind.HEARTBEAT:
            pass
        elif kind == Kind.READY:
            if not self.ready.done():
                self.ready.set_result(control[1])
        elif kind == Kind.FATAL:
            d = control[1]
            if not self.ready.done():
                self.ready.set_exception(PluginError(d["plugin"], d["node"], d["hook"], d["message"], d["traceback"]))
        elif kind == Kind.BYE:
            self.said_bye = True

    def _finish(self, task_id: int, ok: bool) -> _Task | None:
        with self.lock:
            task = self.tasks.pop(task_id, None)
        if task is None:
            return None  # timed out or cancelled already
        if task.timer:
            task.timer.cancel()
        if self.listening:
            self.emit(ev.TaskFinished(task_id, self.node, task.name, ok, time.monotonic() - task.started))
        return task

    def _stderr_loop(self) -> None:
        for raw in iter(self.channel.stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.tail.append(line)
            self.emit(ev.NodeLog(self.node, line))

    # -- loss ----------------------------------------------------------------------------------
    def _lose(self, reason: str) -> None:
        with self.lock:
            if not self.alive:
                return
            self.alive = False
            tasks, self.tasks = self.tasks, {}
        exit_code = self.channel.wait(2.0) if not self.closing else self.channel.wait(0)
        if exit_code is None and not self.closing:
            self.channel.kill()
            exit_code = self.channel.wait(1.0)
        # Let the stderr reader drain what the dying process wrote, for the error message.
        self._threads[1].join(0.5)
        what = f"{reason} while running {len(tasks)} task(s)" if tasks else reason
        self.lost = WorkerLost(self.node, what, exit_code=exit_code, log_tail=list(self.tail))
        if not self.ready.done():
            self.ready.set_exception(self.lost)
        for task in tasks.values():
            if task.timer:
                task.timer.cancel()
            if not task.future.done():
                task.future.set_exception(self.lost)
        if not self.closing:
            self.emit(ev.NodeStage(self.node, "lost", what))

    def check_heartbeat(self, lost_after: float) -> None:
        silent = time.monotonic() - self.last_heard
        if self.alive and silent > lost_after:
            self.channel.kill()
            self._lose(f"no heartbeat for {silent:.0f}s")

    def join_reader(self, timeout: float) -> None:
        self._threads[0].join(timeout)
