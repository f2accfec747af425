"""Managed jobs from Python: ``sky.jobs.launch(train(cfg), nodes=2, provider=...)`` runs a
``@sky.compute`` call as a managed job, and :class:`ManagedJob` is what it returns.

The call is pickled once, when launched (as ``pool.spawn`` pickles it: :mod:`skyward.clusters.spawned`),
and kept in the job's record with the pool's arguments. The controller runs it as it runs a task
file: its launcher (:mod:`skyward.jobs.launcher`) opens the job's named cluster with those
arguments and spawns the call there; a lost node is recovered (a new cluster, the call run again
on every node it runs on), a failed call restarted ``max_restarts_on_errors`` times. When the job
ends the controller keeps every node's outcome (value or exception) in the job's folder before
the cluster goes, so :meth:`ManagedJob.result` works whenever, from any process of this machine.
"""

from __future__ import annotations

import io
import json
import math
import sys
from dataclasses import dataclass
from typing import Any, TypeVar

from skyward.clusters.spawned import Job, Tee, outcome, pickled_call
from skyward.compute import PendingCompute
from skyward.errors import ConfigError
from skyward.job_errors import JobError, JobFailed, JobTimeout
from skyward.jobs import client
from skyward.jobs.store import CANCELLED, CallPlan, JobRecord
from skyward.launch.taskfile.check import Findings
from skyward.launch.taskfile.fields import JobRecovery
from skyward.launch.taskfile.fields import recovery as job_recovery
from skyward.protocol import dumps_by_value
from skyward.runtime.jobqueue import DEFAULT_TASK_CPU_DEMAND

__all__ = ["ManagedJob", "get", "launch", "listed"]

T = TypeVar("T")


@dataclass(frozen=True, repr=False)
class ManagedJob(Job[T]):
    """A managed job (``sky.jobs.launch``): a :class:`~skyward.Job` whose ``id`` is the managed
    job's (``skyward jobs queue``) and whose cluster is the one the controller brought up for it
    (``sky-managed-<id>``, torn down when it ends). Everything is asked of the job's record,
    from any process of this machine, whether the job is running or long over.

    >>> job = sky.jobs.launch(train(cfg), nodes=2, provider=sky.Local())   # doctest: +SKIP
    >>> sky.jobs.get(job.id).result()                 # later, in any process  # doctest: +SKIP
    """

    @property
    def status(self) -> str:
        """PENDING, STARTING, RUNNING, RECOVERING, CANCELLING, SUCCEEDED, CANCELLED, FAILED,
        FAILED_SETUP, FAILED_NO_RESOURCE or FAILED_CONTROLLER (as ``skyward jobs queue`` shows)."""
        return client.get(self.id).status

    def result(self, timeout: float | None = None) -> T:
        """Wait until the job ends (at most ``timeout`` seconds; None: as long as it takes) and
        return the call's value (for ``broadcast=True``, a list, one per node), or raise its
        exception with its type and remote traceback. Raises :class:`~skyward.JobTimeout` when
        ``timeout`` passes first (the job goes on), :class:`~skyward.JobError` for a cancelled
        job, :class:`~skyward.JobFailed` for a job that ended with no outcome kept."""
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 0 <= timeout < math.inf):
            raise ConfigError("timeout", "a number of seconds >= 0, or None (wait as long as the job runs)", timeout)
        try:
            record = client.wait(self.id, timeout)
        except TimeoutError:
            raise JobTimeout(self.cluster, self.id, float(timeout or 0)) from None
        if record.status == CANCELLED:
            raise JobError(self.cluster, self.id, "was cancelled: it has no result")
        kept = client.outcome(record)
        if kept is None:
            raise JobFailed(self.cluster, self.id, record.exit_code,
                            log_tail=[f"{record.status}: {record.reason or 'no outcome was kept'}"])
        parts = {int(node): answer for node, answer in json.loads(kept).items()}
        return outcome(self, parts)  # type: ignore[no-any-return]

    def logs(self, follow: bool = False) -> str:
        """The call's output so far, every run's (``skyward jobs logs ID``), each node's lines as
        ``[node N] ...``. With ``follow``, also written to standard output line by line as the
        job prints them (recoveries included), until the job ends; returns all of it."""
        text = io.StringIO()
        client.logs(self.id, Tee(text, sys.stdout) if follow else text, follow=follow)
        return text.getvalue()

    def cancel(self) -> None:
        """Cancel the job and wait until its cluster is torn down (``skyward jobs cancel ID``);
        :class:`~skyward.JobError` when it has already finished."""
        record = client.get(self.id)
        if record.status not in client.ACTIVE:
            raise JobError(self.cluster, self.id, f"has already finished ({record.status}): there is nothing to "
                                                  "cancel")
        client.cancel([self.id])

    def __repr__(self) -> str:
        return f"<ManagedJob {self.id} ({self.name})>"


def launch(pending: PendingCompute[T], *, nodes: int = 1, provider: Any = None, image: Any = None,
           plugins: Any = (), broadcast: bool = False, recovery: Any = None,
           max_restarts_on_errors: int | None = None) -> ManagedJob[T]:
    """Run ``pending`` (a ``@sky.compute`` call) as a managed job and return it at once.

    The controller (started if none runs) brings up a cluster of ``nodes`` nodes of
    ``provider`` (default :class:`~skyward.Local`) with ``image`` and ``plugins``, runs the call
    on its head node (``broadcast=True``: on every node, as ``@``), recovers the job when a node
    is lost (a new cluster, the call run again), restarts a call that raised as ``recovery``
    says, keeps its outcome and tears the cluster down. ``recovery`` takes what a task file's
    ``resources.job_recovery`` takes: a mapping ``{"max_restarts_on_errors": 2,
    "recover_on_exit_codes": [...], "strategy": ...}`` or a strategy name (``"FAILOVER"``);
    ``max_restarts_on_errors=N`` is short for ``recovery={"max_restarts_on_errors": N}``. The calling
    process may exit as soon as this returns. Raises :class:`~skyward.ConfigError` for bad
    input and :class:`~skyward.SerializationError` for a call that cannot be pickled, before
    anything is recorded.
    """
    if not isinstance(pending, PendingCompute):
        raise ConfigError("pending", "a @sky.compute call, e.g. sky.jobs.launch(train(cfg))", pending)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ConfigError("nodes", "a number of nodes >= 1", nodes)
    if max_restarts_on_errors is not None:
        if recovery is not None:
            raise ConfigError("max_restarts_on_errors", "None when recovery= is given (put it in recovery: "
                              "{'max_restarts_on_errors': N})", max_restarts_on_errors)
        if isinstance(max_restarts_on_errors, bool) or not isinstance(max_restarts_on_errors, int) \
                or max_restarts_on_errors < 0:
            raise ConfigError("max_restarts_on_errors", "a number of restarts >= 0", max_restarts_on_errors)
        recovery = {"max_restarts_on_errors": max_restarts_on_errors}
    restarts = _recovery(recovery)
    from skyward.pool.options import pool_options

    pool_options(provider=provider, nodes=nodes, image=image, plugins=plugins)  # (bad input fails here)
    plan = CallPlan(pending.name, pickled_call(pending),
                    dumps_by_value({"provider": provider, "nodes": nodes, "image": image, "plugins": list(plugins)}),
                    bool(broadcast), nodes, restarts)
    per_node = nodes if broadcast else 1
    job = client.record(plan.name, f"{per_node}x[CPU:{DEFAULT_TASK_CPU_DEMAND:g}]", plan)
    return _handle(client.get(job))


def _recovery(value: Any) -> JobRecovery:
    """``recovery=`` checked as a task file's ``resources.job_recovery`` is; a ConfigError
    naming the part that is wrong."""
    if value is None:
        return JobRecovery()
    found = Findings("recovery")
    kept = job_recovery({"job_recovery": value}, found)
    if found.problems:
        first = found.problems[0]
        name = first.field.replace("resources.job_recovery", "recovery")
        key, given = name.partition(".")[2], {"strategy": value} if isinstance(value, str) else value
        got = value if not key else given[key] if key in given else f"an unknown key {key!r}"
        raise ConfigError(name, first.accepted, got, detail=first.detail)
    return kept or JobRecovery()


def get(job_id: int) -> ManagedJob[Any]:
    """Managed job ``job_id`` (one launched from Python or a task file's);
    :class:`~skyward.ConfigError` naming the ids there are when there is none."""
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise ConfigError("job_id", "a managed job's id (an int, as `skyward jobs queue` shows it)", job_id)
    return _handle(client.get(job_id))


def listed() -> list[ManagedJob[Any]]:
    """Every managed job, oldest first (``skyward jobs queue``; its controller's, wherever it runs)."""
    return [_handle(j) for j in client.jobs()]


def _handle(record: JobRecord) -> ManagedJob[Any]:
    return ManagedJob(record.cluster or f"sky-managed-{record.id}", record.id, record.name)
