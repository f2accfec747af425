"""The managed jobs' controller on this machine (the Local provider's model): one detached
process, ``python -m skyward.jobs.controller``, for every managed job of a skyward home.

* :func:`ensure` starts it when it is not running (in a session of its own, through a process
  that exits at once: the client that asked may exit, or be SIGKILLed, right after) and waits
  until it holds its lock (``managed/controller.lock``, which names its pid). One at a time: a
  second one finds the lock taken and exits.
* It runs one loop (no thread per job): every :data:`TICK` seconds, or at once when a client
  wakes it (SIGUSR1), each job not settled gets a step (:mod:`skyward.jobs.watch`); what may
  wait on a cluster runs on a few threads of the watcher's, whatever the number of jobs. Everything
  it knows is in the jobs' records, so a controller started after another was killed takes
  every job up where the records leave it.
* It exits by itself after :data:`IDLE_SECONDS` (``SKYWARD_JOBS_CONTROLLER_IDLE``) with no job
  to watch; SIGTERM (:func:`stop`) ends it at once, leaving the jobs to the next one.

Its own log is ``managed/controller.log``; each job's, ``managed/<id>/controller.log``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import subprocess
import sys
import time

from skyward.errors import ClusterError
from skyward.jobs.store import JobStore, folder

__all__ = ["CLUSTER_USE", "IDLE_SECONDS", "IDLE_VARIABLE", "TICK", "ensure", "running", "serve", "stop", "wake"]

#: Seconds between the loop's rounds when nothing wakes it.
TICK = 1.0
#: Seconds with no job to watch after which the controller exits (:data:`IDLE_VARIABLE` in the
#: environment it starts in changes it).
IDLE_SECONDS = 600.0
#: The variable that sets the controller's idle seconds (a controller on another machine takes
#: it from the client whose ask starts it: :mod:`skyward.jobs.remote`).
IDLE_VARIABLE = "SKYWARD_JOBS_CONTROLLER_IDLE"
#: Set (by :mod:`skyward.jobs.remote`) to the folder of the worker of the named cluster the
#: controller runs on: while it runs, the controller is one of that cluster's running jobs
#: (a pid file in the folder's ``jobs/controller/``), so the cluster's autostop waits for it.
CLUSTER_USE = "SKYWARD_JOBS_CLUSTER_DIR"
#: Start the controller in a session of its own; exit once it holds its lock (0), or with its
#: status when it ends first (argv: the lock's path, then its command line). Its parent is then
#: gone: the controller belongs to no client.
_DETACH = ("import fcntl, os, subprocess, sys, time\n"
           "p = subprocess.Popen(sys.argv[2:], start_new_session=True, stdin=subprocess.DEVNULL)\n"
           "while p.poll() is None:\n"
           "    fd = os.open(sys.argv[1], os.O_RDONLY)\n"
           "    try:\n"
           "        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)\n"
           "    except BlockingIOError:\n"
           "        sys.exit(0)\n"
           "    finally:\n"
           "        os.close(fd)\n"
           "    time.sleep(0.02)\n"
           "sys.exit(p.returncode)\n")


def _lock_path() -> str:
    return str(folder() / "controller.lock")


def running() -> int | None:
    """The pid of this home's controller, or None when none runs."""
    fd = os.open(_lock_path(), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for _ in range(100):
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.pread(fd, 32, 0).decode(errors="replace").strip()
                if text.isdigit():
                    return int(text)
                time.sleep(0.01)  # (it has the lock and is writing its pid)
                continue
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        return None
    finally:
        os.close(fd)


def ensure(timeout: float = 30.0) -> int:
    """The controller's pid, started first if none runs. Raises :class:`~skyward.ClusterError`
    naming its log (and quoting its end) when it exits as it starts, or is not up within
    ``timeout`` seconds."""
    pid = running()
    if pid is not None:
        return pid
    log = folder() / "controller.log"
    os.close(os.open(_lock_path(), os.O_RDWR | os.O_CREAT, 0o600))
    try:
        with open(log, "ab") as out:
            started = subprocess.run([sys.executable, "-c", _DETACH, _lock_path(), sys.executable, "-m",
                                      "skyward.jobs.controller"], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                     check=False, timeout=timeout)
        problem = f"exited with status {started.returncode} as it started" if started.returncode else ""
    except subprocess.TimeoutExpired:
        problem = f"did not start within {timeout:g}s"
    pid = running()
    if problem or pid is None:
        tail = log.read_text(errors="replace").strip().splitlines()[-2:]
        raise ClusterError("jobs-controller", f"the managed jobs' controller {problem or 'did not start'}"
                           + (f" (its log ends: {' | '.join(tail)})" if tail else ""),
                           way_out=f"see {log}; the jobs are kept, and the next `skyward jobs` command starts "
                                   "the controller again")
    return pid


def wake() -> None:
    """Have the controller look at its jobs now (a job was submitted or cancelled)."""
    pid = running()
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGUSR1)


def stop(timeout: float = 30.0) -> list[int]:
    """End this home's controller and the launchers it left (SIGTERM, then SIGKILL at
    ``timeout``); the jobs stay as they are for the next controller. Returns the pids that did
    not end."""
    from skyward import _procs
    from skyward.jobs.watch import is_launcher

    pids = [p for p in [running()] if p is not None]
    pids += [j.launcher for j in JobStore().all() if j.launcher and is_launcher(j.launcher, j.id)]
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_procs.alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if _procs.alive(p)]
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


def _take(fd: int) -> bool:
    """Take the controller's lock on ``fd``; False when another controller holds it. A look
    (:func:`running`, the start's helper) holds it shared for a moment: that is waited out, not
    taken for a controller."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        probe = os.open(_lock_path(), os.O_RDONLY)
        try:
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # (held exclusively: a controller)
        finally:
            os.close(probe)
        time.sleep(0.005)


def serve() -> int:
    """The controller's loop (``python -m skyward.jobs.controller``); returns its exit status."""
    from skyward.jobs.watch import Watcher

    idle = float(os.environ.get(IDLE_VARIABLE, IDLE_SECONDS))
    fd = os.open(_lock_path(), os.O_RDWR | os.O_CREAT, 0o600)
    if not _take(fd):
        return 0  # (another controller runs)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    stopping: list[int] = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} controller pid {os.getpid()} started", flush=True)
    in_use = _count_as_a_job(os.environ.pop(CLUSTER_USE, ""))
    store = JobStore()
    def wake_loop() -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(wake_w, b"w")

    watcher = Watcher(store, wake_loop)
    idle_since = time.monotonic()
    while not stopping:
        jobs = store.unsettled()
        for job in jobs:
            watcher.step(job)
        if jobs or not watcher.idle():
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > idle:
            break
        with contextlib.suppress(InterruptedError):
            select.select([wake_r], [], [], TICK)
        with contextlib.suppress(BlockingIOError):
            os.read(wake_r, 4096)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} controller pid {os.getpid()} exits "
          + ("(SIGTERM)" if stopping else f"(no job for {idle:g}s)"), flush=True)
    if in_use is not None:
        with contextlib.suppress(OSError):
            os.unlink(in_use)
    if stopping:  # (at once: a look or teardown in flight is the next controller's to do again)
        os._exit(0)
    return 0


def _count_as_a_job(cluster_dir: str) -> str | None:
    """Write this process's pid where the cluster's worker in ``cluster_dir`` counts running
    jobs (:func:`skyward.runtime.cluster.running_jobs`); the pid file's path, None without one."""
    if not cluster_dir:
        return None
    place = os.path.join(os.path.expanduser(cluster_dir), "jobs", "controller")
    try:
        os.makedirs(place, mode=0o700, exist_ok=True)
        path = os.path.join(place, "controller.pid")
        with open(path, "w") as f:
            f.write(str(os.getpid()))
    except OSError as exc:
        print(f"cannot count as a job of the cluster in {cluster_dir}: {exc}", flush=True)
        return None
    return path


if __name__ == "__main__":
    sys.exit(serve())
