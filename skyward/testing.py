"""Test hooks: the few internals skyward's own tests and benchmarks look at, each by a name.

**Not part of the API.** Nothing here is covered by the stability promise of ``import skyward``
and its documented paths: a name may change or go in any release, without notice. Skyward's
tests and benchmarks touch no ``_``-prefixed name of skyward (``tests/test_source_rules.py``
fails on one); what they must see from inside, and no public call shows, comes from here, so
an internal that changes is changed here once.

Importing this module loads nothing heavy: torch and boto3 load only inside the hooks that
need them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from skyward.console import Console
    from skyward.pool import ComputePool
    from skyward.pool.connection import NodeConnection
    from skyward.providers.aws import AWS
    from skyward.providers.aws.launch import PoolState

__all__ = ["AwsBookkeeping", "aws_bookkeeping", "connection", "console_backlog", "device_record",
           "device_sessions", "forget_preemptions"]


def connection(pool: ComputePool, node: int) -> NodeConnection:
    """The client's end of node ``node``'s first worker process (``received_bytes``, ``pid``...)."""
    return pool._connection(node)


@dataclass(frozen=True)
class AwsBookkeeping:
    """What an AWS provider keeps, in this process, about the pools it launched (the live objects)."""

    #: pool id -> its state: private files (``directory``, ``key_path``), the launch ``summary``...
    pools: dict[str, PoolState]
    #: instance id -> the id of the pool it belongs to.
    owners: dict[str, str]
    #: Guards both.
    lock: threading.Lock


def aws_bookkeeping(provider: AWS) -> AwsBookkeeping:
    return AwsBookkeeping(provider._pools, provider._owner, provider._lock)


def console_backlog(console: Console) -> int:
    """Characters of the lines a live console holds, waiting for the terminal to take them."""
    return sum(len(text) for _, text in list(console._pending))


def forget_preemptions() -> None:
    """Forget every preemption notice and ``on_preempt`` callback of this process."""
    from skyward.runtime import preemption

    preemption._reset()


def device_record(device: Any) -> Any:
    """The client's record of a remote ``sky:N`` device (a ``torch.device``): its link to the
    node, its peer address, the operations it sent."""
    from skyward.torch import _backend

    return _backend._devices[device.index]


def device_sessions() -> list[Any]:
    """(On a node, inside a task) the remote-device sessions this worker holds, with their tensors."""
    from skyward.torch import _server

    return list(_server._sessions.values())
