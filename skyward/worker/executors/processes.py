"""The process executor: each slot is a long-lived child process (no per-task spawn).

One reader thread queues the tasks the agent reads; one thread per slot hands them to its
child over a pipe and relays the child's frames (OUTPUT, then RESULT or ERROR) to the client.
A cancelled task's child is killed and replaced. ``around_app`` state lives in the agent's
process, not in the children; ``around_task`` hooks run in the children. Spot preemption
notices reach each child on a pipe of its own, read by a thread of the child (its tasks'
``on_preempt`` callbacks run there); a child started later gets the notices taken so far.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
from typing import Any

import cloudpickle

from skyward.runtime import instance as runtime_instance, preemption as _preempt
from skyward.messages import RemoteFailure
from skyward.plugins._base import Plugin
from skyward.protocol import Kind, Payload
from skyward.worker.executors.base import Send, Task, TaskSource, run_task
from skyward.worker.output import SendOutput, route_output


class ProcessExecutor:
    def __init__(self, concurrency: int, plugins: tuple[Plugin, ...], send: Send, send_output: SendOutput):
        self._send = send
        self._ctx = multiprocessing.get_context("spawn")
        self._blob = cloudpickle.dumps(plugins)
        self._children = [_Child(self._ctx, self._blob) for _ in range(concurrency)]
        self._queue: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._cancelled: set[int] = set()  # cancelled while still queued
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._slot_loop, args=(i,), name=f"skyward-slot-{i}", daemon=True)
            for i in range(concurrency)
        ]
        for t in self._threads:
            t.start()

    def start(self, source: TaskSource) -> None:
        threading.Thread(target=self._read_loop, args=(source,), name="skyward-reader", daemon=True).start()

    def _read_loop(self, source: TaskSource) -> None:
        while (task := source.next_task()) is not None:
            self._queue.put(task)

    def idle(self) -> bool:
        return self._queue.empty() and all(c.task_id is None for c in self._children)

    def cancel(self, task_id: int) -> None:
        with self._lock:
            for child in self._children:
                if child.task_id == task_id:
                    child.task_id = None
                    child.kill()  # the slot's loop sees EOF and replaces the child
                    return
            self._cancelled.add(task_id)

    def _slot_loop(self, index: int) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            task_id, name, parts = item
            with self._lock:
                if task_id in self._cancelled:
                    self._cancelled.discard(task_id)
                    continue
                child = self._children[index]
                child.task_id = task_id
            try:
                child.conn.send((task_id, name, [bytes(p) for p in parts]))
                while True:
                    control, out_parts = child.conn.recv()
                    self._send(control, Payload(out_parts[0], out_parts[1:]) if out_parts else None)
                    if control[0] in (Kind.RESULT, Kind.ERROR):
                        break
            except (EOFError, OSError):
                with self._lock:
                    cancelled = child.task_id is None
                    child.task_id = None
                    child.forget_notices()
                    if not self._stopping:
                        self._children[index] = _Child(self._ctx, self._blob)
                if not cancelled:
                    err = RuntimeError(f"task process exited with code {child.process.exitcode}")
                    self._send((Kind.ERROR, task_id, RemoteFailure.of(err)), None)
            else:
                with self._lock:
                    child.task_id = None

    def preempting(self, notice: Any) -> None:
        with self._lock:
            children = list(self._children)
        for child in children:
            child.tell(notice)

    def shutdown(self, grace: float) -> None:
        self._stopping = True
        while True:  # queued tasks never start once stopping
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            self._queue.put(None)
        for child in self._children:
            try:
                child.conn.send(None)
            except OSError:
                pass
        for child in self._children:
            child.process.join(grace / max(1, len(self._children)))
            if child.process.is_alive():
                child.kill()


class _Child:
    def __init__(self, ctx: Any, plugins_blob: bytes):
        self.conn, child_conn = ctx.Pipe()
        notices_in, self._notices = ctx.Pipe(duplex=False)
        env = {runtime_instance.ENV_VAR: os.environ.get(runtime_instance.ENV_VAR, "")}
        self.process = ctx.Process(target=_child_main, args=(child_conn, plugins_blob, env, notices_in,
                                                             _preempt.notices()), daemon=True)
        self.process.start()
        child_conn.close()
        notices_in.close()
        self._tell_lock = threading.Lock()
        self.task_id: int | None = None

    def tell(self, notice: Any) -> None:
        """Pass a preemption notice on to the child (a child that is gone needs none)."""
        with self._tell_lock:
            try:
                self._notices.send(notice)
            except (OSError, ValueError):
                pass

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.forget_notices()

    def forget_notices(self) -> None:
        """Close the notices' pipe (the child is gone)."""
        with self._tell_lock:
            self._notices.close()


def _take_notices(notices: Any) -> None:
    """(A child's thread) Take each preemption notice the worker passes on, until it is gone."""
    while True:
        try:
            notice = notices.recv()
        except (EOFError, OSError):
            return
        _preempt.deliver(notice)


def _child_main(conn: Any, plugins_blob: bytes, env: dict[str, str], notices: Any = None,
                taken: tuple[Any, ...] = ()) -> None:
    """A slot's child process: run the tasks its slot thread sends, until None or EOF."""
    os.environ.update(env)
    plugins = cloudpickle.loads(plugins_blob)
    for notice in taken:
        _preempt.deliver(notice)
    if notices is not None:
        threading.Thread(target=_take_notices, args=(notices,), name="skyward-preemption", daemon=True).start()

    def send(control: tuple, payload: Payload | None) -> None:
        parts = [] if payload is None else [bytes(p) for p in payload.parts]
        conn.send((control, parts))

    def send_output(task_id: int | None, stream: str, text: str, more: bool = False) -> None:
        conn.send(((Kind.OUTPUT, task_id, stream, text, more), []))

    route_output(send_output)
    while True:
        try:
            item = conn.recv()
        except EOFError:
            return
        if item is None:
            return
        task_id, name, parts = item
        run_task(plugins, task_id, name, parts, send, send_output)
