"""The managed jobs' records: one SQLite database under the skyward home
(``$SKYWARD_HOME/managed/jobs.db``, mode 0600), written by the clients that submit and cancel,
by the controller and by its launchers, and read by every ``skyward jobs`` command.

A job's row is all the controller needs to pick it up again after its own restart: the plan it
runs (pickled when submitted: later edits of the task file change nothing), where it is (its
state, its cluster and that cluster's job id, the launcher at work), what it has used (its
recoveries and restarts) and whether its cluster has been torn down (``cleaned``). A state is
one of SkyPilot's managed-job states (:data:`STATES`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyward._home import home

if TYPE_CHECKING:
    from skyward.launch.taskfile.fields import JobRecovery

__all__ = ["ACTIVE", "FINAL", "RESULT_FILE", "STATES", "CallPlan", "JobRecord", "JobStore", "folder"]

PENDING, STARTING, RUNNING, RECOVERING, CANCELLING = "PENDING", "STARTING", "RUNNING", "RECOVERING", "CANCELLING"
SUCCEEDED, CANCELLED, FAILED, FAILED_SETUP = "SUCCEEDED", "CANCELLED", "FAILED", "FAILED_SETUP"
FAILED_NO_RESOURCE, FAILED_CONTROLLER = "FAILED_NO_RESOURCE", "FAILED_CONTROLLER"
#: A job that has not ended.
ACTIVE = (PENDING, STARTING, RUNNING, RECOVERING, CANCELLING)
#: How a job ends.
FINAL = (SUCCEEDED, CANCELLED, FAILED, FAILED_SETUP, FAILED_NO_RESOURCE, FAILED_CONTROLLER)
STATES = ACTIVE + FINAL

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, resources TEXT,
    plan BLOB NOT NULL, cwd TEXT, task_id TEXT, submitted REAL, started REAL, ended REAL, status TEXT NOT NULL,
    recoveries INTEGER DEFAULT 0, restarts INTEGER DEFAULT 0, run_seconds REAL DEFAULT 0, running_since REAL,
    cluster TEXT, cluster_job INTEGER, attempt INTEGER DEFAULT 0, launcher INTEGER, launch_result TEXT,
    exit_code INTEGER, cancel INTEGER DEFAULT 0, cleaned INTEGER DEFAULT 0, reason TEXT);
"""


#: Every node's outcome of a Python call's last run, kept in the job's folder as it ends.
RESULT_FILE = "result.json"


@dataclass(frozen=True)
class CallPlan:
    """The plan of a managed job whose run is a Python call (:mod:`skyward.jobs.calls`)."""

    name: str
    call: bytes  # (pickled by value, once, when launched)
    pool: bytes  # (the ComputePool arguments, pickled by value: provider, nodes, image, plugins)
    broadcast: bool
    nodes: int
    job_recovery: JobRecovery | None = None


def folder() -> Path:
    """Where the managed jobs live on this machine: ``$SKYWARD_HOME/managed`` (made, 0700)."""
    path = home() / "managed"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


@dataclass(frozen=True)
class JobRecord:
    """One managed job as its row says."""

    id: int
    name: str
    resources: str
    plan: bytes
    cwd: str
    task_id: str
    submitted: float
    started: float | None
    ended: float | None
    status: str
    recoveries: int
    restarts: int
    run_seconds: float
    running_since: float | None
    cluster: str | None
    cluster_job: int | None
    attempt: int
    launcher: int | None
    launch_result: str | None
    exit_code: int | None
    cancel: int
    cleaned: int
    reason: str | None

    @property
    def job_duration(self) -> float:
        """Seconds it has run (recoveries and launches not counted)."""
        return self.run_seconds + (time.time() - self.running_since if self.running_since else 0.0)

    @property
    def total_duration(self) -> float:
        """Seconds since it was submitted (until it ended)."""
        return (self.ended or time.time()) - self.submitted

    @property
    def directory(self) -> Path:
        """Its folder: the controller's log of it and its saved run logs."""
        path = folder() / str(self.id)
        path.mkdir(mode=0o700, exist_ok=True)
        return path

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "resources": self.resources, "submitted": self.submitted,
                "started": self.started, "ended": self.ended, "total_duration": round(self.total_duration, 3),
                "job_duration": round(self.job_duration, 3), "recoveries": self.recoveries,
                "status": self.status, "exit_code": self.exit_code, "cluster": self.cluster,
                "task_id": self.task_id, "reason": self.reason}


_COLUMNS = [f.name for f in fields(JobRecord)]


class JobStore:
    """The database of managed jobs (every call its own short connection: many processes use it)."""

    def __init__(self, path: Path | None = None):
        self.path = path or folder() / "jobs.db"
        if not self.path.exists():
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        with self._connect() as conn:
            conn.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            yield conn
        finally:
            conn.close()

    def add(self, name: str, resources: str, plan: bytes, cwd: str) -> int:
        """A new PENDING job; its id."""
        with self._connect() as conn:
            now = time.time()
            cur = conn.execute("INSERT INTO jobs (name, resources, plan, cwd, submitted, status) VALUES (?,?,?,?,?,?)",
                               (name, resources, plan, cwd, now, PENDING))
            job = int(cur.lastrowid or 0)
            stamp = time.strftime("%Y-%m-%d-%H-%M-%S", time.localtime(now))
            # (SkyPilot's managed jobs: the same id on every run of the job, recoveries included)
            conn.execute("UPDATE jobs SET task_id=?, cluster=? WHERE id=?",
                         (f"sky-managed-{stamp}_{name}_{job}", f"sky-managed-{job}", job))
            return job

    def get(self, job: int) -> JobRecord | None:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM jobs WHERE id=?", (job,)).fetchone()
        return None if row is None else JobRecord(**{k: row[k] for k in _COLUMNS})

    def all(self) -> list[JobRecord]:
        """Every job, oldest first."""
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM jobs ORDER BY id").fetchall()
        return [JobRecord(**{k: r[k] for k in _COLUMNS}) for r in rows]

    def unsettled(self) -> list[JobRecord]:
        """The jobs the controller still has work for: not ended, or ended with a cluster up."""
        return [j for j in self.all() if j.status in ACTIVE or not j.cleaned]

    def update(self, job: int, *, when: str | None = None, **values: Any) -> bool:
        """Set ``values`` on job ``job`` (only while its state is ``when``, if given); whether it did."""
        sets = ", ".join(f"{k}=?" for k in values)
        where, args = ("id=?", [job]) if when is None else ("id=? AND status=?", [job, when])
        with self._connect() as conn:
            cur = conn.execute(f"UPDATE jobs SET {sets} WHERE {where}", [*values.values(), *args])
            return cur.rowcount > 0

    def request_cancel(self, job: int) -> str | None:
        """Mark job ``job`` to be cancelled; its state then (None: no such job). A job that has
        ended is left as it is."""
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute("SELECT status FROM jobs WHERE id=?", (job,)).fetchone()
                if row is not None and row["status"] in ACTIVE:
                    conn.execute("UPDATE jobs SET cancel=1, status=? WHERE id=?", (CANCELLING, job))
            finally:
                conn.execute("COMMIT")
        return None if row is None else str(row["status"])
