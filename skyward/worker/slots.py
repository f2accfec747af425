"""Task slots on a worker: ``concurrency`` threads, or ``concurrency`` long-lived child processes.

Both run a task the same way (:func:`run_task`): unpickle, wrap with the plugins'
``around_task``, call, and answer RESULT or ERROR; output is routed per task, so two tasks
running side by side keep their lines (and their silencing) apart.

* ``thread``: tasks share the worker process (and what ``around_app`` set up, such as a torch
  process group). A timed-out task is interrupted with an asynchronous exception, which
  Python delivers the next time that thread runs Python code.
* ``process``: each slot is a child process started once (no per-task spawn); a timed-out
  task's child is killed and replaced. ``around_app`` state lives in the agent, not in the
  children.
"""

from __future__ import annotations

import collections
import ctypes
import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import cloudpickle

from skyward import errors, runtime
from skyward._wire_errors import encode_exception
from skyward.errors import SerializationError
from skyward.plugins._base import Plugin, wrap_task
from skyward.worker.output import LineSink, route_output
from skyward.protocol import Kind, Payload, dumps_payload, loads_payload

if TYPE_CHECKING:
    from skyward.worker.agent import Agent


class TaskCancelled(BaseException):
    """Raised inside a task the client gave up on (timeout or cancellation).

    A BaseException, so that a task's own ``except Exception`` cannot swallow it; the client
    receives it as :class:`skyward.errors.TaskCancelled`."""


Task = tuple[int, str, list[Any]]  # (task id, name, payload parts)

#: With one slot, a task shorter than this runs without another thread waking to read behind
#: it; a longer one has CANCEL/PING read within about twice this.
HANDOFF_AFTER = 0.02


class Slots(Protocol):
    #: How many threads take turns reading the stream.
    readers: int
    #: Seconds a task may run before another thread takes over reading behind it.
    handoff_after: float

    def accept(self, task: Task) -> Task | None:
        """Take a task just read; return one for the reader to :meth:`run` now, or None."""

    def run(self, task: Task) -> None: ...
    def idle(self) -> bool:
        """True if no task is running (a reader may spin without slowing one down)."""
    def cancel(self, task_id: int) -> None: ...
    def shutdown(self, grace: float) -> None: ...


_functions: dict[bytes, Callable[..., Any]] = {}
_FUNCTION_CACHE_SIZE = 256


def resolve_function(blob: bytes) -> Callable[..., Any]:
    """Unpickle a task's function once per distinct pickle (see compute.function_blob)."""
    fn = _functions.get(blob)
    if fn is None:
        fn = cloudpickle.loads(blob)
        if len(_functions) >= _FUNCTION_CACHE_SIZE:
            _functions.pop(next(iter(_functions)))
        _functions[blob] = fn
    return fn


def run_task(
    plugins: tuple[Plugin, ...],
    task_id: int,
    name: str,
    parts: list[Any],
    send: Callable[[tuple, Payload | None], None],
    send_output: Callable[[int | None, str, str], None],
) -> None:
    sink = LineSink(send_output, task_id)
    token = runtime._sink.set(sink)
    try:
        try:
            blob, args, kwargs = loads_payload(parts)
            result = wrap_task(plugins, resolve_function(blob))(*args, **kwargs)
        except TaskCancelled:
            sink.close()
            stopped = errors.TaskCancelled(name, node=runtime.instance_info().node)
            send((Kind.ERROR, task_id, encode_exception(stopped)), None)
            return
        except BaseException as exc:
            sink.close()
            send((Kind.ERROR, task_id, encode_exception(exc)), None)
            return
        sink.close()
        try:
            payload = dumps_payload(result)
        except Exception as exc:
            err = SerializationError(
                "return value", "a picklable value", type(result).__name__,
                detail=f"{type(exc).__name__}: {exc}",
            )
            send((Kind.ERROR, task_id, encode_exception(err)), None)
            return
        send((Kind.RESULT, task_id), payload)
    finally:
        runtime._sink.reset(token)


def _importing(ident: int) -> bool:
    """True if the thread ``ident`` is executing an import right now."""
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


class ThreadSlots:
    """Tasks run on the thread that read them from the stream (leader/followers).

    ``concurrency + 1`` threads take turns reading frames; at most ``concurrency`` of them run
    a task at a time, so one is always free to read CANCEL, PING and SHUTDOWN. The thread that
    reads a TASK runs it itself after passing the reading on, so no thread hand-off lies
    between a task arriving and it starting (the hand-off happens alongside the task). Tasks
    that arrive while every slot is busy wait in a queue for the next slot to free up.
    """

    def __init__(self, concurrency: int, agent: Agent):
        self._agent = agent
        self.readers = concurrency + 1
        # One slot: nothing else can start while the task runs, so the thread behind it can
        # wait a little before reading (see skyward.worker.agent._ReadRole); several: at once.
        self.handoff_after = HANDOFF_AFTER if concurrency == 1 else 0.0
        self._free = concurrency  # slots not running a task (guarded by _lock)
        self._queue: collections.deque[Task] = collections.deque()
        self._lock = threading.Lock()
        self._running: dict[int, int] = {}  # task id -> thread ident
        self._cancelled: set[int] = set()  # cancelled while still queued
        self._stopping = False

    def _claim(self) -> bool:
        with self._lock:
            if self._stopping or not self._free:
                return False
            self._free -= 1
            return True

    def _release(self) -> None:
        with self._lock:
            self._free += 1

    def idle(self) -> bool:
        return not self._running

    def _pop(self) -> Task | None:
        while True:
            if not self._queue:
                return None  # (the usual case: cheaper than the IndexError below)
            try:
                task = self._queue.popleft()
            except IndexError:
                return None
            with self._lock:
                if task[0] not in self._cancelled:
                    return task
                self._cancelled.discard(task[0])

    def accept(self, task: Task) -> Task | None:
        """Take a task just read. Returns the task the reader should run now (a slot is claimed
        for it), or None when every slot is busy and it was queued."""
        if self._claim():
            return task
        self._queue.append(task)
        if self._claim():  # a slot freed up between the two looks
            queued = self._pop()
            if queued is not None:
                return queued
            self._release()
        return None

    def run(self, task: Task) -> None:
        """Run ``task`` (its slot claimed by :meth:`accept`), then queued tasks; free the slot."""
        item: Task | None = task
        while item is not None:
            self._run_one(*item)
            item = self._pop()
            if item is None:
                self._release()
                if not self._queue or not self._claim():
                    return
                item = self._pop()
                if item is None:
                    self._release()
                    return

    def _run_one(self, task_id: int, name: str, parts: list[Any]) -> None:
        agent = self._agent
        try:
            with self._lock:
                self._running[task_id] = threading.get_ident()
            try:
                run_task(agent.plugins, task_id, name, parts, agent.send, agent.send_output)
            finally:
                with self._lock:
                    self._running.pop(task_id, None)
        except TaskCancelled:
            pass  # arrived just after the task ended; nothing to report

    def cancel(self, task_id: int) -> None:
        with self._lock:
            if task_id not in self._running:
                if any(t[0] == task_id for t in list(self._queue)):
                    self._cancelled.add(task_id)  # still queued: skip it when its turn comes
                return
        self._interrupt(task_id)

    def _interrupt(self, task_id: int) -> None:
        with self._lock:
            ident = self._running.get(task_id)
            if ident is None:
                return  # finished meanwhile
            if not _importing(ident):
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(TaskCancelled))
                return
        # An exception landing inside an import can leave a half-initialised module behind for
        # every later task of this worker: wait until the import is over.
        retry = threading.Timer(0.05, self._interrupt, args=(task_id,))
        retry.daemon = True
        retry.start()

    def shutdown(self, grace: float) -> None:
        self._stopping = True
        self._queue.clear()  # queued tasks never start once the worker is stopping
        with self._lock:
            running = list(self._running)
        for task_id in running:
            self.cancel(task_id)
        deadline = time.monotonic() + grace
        while self._running and time.monotonic() < deadline:
            time.sleep(0.02)


# -- process slots -------------------------------------------------------------------------


def _child_main(conn: Any, plugins_blob: bytes, env: dict[str, str]) -> None:
    os.environ.update(env)
    plugins = cloudpickle.loads(plugins_blob)

    def send(control: tuple, payload: Payload | None) -> None:
        parts = [] if payload is None else [bytes(p) for p in payload.parts]
        conn.send((control, parts))

    def send_output(task_id: int | None, stream: str, line: str) -> None:
        conn.send(((Kind.OUTPUT, task_id, stream, line), []))

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


class _Child:
    def __init__(self, ctx: Any, plugins_blob: bytes):
        self.conn, child_conn = ctx.Pipe()
        env = {runtime.ENV_VAR: os.environ.get(runtime.ENV_VAR, "")}
        self.process = ctx.Process(target=_child_main, args=(child_conn, plugins_blob, env), daemon=True)
        self.process.start()
        child_conn.close()
        self.task_id: int | None = None

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)


class ProcessSlots:
    """Each slot is a child process; one reader thread queues tasks for the slots' threads."""

    readers = 1
    handoff_after = 0.0  # the one reader never runs a task

    def __init__(self, concurrency: int, agent: Agent):
        self._agent = agent
        self._ctx = multiprocessing.get_context("spawn")
        self._blob = cloudpickle.dumps(agent.plugins)
        self._children = [_Child(self._ctx, self._blob) for _ in range(concurrency)]
        self._queue: queue.SimpleQueue[tuple[int, str, list[Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._cancelled: set[int] = set()  # cancelled while still queued
        self._threads = [
            threading.Thread(target=self._loop, args=(i,), name=f"skyward-slot-{i}", daemon=True)
            for i in range(concurrency)
        ]
        for t in self._threads:
            t.start()

    def accept(self, task: Task) -> None:
        self._queue.put(task)

    def run(self, task: Task) -> None:
        raise AssertionError("queued slots never hand a task back to the reader")

    def idle(self) -> bool:
        return self._queue.empty() and all(c.task_id is None for c in self._children)

    def _stop_threads(self) -> None:
        """Drop queued tasks (they never start once stopping) and tell each thread to end."""
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            self._queue.put(None)

    def cancel(self, task_id: int) -> None:
        with self._lock:
            for child in self._children:
                if child.task_id == task_id:
                    child.task_id = None
                    child.kill()  # the slot's loop sees EOF and replaces the child
                    return
            self._cancelled.add(task_id)

    def _loop(self, index: int) -> None:
        agent = self._agent
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
                    agent.send(control, Payload(out_parts[0], out_parts[1:]) if out_parts else None)
                    if control[0] in (Kind.RESULT, Kind.ERROR):
                        break
            except (EOFError, OSError):
                with self._lock:
                    cancelled = child.task_id is None
                    child.task_id = None
                    if not self._agent.stopping.is_set():
                        self._children[index] = _Child(self._ctx, self._blob)
                if not cancelled:
                    err = RuntimeError(f"task process exited with code {child.process.exitcode}")
                    agent.send((Kind.ERROR, task_id, encode_exception(err)))
            else:
                with self._lock:
                    child.task_id = None

    def shutdown(self, grace: float) -> None:
        self._stop_threads()
        for child in self._children:
            try:
                child.conn.send(None)
            except OSError:
                pass
        for child in self._children:
            child.process.join(grace / max(1, len(self._children)))
            if child.process.is_alive():
                child.kill()


def make_slots(executor: str, concurrency: int, agent: Agent) -> Slots:
    if executor == "process":
        return ProcessSlots(concurrency, agent)
    return ThreadSlots(concurrency, agent)
