"""What the controller does for one managed job, a step at a time (:meth:`Watcher.step`, called
by the controller's one loop for every job not settled; no step waits on a job).

What may wait on a cluster (a look at a running job, a teardown, keeping a run's logs) runs on a
small pool of :data:`WORKERS` threads, whatever the number of jobs: a step hands it over and
returns, and a later step of the same job collects how it went (one piece of work per job at a
time). A node that does not answer thus holds up one thread for its job, never the loop: the
other jobs launch, run and end meanwhile. (One thread per job would cost a stack per job; a
process per look, a Python start every :data:`LOOK_EVERY` seconds per job.)

* PENDING: a launcher (:mod:`skyward.jobs.launcher`) is started, at most
  :data:`MAX_LAUNCHES` at once; the job is STARTING.
* STARTING / RECOVERING: when the launcher has written its result, the job is RUNNING on its
  cluster, or it ends: FAILED_NO_RESOURCE (no cluster could be had), FAILED_SETUP, FAILED.
* RUNNING: every :data:`LOOK_EVERY` seconds its cluster is asked how the run goes. Ended well:
  SUCCEEDED. A node lost (the cluster not all up, unreachable, or gone): RECOVERING, the cluster
  torn down and a fresh one launched, the run started again with the same ``SKYPILOT_TASK_ID``.
  Failed on a cluster that is up: restarted the same way as ``job_recovery`` says
  (``recover_on_exit_codes``; ``max_restarts_on_errors`` times), else FAILED.
* A cancel (CANCELLING): the launcher is interrupted, the cluster torn down, CANCELLED.

Whatever the end, the job's cluster is torn down first and its run logs kept under the job's
folder; a teardown that cannot be confirmed is tried again on the next steps (``cleaned``).
Recoveries and restarts together are at most :data:`~skyward.launch.recovery.MAX_RECOVERIES`.

A step that raises (a bug, a broken record; a launcher that dies without a result counts too) is
logged with its traceback in the job's controller log; :data:`FAILURES_IN_A_ROW` of them end the
job FAILED_CONTROLLER, its cluster torn down.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from skyward.clusters import jobs as cluster_jobs
from skyward.clusters import manage
from skyward.clusters.spawned import ask
from skyward.clusters.state import UP, ClusterStore, note
from skyward.errors import ClusterBusy, SkywardError
from skyward.jobs.store import (RESULT_FILE, CallPlan, CANCELLED, CANCELLING, FAILED, FAILED_CONTROLLER, FAILED_NO_RESOURCE, FAILED_SETUP,
                                FINAL, PENDING, RECOVERING, RUNNING, STARTING, SUCCEEDED, JobStore, JobRecord)
from skyward.runtime.jobqueue import ACTIVE

__all__ = ["FAILURES_IN_A_ROW", "LOOK_EVERY", "MAX_LAUNCHES", "WORKERS", "Watcher", "is_launcher"]

#: Launches (cluster provisioning and setup) at once; the other jobs wait PENDING.
MAX_LAUNCHES = 8
#: Seconds between looks at a running job's cluster.
LOOK_EVERY = 2.0
#: Threads for the work that may wait on a cluster (looks, teardowns), all jobs together.
WORKERS = 8
#: Steps of one job that may fail in a row before it is FAILED_CONTROLLER.
FAILURES_IN_A_ROW = 3


def is_launcher(pid: int | None, job: int) -> bool:
    """Whether ``pid`` is the launcher of job ``job`` (alive; not a process that took its pid)."""
    from skyward import _procs

    if not pid or not _procs.alive(pid):
        return False
    cmd = (_procs.cmdline(pid) or b"").split(b"\0")
    return b"skyward.jobs.launcher" in cmd and str(job).encode() in cmd


class Watcher:
    """The controller's steps for its jobs; holds only the launchers it started (to reap them)
    and when to look at each running job next."""

    def __init__(self, store: JobStore, wake: Callable[[], None] = lambda: None):
        self.store = store
        self.wake = wake  # (called as a piece of work ends: the loop collects it at once)
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.next_look: dict[int, float] = {}
        self.interrupted: set[int] = set()
        self.pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="skyward-jobs")
        self.busy: dict[int, Future[None]] = {}
        self.failures: dict[int, int] = {}

    def log(self, job: JobRecord, line: str) -> None:
        """A line in the job's controller log (``skyward jobs logs ID --controller``)."""
        with open(job.directory / "controller.log", "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")

    def step(self, job: JobRecord) -> None:
        """One step of ``job``; never waits on its cluster. An error (this step's, or that of the
        work it collects) is counted: :meth:`trouble`."""
        try:
            self._step(job)
        except Exception as exc:  # (one job's trouble never stops the others)
            self.trouble(job, exc)

    def _step(self, job: JobRecord) -> None:
        work = self.busy.get(job.id)
        if work is not None:
            if not work.done():
                return
            del self.busy[job.id]
            work.result()  # (raises the error it ended with)
            self.failures.pop(job.id, None)
            fresh = self.store.get(job.id)  # (the work changed it)
            if fresh is None or (fresh.status in FINAL and fresh.cleaned):
                return
            job = fresh
        if job.status in FINAL:
            if self._launcher_alive(job):
                self._signal_launcher(job)
            else:
                self._off(job, self._clean)
        elif job.cancel:
            self._cancel(job)
        elif job.status in (PENDING, STARTING, RECOVERING):
            self._launching(job)
        elif job.status == RUNNING and time.monotonic() >= self.next_look.get(job.id, 0.0):
            self.next_look[job.id] = time.monotonic() + LOOK_EVERY
            self._off(job, self._look)

    def _off(self, job: JobRecord, work: Callable[..., None], *args: Any) -> None:
        """Run ``work(job, *args)`` on the pool; a later step collects it."""
        self.busy[job.id] = future = self.pool.submit(work, job, *args)
        future.add_done_callback(lambda done: self.wake())

    def idle(self) -> bool:
        """Whether no work is in flight. The ended work of a settled job is let go here: a job's
        last work, its teardown, settles it, and no later step collects it."""
        for job, work in list(self.busy.items()):
            if work.done() and self._settled(job):
                del self.busy[job]
        return all(work.done() for work in self.busy.values())

    def _settled(self, job: int) -> bool:
        found = self.store.get(job)
        return found is None or (found.status in FINAL and bool(found.cleaned))

    def trouble(self, job: JobRecord, exc: BaseException) -> None:
        """A step of ``job`` failed: logged with its traceback; the job ends FAILED_CONTROLLER
        (its cluster torn down) after :data:`FAILURES_IN_A_ROW` in a row."""
        count = self.failures[job.id] = self.failures.get(job.id, 0) + 1
        trace = "".join(traceback.format_exception(exc)).strip()
        self.log(job, f"controller error ({count} of {FAILURES_IN_A_ROW} in a row): {trace}")
        self.next_look[job.id] = 0.0  # (tried again at the next round)
        if count >= FAILURES_IN_A_ROW and job.status not in FINAL:
            self.failures.pop(job.id, None)
            self._off(job, self._end, FAILED_CONTROLLER, job.exit_code, f"the controller failed on it: {exc!r}")

    # -- launching -------------------------------------------------------------------------------

    def _launcher_alive(self, job: JobRecord) -> bool:
        child = self.children.get(job.id)
        if child is not None:
            if child.poll() is None:
                return True
            del self.children[job.id]
            return False
        return is_launcher(job.launcher, job.id)

    def _launching(self, job: JobRecord) -> None:
        if self._launcher_alive(job):
            return
        if job.launch_result is not None:
            self._launched(job, json.loads(job.launch_result))
        elif job.launcher is not None:  # (ended without a word: a crash; the attempt is made again)
            self.store.update(job.id, when=job.status, launcher=None)
            raise RuntimeError(f"the launcher (pid {job.launcher}) ended without a result (see above); launching "
                               "again")
        elif job.cluster and ClusterStore().get(job.cluster) is not None:
            self._off(job, self._down)  # (the last attempt's cluster goes first)
        elif sum(1 for c in self.children.values() if c.poll() is None) < MAX_LAUNCHES:
            state = STARTING if job.status == PENDING else job.status
            if not self.store.update(job.id, when=job.status, status=state, attempt=job.attempt + 1):
                return  # (cancelled meanwhile)
            with open(job.directory / "controller.log", "ab") as out:
                child = subprocess.Popen([sys.executable, "-m", "skyward.jobs.launcher", str(job.id)],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
            self.children[job.id] = child
            self.store.update(job.id, launcher=child.pid)
            self.log(job, f"{state}: launching cluster {job.cluster} (attempt {job.attempt + 1}, launcher pid "
                          f"{child.pid})")

    def _launched(self, job: JobRecord, result: dict[str, Any]) -> None:
        if result["code"] == 0 and result["job"] is not None:
            now = time.time()
            if self.store.update(job.id, when=job.status, status=RUNNING, cluster_job=result["job"],
                                 running_since=now, started=job.started or now, launcher=None):
                self.log(job, f"RUNNING: job {result['job']} of cluster {job.cluster}")
            return
        state = {"provision": FAILED_NO_RESOURCE, "setup": FAILED_SETUP}.get(result["phase"], FAILED)
        self._off(job, self._end, state, result["code"], result["error"] or f"the launch ended with status {result['code']}")

    # -- running ---------------------------------------------------------------------------------

    def _look(self, job: JobRecord) -> None:
        record = ClusterStore().get(job.cluster or "")
        if record is None:
            return self._recover(job, f"its cluster {job.cluster} is gone")
        try:
            state = cluster_jobs.job(record.name, job.cluster_job)
        except SkywardError as exc:
            return self._recover(job, f"its cluster cannot be asked ({exc})")
        if state is not None and state.status in (SUCCEEDED, CANCELLED):
            return self._end(job, state.status, state.exit_code, None)
        try:
            live = manage.live_status(record)
        except ConnectionError as exc:
            live = f"unreachable ({exc})"
        if live != UP:
            return self._recover(job, f"a node was lost (cluster {record.name} is {live})")
        if state is None:
            return self._recover(job, f"job {job.cluster_job} is no longer in its cluster's queue")
        if state.status == FAILED_SETUP:  # (setup runs inside the cluster's job: not retried, as SkyPilot's)
            return self._end(job, FAILED_SETUP, state.exit_code, f"setup failed with exit code {state.exit_code}")
        if state.status == FAILED:
            return self._failed(job, state.exit_code)
        if state.status not in ACTIVE:  # (FAILED_DRIVER: the node's worker is gone, the job with it)
            return self._recover(job, f"job {job.cluster_job} ended {state.status} on its cluster")
        return None

    def _failed(self, job: JobRecord, code: int | None) -> None:
        from skyward.launch.recovery import MAX_RECOVERIES

        recovery = pickle.loads(job.plan).job_recovery
        codes = recovery.recover_on_exit_codes if recovery is not None else ()
        restarts = recovery.max_restarts_on_errors if recovery is not None else 0
        if code in codes and job.recoveries < MAX_RECOVERIES:
            return self._recover(job, f"the run failed with exit code {code} (in recover_on_exit_codes)")
        if job.restarts < restarts:
            return self._recover(job, f"the run failed with exit code {code} (restart {job.restarts + 1} of "
                                      f"max_restarts_on_errors={restarts})", restart=True)
        return self._end(job, FAILED, code, f"the run failed with exit code {code}")

    def _recover(self, job: JobRecord, why: str, restart: bool = False) -> None:
        from skyward.launch.recovery import MAX_RECOVERIES

        if job.recoveries >= MAX_RECOVERIES:
            return self._end(job, FAILED, job.exit_code, f"{why}; recovery gave up after {MAX_RECOVERIES}")
        self.log(job, f"RECOVERING: {why}")
        if job.cluster:
            note(job.cluster, "recovery", f"managed job {job.id} ({job.name}) recovers: {why}")
        self._save_logs(job)
        now = time.time()
        # (the old cluster is torn down before the next launch: see _launching)
        self.store.update(job.id, when=job.status, status=RECOVERING, recoveries=job.recoveries + 1,
                          restarts=job.restarts + (1 if restart else 0), run_seconds=job.job_duration,
                          running_since=None, cluster_job=None, launcher=None, launch_result=None)
        return None

    # -- ending ----------------------------------------------------------------------------------

    def _cancel(self, job: JobRecord) -> None:
        if self._launcher_alive(job):
            self._signal_launcher(job)
            return
        self._off(job, self._end, CANCELLED, None, "cancelled", CANCELLING)

    def _signal_launcher(self, job: JobRecord) -> None:
        """Interrupt the job's launcher, once: it unwinds what it started, then exits."""
        pid = self.children[job.id].pid if job.id in self.children else job.launcher
        if job.id not in self.interrupted and pid and pid > 0:
            self.interrupted.add(job.id)
            self.log(job, f"{job.status}: interrupting the launcher (pid {pid})")
            os.kill(pid, signal.SIGTERM)

    def _end(self, job: JobRecord, state: str, code: int | None, reason: str | None, when: str | None = None) -> None:
        """Keep the logs, tear the cluster down, then say how the job ended (a teardown that
        fails is tried again by the next steps: the job ends all the same)."""
        self._save_logs(job)
        self._save_outcome(job)
        try:
            cleaned = self._down(job)
        except Exception as exc:
            self.log(job, f"teardown of {job.cluster} failed: {exc!r}")
            cleaned = False
        if self.store.update(job.id, when=when or job.status, status=state, exit_code=code, reason=reason,
                             ended=time.time(), run_seconds=job.job_duration, running_since=None,
                             cleaned=int(cleaned), launcher=None):
            self.log(job, f"{state}" + (f": {reason}" if reason else "") + (
                "" if cleaned else f" (cluster {job.cluster} not yet confirmed down: trying again)"))
        self.next_look.pop(job.id, None)
        self.interrupted.discard(job.id)

    def _clean(self, job: JobRecord) -> None:
        """Tear down the cluster of a job that has ended, if not done yet."""
        if self._down(job):
            self.store.update(job.id, cleaned=1)

    def _down(self, job: JobRecord) -> bool:
        """Tear the job's cluster down, if it is there; whether it is gone."""
        if not job.cluster or ClusterStore().get(job.cluster) is None:
            return True
        try:
            problems = manage.down(job.cluster)
        except ClusterBusy as busy:
            problems = [str(busy)]
        for problem in problems:
            self.log(job, f"teardown of {job.cluster}: {problem}")
        if not problems:
            self.log(job, f"cluster {job.cluster} torn down")
        return not problems

    def _save_outcome(self, job: JobRecord) -> None:
        """A Python call's outcome on every node (value or exception), kept as ``result.json``
        for :meth:`skyward.jobs.calls.ManagedJob.result` (the cluster goes)."""
        if not job.cluster or job.cluster_job is None or ClusterStore().get(job.cluster) is None:
            return
        try:
            if not isinstance(pickle.loads(job.plan), CallPlan):
                return
            parts = ask(cluster_jobs.cluster_record(job.cluster), job.cluster_job, 0.0)
        except Exception as exc:  # (the job ends all the same)
            self.log(job, f"could not keep the call's outcome: {exc!r}")
            return
        if parts and all(p["status"] not in ACTIVE for p in parts.values()):
            part = job.directory / (RESULT_FILE + ".part")
            part.write_text(json.dumps(parts))
            os.replace(part, job.directory / RESULT_FILE)

    def _save_logs(self, job: JobRecord) -> None:
        """The run's output on its cluster, kept as ``run-<attempt>.log`` (the cluster goes)."""
        if not job.cluster or job.cluster_job is None or ClusterStore().get(job.cluster) is None:
            return
        path = job.directory / f"run-{job.attempt}.log"
        part = path.with_suffix(".part")  # (a reader sees the whole file or none)
        try:
            with open(part, "w") as out:
                cluster_jobs.logs(job.cluster, job.cluster_job, out, follow=False)
        except Exception as exc:  # (a lost node's part cannot be read: what could be is kept)
            self.log(job, f"could not keep every node's log of attempt {job.attempt}: {exc}")
        os.replace(part, path)
