"""What runs a worker's tasks: threads of the worker (:mod:`.threads`, the default) or long-lived
child processes (:mod:`.processes`).

The interface to the agent, and running one task, are in :mod:`.base`; the agent picks an
executor with :func:`make_executor` from its SETUP message.
"""

from __future__ import annotations

from skyward.plugins._base import Plugin
from skyward.worker.executors.base import Executor, Send, SendOutput, StopTask, Task, TaskSource, run_task
from skyward.worker.executors.threads import ThreadExecutor

__all__ = [
    "Executor", "Send", "SendOutput", "StopTask", "Task", "TaskSource", "ThreadExecutor", "make_executor", "run_task",
]


def make_executor(kind: str, concurrency: int, plugins: tuple[Plugin, ...], send: Send,
                  send_output: SendOutput) -> Executor:
    """``kind`` is ``"process"`` (a child process per slot) or ``"thread"`` (the default)."""
    if kind == "process":
        # Imported only here: multiprocessing adds ~4 ms to every worker's start.
        from skyward.worker.executors.processes import ProcessExecutor

        return ProcessExecutor(concurrency, plugins, send, send_output)
    return ThreadExecutor(concurrency, plugins, send, send_output)
