"""Detached calls on a named cluster, from Python: ``pool.spawn(train(cfg))`` puts the pickled
call in the cluster's job queue (the queue of ``skyward exec``: same ids, same states, same
``skyward queue`` and ``cancel``) and returns a :class:`Job` at once. The job runs whether or not
a client stays attached; ``pool.job(3)`` and ``pool.jobs()`` get jobs back in any later process.

A :class:`Job` holds only its cluster's name and its id: its status, result, log and cancel ask
the nodes over their transport, as ``skyward queue`` does, so they work attached or not and never
disturb the client that holds the cluster. How the call runs on the node and what is kept:
:mod:`skyward.runtime.spawned`.
"""

from __future__ import annotations

import base64
import io
import json
import math
import pickle
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from skyward.clusters import jobs
from skyward.compute import PendingCompute, compute
from skyward.errors import ClusterError, ConfigError, SerializationError
from skyward.job_errors import JobError, JobFailed, JobTimeout
from skyward.protocol import dumps_by_value
from skyward.runtime.jobqueue import ACTIVE, CANCELLED, DEFAULT_TASK_CPU_DEMAND, SUCCEEDED, new_job
from skyward.runtime.spawned import KEEP_SECONDS, RESULT_LIMIT, place

if TYPE_CHECKING:
    from skyward.providers.base import Instance
    from skyward.pool.pool import ComputePool

__all__ = ["Job", "Tee", "ask", "find", "listed", "outcome", "pickled_call", "queue_call", "spawn"]

T = TypeVar("T")
#: Seconds one ask of a node waits for the job to end there (well under the ask's own limit).
WAIT_STEP = 30.0


@dataclass(frozen=True)
class Job(Generic[T]):
    """A job in a named cluster's queue: a spawned call (``pool.spawn``) or a command
    (``skyward exec``). It holds the cluster's name and the job's id; everything else is asked
    of the cluster when called, from any process, attached to the cluster or not.

    >>> with sky.ComputePool(name="dev") as pool:   # doctest: +SKIP
    ...     job = pool.spawn(train(cfg))             # returns at once: Job 3 of cluster 'dev'
    >>> # ... later, in any process:
    >>> with sky.ComputePool(name="dev") as pool:   # doctest: +SKIP
    ...     model = pool.job(3).result()

    Attributes:
        cluster: the cluster's name.
        id: the job's id in that cluster's queue (1, 2, 3...).
        name: the job's name (the function's, or the task file's).
    """

    cluster: str
    id: int
    name: str = field(default="", compare=False)

    @property
    def status(self) -> str:
        """The job's state now: PENDING, SETTING_UP, RUNNING, SUCCEEDED, FAILED, FAILED_SETUP
        or CANCELLED (as ``skyward queue`` shows it)."""
        return _row(self.cluster, self.id).status

    def result(self, timeout: float | None = None) -> T:
        """Wait for the job to end (at most ``timeout`` seconds; None: as long as it runs) and
        return its result.

        A spawned call gives its return value (for ``broadcast=True``, a list, one per node in
        node order) or raises its exception, rebuilt with its type and the remote traceback as a
        note (as ``>>`` does). A command job (``skyward exec``) gives its exit code, 0, or raises
        :class:`~skyward.JobFailed` (exit code, node, last lines of its log). Raises
        :class:`~skyward.JobTimeout` when ``timeout`` passes first (the job goes on), and
        :class:`~skyward.JobError` for a cancelled job or a result no longer kept.
        """
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 0 <= timeout < math.inf):
            raise ConfigError("timeout", "a number of seconds >= 0, or None (wait as long as the job runs)", timeout)
        record = jobs.cluster_record(self.cluster)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_STEP if deadline is None else max(0.0, min(WAIT_STEP, deadline - time.monotonic()))
            parts = ask(record, self.id, left)
            if not parts:
                raise _unknown(self.cluster, self.id)
            if all(p["status"] not in ACTIVE for p in parts.values()):
                return outcome(self, parts)
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeout(self.cluster, self.id, float(timeout or 0))

    def logs(self, follow: bool = False) -> str:
        """The job's output so far, every node's lines as ``[node N] ...`` (``skyward logs``).
        With ``follow``, also wait until the job has ended, writing the lines to standard output
        as they come; returns all of it."""
        _row(self.cluster, self.id)
        text = io.StringIO()
        jobs.logs(self.cluster, self.id, Tee(text, sys.stdout) if follow else text, follow=follow)
        return text.getvalue()

    def cancel(self) -> None:
        """End the job: every process it started, on every node, confirmed gone; it is then
        CANCELLED (``skyward cancel``). Raises :class:`~skyward.JobError` when the job has
        already finished."""
        row = _row(self.cluster, self.id)
        if row.status not in ACTIVE:
            raise JobError(self.cluster, self.id, f"has already finished ({row.status}): there is nothing to cancel")
        _, problems = jobs.cancel(self.cluster, [self.id])
        if problems:
            raise ClusterError(self.cluster, f"cancel of job {self.id} not confirmed: " + "; ".join(problems),
                               way_out=f"see `skyward queue {self.cluster}`")

    def __repr__(self) -> str:
        return f"<Job {self.id} of cluster {self.cluster!r}" + (f" ({self.name})>" if self.name else ">")


class Tee(io.TextIOBase):
    """Lines kept and shown as they come (``logs(follow=True)``)."""

    def __init__(self, *outs: Any):
        self.outs = outs

    def write(self, text: str) -> int:
        for out in self.outs:
            out.write(text)
        return len(text)

    def flush(self) -> None:
        for out in self.outs:
            out.flush()


def pickled_call(pending: PendingCompute[Any]) -> bytes:
    """``pending`` pickled (by value) to be run as a job; :class:`~skyward.SerializationError`
    naming what cannot be pickled, or when the pickle is over the limit a job's call may take."""
    try:
        call = dumps_by_value(pending)
    except Exception as exc:
        pending.payload()  # (raises naming the argument that cannot be pickled)
        raise SerializationError(f"the call {pending.name}()", "a picklable call", pending,
                                 detail=f"{type(exc).__name__}: {exc}") from exc
    if len(call) > RESULT_LIMIT:
        raise SerializationError(f"the call {pending.name}()", f"a call whose pickle takes at most "
                                 f"{RESULT_LIMIT // 2**20} MiB", f"{len(call) / 2**20:.1f} MiB",
                                 detail="a spawned call waits on the cluster until it runs: pass a path or a "
                                        "location in storage rather than the data")
    return call


def spawn(pool: ComputePool, pending: PendingCompute[Any], broadcast: bool) -> Job[Any]:
    """Put ``pending`` in cluster ``pool.name``'s queue: run on the head node, or with
    ``broadcast`` on every node; returns the job at once."""
    return queue_call(pool, pickled_call(pending), pending.name, broadcast)


def queue_call(pool: ComputePool, call: bytes, name: str, broadcast: bool, env: dict[str, str] | None = None) -> Job[Any]:
    """Put the pickled call ``call`` (:func:`pickled_call`) in cluster ``pool.name``'s queue,
    run with the pool's plugins' hooks and the variables ``env`` added to the node's."""
    nodes = (len(pool.instances) or pool.nodes) if broadcast else 1
    cpu = DEFAULT_TASK_CPU_DEMAND
    meta = {"name": name, "cpus": cpu, "gpus": 0.0, "nodes": nodes, "resources": f"{nodes}x[CPU:{cpu:g}]"}
    ids = compute(name="number the job")(new_job)(meta) @ pool
    job = next(i for i in ids if i)
    plugins = dumps_by_value(list(pool.plugins)) if pool.plugins else None
    compute(name=f"queue job {job}")(place)(job, meta, call, broadcast, env, plugins) @ pool
    return Job(str(pool.name), job, name)


def find(name: str, job: object) -> Job[Any]:
    """Job ``job`` (an id, or a :class:`Job`) of cluster ``name``; :class:`~skyward.JobError`
    when the cluster has no such job or the job is another cluster's."""
    if isinstance(job, Job):
        if job.cluster != name:
            raise JobError(job.cluster, job.id, f"is a job of cluster {job.cluster!r}, not of {name!r} (this pool's)",
                           way_out=f"get it from a pool of cluster {job.cluster!r}, or pass its id to this one's")
        job = job.id
    if isinstance(job, bool) or not isinstance(job, int):
        raise ConfigError("job", "a job id (an int, as `skyward queue` shows it) or a sky.Job", job)
    row = _row(name, job)
    return Job(name, row.id, row.name)


def listed(name: str) -> list[Job[Any]]:
    """Cluster ``name``'s jobs, oldest first (those ``skyward queue -a`` shows)."""
    return [Job(name, r.id, r.name) for r in jobs.jobs(name)]


def _row(name: str, job: int) -> jobs.JobRow:
    found = jobs.jobs(name)
    row = next((r for r in found if r.id == job), None)
    if row is None:
        raise _unknown(name, job, [r.id for r in found])
    return row


def _unknown(name: str, job: int, known: list[int] | None = None) -> JobError:
    if known is None:
        known = [r.id for r in jobs.jobs(name)]
    have = f"its jobs are {', '.join(map(str, known))}" if known else "its queue is empty"
    return JobError(name, job, f"no such job ({have})", way_out=f"`skyward queue {name} -a` lists them")


def ask(record: Any, job: int, wait: float) -> dict[int, dict[str, Any]]:
    """Every node's part of ``job`` (node -> the queue tool's answer), each node waiting up to
    ``wait`` seconds for its part to end; nodes without a part are left out."""
    parts: dict[int, dict[str, Any]] = {}
    lock = threading.Lock()

    def one(inst: Instance) -> None:
        code, out = jobs.run_tool(record, inst, "result", str(job), f"{wait:.3f}")
        if code == 0:
            with lock:
                parts[inst.node] = json.loads(out)

    jobs.each_node(record, one)
    return parts


def outcome(job: Job[Any], parts: dict[int, dict[str, Any]]) -> Any:
    """The result of a job that has ended on every node (or the error it ended with), from every
    node's answer (:func:`ask`)."""
    ordered = sorted(parts.items())
    if any(p["status"] == CANCELLED for _, p in ordered):
        raise JobError(job.cluster, job.id, "was cancelled: it has no result")
    spawned = next((p["spawn"] for _, p in ordered if p["spawn"] is not None), None)
    if spawned is None:  # a command job: its exit code
        failed = next(((node, p) for node, p in ordered if p["status"] != SUCCEEDED), None)
        if failed is not None:
            node, p = failed
            raise JobFailed(job.cluster, job.id, p["exit_code"], node=node, log_tail=p["tail"])
        return 0
    values = []
    for node, p in ordered:
        if p["expired"]:
            raise JobError(job.cluster, job.id, f"its result is no longer kept (a result is kept "
                           f"{KEEP_SECONDS / 86400:g} days after its job ended)")
        if p["result"] is None:
            raise JobFailed(job.cluster, job.id, p["exit_code"], node=node, log_tail=p["tail"])
        kind, value = pickle.loads(base64.b64decode(p["result"]))
        if kind == "error":
            raise value.rebuild(node)
        values.append(value)
    return values if spawned["broadcast"] else values[0]
