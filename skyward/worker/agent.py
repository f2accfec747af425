"""The worker agent: protocol, handshake, plugins' ``around_app``, heartbeats, control, exit.

What runs the tasks is an executor (:mod:`skyward.worker.executors`); the agent reads the
stream for it and handles everything else. Lifecycle:

1. Take the protocol streams off fds 0/1 and point fd 1 at stderr, so stray writes from C
   code (or a subprocess) can never corrupt a frame. On Linux the worker runs under its
   keepers (:mod:`skyward.worker.keeper`), which end every process the tasks started,
   however detached, once the worker is gone; elsewhere it leads its own process group, so
   that everything the tasks start (in that group) can be stopped together.
2. Wait for SETUP (a :class:`~skyward.messages.Setup`, the plugins as payload); export
   ``COMPUTE_POOL``; enter every plugin's ``around_app`` in order; answer READY (or FATAL,
   a :class:`~skyward.messages.Fatal` naming the plugin).
3. Start the executor; its threads ask :meth:`Agent.next_task` for tasks, which handles
   PING, CANCEL and SHUTDOWN on the way. Heartbeats go out every ``heartbeat_interval``. On a
   spot machine (``Setup.watch_preemption``) a thread watches for preemption notices
   (:mod:`skyward.worker.preemption`): each goes to the tasks and to the client (PREEMPT).
4. Stop on SHUTDOWN (clean: hooks exited, BYE sent), on end of input or when the client has
   been silent for ``idle_timeout`` seconds (dead man's switch): then everything the tasks
   started is killed (by the keeper, or with the process group), so nothing outlives the
   worker. A named cluster's worker (:mod:`skyward.worker.resident`) ends only on SHUTDOWN
   or its autostop: the end of a client's stream, its silence or DETACH end that client's
   session (its tasks are cancelled) and the worker waits for the next client.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import select
import signal
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

from skyward.runtime import instance as runtime_instance, preemption as _preempt
from skyward.messages import Fatal, Setup
from skyward.plugins._base import Plugin
from skyward.protocol import FrameReader, FrameWriter, Kind, loads_payload, spinner
from skyward.runtime.cluster import AUTOSTOPPED
from skyward.worker import keeper
from skyward.worker.keeper import group_has_others, kill_group_and_exit
from skyward.worker.executors import Executor, Task, make_executor
from skyward.worker.log import log
from skyward.worker.output import route_output
from skyward.worker.replies import Replies

if TYPE_CHECKING:  # (a named cluster's worker imports it, in main; a pool's needs none of it: 8 ms less at start)
    from skyward.worker.resident import Link, Resident

SETUP_TIMEOUT = 60.0


class Agent:
    """One worker's end of the protocol: the handshake, the control messages, heartbeats, and
    the :class:`~skyward.worker.executors.TaskSource` its executor reads tasks from."""

    def __init__(self, reader: FrameReader, writer: FrameWriter, in_fd: int | None = None,
                 resident: Resident | None = None):
        self.reader = reader
        self.in_fd = in_fd
        self.writer = writer
        self.resident = resident
        self.session = resident.link.session if resident is not None and resident.link else 0
        self._live: set[int] = set()  # (resident) the current session's tasks, by inner id
        self.last_heard = time.monotonic()
        self.stopping = threading.Event()
        self.executor: Executor | None = None
        self._done = threading.Event()  # serving is over (SHUTDOWN, or the stream ended)
        self._clean = False  # ... by SHUTDOWN
        self.autostopped = False  # (resident) ... by the cluster's autostop
        self._spin: Any = None
        self._batch: collections.deque[Task] = collections.deque()  # a TASKS frame's tasks not yet taken
        self._replies = Replies(self.write)

    # -- sending ---------------------------------------------------------------------------
    def send(self, control: tuple, payload: Any = None) -> None:
        session = self.session
        if self.resident is not None and len(control) > 1 and control[0] in _TASK_REPLIES and control[1] is not None:
            session, task_id = self.resident.outer(control[1])
            if control[0] != Kind.OUTPUT:
                self._live.discard(control[1])
            if session != self.session:
                return  # a task of a client that has left: its result goes nowhere
            control = (control[0], task_id, *control[2:])
        elif control[0] in _ANSWERS and self._replies.hold(control, payload):
            return  # (a batched task's answer: it goes with its batch's)
        self.write(control, payload)

    def write(self, control: tuple, payload: Any = None) -> None:
        """Write a frame; a client that is gone ends the session (or the worker)."""
        session = self.session
        try:
            self.writer.send(control, payload)
        except (OSError, ValueError):
            if self.resident is not None:  # that client is gone: end its session, wait for the next
                self.resident.cut(session)
                return
            kill_group_and_exit(0 if self.stopping.is_set() else 2)  # the client is gone: nothing to report to

    def send_output(self, task_id: int | None, stream: str, text: str, more: bool = False) -> None:
        self.send((Kind.OUTPUT, task_id, stream, text, more))

    # -- start -----------------------------------------------------------------------------
    def handshake(self) -> tuple[Setup, tuple[Plugin, ...]]:
        timer = threading.Timer(SETUP_TIMEOUT, lambda: (log("no SETUP from the client"), kill_group_and_exit(3)))
        timer.daemon = True
        timer.start()
        try:
            frame = self.reader.recv()
            while frame is not None and frame[0][0] == Kind.PING:  # the client's heartbeat may come first
                frame = self.reader.recv()
        finally:
            timer.cancel()
        if frame is None:
            kill_group_and_exit(0)
        control, parts = frame
        if control[0] != Kind.SETUP or not isinstance(control[1], Setup):
            log(f"expected SETUP, got {control[0]!r}")
            kill_group_and_exit(3)
        plugins = tuple(loads_payload(parts)) if parts else ()
        return control[1], plugins

    def heartbeat_loop(self, interval: float) -> None:
        while not self.stopping.wait(interval):
            self.send((Kind.HEARTBEAT,))

    def watch_client(self, interval: float, idle_timeout: float) -> None:
        """The dead man's switch, on a thread that never writes: a write blocked on a dead link
        (output filling the pipe to a cut-off client) must not keep the worker alive."""
        while not self._done.wait(interval):
            silent_for = time.monotonic() - self.last_heard
            if silent_for > idle_timeout and self.resident is not None:
                if self.resident.link is not None:
                    log(f"no word from the client for {silent_for:.0f}s; ending its session")
                    self.resident.cut(self.session)
                self.last_heard = time.monotonic()
            elif silent_for > idle_timeout:
                log(f"no word from the client for {silent_for:.0f}s (idle_timeout={idle_timeout:g}s); exiting")
                kill_group_and_exit(4)

    def run(self) -> int:
        setup, plugins = self.handshake()
        self.last_heard = time.monotonic()
        if self.resident is not None:
            self.resident.autostop = setup.autostop
        info = setup.info
        os.environ[runtime_instance.ENV_VAR] = info.to_json()
        os.environ.update(setup.env)

        threading.Thread(target=self.heartbeat_loop, args=(setup.heartbeat_interval,),
                         name="skyward-heartbeat", daemon=True).start()
        threading.Thread(target=self.watch_client, args=(min(setup.heartbeat_interval, 1.0), setup.idle_timeout),
                         name="skyward-watchdog", daemon=True).start()
        if setup.watch_preemption:  # a spot machine: the cloud may take it back at short notice
            from skyward.worker import preemption

            preemption.watch(self._preempted, self.stopping)

        with contextlib.ExitStack() as app:
            with self._listening():  # the client's pings count while the hooks run
                for plugin in plugins:
                    if plugin.around_app is None:
                        continue
                    try:
                        app.enter_context(plugin.around_app(info))
                    except BaseException as exc:  # report which plugin failed, then stop
                        message = f"{type(exc).__name__}: {exc}"
                        self.send((Kind.FATAL, Fatal(plugin.name, "around_app", info.node, message,
                                                     traceback.format_exc())))
                        self.stopping.set()
                        app.close()
                        return 5
            self.executor = make_executor(setup.executor, setup.concurrency, plugins, self.send, self.send_output)
            for notice in _preempt.notices():  # (one that came while the executor was being made)
                self.executor.preempting(notice)
            self.send((Kind.READY, os.getpid()))
            clean = self.serve(setup.spin)
            self.stopping.set()
            self.executor.shutdown(grace=setup.shutdown_grace)
            if not clean:
                kill_group_and_exit(AUTOSTOPPED if self.autostopped else 0)
            # Leaving the ExitStack runs the plugins' exits (e.g. destroy_process_group);
            # a watchdog makes sure a hook that hangs cannot keep the worker alive.
            watchdog = threading.Timer(15.0, lambda: (log("plugin shutdown hung"), kill_group_and_exit(6)))
            watchdog.daemon = True
            watchdog.start()
            with self._listening():  # a client that vanishes meanwhile ends the worker at once
                app.close()
        self._replies.flush()
        self.send((Kind.BYE,))
        return 0

    @contextlib.contextmanager
    def _listening(self) -> Any:
        """Read the stream on a thread of its own while the block runs (the plugins' start-up
        hooks, which may take minutes): pings keep the dead man's switch from firing, and a
        client that is gone (end of input, SHUTDOWN) stops the worker at once. Nothing else
        comes before READY. The thread reads only whole frames that have begun to arrive and
        is done before the block's exit returns, so the executor reads alone afterwards."""
        if self.in_fd is None:
            yield
            return
        wake_r, wake_w = os.pipe()
        poller = select.poll()
        poller.register(self.in_fd, select.POLLIN)
        poller.register(wake_r, select.POLLIN)

        def listen() -> None:
            while True:
                if not self.reader.buffered():
                    ready = [fd for fd, _ in poller.poll()]
                    if wake_r in ready:
                        return
                try:
                    frame = self.reader.recv()
                except (EOFError, OSError):
                    frame = None
                if frame is None or frame[0][0] == Kind.SHUTDOWN:
                    log("the client went away while the worker was starting")
                    kill_group_and_exit(0)
                self.last_heard = time.monotonic()

        thread = threading.Thread(target=listen, name="skyward-start-listener", daemon=True)
        thread.start()
        try:
            yield
        finally:
            os.write(wake_w, b"!")
            thread.join()
            os.close(wake_r)
            os.close(wake_w)

    def _preempted(self, notice: _preempt.Preemption) -> None:
        """A preemption notice: to this process's tasks, the executor's processes, the client."""
        if _preempt.deliver(notice):
            if self.executor is not None:
                self.executor.preempting(notice)
            self.send((Kind.PREEMPT, notice))

    # -- serving ---------------------------------------------------------------------------
    def serve(self, spin_seconds: float) -> bool:
        """Let the executor read and run tasks until SHUTDOWN (True) or end of input (False)."""
        assert self.executor is not None
        self._spin_seconds = spin_seconds
        self._spin = spinner(self.in_fd, spin_seconds) if self.in_fd is not None else None
        self.executor.start(self)
        self._done.wait()
        return self._clean

    def _finish(self, clean: bool) -> None:
        self._clean = clean
        self._done.set()

    def next_task(self) -> Task | None:
        """Handle frames until one brings a task (returned) or serving is over (None).

        Called by the executor's reader threads, one at a time (the executor sees to that).
        """
        executor = self.executor
        assert executor is not None
        while not self._done.is_set():
            if self._batch:
                return self._batch.popleft()
            if self._spin is not None and not self.reader.buffered() and executor.idle():
                self._spin()  # the next task may be on its way: don't fall asleep just yet
            try:
                frame = self.reader.recv()
            except (EOFError, OSError) as exc:
                log(f"client stream broke: {exc}")
                frame = None
            if frame is None:
                if self.resident is not None and self._next_session():
                    continue
                self._finish(False)
                return None
            self.last_heard = time.monotonic()
            control, parts = frame
            kind = control[0]
            if kind == Kind.TASK:
                if self.resident is None:
                    return (control[1], control[2], parts)
                inner = self.resident.inner(self.session, control[1])
                self._live.add(inner)
                return (inner, control[2], parts)
            elif kind == Kind.TASKS:
                self._take(control[1], parts)
            elif kind == Kind.PING:
                pass
            elif kind == Kind.CANCEL:
                self._replies.forget(control[1])  # (a resident worker's are never held)
                executor.cancel(control[1] if self.resident is None else self.resident.inner(self.session, control[1]))
            elif kind == Kind.SHUTDOWN:
                self._finish(True)
                return None
            elif kind == Kind.DETACH and self.resident is not None:
                self.send((Kind.BYE,))
                with contextlib.suppress(OSError, ValueError):
                    self.writer.close()
                if not self._next_session():
                    self._finish(False)
                    return None
            elif kind == Kind.SETUP and self.resident is not None:
                self.resident.autostop = control[1].autostop  # (the cluster's policy may have changed)
                self.send((Kind.READY, os.getpid()))  # a client attaching: this worker is set up
                for notice in _preempt.notices():  # ... on a machine that may be about to go
                    self.send((Kind.PREEMPT, notice))
            else:
                log(f"unknown message {kind!r}")
        return None

    def _take(self, entries: tuple[tuple[int, str, int], ...], parts: list[Any]) -> None:
        """A batch of tasks: queued for :meth:`next_task`; answers go back in batches (a resident's one at a time)."""
        at = 0
        for task_id, name, count in entries:
            inner = task_id if self.resident is None else self.resident.inner(self.session, task_id)
            self._batch.append((inner, name, parts[at:at + count]))
            at += count
            if self.resident is not None:
                self._live.add(inner)
        if self.resident is None:
            self._replies.expect(task_id for task_id, _, _ in entries)

    def _next_session(self) -> bool:
        """(Resident) The session is over: cancel its tasks, wait for the next client (False: autostop)."""
        assert self.resident is not None and self.executor is not None
        for task in list(self._live):
            self.executor.cancel(task)
        self._live.clear()
        link = self.resident.next_link()
        if link is None:
            log(f"no client for {self.resident.autostop or 0:g}s: autostop")
            self.resident.close()
            self.autostopped = True
            return False
        self._use(link)
        return True

    def _use(self, link: Link) -> None:
        self.reader = FrameReader(link.reader_stream)
        self.writer = FrameWriter(link.writer_stream)
        self.in_fd = link.sock.fileno()
        self.session = link.session
        self.last_heard = time.monotonic()
        if self._spin is not None:
            self._spin = spinner(self.in_fd, self._spin_seconds)


_TASK_REPLIES = (Kind.RESULT, Kind.ERROR, Kind.OUTPUT)
_ANSWERS = (Kind.RESULT, Kind.ERROR)


def main(resident_options: dict[str, Any] | None = None) -> int:
    # 1. Protocol streams on private fds; fd 0 <- /dev/null, fd 1 -> stderr. (A cluster's
    # worker: the first client's connection to its socket.)
    resident = None
    if resident_options is not None:
        from skyward.worker.resident import Resident, listening  # (see TYPE_CHECKING above)
        resident = Resident(**resident_options)
        listening()
        first = resident.next_link()
        if first is None:
            resident.close()
            return AUTOSTOPPED
        proto_in, proto_out = first.reader_stream, first.writer_stream
    else:
        proto_in = os.fdopen(os.dup(0), "rb", buffering=0)  # FrameReader buffers
        proto_out = os.fdopen(os.dup(1), "wb", buffering=1 << 16)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    if not keeper.kept and os.getpgrp() != os.getpid():
        with contextlib.suppress(OSError):
            os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client decides when we stop

    agent = Agent(FrameReader(proto_in), FrameWriter(proto_out), proto_in.fileno(), resident)
    route_output(agent.send_output)
    try:
        code = agent.run()
    except BaseException:
        log("worker failed:\n" + traceback.format_exc())
        code = 1
    try:
        agent.writer.close() if resident is not None else proto_out.flush()
    except OSError:
        pass
    if resident is not None:
        resident.close()
    # Tasks may have started processes of their own; none may outlive the worker.
    if keeper.kept or group_has_others():
        kill_group_and_exit(code)
    os._exit(code)

