"""The client's end of one worker: its channel, its in-flight tasks, and who reads its stream.

Frames from the worker are handled in one place (:meth:`NodeConnection._handle`): RESULT/ERROR
(and REPLIES, many of them: :mod:`skyward.pool.batch`) resolve the task's
:class:`~concurrent.futures.Future`, OUTPUT becomes events, and when the
stream ends unexpectedly every in-flight task fails with :class:`~skyward.errors.WorkerLost`
carrying the exit code and the last lines of output.

Replies reach callers the same way for every transport: one thread at a time reads the
stream, the process's I/O loop (:mod:`skyward.pool.ioloop`, one thread serving every worker)
or a caller waiting in ``>>`` for its own reply (:mod:`skyward.pool.turns`). Pings and
silence are :mod:`skyward.pool.liveness`'s; the worker's own stderr is read by
:mod:`skyward.pool.worker_log` (on the loop where the channel gives its descriptor, on a thread
of the connection's own elsewhere: SSH). A connection adds no thread of its own on Local;
a loss is settled (exit code, kill) on a short-lived thread, and so is a task's timeout.
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
from skyward.errors import ConnectionLost, SkywardError, WorkerLost
from skyward.messages import Fatal
from skyward.pool import batch, ioloop, worker_log
from skyward.pool.batch import TaskFuture, fail
from skyward.pool.liveness import Liveness, confirm_gone, exit_status, explained
from skyward.pool.turns import Reply, Turns
from skyward.protocol import FrameReader, FrameWriter, Kind, Payload
from skyward.transport.base import Channel

_task_ids = itertools.count(1)
LOG_TAIL = 30
#: Seconds a caller that finds the worker gone waits for the loss to be settled (its exit code
#: read, the worker killed if it would not exit): at most about what :meth:`_lose` takes.
LOSS_SETTLES_WITHIN = 15.0


@dataclass(eq=False)
class _Task:
    future: Future[Any]
    name: str
    started: float
    timer: ioloop.Timer | None = None


@dataclass(eq=False)
class NodeConnection:
    node: int
    host: str
    channel: Channel
    emit: Callable[[ev.Event], None]
    #: The pool's subscribers: events are only built when someone listens (hot path).
    listening: list[Any]
    #: Seconds a caller reading its own reply polls before it blocks (protocol.spinner).
    spin: float = 0.0
    #: This worker's number among the ``processes`` worker processes of its node.
    local_rank: int = 0
    processes: int = 1
    _tasks: dict[int, _Task] = field(default_factory=dict)
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_TAIL))
    #: Resolved by READY (the worker's pid), or failed by FATAL (PluginError) or a loss.
    ready: Future[int] = field(default_factory=Future)
    alive: bool = True
    closing: bool = False
    said_bye: bool = False
    #: Why the worker is gone, once settled (:meth:`loss`): a WorkerLost, or what ``explain`` says.
    lost: SkywardError | None = None
    lost_serving: bool = False  # it was lost while serving, not ended by the pool's stop
    explain: Callable[[WorkerLost], SkywardError | None] | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._writer = FrameWriter(self.channel.stdin)
        self._reader = FrameReader(self.channel.stdout)
        # Set once ``alive`` is False *and* ``lost`` says why (or the end was expected): a loss
        # is noticed by one thread and seen by others before its exit code is read.
        self._settled = threading.Event()
        self._ended = threading.Event()  # the stream is over and what that means is handled
        self._stderr_done = threading.Event()  # the worker's stderr is read to its end
        self._liveness = Liveness(self.node, self._writer, self.channel, lambda: self.alive and not self.closing,
                                  lambda reason: self._lose(reason, wait_exit=False))
        fd = self.channel.stderr_fd()
        if fd is not None:
            worker_log.watch(fd, self._log_line, self._stderr_done)
        else:  # (SSH: paramiko's stderr has no descriptor of its own)
            threading.Thread(target=self._read_stderr, name=f"skyward-node{self.node}-stderr", daemon=True).start()
        self._turns = Turns(self.channel.poll_fd(), self._reader, self._lock, self._pump, self.spin,
                            lambda: bool(self._tasks), self._stream_ended)

    # -- sending ---------------------------------------------------------------------------
    @property
    def inflight(self) -> int:
        return len(self._tasks)

    def send(self, control: tuple, payload: Payload | None = None) -> None:
        try:
            self._writer.send(control, payload)
        except (OSError, ValueError) as exc:
            self._lose(f"could not write to the worker: {exc}")
            raise self.loss() from exc

    def submit(self, payload: Payload, name: str, timeout: float | None, reply: Reply | None = None) -> Future[Any]:
        """Send a task; its result resolves the returned Future (or ``reply``, for :meth:`call`)."""
        task_id, future = self.register(name, timeout, reply)
        if task_id is not None:
            try:
                self.send((Kind.TASK, task_id, name), payload)
            except WorkerLost:  # (_lose() already failed the future)
                pass
        return future

    def register(self, name: str, timeout: float | None, reply: Reply | None = None) -> tuple[int | None, Any]:
        """A new task's id and future, before it is sent (id None: the worker is gone, the
        future failed). The future is left PENDING, so that ``future.cancel()`` works: it stops
        the task on the worker."""
        future: Any = reply
        if future is None:
            future = TaskFuture(self)
        task_id = next(_task_ids)
        task = _Task(future, name, time.monotonic())
        with self._lock:  # (checked under the lock: _lose() takes the in-flight tasks under it)
            alive = self.alive
            if alive:
                self._tasks[task_id] = task
                self._turns.need_thread()  # (a reply a caller waits for is read by that caller)
        if not alive:
            fail(future, self.loss())
            return None, future
        if timeout is not None:
            task.timer = ioloop.get().call_later(timeout, lambda: self._expire(task_id, timeout))
        if self.listening:
            self.emit(ev.TaskStarted(task_id, self.node, name))
        return task_id, future

    def call(self, payload: Payload, name: str, timeout: float | None) -> Any:
        """Run a task and return its result, reading the reply on this thread when possible."""
        main = threading.current_thread() is threading.main_thread()
        try:
            fd = self._turns.claim(main)
            if fd is None:
                return self.submit(payload, name, timeout).result()
            reply = Reply()
            self.submit(payload, name, timeout, reply)
            self._turns.read_until(reply, fd, main, self._lose)
        finally:  # (whatever interrupted us, and wherever: a stream this thread holds is given back)
            self._turns.release()
        while not reply.done():  # the stream ended: the loop is failing the task
            if self._ended.is_set() and not reply.done():
                reply.set_exception(self.loss())
                break
            time.sleep(0.01)
        return reply.result()

    def listen(self) -> None:
        """Have the loop read now if nobody does (the pool is closing: BYE is coming)."""
        with self._lock:
            self._turns.need_thread()

    def interrupt(self, future: Future[Any]) -> None:
        """Ask the worker to stop the task behind ``future``; its future resolves when it does."""
        with self._lock:
            ids = [tid for tid, t in self._tasks.items() if t.future is future]
        for tid in ids:
            with contextlib.suppress(OSError, ValueError):
                self._writer.send((Kind.CANCEL, tid))

    def cancel(self, future: Future[Any]) -> None:
        """Stop the task behind ``future`` on the worker (best effort) and forget it."""
        with self._lock:
            found = [(tid, t) for tid, t in self._tasks.items() if t.future is future]
            for tid, _ in found:
                del self._tasks[tid]
        for tid, t in found:
            if t.timer:
                t.timer.cancel()
            if self.listening:
                self.emit(ev.TaskFinished(tid, self.node, t.name, False, time.monotonic() - t.started, cancelled=True))
            if self.alive:
                try:
                    self._writer.send((Kind.CANCEL, tid))
                except (OSError, ValueError):
                    pass

    def _expire(self, task_id: int, timeout: float) -> None:
        from skyward.errors import TaskTimeout

        with self._lock:
            task = self._tasks.pop(task_id, None)
        if task is None:
            return
        if self.alive:
            try:
                self._writer.send((Kind.CANCEL, task_id))
            except (OSError, ValueError):
                pass
        self.emit(ev.TaskFinished(task_id, self.node, task.name, False, time.monotonic() - task.started))
        if not task.future.done():
            fail(task.future, TaskTimeout(task.name, timeout, node=self.node))

    # -- receiving ---------------------------------------------------------------------------
    def _stream_ended(self, why: str | None) -> None:
        """(On the loop.) The stream ended (``why`` None) or broke: an expected end is settled
        here; a loss, which waits for the exit code, on a thread of its own."""
        if self.said_bye:
            self.alive = False
            self._settled.set()
            self._ended.set()
            return

        def lose() -> None:
            try:
                self._lose(why or "worker exited")
            finally:
                self._ended.set()

        threading.Thread(target=lose, name=f"skyward-node{self.node}-end", daemon=True).start()

    def _read_stderr(self) -> None:
        try:
            worker_log.read_lines(self.channel.stderr, self._log_line)
        finally:
            self._stderr_done.set()

    def _pump(self) -> bool:
        """Read one frame and handle it; False at the end of the stream. (The frame dies with
        this call: no reader keeps the last payload alive while it waits for the next.)"""
        frame = self._reader.recv()
        if frame is None:
            return False
        self._liveness.heard_now()
        self._handle(*frame)
        return True

    def _handle(self, control: tuple, parts: list[Any]) -> None:
        kind = control[0]
        if kind == Kind.RESULT:
            batch.result(self, control[1], parts)
        elif kind in (Kind.ERROR, Kind.REPLIES):
            batch.resolve(self, (control,) if kind == Kind.ERROR else control[1], parts)
        elif kind == Kind.OUTPUT:
            _, task_id, stream, text, more = control
            self.tail.append(text)
            if self.listening:
                self.emit(ev.TaskOutput(self.node, task_id, stream, text, more))
        elif kind == Kind.HEARTBEAT:
            pass
        elif kind == Kind.READY:
            if not self.ready.done():
                self.ready.set_result(control[1])
        elif kind == Kind.FATAL:
            fatal: Fatal = control[1]
            if not self.ready.done():
                self.ready.set_exception(fatal.error())
        elif kind == Kind.BYE:
            self.said_bye = True
        elif kind == Kind.PREEMPT:
            n = control[1]  # (a worker of an older skyward sends no `heard`)
            if self.local_rank == 0:  # (every worker process of the node heard it: one event)
                self.emit(ev.NodePreempting(self.node, n.action, n.at, n.kind, getattr(n, "heard", None)))

    def finish(self, task_id: int, ok: bool) -> _Task | None:
        with self._lock:
            task = self._tasks.pop(task_id, None)
        if task is None:
            return None  # timed out or cancelled already
        if task.timer:
            task.timer.cancel()
        if self.listening:
            self.emit(ev.TaskFinished(task_id, self.node, task.name, ok, time.monotonic() - task.started))
        return task

    def _log_line(self, line: str) -> None:
        self.tail.append(line)
        self.emit(ev.NodeLog(self.node, line))

    # -- loss ----------------------------------------------------------------------------------
    def loss(self) -> SkywardError:
        """Why the worker is not running. Called once ``alive`` is False: the loss may have just
        been noticed by another thread, which is still reading the exit code, so this waits
        (seconds at most) until it is settled; every caller gets the same error, exit code
        and last output included."""
        self._settled.wait(LOSS_SETTLES_WITHIN)
        return self.lost or WorkerLost(self.node, "worker is not running")

    def _lose(self, reason: str, *, wait_exit: bool = True) -> None:
        """Fail every in-flight task with WorkerLost; ``wait_exit``: wait briefly for the exit
        code (and kill a worker that does not exit) first, to put it in the error."""
        with self._lock:
            if not self.alive:
                return
            self.alive, self.lost_serving = False, not self.closing
            tasks, self._tasks = self._tasks, {}
        self._liveness.end()
        exit_code = exit_status(self.channel, closing=self.closing) if wait_exit else None
        # Let the stderr reader drain what the dying process wrote, for the error message.
        self._stderr_done.wait(0.5)
        what = f"{reason} while running {len(tasks)} task(s)" if tasks else reason
        lost: SkywardError = WorkerLost(self.node, what, exit_code=exit_code, log_tail=list(self.tail),
                                        local_rank=self.local_rank if self.processes > 1 else None)
        if self.explain is not None and not self.closing:  # (a batch scheduler may know why)
            lost, what = explained(lost, self.explain, what)
        self.lost = lost
        self._settled.set()
        if not self.ready.done():
            self.ready.set_exception(self.lost)
        for task in tasks.values():
            if task.timer:
                task.timer.cancel()
            fail(task.future, self.lost)
        if not self.closing:
            self.emit(ev.NodeStage(self.node, "lost", what))

    # -- the pool's side of the lifecycle -------------------------------------------------------
    def setup(self, settings: Any, plugins: Payload) -> None:
        """Send the worker its identity, settings and plugins (the first message it reads)."""
        self.send((Kind.SETUP, settings), plugins)
        self._liveness.arm()

    def keepalive(self, lost_after: float) -> None:
        """Have the worker pinged (its dead man's switch) and declare it lost after
        ``lost_after`` seconds without a frame from it (:mod:`skyward.pool.liveness`). Never
        blocks, so a dead or slow link delays nothing of the other connections."""
        self._liveness.check(lost_after)

    @property
    def went_silent(self) -> bool:
        """The worker was declared lost for silence (its host may be unreachable)."""
        return self._liveness.went_silent

    def begin_stop(self, *, graceful: bool) -> None:
        """Stop serving: from now on the end of the stream is expected (not a loss); a graceful
        stop asks the worker to finish (SHUTDOWN: plugins' exits run, BYE comes back)."""
        self.closing = True
        self._liveness.end()
        self.listen()
        if self.alive and graceful:
            with contextlib.suppress(OSError, ValueError):
                self._writer.send((Kind.SHUTDOWN,))

    def finish_stop(self, grace_end: float) -> str | None:
        """Make sure the worker is gone (killing it after ``grace_end``, a monotonic time) and
        fail whatever it still had; returns what could not be confirmed, or None."""
        if self._liveness.went_silent:  # it was stopped (or tried) when that was noticed
            problem = self._liveness.stopped_silent()
        else:
            if self.channel.wait(max(0.0, grace_end - time.monotonic())) is None:
                self.channel.kill()
            problem = confirm_gone(self.channel)
        self._ended.wait(2.0)
        with self._lock:
            leftovers, self._tasks = self._tasks, {}
            self.alive = False
        self._settled.set()
        for task in leftovers.values():
            if task.timer:
                task.timer.cancel()
            fail(task.future, ConnectionLost(self.node, "the worker was stopped before the task finished"))
        # The pipes are closed here, not by the garbage collector (one unclosed file warning
        # each, in whatever code runs then), once nobody uses them: a descriptor closed under
        # its reader could be read again when its number is reused (so stderr only once read).
        if problem is None and self._ended.is_set():
            self.channel.close(stderr=self._stderr_done.wait(1.0))
        return problem

    @property
    def received_bytes(self) -> int:
        """Bytes read from this worker's stream so far (frames, headers included)."""
        return self._reader.received

    @property
    def where(self) -> str:
        """How messages name this worker: "node 1", or "node 1, local rank 0" with several."""
        return f"node {self.node}" + (f", local rank {self.local_rank}" if self.processes > 1 else "")

    @property
    def pid(self) -> int | None:
        """The worker's process id on its machine (the one that runs the tasks, as its READY
        said; before that, the process the transport started), when known."""
        ready = self.ready
        if ready.done() and not ready.cancelled() and ready.exception() is None:
            return ready.result()
        return getattr(self.channel, "pgid", None)

