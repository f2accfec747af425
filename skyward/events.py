"""Typed events a pool emits over its lifetime. Subscribe with ``ComputePool(on_event=...)`` or
``pool.subscribe(callback)``; the console is one such subscriber.

Callbacks run on the pool's threads and must return quickly; an exception in a callback is
reported on stderr and does not disturb the pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

__all__ = [
    "Event",
    "NodeAdded",
    "NodeLog",
    "NodePreempting",
    "NodeRemoved",
    "NodeStage",
    "PoolReady",
    "PoolStarting",
    "PoolStopped",
    "Stage",
    "TaskFinished",
    "TaskOutput",
    "TaskRetried",
    "TaskStarted",
    "TasksSent",
]

Stage = Literal["provisioning", "connecting", "bootstrapping", "starting", "ready", "stopping", "stopped", "lost"]


@dataclass(frozen=True, slots=True)
class PoolStarting:
    """A pool begins to start: ``nodes`` nodes from ``provider``, ``concurrency`` task slots
    each (``None`` when not known: then every task sent to a node counts as running)."""

    pool_id: str
    nodes: int
    provider: str
    concurrency: int | None = None


@dataclass(frozen=True, slots=True)
class NodeStage:
    """A node moved to ``stage`` (``detail`` says more, e.g. the host or the reason)."""

    node: int
    stage: Stage
    detail: str = ""


@dataclass(frozen=True, slots=True)
class NodeLog:
    """A line of a node's bootstrap or worker diagnostics (not task output)."""

    node: int
    line: str


@dataclass(frozen=True, slots=True)
class NodeAdded:
    """An open pool gained node ``node`` (its workers are ready): ``reason`` is
    ``"scale-up: N tasks waiting"`` or ``"replacement"``. A node number comes back after its
    node was removed (a replacement takes the lost node's number)."""

    node: int
    reason: str


@dataclass(frozen=True, slots=True)
class NodeRemoved:
    """Node ``node`` left an open pool, its workers stopped and its machine released (or, when
    ``reason`` starts with ``"replacement failed"``, a lost node could not be replaced).
    ``reason``: ``"idle 60s"``, ``"lost: ..."`` or ``"replacement failed: ..."``."""

    node: int
    reason: str


@dataclass(frozen=True, slots=True)
class NodePreempting:
    """The cloud is taking ``node`` back (a spot machine; one event per node and kind).

    ``kind`` is ``"interruption"``: the machine will ``action`` (``"terminate"``, ``"stop"``
    or ``"hibernate"``) at ``at``, about two minutes after the notice; or ``"rebalance"``: EC2
    recommends moving off it (at elevated risk of interruption, ``action`` None, ``at`` when
    the recommendation was issued). ``at`` is timezone-aware (UTC). ``heard``: when the node's
    worker read the notice (by the node's clock; a notice heard before this client attached is
    told at the attach, with the time it was heard); not compared.
    """

    node: int
    action: str | None
    at: datetime
    kind: Literal["interruption", "rebalance"]
    heard: datetime | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class PoolReady:
    """Every node is ready, ``seconds`` after the pool began to start."""

    pool_id: str
    nodes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class TaskStarted:
    """Task ``task_id`` (a function called ``name``) was sent to ``node``; it runs when a slot
    there is free."""

    task_id: int
    node: int
    name: str


@dataclass(frozen=True, slots=True)
class TasksSent:
    """``count`` tasks of a gather went to ``node`` in one frame (each also has its
    ``TaskStarted``): a gather sends each node its tasks in batches, not a frame a task."""

    node: int
    count: int


@dataclass(frozen=True, slots=True)
class TaskFinished:
    """Task ``task_id`` ended on ``node``: ``ok`` when it returned a result; ``cancelled``
    when the client stopped it (a cancelled future, Ctrl-C, a failed broadcast's other nodes)."""

    task_id: int
    node: int
    name: str
    ok: bool
    seconds: float
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class TaskOutput:
    """One line a task printed (``task_id`` is None for output outside any task), without its
    newline. With ``more``, ``line`` is a piece of a line that goes on in the next TaskOutput of
    the same node, task and stream: a line longer than 64 KiB comes in pieces (never cut), and
    so does a line the task flushed before its end (a progress bar, a prompt)."""

    node: int
    task_id: int | None
    stream: Literal["stdout", "stderr"]
    line: str
    more: bool = False


@dataclass(frozen=True, slots=True)
class TaskRetried:
    """Task ``name`` lost its node (``lost_node``) and is sent again: ``attempt`` of
    ``attempts`` (``@sky.compute(retries=N)``: N + 1 attempts in all)."""

    name: str
    lost_node: int
    attempt: int
    attempts: int


@dataclass(frozen=True, slots=True)
class PoolStopped:
    """The pool is down: ``clean`` when every worker and machine was confirmed released;
    ``interrupted`` when it was stopped by Ctrl-C (KeyboardInterrupt); ``detached`` when this
    client let go of a named cluster, whose workers stay up."""

    pool_id: str
    seconds: float
    clean: bool
    interrupted: bool = False
    detached: bool = False


Event = (PoolStarting | NodeStage | NodeLog | PoolReady | TaskStarted | TaskFinished | TaskOutput | PoolStopped
         | NodePreempting | NodeAdded | NodeRemoved | TaskRetried)
