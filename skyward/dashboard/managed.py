"""The managed jobs (``skyward jobs``) as the dashboard shows them: the queue, one job's log as
it grows, and cancel, through the functions ``skyward jobs queue``, ``logs`` and ``cancel`` use.

Guarantees:

1. Listing reads the jobs' database as ``skyward jobs queue`` does (a controller killed while it
   had work is started again, as there); where no managed job was ever submitted, nothing is
   made on disk.
2. A job's log is what ``skyward jobs logs`` prints: every attempt's saved output (lines as
   ``[node N] ...``), then the running attempt's, read from its cluster's nodes after the byte
   offsets the page carries (``n<node>``), as a cluster job's is. The page carries an offset per
   saved attempt too (``r<attempt>``), and which attempt it followed live (``a``): that one's
   saved copy is not shown again (as ``logs --follow`` does not print it twice).
3. Cancel asks the controller to cancel the job and returns at once; the page shows CANCELLING,
   then CANCELLED once the controller has ended it and torn its cluster down.
"""

from __future__ import annotations

from typing import Any

from skyward._home import home
from skyward.clusters import jobs as cluster_jobs
from skyward.clusters.state import ClusterStore
from skyward.dashboard import costs
from skyward.errors import SkywardError

__all__ = ["cancel", "log", "queue"]

#: At most this many bytes of a saved attempt's log per poll (the rest with the next).
CHUNK = 1 << 20


def _known() -> bool:
    return (home() / "managed" / "jobs.db").exists()


def queue() -> list[dict[str, Any]]:
    """Every managed job, newest first, as ``skyward jobs queue --json`` lists it, with its cost."""
    if not _known():
        return []
    from skyward.jobs import client
    from skyward.jobs.store import ACTIVE

    store = ClusterStore()
    out = []
    for job in reversed(client.jobs()):
        live = store.get(job.cluster) if job.cluster and job.status in ACTIVE else None
        out.append({**job.as_dict(), "active": job.status in ACTIVE,
                    "cost": costs.managed_cost(job.cluster, job.submitted, live)})
    return out


def _saved(path: Any, offset: int) -> tuple[list[str], int]:
    """The whole lines of file ``path`` after byte ``offset`` (at most :data:`CHUNK`), and the
    offset after them."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(CHUNK)
    taken = data if len(data) < CHUNK else data[:data.rfind(b"\n") + 1]
    return taken.decode(errors="replace").splitlines(), offset + len(taken)


def log(job_id: int, seen: dict[str, int]) -> dict[str, Any]:
    """Managed job ``job_id``'s lines not yet shown (``seen``: what the page carries), the new
    offsets, and the job's row."""
    from skyward.jobs.store import ACTIVE, RUNNING, JobStore

    job = JobStore().get(job_id) if _known() else None
    if job is None:
        return {"error": f"no managed job {job_id}", "job": None}
    lines: list[dict[str, Any]] = []
    kept = dict(seen)
    followed = seen.get("a", 0)
    for attempt in range(1, job.attempt + 1):
        path = job.directory / f"run-{attempt}.log"
        if attempt != followed and path.exists():
            text, kept[f"r{attempt}"] = _saved(path, seen.get(f"r{attempt}", 0))
            lines += [{"node": None, "text": t} for t in text]
    running = job.status == RUNNING and job.cluster and job.cluster_job is not None
    if running and not (job.directory / f"run-{job.attempt}.log").exists():
        if followed != job.attempt:  # (a new attempt: its nodes' logs from their start)
            kept = {k: v for k, v in kept.items() if not k.startswith("n")}
        offsets = {int(k[1:]): v for k, v in kept.items() if k.startswith("n")}
        try:
            parts = cluster_jobs.log_since(job.cluster or "", job.cluster_job or 0, offsets)
        except SkywardError:
            parts = {}  # (its cluster went: the controller keeps the attempt's log)
        for node in sorted(parts):
            lines += [{"node": node, "text": t} for t in parts[node][0]]
            kept[f"n{node}"] = parts[node][1]
        if parts:
            kept["a"] = job.attempt
    return {"job": job.as_dict(), "active": job.status in ACTIVE, "lines": lines, "seen": kept}


def cancel(job_id: int) -> list[str]:
    """Ask the controller to cancel managed job ``job_id``; the problems (none: asked)."""
    from skyward.jobs import controller
    from skyward.jobs.store import ACTIVE, JobStore

    job = JobStore().get(job_id) if _known() else None
    if job is None:
        return [f"no managed job {job_id}"]
    if job.status not in ACTIVE:
        return [f"managed job {job_id} was not cancelled (it is {job.status})"]
    JobStore().request_cancel(job_id)
    controller.ensure()
    controller.wake()
    return []
