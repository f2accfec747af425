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

from skyward._retry import Backoff, retry
from skyward.errors import CommandFailed, ConnectionLost

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

    if recovery is None:
        run()
        return
    added: set[int] = set()

    def note(event: Event) -> None:
        if isinstance(event, ev.NodeAdded):
            added.add(event.node)

    budget = _Budget(recovery)

    def again(attempt: int, exc: BaseException, pause: float) -> None:
        err.write(budget.take(exc))
        if isinstance(exc, ConnectionLost):
            pool.wait_ready()
            pool.restart_workers()  # every node's variables name the new set of nodes
            new = set(added)
            added.clear()
            prepare(new)

    unsubscribe = pool.subscribe(note)
    try:  # no pause between runs: the budgets alone end the recoveries
        retry(run, Backoff(delay=0.0), on=(CommandFailed, ConnectionLost), giveup=budget.spent, on_retry=again)
    finally:
        unsubscribe()


class _Budget:
    """What is left of a launch's recoveries: lost nodes and listed exit codes share
    :data:`MAX_RECOVERIES`; other failed runs use ``max_restarts_on_errors``."""

    def __init__(self, recovery: JobRecovery):
        self.restarts = recovery.max_restarts_on_errors
        self.codes = recovery.recover_on_exit_codes
        self.errors_left = self.restarts
        self.recoveries = 0

    def _listed(self, exc: BaseException) -> bool:
        return isinstance(exc, CommandFailed) and exc.exit_code in self.codes and self.recoveries < MAX_RECOVERIES

    def spent(self, exc: BaseException) -> bool:
        """True when ``exc`` ends the launch (a lost node past the limit gets a note saying so)."""
        if isinstance(exc, CommandFailed):
            return not self._listed(exc) and self.errors_left <= 0
        if self.recoveries >= MAX_RECOVERIES:
            exc.add_note(f"skyward: job recovery gave up after {MAX_RECOVERIES} recoveries")
            return True
        return False

    def take(self, exc: BaseException) -> str:
        """Use one recovery for ``exc`` (not :meth:`spent`); the line that says so."""
        if isinstance(exc, CommandFailed):
            code = exc.exit_code
            if self._listed(exc):
                self.recoveries += 1
                why = f"exit code {code} is in recover_on_exit_codes"
            else:
                self.errors_left -= 1
                why = f"restart {self.restarts - self.errors_left} of max_restarts_on_errors={self.restarts}"
            return (f"skyward: job recovery: the run failed on node {exc.node} (exit code {code}); "
                    f"starting it again on every node ({why})\n")
        assert isinstance(exc, ConnectionLost)
        self.recoveries += 1
        return (f"skyward: job recovery: node {exc.node} was lost during the run; replacing it "
                f"and starting the run again on every node (recovery {self.recoveries} of at most "
                f"{MAX_RECOVERIES})\n")
