"""Job recovery for ``skyward launch``: SkyPilot's ``resources.job_recovery``.

A task file that sets ``job_recovery`` runs on a pool that replaces a lost node
(``ComputePool(replace_lost=True)``). While its ``run`` block runs:

* a node lost or preempted (its worker gone: :class:`~skyward.WorkerLost`) is replaced by the
  pool; once the replacement is up every worker is restarted (so each node's
  ``SKYPILOT_NODE_IPS`` and the head address name the new set), the files are synced again,
  ``setup`` runs on the new node(s) only, and ``run`` starts again on every node with the same
  ``SKYPILOT_TASK_ID``. A run script that resumes from its own checkpoint carries on from there.
  This happens each time, up to :data:`MAX_RECOVERIES` times in one launch;
* a run that fails (a non-zero exit on some node) starts again on every node up to
  ``max_restarts_on_errors`` times, and whenever its exit code is one of
  ``recover_on_exit_codes`` (up to :data:`MAX_RECOVERIES` times).

Each recovery is one line on stderr. Ctrl-C and the exit status are as without recovery.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from skyward.events import Event
    from skyward.launch.taskfile.fields import JobRecovery
    from skyward.pool.pool import ComputePool

__all__ = ["MAX_RECOVERIES", "run_with_recovery", "only_on"]

#: Recoveries for lost nodes (and for listed exit codes) in one launch, beyond which the error
#: is reported as it is: a node that is lost again and again (out of memory, say) must end.
MAX_RECOVERIES = 10


def only_on(nodes: Iterable[int], script: str) -> str:
    """``script`` guarded to run on the nodes ``nodes`` only (the others exit 0 at once)."""
    listed = " ".join(str(n) for n in sorted(nodes))
    return f'case " {listed} " in *" $SKYPILOT_NODE_RANK "*) ;; *) exit 0 ;; esac\n{script}'


def run_with_recovery(pool: ComputePool, recovery: JobRecovery | None, run: Callable[[], None],
                      prepare: Callable[[set[int]], None], err: IO[str]) -> None:
    """Run ``run()`` (the task's run block on every node) as ``recovery`` (a
    :class:`~skyward.launch.taskfile.fields.JobRecovery`, or None: once) says; ``prepare(new_nodes)``
    syncs files and runs setup on the nodes a replacement brought."""
    from skyward import events as ev
    from skyward.errors import CommandFailed, ConnectionLost

    if recovery is None:
        run()
        return
    added: set[int] = set()

    def note(event: Event) -> None:
        if isinstance(event, ev.NodeAdded):
            added.add(event.node)

    unsubscribe = pool.subscribe(note)
    errors_left = recovery.max_restarts_on_errors
    recoveries = 0
    try:
        while True:
            try:
                run()
                return
            except CommandFailed as exc:
                code = exc.exit_code
                listed = code in recovery.recover_on_exit_codes
                if listed and recoveries < MAX_RECOVERIES:
                    recoveries += 1
                    why = f"exit code {code} is in recover_on_exit_codes"
                elif errors_left > 0:
                    errors_left -= 1
                    used = recovery.max_restarts_on_errors - errors_left
                    why = f"restart {used} of max_restarts_on_errors={recovery.max_restarts_on_errors}"
                else:
                    raise
                err.write(f"skyward: job recovery: the run failed on node {exc.node} (exit code {code}); "
                          f"starting it again on every node ({why})\n")
            except ConnectionLost as exc:
                if recoveries >= MAX_RECOVERIES:
                    exc.add_note(f"skyward: job recovery gave up after {MAX_RECOVERIES} recoveries")
                    raise
                recoveries += 1
                err.write(f"skyward: job recovery: node {exc.node} was lost during the run; replacing it "
                          f"and starting the run again on every node (recovery {recoveries} of at most "
                          f"{MAX_RECOVERIES})\n")
                pool.wait_ready()
                pool.restart_workers()  # every node's variables name the new set of nodes
                new, added_now = set(added), added
                added_now.clear()
                prepare(new)
    finally:
        unsubscribe()
