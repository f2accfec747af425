"""What a task sees on its node: where am I, which data is mine, is this machine going away,
who may print.

Everything here also works outside a pool, where the caller is node 0 of 1. This package is
imported on workers, so it imports nothing heavy. It sits below the pool and the worker: both
import it, it imports neither.

- :mod:`~skyward.runtime.instance`: :class:`InstanceInfo`, :func:`instance_info`;
- :mod:`~skyward.runtime.sharding`: :func:`shard`;
- :mod:`~skyward.runtime.preemption`: :class:`Preemption`, :func:`on_preempt`;
- :mod:`~skyward.runtime.output`: :func:`stdout`, :func:`stderr`, :func:`silent`;
- :mod:`~skyward.runtime.command`: what ``sky.shell`` runs on the node;
- :mod:`~skyward.runtime.cluster`: the folders a named cluster keeps on its nodes.
"""

from __future__ import annotations

from skyward.runtime.instance import ENV_VAR, InstanceInfo, Peer, instance_info
from skyward.runtime.output import silent, stderr, stdout
from skyward.runtime.preemption import Preemption, on_preempt
from skyward.runtime.sharding import shard

__all__ = [
    "ENV_VAR",
    "InstanceInfo",
    "Peer",
    "Preemption",
    "instance_info",
    "on_preempt",
    "shard",
    "silent",
    "stderr",
    "stdout",
]
