"""What a client does with managed jobs (``skyward jobs``): submit, list, cancel, read logs.

A client writes the job's record and wakes the controller (:mod:`skyward.jobs.controller`,
started if none runs); it never holds the job: once :func:`submit` has returned the id, the
client may exit or be killed. Listing a job that has not settled restarts a controller that
was killed, so that it takes its jobs up again.

With the controller on another machine (an AWS job's, :mod:`skyward.jobs.aws`, or the cluster
``SKYWARD_JOBS_CONTROLLER`` names, :mod:`skyward.jobs.remote`), each of these asks the controller's
node instead, where the same functions run against the controller there.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import IO, TYPE_CHECKING

from skyward.errors import ConfigError
from skyward.jobs import aws, controller, remote
from skyward.jobs.store import ACTIVE, CANCELLED, FINAL, RESULT_FILE, SUCCEEDED, JobStore, JobRecord

if TYPE_CHECKING:
    from skyward.launch.run import LaunchPlan

__all__ = ["STATUS_CODES", "cancel", "get", "jobs", "logs", "outcome", "record", "submit", "wait"]

#: A job's end as an exit status (SkyPilot's ``logs`` codes): 0 succeeded, 103 cancelled, 100
#: any failure, 101 not finished.
STATUS_CODES = {SUCCEEDED: 0, CANCELLED: 103}
FAILED_CODE, NOT_FINISHED = 100, 101
#: Seconds a cancel waits for the controller to confirm the job's cluster gone.
CANCEL_TIMEOUT = 120.0
_POLL = 0.2  # (seconds between looks at a job's record while waiting on it)


def _far(plan: object = None) -> remote.RemoteController | None:
    """The controller of another machine (on AWS: :func:`skyward.jobs.aws.chosen`; or the
    cluster's node ``SKYWARD_JOBS_CONTROLLER`` names), or None: this machine's. ``plan``: a job
    being submitted (on AWS, its first submit launches the controller)."""
    return aws.controller(plan) if aws.chosen(plan) else remote.named()


def exit_status(job: JobRecord) -> int:
    if job.status in ACTIVE:
        return NOT_FINISHED
    return STATUS_CODES.get(job.status, FAILED_CODE)


def submit(p: LaunchPlan) -> int:
    """Record plan ``p`` as a managed job and hand it to the controller; its id."""
    from skyward.launch.cluster import demand

    if p.then:
        raise ConfigError("TASK.yaml", "a task file of one task (a pipeline is not run as a managed job yet)",
                          f"a pipeline of {len(p.stages)} tasks")
    return record(p.name, demand(p.accelerator, p.cpus, p.nodes)["resources"], p)


def record(name: str, resources: str, plan: object, *, cwd: str | None = None) -> int:
    """Record ``plan`` (a task file's, or a Python call's: :mod:`skyward.jobs.calls`) as a
    managed job and hand it to the controller; its id. ``cwd``: where its relative paths start
    (default: this process's working directory)."""
    if (far := _far(plan)) is not None:
        return int(far.ask("submit", name, resources, cwd or os.getcwd(), stdin=pickle.dumps(plan)))
    controller.ensure()  # (first: a controller that cannot start leaves no job behind)
    job = JobStore().add(name, resources, pickle.dumps(plan), cwd or os.getcwd())
    controller.wake()
    return job


def jobs() -> list[JobRecord]:
    """Every managed job, oldest first (a controller is started if one has work and none runs)."""
    if (far := _far()) is not None:
        return list(far.ask("list"))
    found = JobStore().all()
    if any(j.status in ACTIVE or not j.cleaned for j in found):
        controller.ensure()
    return found


def get(job_id: int) -> JobRecord:
    """Managed job ``job_id``; :class:`~skyward.ConfigError` naming the ids there are when none."""
    if (far := _far()) is not None:
        return far.ask("get", job_id)  # type: ignore[no-any-return]
    found = JobStore().get(job_id)
    if found is None:
        known = [j.id for j in JobStore().all()]
        have = f"one of {', '.join(map(str, known))}" if known else "there are no managed jobs"
        raise ConfigError("ID", f"a managed job's id ({have}; see `skyward jobs queue`)", job_id)
    return found


def cancel(ids: list[int] | None = None, *, name: str | None = None, timeout: float = CANCEL_TIMEOUT) -> list[JobRecord]:
    """Cancel managed jobs: ``ids``, or those named ``name``, or (neither) every unfinished one;
    waits until the controller has ended each (its cluster torn down). Returns them as they ended.
    :class:`~skyward.ConfigError` for an unknown id, or one that has finished, before anything
    is cancelled."""
    if (far := _far()) is not None:
        return list(far.ask("cancel", timeout, name or "-", *(ids or ()), timeout=timeout + remote.ASK_TIMEOUT))
    store = JobStore()
    if ids:
        chosen = [get(i) for i in ids]
        for j in chosen:
            if j.status not in ACTIVE:
                raise ConfigError("ID", f"a managed job that has not finished (job {j.id} is {j.status})", j.id)
    elif name is not None:
        chosen = [j for j in store.all() if j.name == name and j.status in ACTIVE]
        if not chosen:
            names = sorted({j.name for j in store.all() if j.status in ACTIVE})
            raise ConfigError("-n/--name", "the name of an unfinished managed job (" +
                              (", ".join(names) if names else "none is unfinished") + ")", name)
    else:
        chosen = [j for j in store.all() if j.status in ACTIVE]
    for j in chosen:
        store.request_cancel(j.id)
    if chosen:
        controller.ensure()
        controller.wake()
    return [wait(j.id, timeout) for j in chosen]


def wait(job_id: int, timeout: float | None = None) -> JobRecord:
    """Job ``job_id`` once it has ended (``timeout`` None: however long that takes); a controller
    that dies meanwhile is started again. TimeoutError at ``timeout`` seconds."""
    if (far := _far()) is not None:
        return far.ask("wait", job_id, "none" if timeout is None else timeout,  # type: ignore[no-any-return]
                       timeout=None if timeout is None else timeout + remote.ASK_TIMEOUT)
    deadline = None if timeout is None else time.monotonic() + timeout
    while (job := get(job_id)).status in ACTIVE:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"managed job {job_id} is still {job.status} after {timeout:g}s")
        controller.ensure()
        time.sleep(_POLL)
    return job


def logs(job_id: int, out: IO[str], *, follow: bool = True, of_controller: bool = False) -> JobRecord:
    """Write job ``job_id``'s run output (every attempt's, recoveries included; each node's lines
    as ``[node N] ...``), or with ``of_controller`` the controller's log of it; with ``follow``,
    until it ends. Returns the job as it was last seen."""
    if (far := _far()) is not None:
        return far.ask("logs", job_id, int(follow), int(of_controller), out=out,  # type: ignore[no-any-return]
                       timeout=None if follow else remote.ASK_TIMEOUT)
    job = get(job_id)
    if of_controller:
        return _follow_file(job, job.directory / "controller.log", out, follow)
    from skyward.clusters import jobs as cluster_jobs
    from skyward.errors import SkywardError

    printed: set[int] = set()
    while True:
        job = get(job_id)
        for attempt in range(1, job.attempt + 1):
            saved = job.directory / f"run-{attempt}.log"
            if attempt not in printed and saved.exists():
                out.write(saved.read_text(errors="replace"))
                out.flush()
                printed.add(attempt)
        if job.status in FINAL:
            return job
        live = job.status == "RUNNING" and job.attempt not in printed and job.cluster_job is not None
        if live and job.cluster:
            try:
                cluster_jobs.logs(job.cluster, job.cluster_job or 0, out, follow=follow)
            except SkywardError:
                pass  # (the cluster went: the controller keeps the attempt's log, printed if not yet)
            if follow:
                printed.add(job.attempt)
        if not follow:
            return job
        controller.ensure()
        time.sleep(_POLL)


def _follow_file(job: JobRecord, path: os.PathLike[str], out: IO[str], follow: bool) -> JobRecord:
    offset = 0
    while True:
        job = get(job.id)
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                f.seek(offset)
                text = f.read()
                offset = f.tell()
            out.write(text)
            out.flush()
        if not follow or job.status in FINAL:
            return job
        time.sleep(_POLL)


def outcome(job: JobRecord) -> str | None:
    """The text of ``job``'s kept outcome (a Python call's, :data:`~skyward.jobs.store.RESULT_FILE`),
    or None when none was kept."""
    if (far := _far()) is not None:
        return far.ask("outcome", job.id)  # type: ignore[no-any-return]
    kept = job.directory / RESULT_FILE
    return kept.read_text() if kept.exists() else None
