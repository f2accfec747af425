"""The worker's main loop: handshake, plugins' ``around_app``, task slots, heartbeats, exit.

Lifecycle:

1. Take the protocol streams off fds 0/1 and point fd 1 at stderr, so stray writes from C
   code (or a subprocess) can never corrupt a frame. Become a process-group leader so that
   everything the tasks start can be stopped together.
2. Wait for SETUP (identity, settings, plugins); export ``COMPUTE_POOL``; enter every plugin's
   ``around_app`` in order; answer READY (or FATAL naming the plugin).
3. Run TASK frames in ``concurrency`` slots; stream output; answer RESULT / ERROR.
4. Stop on SHUTDOWN (clean: hooks exited, BYE sent), on end of input or when the client has
   been silent for ``idle_timeout`` seconds (dead man's switch): then the whole process group
   is killed, so nothing the tasks started outlives the worker.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from skyward import runtime
from skyward._procs import group_members
from skyward.plugins._base import Plugin
from skyward.protocol import FrameReader, FrameWriter, Kind, loads_payload, spinner
from skyward.worker.output import route_output
from skyward.worker.slots import Slots, Task, make_slots

SETUP_TIMEOUT = 60.0


def _log(msg: str) -> None:
    try:
        os.write(2, f"[skyward.worker {os.getpid()}] {msg}\n".encode())
    except OSError:
        pass


def _kill_group_and_exit(code: int) -> None:
    """Stop everything this worker started, then exit without running more Python code."""
    try:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # includes this process
    finally:
        os._exit(code)


class Agent:
    def __init__(self, reader: FrameReader, writer: FrameWriter, in_fd: int | None = None):
        self.reader = reader
        self.in_fd = in_fd
        self.spin_seconds = 0.0
        self.writer = writer
        self.last_heard = time.monotonic()
        self.stopping = threading.Event()
        self.plugins: tuple[Plugin, ...] = ()
        self.slots: Slots | None = None
        self.node = -1

    # -- sending ---------------------------------------------------------------------------
    def send(self, control: tuple, payload: Any = None) -> None:
        try:
            self.writer.send(control, payload)
        except (OSError, ValueError):
            # The client is gone; nothing to report to.
            _kill_group_and_exit(0 if self.stopping.is_set() else 2)

    def send_output(self, task_id: int | None, stream: str, line: str) -> None:
        self.send((Kind.OUTPUT, task_id, stream, line))

    # -- start -----------------------------------------------------------------------------
    def handshake(self) -> tuple[dict[str, Any], tuple[Plugin, ...]]:
        timer = threading.Timer(SETUP_TIMEOUT, lambda: (_log("no SETUP from the client"), _kill_group_and_exit(3)))
        timer.daemon = True
        timer.start()
        try:
            frame = self.reader.recv()
        finally:
            timer.cancel()
        if frame is None:
            _kill_group_and_exit(0)
        control, parts = frame
        if control[0] != Kind.SETUP:
            _log(f"expected SETUP, got {control[0]!r}")
            _kill_group_and_exit(3)
        settings: dict[str, Any] = control[1]
        plugins = tuple(loads_payload(parts)) if parts else ()
        return settings, plugins

    def heartbeat_loop(self, interval: float, idle_timeout: float) -> None:
        while not self.stopping.wait(interval):
            silent_for = time.monotonic() - self.last_heard
            if silent_for > idle_timeout:
                _log(f"no word from the client for {silent_for:.0f}s (idle_timeout={idle_timeout:g}s); exiting")
                _kill_group_and_exit(4)
            self.send((Kind.HEARTBEAT,))

    def run(self) -> int:
        settings, plugins = self.handshake()
        self.last_heard = time.monotonic()
        info_json: str = settings["info"]
        os.environ[runtime.ENV_VAR] = info_json
        for key, value in settings.get("env", {}).items():
            os.environ[key] = value
        info = runtime.instance_info()
        self.node = info.node
        self.plugins = plugins
        self.spin_seconds = float(settings.get("spin", 0.0))

        threading.Thread(
            target=self.heartbeat_loop,
            args=(float(settings["heartbeat_interval"]), float(settings["idle_timeout"])),
            name="skyward-heartbeat",
            daemon=True,
        ).start()

        with contextlib.ExitStack() as app:
            for plugin in plugins:
                if plugin.around_app is None:
                    continue
                try:
                    app.enter_context(plugin.around_app(info))
                except BaseException as exc:  # report which plugin failed, then stop
                    self.send((Kind.FATAL, {
                        "plugin": plugin.name, "hook": "around_app", "node": info.node,
                        "message": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(),
                    }))
                    self.stopping.set()
                    app.close()
                    return 5
            self.slots = make_slots(settings["executor"], int(settings["concurrency"]), self)
            self.send((Kind.READY, os.getpid()))
            clean = self.serve()
            self.stopping.set()
            self.slots.shutdown(grace=float(settings.get("shutdown_grace", 3.0)))
            if not clean:
                _kill_group_and_exit(0)
            # Leaving the ExitStack runs the plugins' exits (e.g. destroy_process_group);
            # a watchdog makes sure a hook that hangs cannot keep the worker alive.
            watchdog = threading.Timer(15.0, lambda: (_log("plugin shutdown hung"), _kill_group_and_exit(6)))
            watchdog.daemon = True
            watchdog.start()
        self.send((Kind.BYE,))
        return 0

    def serve(self) -> bool:
        """Read and run frames until SHUTDOWN (returns True) or end of input (returns False).

        ``slots.readers`` threads take turns reading (see :class:`_ReadRole`); this thread
        waits for one of them to see the end.
        """
        assert self.slots is not None
        self._done = threading.Event()
        self._clean = False
        self._role = _ReadRole(self.slots.handoff_after, self._done)
        self._spin = spinner(self.in_fd, self.spin_seconds) if self.in_fd is not None else None
        for i in range(self.slots.readers):
            threading.Thread(target=self._read_loop, name=f"skyward-reader-{i}", daemon=True).start()
        self._done.wait()
        return self._clean

    def _finish(self, clean: bool) -> None:
        self._clean = clean
        self._done.set()
        self._role.wake_all()

    def _read_loop(self) -> None:
        assert self.slots is not None
        role = self._role
        while role.take():
            task = self._read_until_task()
            if task is None:
                role.leave()
                return
            role.running()
            self.slots.run(task)
            role.finished()

    def _read_until_task(self) -> Task | None:
        """Handle frames until one brings a task this thread should run (None: stop reading)."""
        assert self.slots is not None
        while not self._done.is_set():
            if self._spin is not None and not self.reader.buffered() and self.slots.idle():
                self._spin()  # the next task may be on its way: don't fall asleep just yet
            try:
                frame = self.reader.recv()
            except (EOFError, OSError) as exc:
                _log(f"client stream broke: {exc}")
                self._finish(False)
                return None
            if frame is None:
                self._finish(False)
                return None
            self.last_heard = time.monotonic()
            control, parts = frame
            frame = None
            kind = control[0]
            if kind == Kind.TASK:
                task = self.slots.accept((control[1], control[2], parts))
                parts = None
                if task is not None:
                    return task
            elif kind == Kind.PING:
                pass
            elif kind == Kind.CANCEL:
                self.slots.cancel(control[1])
            elif kind == Kind.SHUTDOWN:
                self._finish(True)
                return None
            else:
                _log(f"unknown message {kind!r}")
        return None


class _ReadRole:
    """Which of the reader threads reads the stream now (the others wait their turn).

    The thread that reads a TASK runs it. Someone must go on reading behind it (CANCEL, PING,
    SHUTDOWN, more tasks), but waking another thread for that costs more than a short task
    (a wake-up across CPUs, and the GIL between them). So the hand-off waits: a waiting thread
    takes the reading over only once the task has run for ``handoff_after`` seconds (it looks
    that often); a short task is over before anyone wakes. With ``handoff_after=0`` the role
    is handed on the moment a task starts (more than one slot: other tasks must start at once).
    """

    def __init__(self, handoff_after: float, done: threading.Event):
        self._lock = threading.Lock()  # taken directly (cheaper than the Condition's wrapper)
        self._cv = threading.Condition(self._lock)
        self._holder: int | None = None
        self._busy_since: float | None = None  # the holder is running a task since then
        self._after = handoff_after
        self._done = done

    def take(self) -> bool:
        """Become the reader (at once if this thread still is); False once serving is over."""
        me = threading.get_ident()
        with self._lock:
            while not self._done.is_set():
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

    def leave(self) -> None:
        with self._lock:
            if self._holder == threading.get_ident():
                self._holder = None
            self._cv.notify_all()

    def wake_all(self) -> None:
        with self._lock:
            self._cv.notify_all()


def main() -> int:
    # 1. Protocol streams on private fds; fd 0 <- /dev/null, fd 1 -> stderr.
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)  # FrameReader buffers
    proto_out = os.fdopen(os.dup(1), "wb", buffering=1 << 16)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    if os.getpgrp() != os.getpid():
        with contextlib.suppress(OSError):
            os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client decides when we stop

    agent = Agent(FrameReader(proto_in), FrameWriter(proto_out), proto_in.fileno())
    route_output(agent.send_output)
    try:
        code = agent.run()
    except BaseException:
        _log("worker failed:\n" + traceback.format_exc())
        code = 1
    try:
        proto_out.flush()
    except OSError:
        pass
    # Tasks may have started processes of their own; none may outlive the worker.
    if _group_has_others():
        _kill_group_and_exit(code)
    os._exit(code)


def _group_has_others() -> bool:
    members = group_members(os.getpgrp())
    return members is None or any(pid != os.getpid() for pid in members)
