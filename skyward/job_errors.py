"""The errors of a named cluster's jobs (``pool.spawn``, ``pool.job``; :mod:`skyward.clusters.spawned`),
under Skyward's one root (:mod:`skyward.errors` draws the whole tree)::

    SkywardError
    └── JobError          a cluster job cannot be found, cancelled or collected as asked
        ├── JobFailed     a job ended without a result: a command's non-zero exit
        └── JobTimeout    a job did not finish within ``result(timeout=...)`` (it goes on)
"""

from __future__ import annotations

from collections.abc import Sequence

from skyward.errors import SkywardError, _exit_text, _tail

__all__ = ["JobError", "JobFailed", "JobTimeout"]


class JobError(SkywardError):
    """Job ``job`` of cluster ``cluster`` cannot be used as asked: there is no such job, it is a
    job of another cluster, it has already finished (cancel), it was cancelled or its result is
    not kept (result). ``problem`` says which; the message ends with the way out."""

    def __init__(self, cluster: str, job: int, problem: str, *, way_out: str = ""):
        self.cluster = cluster
        self.job = job
        self.problem = problem
        self.way_out = way_out
        super().__init__(f"job {job} of cluster {cluster!r}: {problem}" + (f"; {way_out}" if way_out else ""))

    def __reduce__(self):  # keyword-only fields survive pickling
        return (_rebuild_job_error, (type(self), self.cluster, self.job, self.problem, self.way_out))


def _rebuild_job_error(cls, cluster, job, problem, way_out):
    error = JobError.__new__(cls)
    JobError.__init__(error, cluster, job, problem, way_out=way_out)
    return error


class JobFailed(JobError):
    """A job ended without a result: a command job (``skyward exec``) that exited non-zero on a
    node, or a spawned call whose process died before it could keep one. ``exit_code`` is the
    first failing node's, ``node`` that node, ``log_tail`` the last lines of its output."""

    def __init__(self, cluster: str, job: int, exit_code: int | None, *, node: int | None = None,
                 log_tail: Sequence[str] = ()):
        self.exit_code = exit_code
        self.node = node
        self.log_tail = list(log_tail)
        where = f" on node {node}" if node is not None else ""
        how = _exit_text(exit_code) if exit_code is not None else "no exit code"
        problem = f"FAILED{where} ({how})"
        if self.log_tail:
            problem += "\n  last output:\n" + _tail(self.log_tail)
        super().__init__(cluster, job, problem)

    def __reduce__(self):
        return (_rebuild_job_failed, (self.cluster, self.job, self.exit_code, self.node, self.log_tail))


def _rebuild_job_failed(cluster, job, exit_code, node, log_tail):
    return JobFailed(cluster, job, exit_code, node=node, log_tail=log_tail)


class JobTimeout(JobError, TimeoutError):
    """A job did not finish within the ``timeout`` (seconds) given to ``result()``; the job goes
    on (collect it later, or cancel it)."""

    def __init__(self, cluster: str, job: int, timeout: float):
        self.timeout = timeout
        super().__init__(cluster, job, f"not finished within {timeout:g}s (it goes on)",
                         way_out="call result() again later, or cancel() it")

    def __reduce__(self):
        return (JobTimeout, (self.cluster, self.job, self.timeout))
