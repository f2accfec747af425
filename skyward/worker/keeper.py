"""The worker's keeper: the process that outlives the worker just long enough to end every
process the worker's tasks started, however detached.

A task may start a process in a session of its own (``start_new_session=True``) or
double-fork a daemon: neither is in the worker's process group, so killing the group misses
it, and once its parent is gone Linux hands it to init. So ``python -m skyward.worker``
splits in two before anything else runs (:func:`split`):

* the **keeper** (the process the transport started: its pid is the channel's process
  group) becomes a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): every process below
  it whose parent dies is re-parented to it instead of init, so every descendant stays in
  its tree, detached or not. It only waits. When the worker ends, by any means (its own
  exit, a signal, SIGKILL from outside), the keeper kills every process in its tree, again
  and again until it has no child left (a process forking meanwhile is caught on the next
  round), then exits the way the worker did (the same exit code, or the same signal), so
  the client reports the worker's end. SIGTERM to the keeper means "stop": it kills the
  worker, then does the same.
* the **worker** (its child, in the same process group) runs the agent and talks to the
  client over the inherited stdin/stdout. It dies with the keeper
  (``PR_SET_PDEATHSIG``), and leaves the clean-up of its tree to the keeper.

Elsewhere than Linux (no ``prctl``) nothing splits, and the worker kills its own process
group on the way out, as before.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from skyward._procs import descendants

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
    """Fork the keeper off this process; return in the worker (the child), never in the keeper."""
    global kept
    if not sys.platform.startswith("linux"):
        return
    if os.getpgrp() != os.getpid():
        try:
            os.setsid()  # the keeper leads the group and session the client knows
        except OSError:
            pass
    if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        return
    keeper = os.getpid()
    worker = os.fork()
    if worker == 0:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != keeper:  # the keeper died before the line above
            os._exit(1)
        kept = True
        return
    _keep(worker)


def _keep(worker: int) -> None:
    """The keeper's whole life: wait for the worker, clear the tree, exit as the worker did."""
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
            os.write(2, f"[skyward.keeper {os.getpid()}] processes still running after "
                        f"{CLEAR_LIMIT:g}s of SIGKILL\n".encode())
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
