"""One launch of a managed job: ``python -m skyward.jobs.launcher JOB``, started by the
controller, in a session of its own, with its output in the job's controller log.

It brings up the job's cluster (``sky-managed-<id>``, a named cluster that tears itself down
after :data:`SAFETY_IDLE_MINUTES` idle minutes, should its controller never come back), runs
setup there, puts the run in the cluster's job queue (detached: it goes on without this
process) with the job's own ``SKYPILOT_TASK_ID`` and ``SKYWARD_TASK_ID`` (the same on every node
and every recovery, a task file's run or a Python call alike), writes how it
went in the job's row (``launch_result``: the phase reached, the cluster's job id, the exit
status) and exits. The controller reads that row; it never waits on this process.

SIGTERM (a cancel while launching) is taken as an interrupt: the launch unwinds and the
cluster, as far as it got, is left to the controller to tear down.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import sys
from dataclasses import replace
from typing import Any, NoReturn

from skyward.jobs.store import CallPlan

__all__ = ["SAFETY_IDLE_MINUTES", "launch", "main"]

#: The idle minutes after which a managed job's cluster tears itself down (no job running on
#: it, no client attached): what ends it if its controller is gone for good.
SAFETY_IDLE_MINUTES = 5.0


class _KeptStderr(io.StringIO):
    """The launch's stderr: written to the log and kept (its last line names a failure)."""

    def __init__(self, out: Any):
        super().__init__()
        self.out = out

    def write(self, text: str) -> int:
        self.out.write(text)
        self.out.flush()
        return super().write(text)


def launch(job: int) -> dict[str, Any]:
    """Launch job ``job`` as its row says; returns (and records) the launch's result."""
    from skyward.jobs.store import JobStore
    from skyward.launch import execute

    store = JobStore()
    found = store.get(job)
    if found is None or found.cluster is None:
        raise SystemExit(f"skyward: no managed job {job}")
    p = pickle.loads(found.plan)
    env = {"SKYPILOT_TASK_ID": found.task_id, "SKYWARD_TASK_ID": found.task_id, "SKYWARD_MANAGED_JOB_ID": str(job)}
    if isinstance(p, CallPlan):
        result = launch_call(found.cluster, p, env)
        store.update(job, launch_result=json.dumps(result))
        return result
    p = replace(p, envs={**p.envs, **env}, job_recovery=None, autostop=None)  # (recovery is the controller's)
    if found.cwd and os.path.isdir(found.cwd):
        os.chdir(found.cwd)
    progress: list[Any] = []
    err = _KeptStderr(sys.stderr)
    cluster = {"name": found.cluster, "idle_minutes": SAFETY_IDLE_MINUTES, "down": True, "provider_given": True,
               "shape_given": True}
    try:
        code = execute(p, console=False, err=err, cluster=cluster, detach_run=True, progress=progress)
    except KeyboardInterrupt:
        code = 130
    last = err.getvalue().strip().splitlines()
    result = {"code": code, "phase": progress[0] if progress else "provision",
              "job": progress[1] if len(progress) > 1 else None, "error": last[-1][-500:] if last else ""}
    store.update(job, launch_result=json.dumps(result))
    return result


def launch_call(cluster: str, p: CallPlan, env: dict[str, str]) -> dict[str, Any]:
    """Bring up cluster ``cluster`` with the pool arguments of ``p`` and spawn its call there
    (a job of the cluster's queue, which goes on without this process, its variables ``env``
    added); the launch's result."""
    from skyward.clusters.spawned import queue_call
    from skyward.pool import ComputePool

    phase, job, code, error = "provision", None, 0, ""
    try:
        with ComputePool(name=cluster, idle_minutes=SAFETY_IDLE_MINUTES, down=True, console=False,
                         **pickle.loads(p.pool)) as pool:
            phase = "run"
            job = queue_call(pool, p.call, p.name, p.broadcast, env).id
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:
        code, error = 1, f"{type(exc).__name__}: {exc}"[-500:]
        print(f"skyward: {error}", file=sys.stderr, flush=True)
    return {"code": code, "phase": phase, "job": job, "error": error}


def _interrupted(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _interrupted)
    result = launch(int(argv[0]))
    return 0 if result["code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
