"""The guardian of one shell command: runs it, and owns every process it starts.

Run as a script, never imported by skyward (``python -I -S _reaper.py PROCS GRACE SHELL
SCRIPT_FD STATUS_FD``), so it starts in a few milliseconds and depends on the standard library alone: it
reads /proc with skyward's own reader, ``skyward/_procs.py`` (stdlib only), loaded from the
path ``PROCS``. The worker
(:mod:`skyward.runtime.command`) starts it in a session of its own, with:

* stdin: a pipe from the worker. End of input means "stop the command": the worker closes it
  to cancel, and the kernel closes it when the worker dies, however it dies (SIGKILL too).
  SIGTERM to this process means the same (how ``skyward cancel`` stops a cluster's job).
* stdout/stderr: inherited by the command (the worker reads its lines from them).
* SCRIPT_FD: the command's code, an open file already removed from its folder (the worker
  wrote it with mode 0600 in a private folder and removed both at once): the shell reads it
  through this process's descriptor (``SHELL /proc/PID/fd/SCRIPT_FD``), which the command and
  its processes never inherit. A command of any size runs, and no file is ever left behind.
* STATUS_FD: a pipe on which it writes one line when all is over: ``<returncode> <stopped> <left>``
  (returncode negative for a signal, as ``subprocess`` reports it; ``stopped`` 1 if it was
  stopped; ``left`` the number of processes that could not be killed, normally 0).

Why a process of its own: a command such as ``torchrun`` starts its workers in sessions of
their own (``start_new_session``), and a daemonising child (``setsid``, double fork) leaves
its parent's process group, so no process group or session contains the whole tree. This
process is a *child subreaper* (Linux ``prctl``): every orphan of the tree is re-parented to
it instead of to init, so "every descendant of this process" is exactly what the command
started, whatever sessions they made. Stopping sends SIGTERM to all of them, SIGKILL after
``GRACE`` seconds to any left, and repeats until a scan of ``/proc`` finds none. When the
command ends by itself, whatever it left running in the background is stopped the same way,
so nothing outlives the command.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import select
import signal
import subprocess
import sys
import time
from types import ModuleType

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def load_procs(path: str) -> ModuleType:
    """skyward's /proc reader (``skyward/_procs.py``, stdlib only), loaded from its file:
    this script imports nothing of skyward, so it starts fast and in any interpreter state."""
    spec = importlib.util.spec_from_file_location("_skyward_procs", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


procs: ModuleType  # set by main() from its first argument


def descendants(root: int) -> list[int]:
    """Live processes below ``root`` (zombies are left to reap)."""
    return procs.descendants(root, zombies=False)


def reap(me: int, keep: int) -> None:
    """Collect the orphans (re-parented to us, a subreaper) that have ended; never ``keep``,
    the command itself, whose status ``subprocess`` must collect."""
    for pid in procs.zombie_children(me):
        if pid != keep:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def alone() -> bool:
    """Collect every ended child; True when no child is left, so nothing runs below this process
    (a subreaper: every orphan of the tree is its child). Called once the command itself has
    been collected: the end of a command that left nothing running costs no scan of /proc
    (each scan reads every process's stat on the machine: ~40 ms of CPU per job with a few
    hundred processes, before the job's end could be reported)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def stop_tree(me: int, group: int, grace: float, *, group_alive: bool) -> int:
    """SIGTERM every descendant, SIGKILL the rest after ``grace``; return how many remain.

    ``group`` is the command's process group; it is signalled as a group only while its
    leader is unreaped (``group_alive``), so that the id cannot have been reused."""
    if group_alive:
        try:
            os.killpg(group, signal.SIGTERM)
        except OSError:
            pass
    signal_all(descendants(me), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        reap(me, group)
        if not descendants(me):
            return 0
        time.sleep(0.02)
    for _ in range(200):  # SIGKILL until a scan finds nothing (a fork may race one scan)
        left = descendants(me)
        if not left:
            return 0
        signal_all(left, signal.SIGKILL)
        time.sleep(0.01)
        reap(me, group)
    return len(descendants(me))


def main(argv: list[str]) -> int:
    global procs
    procs = load_procs(argv[1])
    grace = float(argv[2])
    shell, script_fd, status_fd = argv[3], int(argv[4]), int(argv[5])
    os.set_inheritable(script_fd, False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when the command stops
    me = os.getpid()
    become_subreaper()
    status = os.fdopen(status_fd, "w")
    try:
        # (SIGINT is ignored here and by the worker; the command gets the default back.)
        proc = subprocess.Popen([shell, f"/proc/{me}/fd/{script_fd}"], stdin=subprocess.DEVNULL, process_group=0,
                                close_fds=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509 (one thread)
    except OSError as exc:
        print(f"skyward: cannot start {shell}: {exc}", file=sys.stderr, flush=True)
        status.write("127 0 0\n")
        status.flush()
        return 0
    control = sys.stdin.fileno()
    # SIGCHLD wakes the select below the moment the command ends (no polling delay).
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    terminated: list[int] = []  # SIGTERM: stop the command as a closed control pipe does (a job's cancel)
    signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))
    stopped = False
    returncode = proc.poll()
    while returncode is None:
        ready, _, _ = select.select([control, wake_r], [], [], 1.0)
        if wake_r in ready:
            os.read(wake_r, 512)
            if proc.poll() is None:  # (once it has ended, what it left is seen to below)
                reap(me, proc.pid)  # orphans that ended
        if terminated or (control in ready and not os.read(control, 64)):  # the worker closed it, or is gone
            stopped = True
            break
        returncode = proc.poll()
    if returncode is not None and alone():
        left = 0
    else:
        left = stop_tree(me, proc.pid, grace if stopped else min(grace, 0.5), group_alive=returncode is None)
        if returncode is None:
            returncode = proc.wait()
        reap(me, proc.pid)
    status.write(f"{returncode} {int(stopped)} {left}\n")
    status.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
