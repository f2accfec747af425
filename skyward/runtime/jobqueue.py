"""A named cluster's job queue, on its nodes (as SkyPilot's job queue).

Every ``skyward launch -c`` / ``exec`` run on a cluster is a *job*: an id from the head node (1,
2, 3... per cluster), and on every node an entry in that node's queue, a small SQLite database in
the cluster worker's 0700 folder (``$SKYWARD_CLUSTER_DIR/jobs.db``; the head's holds the ids). It
lives on the cluster, not on the laptop: it outlives the client that submitted, and any
``skyward`` process reaches it over the node's transport (:mod:`skyward.runtime.jobtool` runs
there as a script).

The cluster worker (each node's first process) starts a job when the node has room, in
submission order: a job's demand is its task's accelerators and cpus (with neither,
:data:`DEFAULT_TASK_CPU_DEMAND`), a node's room its CPUs and accelerators (worker processes stand
in for accelerators where there are none, as ``SKYPILOT_NUM_GPUS_PER_NODE`` says); a job that
does not fit waits PENDING, and so do the ones behind it. A job with a setup block runs it
first (SETTING_UP; FAILED_SETUP with its exit code when it fails), then its run (RUNNING), both
holding the job's room. Each command runs under the command
guardian (``runtime/_reaper.py``), a child of the worker, so it ends with the cluster and a
cancel ends every process it started; a thread of the worker keeps its exit code and starts what
waits next (no client needed).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sqlite3

PENDING, SETTING_UP, RUNNING = "PENDING", "SETTING_UP", "RUNNING"
SUCCEEDED, FAILED, FAILED_SETUP, CANCELLED = "SUCCEEDED", "FAILED", "FAILED_SETUP", "CANCELLED"
#: A job that had not ended when its node's worker went away (the cluster was stopped): it will
#: never end by itself (SkyPilot's name for it).
FAILED_DRIVER = "FAILED_DRIVER"
ACTIVE = (PENDING, SETTING_UP, RUNNING)  # (a job that has not ended)
#: What a task with no accelerators and no cpus asks of a node (SkyPilot's default).
DEFAULT_TASK_CPU_DEMAND = 0.5
#: The queue's database, in the cluster worker's folder.
DATABASE = "jobs.db"
#: The file in that folder naming the path of :mod:`skyward.runtime.jobtool` on the node.
TOOL = "jobqueue.path"
#: Seconds a cancelled job's processes get between SIGTERM and SIGKILL.
GRACE = 5.0
FOLLOW_POLL = 0.2  # (seconds between looks at a followed log that has no new bytes)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, submitted REAL,
    cpus REAL, gpus REAL, resources TEXT, nodes INTEGER);
CREATE TABLE IF NOT EXISTS tasks (job INTEGER, node INTEGER, status TEXT, exit_code INTEGER, pid INTEGER,
    owner INTEGER, started REAL, ended REAL, spec TEXT, cancelling INTEGER DEFAULT 0, PRIMARY KEY (job, node));
"""
_lock = threading.Lock()  # (one scheduler at a time in this process; SQLite orders the processes)


def _here(name: str) -> str:  # (a file of skyward, by its path)
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), *name.split("/"))


def _load_procs() -> ModuleType:
    """skyward's /proc reader (in the queue's script, run with ``python -I -S``, the copy that
    :mod:`skyward.runtime.jobtool` loaded by its path)."""
    try:
        from skyward import _procs
    except ImportError:
        return sys.modules["_skyward_procs"]
    return _procs


def connect(base: str) -> sqlite3.Connection:
    """The queue in folder ``base`` (made, mode 0600, if new)."""
    import sqlite3  # (here: the worker loads this module, and needs SQLite only on a cluster)

    path = os.path.join(base, DATABASE)
    if not os.path.exists(path):
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.executescript(_SCHEMA)
    return conn


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def log_path(base: str, node: int, job: int) -> str:  # (next to the pid files of runtime.cluster)
    return os.path.join(base, "jobs", str(node), f"{job}.log")


# -- the worker's side: called as tasks of the client that submits ----------------------------


def _cluster_dir() -> str:
    from skyward.runtime.cluster import jobs_dir

    jobs_dir(0)  # (raises naming what is needed when this is no cluster's worker)
    return os.environ["SKYWARD_CLUSTER_DIR"]


def capacity() -> tuple[float, float]:
    """(cpus, accelerators) of this node, as the queue counts them."""
    from skyward.runtime import instance_info

    info = instance_info()
    return float(len(os.sched_getaffinity(0))), float(info.accelerators or info.processes_per_node)


def _check_fits(meta: dict[str, Any]) -> None:
    from skyward.errors import ConfigError
    from skyward.runtime import instance_info

    cpus, gpus = capacity()
    for field, want, have in (("resources.accelerators", meta["gpus"], gpus), ("resources.cpus", meta["cpus"], cpus)):
        if want > have:
            raise ConfigError(field, f"at most {have:g} (what node {instance_info().node} of the cluster has)",
                              meta["resources"], detail="the job could never start on this cluster")


def new_job(meta: dict[str, Any]) -> int | None:
    """Broadcast: every node checks that the job fits it; the head numbers it (None elsewhere)."""
    from skyward.runtime import instance_info

    info = instance_info()
    if info.local_rank:
        return None
    _check_fits(meta)
    if info.node:
        return None
    base = _cluster_dir()
    conn = connect(base)
    try:
        with _transaction(conn):
            cur = conn.execute("INSERT INTO jobs (name, submitted, cpus, gpus, resources, nodes) VALUES (?,?,?,?,?,?)",
                               (meta["name"], time.time(), meta["cpus"], meta["gpus"], meta["resources"],
                                meta["nodes"]))
        return int(cur.lastrowid or 0)
    finally:
        conn.close()


def enqueue(job: int, meta: dict[str, Any], command: str, env: dict[str, str], cwd: str | None,
            setup: str | None = None) -> None:
    """Broadcast: put job ``job`` in this node's queue (``setup``: a block run first), and start it
    if the node has room."""
    from skyward.runtime import instance_info

    info = instance_info()
    if info.local_rank:
        return
    base = _cluster_dir()
    _name_tool(base)
    node_env = {k: v for k, v in os.environ.items() if k.startswith(("SKYWARD_", "SKYPILOT_"))}
    spec = json.dumps({"command": command, "setup": setup, "cwd": cwd,
                       "env": {**node_env, **env, "SKYWARD_JOB_ID": str(job)}})
    conn = connect(base)
    try:
        with _transaction(conn):
            conn.execute("INSERT OR IGNORE INTO jobs (id, name, submitted, cpus, gpus, resources, nodes) "
                         "VALUES (?,?,?,?,?,?,?)", (job, meta["name"], time.time(), meta["cpus"], meta["gpus"],
                                                    meta["resources"], meta["nodes"]))
            conn.execute("INSERT INTO tasks (job, node, status, owner, spec) VALUES (?,?,?,?,?)",
                         (job, info.node, PENDING, os.getpid(), spec))
    finally:
        conn.close()
    schedule(base, info.node)


def _name_tool(base: str) -> None:
    """Name this worker's :mod:`~skyward.runtime.jobtool` in folder ``base`` (:data:`TOOL`): replaced
    whole, and only when it changed (a follower reads it as the job is being queued)."""
    path, tool = os.path.join(base, TOOL), _here("runtime/jobtool.py")
    with contextlib.suppress(OSError), open(path) as f:
        if f.read() == tool:
            return
    with open(f"{path}.{os.getpid()}", "w") as f:
        f.write(tool)
    os.replace(f"{path}.{os.getpid()}", path)


def schedule(base: str, node: int) -> None:
    """Start node ``node``'s pending jobs that fit, in submission order (the first that does not
    fit holds the ones behind it)."""
    room = capacity()
    with _lock:
        conn = connect(base)
        try:
            with _transaction(conn):
                _reconcile(conn, _load_procs())
                rows = conn.execute("SELECT t.job, t.status, t.spec, j.cpus, j.gpus FROM tasks t JOIN jobs j "
                                    "ON j.id = t.job WHERE t.node = ? AND t.status IN (?,?,?) ORDER BY t.job",
                                    (node, *ACTIVE)).fetchall()
                cpus = room[0] - sum(r["cpus"] for r in rows if r["status"] != PENDING)
                gpus = room[1] - sum(r["gpus"] for r in rows if r["status"] != PENDING)
                for r in rows:
                    if r["status"] != PENDING:
                        continue
                    if r["cpus"] > cpus + 1e-9 or r["gpus"] > gpus + 1e-9:
                        break
                    cpus, gpus = cpus - r["cpus"], gpus - r["gpus"]
                    spec = json.loads(r["spec"])
                    _start(conn, base, node, r["job"], spec, SETTING_UP if spec.get("setup") else RUNNING)
        finally:
            conn.close()


def _start(conn: sqlite3.Connection, base: str, node: int, job: int, spec: dict[str, Any], phase: str) -> None:
    """Start a job's setup (``phase`` SETTING_UP) or run (RUNNING) under its guardian; a thread
    keeps its end (run in a transaction)."""
    from skyward.runtime.command import write_script

    log = log_path(base, node, job)
    os.makedirs(os.path.dirname(log), mode=0o700, exist_ok=True)
    status_r, status_w = os.pipe()
    control_r, control_w = os.pipe()  # (closed by the thread at the end, or by the kernel with this worker)
    cwd = os.path.expanduser(spec["cwd"]) if spec["cwd"] else None
    env = {**os.environ, **spec["env"]}
    try:
        # the command travels as a file the guardian holds open (see runtime.command): any size
        script = write_script(spec["setup"] if phase == SETTING_UP else spec["command"], env.get("TMPDIR"))
        try:
            with open(log, "ab") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", _here("runtime/_reaper.py"), _here("_procs.py"), str(GRACE),
                     "/bin/bash", str(script), str(status_w)], stdin=control_r, stdout=out, stderr=subprocess.STDOUT,
                    env=env, cwd=cwd, pass_fds=(status_w, script), start_new_session=True)
        finally:
            os.close(script)
    except OSError as exc:
        for fd in (status_r, status_w, control_r, control_w):
            os.close(fd)
        with open(log, "a") as out:
            out.write(f"skyward: cannot start the job: {exc}\n")
        conn.execute("UPDATE tasks SET status=?, exit_code=127, started=?, ended=?, spec=NULL WHERE job=? AND node=?",
                     (FAILED_SETUP if phase == SETTING_UP else FAILED, time.time(), time.time(), job, node))
        return
    os.close(status_w)
    os.close(control_r)
    with open(os.path.join(base, "jobs", str(node), f"{job}.pid"), "w") as f:
        f.write(str(proc.pid))
    # (the spec stays until the run has started; STARTED is the run's start, as SkyPilot's)
    conn.execute("UPDATE tasks SET status=?, pid=?, owner=?, started=?, spec=? WHERE job=? AND node=?",
                 (phase, proc.pid, os.getpid(), time.time() if phase == RUNNING else None,
                  json.dumps(spec) if phase == SETTING_UP else None, job, node))
    threading.Thread(target=_watch, args=(base, node, job, proc, status_r, control_w, phase),
                     name=f"skyward-job-{job}", daemon=True).start()


def _watch(base: str, node: int, job: int, proc: subprocess.Popen[bytes], status_r: int, control_w: int,
           phase: str) -> None:
    """Wait for a job's guardian to report, keep the exit code; after a setup that succeeded start
    the run, else start what waits next."""
    with os.fdopen(status_r) as status:
        line = status.readline().split()
    proc.wait()
    os.close(control_w)
    with contextlib.suppress(OSError):  # (autostop looks at the live ones)
        os.unlink(os.path.join(base, "jobs", str(node), f"{job}.pid"))
    code = int(line[0]) if line else (proc.returncode or 1)
    code = code if code >= 0 else 128 - code
    conn = connect(base)
    try:
        with _transaction(conn):
            row = conn.execute("SELECT status, cancelling, spec FROM tasks WHERE job=? AND node=?", (job, node)).fetchone()
            if phase == SETTING_UP and code == 0 and row["status"] == SETTING_UP and not row["cancelling"]:
                _start(conn, base, node, job, json.loads(row["spec"]), RUNNING)
                return
            failed = FAILED_SETUP if phase == SETTING_UP else FAILED
            # (a cancelled job is CANCELLED only now: its guardian has confirmed its tree gone)
            conn.execute("UPDATE tasks SET status=CASE WHEN cancelling THEN ? ELSE ? END, spec=NULL WHERE job=? "
                         "AND node=? AND status=?", (CANCELLED, SUCCEEDED if code == 0 else failed, job, node, phase))
            conn.execute("UPDATE tasks SET exit_code=?, ended=? WHERE job=? AND node=?", (code, time.time(), job, node))
    finally:
        conn.close()
    schedule(base, node)


def _reconcile(conn: sqlite3.Connection, procs: ModuleType) -> None:
    """Jobs whose worker is gone (the cluster was stopped) will never end by themselves:
    FAILED_DRIVER, as SkyPilot marks the jobs a stop or a reboot cut short."""
    for r in conn.execute("SELECT job, node, owner FROM tasks WHERE status IN (?,?,?)", ACTIVE).fetchall():
        if not r["owner"] or not procs.alive(r["owner"]):
            conn.execute("UPDATE tasks SET status=?, ended=?, spec=NULL WHERE job=? AND node=?",
                         (FAILED_DRIVER, time.time(), r["job"], r["node"]))


def jobs_in_use() -> bool:
    """Whether this cluster has work going on here (the resident worker's autostop waits for it):
    a job pending or running in its queue, or a detached run's process alive."""
    from skyward.runtime.cluster import CLUSTER_DIR, running_jobs

    base = os.environ.get(CLUSTER_DIR)
    return bool(base) and (active(str(base)) or bool(running_jobs()))


def active(base: str) -> bool:
    """Whether this folder's queue holds a job that has not ended (autostop waits for it)."""
    if not os.path.exists(os.path.join(base, DATABASE)):
        return False
    procs = _load_procs()
    conn = connect(base)
    try:
        owners = conn.execute("SELECT DISTINCT owner FROM tasks WHERE status IN (?,?,?)", ACTIVE).fetchall()
    finally:
        conn.close()
    return any(r["owner"] and procs.alive(r["owner"]) for r in owners)
