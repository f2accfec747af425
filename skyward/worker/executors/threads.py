"""The thread executor: tasks run in the worker process, on the thread that read them.

Tasks share the worker process (and what ``around_app`` set up, such as a torch process
group). A cancelled task is interrupted with an asynchronous exception (:class:`StopTask`),
which Python delivers the next time that thread runs Python code.

Leader/followers: ``concurrency + 1`` threads take turns reading frames (:class:`_ReadRole`);
the thread that reads a TASK runs it itself, so no thread hand-off lies between a task
arriving and it starting, nor between its result and reading the next task. At most
``concurrency`` of them run a task at a time, so one is always free to read CANCEL, PING and
SHUTDOWN. Tasks that arrive while every slot is busy wait in a queue for the next free slot.
"""

from __future__ import annotations

import collections
import ctypes
import sys
import threading
import time
from typing import Any

from skyward.plugins._base import Plugin
from skyward.worker.executors.base import (
    Send,
    SendOutput,
    StopTask,
    Task,
    TaskSource,
    run_task,
)

#: With one slot, a task shorter than this runs without another thread waking to read behind
#: it; a longer one has CANCEL/PING read within about twice this.
HANDOFF_AFTER = 0.02


class ThreadExecutor:
    def __init__(self, concurrency: int, plugins: tuple[Plugin, ...], send: Send, send_output: SendOutput):
        self._plugins = plugins
        self._send = send
        self._send_output = send_output
        self._readers = concurrency + 1
        # One slot: nothing else can start while the task runs, so the thread behind it can
        # wait a little before reading; several: other tasks must start at once.
        self._role = _ReadRole(HANDOFF_AFTER if concurrency == 1 else 0.0)
        self._free = concurrency  # slots not running a task (guarded by _lock)
        self._queue: collections.deque[Task] = collections.deque()
        self._lock = threading.Lock()
        self._running: dict[int, int] = {}  # task id -> thread ident
        self._cancelled: set[int] = set()  # cancelled while still queued
        self._stopping = False

    def start(self, source: TaskSource) -> None:
        for i in range(self._readers):
            threading.Thread(target=self._read_loop, args=(source,), name=f"skyward-reader-{i}", daemon=True).start()

    def _read_loop(self, source: TaskSource) -> None:
        role = self._role
        next_task = source.next_task
        while role.take():
            task = None
            while task is None:
                read = next_task()
                if read is None:  # serving is over: every reader ends
                    role.close()
                    return
                task = self._accept(read)
            role.running()
            self._run(task)
            role.finished()

    def idle(self) -> bool:
        return not self._running

    # -- slots -----------------------------------------------------------------------------
    def _claim(self) -> bool:
        with self._lock:
            if self._stopping or not self._free:
                return False
            self._free -= 1
            return True

    def _release(self) -> None:
        with self._lock:
            self._free += 1

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

    def _accept(self, task: Task) -> Task | None:
        """The task the reader should run now (a slot is claimed for it), or None when every
        slot is busy and ``task`` was queued."""
        if self._claim():
            return task
        self._queue.append(task)
        if self._claim():  # a slot freed up between the two looks
            queued = self._pop()
            if queued is not None:
                return queued
            self._release()
        return None

    def _run(self, task: Task) -> None:
        """Run ``task`` (its slot claimed by :meth:`_accept`), then queued tasks; free the slot."""
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
        try:
            with self._lock:
                self._running[task_id] = threading.get_ident()
            try:
                run_task(self._plugins, task_id, name, parts, self._send, self._send_output)
            finally:
                with self._lock:
                    self._running.pop(task_id, None)
        except StopTask:
            pass  # arrived just after the task ended; nothing to report

    def preempting(self, notice: Any) -> None:
        pass  # the tasks run in the worker's own process, which has taken the notice

    # -- stopping --------------------------------------------------------------------------
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
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(StopTask))
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


def _importing(ident: int) -> bool:
    """True if the thread ``ident`` is executing an import right now."""
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


class _ReadRole:
    """Which of the reader threads reads the stream now (the others wait their turn).

    The thread that reads a TASK runs it. Someone must go on reading behind it (CANCEL, PING,
    SHUTDOWN, more tasks), but waking another thread for that costs more than a short task
    (a wake-up across CPUs, and the GIL between them). So the hand-off waits: a waiting thread
    takes the reading over only once the task has run for ``handoff_after`` seconds (it looks
    that often); a short task is over before anyone wakes. With ``handoff_after=0`` the role
    is handed on the moment a task starts (more than one slot: other tasks must start at once).
    """

    def __init__(self, handoff_after: float):
        self._lock = threading.Lock()  # taken directly (cheaper than the Condition's wrapper)
        self._cv = threading.Condition(self._lock)
        self._holder: int | None = None
        self._busy_since: float | None = None  # the holder is running a task since then
        self._after = handoff_after
        self._closed = False

    def take(self) -> bool:
        """Become the reader (at once if this thread still is); False once reading is over."""
        me = threading.get_ident()
        with self._lock:
            while not self._closed:
                if self._holder is None or self._holder == me:
                    self._holder, self._busy_since = me, None
                    return True
                since = self._busy_since
                if since is not None and self._after and time.monotonic() - since >= self._after:
                    self._holder, self._busy_since = me, None  # take over from a long task
                    return True
                self._cv.wait(self._after or None)
            return False

    def running(self) -> None:
        """The reader starts running the task it read."""
        with self._lock:
            if self._after:
                self._busy_since = time.monotonic()
            else:
                self._holder = None
                self._cv.notify()

    def finished(self) -> None:
        """The task is over; the thread keeps reading unless someone took over meanwhile."""
        with self._lock:
            if self._holder == threading.get_ident():
                self._busy_since = None

    def close(self) -> None:
        """Reading is over: every thread waiting for the role (and every later ``take``) ends."""
        with self._lock:
            self._closed = True
            self._holder = None
            self._cv.notify_all()
