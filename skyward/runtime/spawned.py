"""A Python call run as a job of a named cluster (``pool.spawn``), on its node: where its files
live, how large and how long a result is kept, and the node's side of submitting one.

The job is an ordinary entry of the cluster's job queue (:mod:`skyward.runtime.jobqueue`): same
ids, same states, same cancel. Its command runs ``python -m skyward.worker.spawned`` with the
cluster worker's own Python, environment and working directory, so the call finds what a task
of that worker finds. Its files, in the node's job folder (``$SKYWARD_CLUSTER_DIR/jobs/<node>/``,
the cluster worker's private folder):

- ``<id>.call``: the pickled call, written at submit; the runner deletes it once loaded (its
  arguments may hold secrets).
- ``<id>.spawn``: one line of JSON (``{"broadcast": false}``) marking the job as a Python call.
- ``<id>.plugins``: the pool's plugins (a pickled list), when it has any: the runner enters their
  ``around_app`` and ``around_task`` hooks around the call as a worker does around a task
  (:mod:`skyward.worker.spawned`), so a broadcast call on a torch pool runs in a process group;
  the runner deletes it once loaded.
- ``<id>.result``: what the runner kept, a pickle of ``("ok", value)`` or ``("error",
  RemoteFailure)`` (:class:`skyward.messages.RemoteFailure`: type, message, remote traceback).

Guarantees, as the Jobs page documents them:

1. A call whose pickle is over :data:`RESULT_LIMIT` is refused at submit; a result whose pickle
   is over it is not kept: the job FAILS and its result is a :class:`~skyward.JobError` saying
   so (written to the job's log too).
2. A result is kept :data:`KEEP_SECONDS` after its job ended; after that, collecting it raises
   :class:`~skyward.JobError`. Older files are deleted when a later call is spawned on the node,
   and every file when the cluster is torn down.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import sys
import time
from typing import Any

__all__ = ["KEEP_SECONDS", "RESULT_LIMIT", "call_path", "marker_path", "place", "plugins_path", "prune", "result_path"]

#: The most bytes a spawned call's pickle, or its result's, may take (64 MiB).
RESULT_LIMIT = 64 * 1024 * 1024
#: How long a spawned call's result is kept once its job has ended (7 days).
KEEP_SECONDS = 7 * 24 * 3600.0


def call_path(folder: str, job: int) -> str:
    return os.path.join(folder, f"{job}.call")


def marker_path(folder: str, job: int) -> str:
    return os.path.join(folder, f"{job}.spawn")


def plugins_path(folder: str, job: int) -> str:
    return os.path.join(folder, f"{job}.plugins")


def result_path(folder: str, job: int) -> str:
    return os.path.join(folder, f"{job}.result")


def _write_private(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def place(job: int, meta: dict[str, Any], call: bytes, broadcast: bool, env: dict[str, str] | None = None,
          plugins: bytes | None = None) -> None:
    """Broadcast: on the nodes that run job ``job`` (every node for a broadcast, else the head),
    write its call (and ``plugins``, the pool's, pickled) and queue it; its command runs the call
    with this worker's Python and environment, ``env`` added."""
    from skyward.runtime import instance_info
    from skyward.runtime.cluster import jobs_dir
    from skyward.runtime.jobqueue import enqueue

    info = instance_info()
    if info.local_rank or (info.node and not broadcast):
        return
    folder = jobs_dir(info.node)
    prune(folder)
    _write_private(call_path(folder, job), call)
    _write_private(marker_path(folder, job), json.dumps({"broadcast": broadcast}).encode())
    args = [sys.executable, "-m", "skyward.worker.spawned", call_path(folder, job), result_path(folder, job)]
    if plugins:
        _write_private(plugins_path(folder, job), plugins)
        args += [plugins_path(folder, job), "broadcast" if broadcast else "head"]
    enqueue(job, meta, "exec " + shlex.join(args), dict(env or {}), os.getcwd())


def prune(folder: str, now: float | None = None) -> None:
    """Delete the results kept longer than :data:`KEEP_SECONDS` (written when their job ended)."""
    limit = (time.time() if now is None else now) - KEEP_SECONDS
    for path in glob.glob(os.path.join(glob.escape(folder), "*.result")):
        try:
            if os.stat(path).st_mtime < limit:
                os.unlink(path)
        except OSError:
            continue
