"""The worker's keepers: the processes that outlive the worker just long enough to end every
process the worker's tasks started, however detached.

A task may start a process in a session of its own (``start_new_session=True``) or
double-fork a daemon: neither is in the worker's process group, so killing the group misses
it, and once its parent is gone Linux hands it to init. So ``python -m skyward.worker``
splits in three before anything else runs (:func:`split`), a chain of processes each the
parent of the next:

* the **guard** (the process the transport started: its pid is the channel's process group)
  and, below it, the **keeper** are both child subreapers (``prctl(PR_SET_CHILD_SUBREAPER)``):
  a process whose parent dies is re-parented to the nearest subreaper above it instead of
  init, so every descendant of the worker stays in the guard's tree, detached or not. Each
  only waits for its one child. When that child ends, by any means (its own exit, a signal,
  SIGKILL from outside), it kills every process in its tree, again and again until it has
  no child left (a process forking meanwhile is caught on the next round), then exits the
  way the child did (the same exit code, or the same signal), so the client reports the
  worker's end. SIGTERM to either means "stop": it kills its child, then does the same.
* the **worker** (the keeper's child, in the same process group) runs the agent and talks
  to the client over the inherited stdin/stdout. It dies with the keeper
  (``PR_SET_PDEATHSIG``), and leaves the clean-up of its tree to the keeper.

Why two: a process killed with SIGKILL can do nothing, and whatever it was holding goes
up the chain. Killed, the worker leaves its tree to the keeper; the keeper, to the guard
(the worker dies with it, and the orphans the keeper held become the guard's); the
guard's death is the keeper's SIGTERM (``PR_SET_PDEATHSIG``), so the keeper clears the tree
as when asked to stop. Any one of the three can be killed and nothing a task started
survives it. (Both keepers at once, as ``kill -9`` of the whole group does, is left to the
transport's teardown, which ends whatever still carries the tree's ``SKYWARD_TREE``.)

Elsewhere than Linux (no ``prctl``) nothing splits, and the worker kills its own process
group on the way out, as before.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import NoReturn

from skyward._procs import descendants, group_members
from skyward.worker.log import log

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: Seconds the keeper keeps killing before it gives up on a process that will not die (one
#: stuck in the kernel, uninterruptible) and exits anyway, saying so on stderr.
CLEAR_LIMIT = 30.0

#: True in a worker that has a keeper (set by :func:`split`).
kept = False


def _prctl(option: int, value: int) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def split() -> None:
    """Fork the keeper off this process (the guard), and the worker off the keeper; return in
    the worker, never in the guard or the keeper."""
    global kept
    if not sys.platform.startswith("linux"):
        return
    if os.getpgrp() != os.getpid():
        try:
            os.setsid()  # the guard leads the group and session the client knows
        except OSError:
            pass
    # The guard's death is the keeper's SIGTERM (stop: kill the worker, clear the tree); the
    # keeper's is the worker's SIGKILL (its orphans are the guard's to clear).
    for death_signal in (signal.SIGTERM, signal.SIGKILL):
        if not _prctl(PR_SET_CHILD_SUBREAPER, 1):  # (not inherited: each keeper asks for itself)
            return
        parent = os.getpid()
        child = os.fork()
        if child:
            _keep(child)
        _prctl(PR_SET_PDEATHSIG, death_signal)
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)
    kept = True


def _keep(worker: int) -> None:
    """A keeper's whole life (the guard's too): wait for its child (``worker``), clear the tree,
    exit as the child did."""
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        # The client must see the end of the stream when the worker ends: hold no end of it.
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.close(devnull)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client decides when we stop
        status: int | None = None

        def on_sigterm(signum: int, frame: object) -> None:
            if status is None:  # (once reaped, its pid may be someone else's)
                _kill(worker)

        signal.signal(signal.SIGTERM, on_sigterm)
        while status is None:
            try:
                pid, st = os.waitpid(-1, 0)  # reaps orphans handed to us on the way
            except ChildProcessError:
                status = 0
                break
            if pid == worker:
                status = st
        if not _clear():
            log(f"processes still running after {CLEAR_LIMIT:g}s of SIGKILL", "keeper")
        _exit_as(status)
    finally:
        os._exit(70)  # never back into the worker's code


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _clear() -> bool:
    """Kill every process in this one's tree until it has no child left; False on giving up."""
    deadline = time.monotonic() + CLEAR_LIMIT
    me = os.getpid()
    while True:
        for pid in descendants(me):
            _kill(pid)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return True  # no child left: as a subreaper, no descendant either
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def _exit_as(status: int) -> None:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:  # the worker dumped core, if it did: the keeper need not
                import resource

                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            except (ImportError, ValueError, OSError):
                pass
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def kill_group_and_exit(code: int) -> NoReturn:
    """Stop everything this worker started, then exit without running more Python code.

    Under a keeper, exiting is enough: the keeper kills the whole tree once the worker is gone
    (killing the group here would kill the keeper first)."""
    try:
        if not kept:
            os.killpg(os.getpgrp(), signal.SIGKILL)  # includes this process
    finally:
        os._exit(code)


def group_has_others() -> bool:
    """True when this process group has another process (or that cannot be told)."""
    members = group_members(os.getpgrp())
    return members is None or any(pid != os.getpid() for pid in members)
