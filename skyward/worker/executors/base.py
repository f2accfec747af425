"""What every executor shares: the interface to the agent, and running one task.

An executor runs the tasks the agent reads (:mod:`skyward.worker.agent`). It knows the agent
only through this interface, never by import:

1. The agent calls :meth:`Executor.start` once, with a :class:`TaskSource` (itself). The
   executor's own threads call ``source.next_task()``, which reads frames, handles every
   message that is not a task (PING, CANCEL, SHUTDOWN) and returns the next task, or None
   once serving is over: then the executor's readers end.
2. Results, errors and output go back through the ``send`` / ``send_output`` callables the
   executor was built with (a failed send ends the worker: nothing is raised to the task).
3. The agent asks :meth:`Executor.idle` whether it may poll for the next frame without taking
   a CPU from a running task, passes CANCEL on as :meth:`Executor.cancel`, spot preemption
   notices as :meth:`Executor.preempting`, and ends with :meth:`Executor.shutdown`.

A task's answer is exactly one RESULT or one ERROR frame (:func:`run_task`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import pickle

from skyward.runtime import instance as runtime_instance, output as runtime_output
from skyward.errors import SerializationError, TaskCancelled
from skyward.messages import RemoteFailure
from skyward.plugins._base import Plugin, wrap_task
from skyward.protocol import Kind, Payload, dumps_payload, loads_payload
from skyward.worker.output import LineSink, SendOutput

__all__ = ["Executor", "Send", "SendOutput", "StopTask", "Task", "TaskSource", "run_task"]

#: A task as its TASK frame brings it: (task id, name, payload parts).
Task = tuple[int, str, list[Any]]
#: Writes one frame to the client: ``send(control, payload or None)``.
Send = Callable[[tuple, Payload | None], None]


class TaskSource(Protocol):
    def next_task(self) -> Task | None:
        """Read until a task arrives (returned) or serving is over (None)."""


class Executor(Protocol):
    def start(self, source: TaskSource) -> None:
        """Start reading tasks from ``source`` and running them; returns at once."""

    def idle(self) -> bool:
        """True if no task is running or waiting (the reader may spin without slowing one)."""

    def cancel(self, task_id: int) -> None:
        """Stop a running task (it answers TaskCancelled), or drop it if it has not started."""

    def shutdown(self, grace: float) -> None:
        """Drop tasks that have not started, stop running ones, give them ``grace`` seconds."""

    def preempting(self, notice: Any) -> None:
        """A preemption notice the worker took (:func:`skyward.runtime.preemption.deliver`): hand it to
        every other process that runs tasks, now and later (their tasks' ``on_preempt``)."""


class StopTask(BaseException):
    """Raised inside a task's thread to stop it; the task is answered with TaskCancelled.

    Not an error type and never seen outside the worker: the one exception the client (and so
    the user) sees for a stopped task is :class:`skyward.TaskCancelled`. It derives from
    BaseException so that a task's own ``except Exception`` cannot swallow the stop.
    """


_functions: dict[bytes, Callable[..., Any]] = {}
_FUNCTION_CACHE_SIZE = 256


def resolve_function(blob: bytes) -> Callable[..., Any]:
    """Unpickle a task's function once per distinct pickle (see compute.function_blob)."""
    fn = _functions.get(blob)
    if fn is None:
        fn = pickle.loads(blob)  # (cloudpickle's by-value parts import it as they load)
        if len(_functions) >= _FUNCTION_CACHE_SIZE:
            _functions.pop(next(iter(_functions)))
        _functions[blob] = fn
    return fn


def run_task(
    plugins: tuple[Plugin, ...], task_id: int, name: str, parts: list[Any], send: Send, send_output: SendOutput
) -> None:
    """Unpickle, wrap with the plugins' ``around_task``, call; answer RESULT or ERROR.

    The task's output goes to a sink of its own, so two tasks running side by side keep their
    lines (and their silencing) apart.
    """
    sink = LineSink(send_output, task_id)
    token = runtime_output.task_sink.set(sink)
    try:
        try:
            blob, args, kwargs = loads_payload(parts)
            result = wrap_task(plugins, resolve_function(blob))(*args, **kwargs)
        except StopTask:
            sink.close()
            stopped = TaskCancelled(name, node=runtime_instance.instance_info().node)
            send((Kind.ERROR, task_id, RemoteFailure.of(stopped)), None)
            return
        except BaseException as exc:
            sink.close()
            send((Kind.ERROR, task_id, RemoteFailure.of(exc)), None)
            return
        sink.close()
        try:
            payload = dumps_payload(result)
        except Exception as exc:
            err = SerializationError(
                "return value", "a picklable value", type(result).__name__,
                detail=f"{type(exc).__name__}: {exc}",
            )
            send((Kind.ERROR, task_id, RemoteFailure.of(err)), None)
            return
        send((Kind.RESULT, task_id), payload)
    finally:
        runtime_output.task_sink.reset(token)
