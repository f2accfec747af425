"""Skyward: run ordinary Python functions on a pool of machines, then tear everything down.

>>> import skyward as sky
>>> @sky.compute
... def hello(name: str) -> str:
...     return f"hello {name} from node {sky.instance_info().node}"
>>> with sky.ComputePool(nodes=2) as pool:     # doctest: +SKIP
...     hello("you") @ pool
['hello you from node 0', 'hello you from node 1']

Importing skyward is light: it loads neither boto3, paramiko nor torch. Those are imported
where they are needed (the SSH and AWS providers, the torch plugin on the worker).
"""

from __future__ import annotations

from typing import Any

from skyward import integrations, plugins
from skyward.compute import ComputeFunction, PendingCompute, PendingGather, compute, gather
from skyward.errors import (
    BootstrapError,
    CapacityError,
    ConfigError,
    ConnectionLost,
    PluginError,
    ProvisionError,
    RemoteError,
    SerializationError,
    SkywardError,
    TaskCancelled,
    TaskTimeout,
    WorkerLost,
)
from skyward.image import Image
from skyward.plugin import Cluster, Plugin
from skyward.pool import ComputePool
from skyward.providers import Local
from skyward.runtime import InstanceInfo, Peer, instance_info, shard, silent, stderr, stdout

__version__ = "0.1.0"

__all__ = [
    "AWS",
    "BootstrapError",
    "CapacityError",
    "Cluster",
    "ComputeFunction",
    "ComputePool",
    "ConfigError",
    "ConnectionLost",
    "Image",
    "InstanceInfo",
    "Local",
    "Peer",
    "PendingCompute",
    "PendingGather",
    "Plugin",
    "PluginError",
    "ProvisionError",
    "RemoteError",
    "SSH",
    "SerializationError",
    "SkywardError",
    "TaskCancelled",
    "TaskTimeout",
    "WorkerLost",
    "__version__",
    "compute",
    "gather",
    "instance_info",
    "integrations",
    "plugins",
    "shard",
    "silent",
    "stderr",
    "stdout",
]


def __getattr__(name: str) -> Any:
    # Providers and modules with heavy dependencies load on first use.
    if name == "accelerators":
        import skyward.accelerators as accelerators

        return accelerators
    if name == "AWS":
        from skyward.providers.aws import AWS

        return AWS
    if name == "SSH":
        from skyward.providers.ssh import SSH

        return SSH
    raise AttributeError(f"module 'skyward' has no attribute {name!r}")
