"""What a task on a named cluster's node finds there: the folder of the cluster's worker
(``SKYWARD_CLUSTER_DIR``), and in it the logs and pid files of its jobs (:mod:`skyward.runtime.jobqueue`). The worker
sets the variable; the job queue and the worker's autostop read it.
"""

from __future__ import annotations

import os

from skyward._procs import alive

__all__ = ["AUTOSTOPPED", "CLUSTER_DIR", "CONTROL_SUFFIX", "DETACHED_NEEDS", "jobs_dir", "running_jobs"]

#: What a detached run needs (the error's ``accepted`` when it has none).
DETACHED_NEEDS = "True only on a named cluster (skyward launch -c NAME -d; a run goes on without its client there)"
#: The environment variable naming the directory of the cluster worker's socket (on the node).
CLUSTER_DIR = "SKYWARD_CLUSTER_DIR"
#: The cluster worker's control socket is its socket's path with this added: ``skyward status``
#: and ``skyward autostop`` ask there (one line, one answer), which is no use of the cluster.
CONTROL_SUFFIX = ".ctl"
#: The exit code of a cluster's worker that ended by its autostop (its keepers exit the same):
#: a worker that is a job step runs the provider's release after it (Slurm: scancel).
AUTOSTOPPED = 75


def jobs_dir(node: int) -> str:
    """Where node ``node``'s jobs keep their logs and pid files
    (``<socket dir>/jobs/<node>``: the nodes of a Local cluster share one machine)."""
    base = os.environ.get(CLUSTER_DIR)
    if not base:
        from skyward.errors import ConfigError

        raise ConfigError("detach_run", DETACHED_NEEDS, True, detail="this is not a named cluster's worker")
    path = os.path.join(base, "jobs", str(node))
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def running_jobs() -> list[int]:
    """The pids of this cluster's jobs still running on this machine."""
    import glob

    base = os.environ.get(CLUSTER_DIR)
    if not base:
        return []
    running = []
    for pid_file in glob.glob(os.path.join(glob.escape(base), "jobs", "*", "*.pid")):
        try:
            with open(pid_file) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if alive(pid):
            running.append(pid)
    return running

