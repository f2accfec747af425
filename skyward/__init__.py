"""Skyward: run ordinary Python functions on a pool of machines, then tear everything down.

>>> import skyward as sky
>>> @sky.compute
... def hello(name: str) -> str:
...     return f"hello {name} from node {sky.instance_info().node}"
>>> with sky.ComputePool(nodes=2) as pool:     # doctest: +SKIP
...     hello("you") @ pool
['hello you from node 0', 'hello you from node 1']

Importing skyward is light: every public name is loaded on first use, so a worker (which
imports skyward too) pays only for what its tasks touch, and boto3, paramiko and torch are
imported only where they are needed (the SSH and AWS providers, the torch plugin).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from skyward import accelerators, integrations, jobs, plugins
    from skyward.compute import ComputeFunction, PendingCompute, PendingGather, gather
    from skyward.errors import (
        BootstrapError,
        CapacityError,
        ClusterBusy,
        ClusterError,
        CommandFailed,
        ConfigError,
        ConnectionLost,
        DeviceError,
        PluginError,
        ProvisionError,
        RemoteError,
        SerializationError,
        SkywardError,
        SlurmTimeLimit,
        TaskCancelled,
        TaskTimeout,
        WorkerLost,
    )
    from skyward._secrets import Secret
    from skyward.clusters.spawned import Job
    from skyward.job_errors import JobError, JobFailed, JobTimeout
    from skyward.image import Image
    from skyward.plugins._base import PoolInfo, Plugin
    from skyward.pool import ComputePool
    from skyward.providers.aws import AWS
    from skyward.providers.local import Local
    from skyward.providers.slurm import Slurm
    from skyward.providers.ssh import SSH
    from skyward.runtime import (
        InstanceInfo,
        Peer,
        Preemption,
        instance_info,
        on_preempt,
        shard,
        silent,
        stderr,
        stdout,
    )
    from skyward._shell import CommandResult, shell

# Bound eagerly: ``skyward.compute`` is also the name of a submodule, and importing that
# submodule would otherwise leave the module (not the decorator) as ``sky.compute``. (No other
# public name is a submodule's: ``sky.shell`` lives in ``skyward._shell`` for that reason.)
from skyward.compute import compute

from skyward._version import __version__
from skyward._features import features as _features


def _open_named(name: Any, idle_minutes: Any, down: Any, shape: dict[str, Any]) -> Any:
    from skyward.clusters.session import open_named

    return open_named(name, idle_minutes, down, shape)


def _open_device(pool: Any, kind: str, node: int) -> Any:
    from skyward.torch._device import open_device

    return open_device(pool, kind, node)


# Named clusters and the remote device are built on pools, which may not import them: the
# public face, which every import of skyward runs first, hands them to the pool.
_features.open_named = _open_named
_features.open_device = _open_device

# public name -> the module that defines it (a module itself when the value is None)
_WHERE: dict[str, str] = {
    "accelerators": "skyward.accelerators",
    "integrations": "skyward.integrations",
    "jobs": "skyward.jobs",
    "plugins": "skyward.plugins",
    **dict.fromkeys(["ComputeFunction", "PendingCompute", "PendingGather", "compute", "gather"], "skyward.compute"),
    **dict.fromkeys(
        [
            "BootstrapError", "CapacityError", "ClusterBusy", "ClusterError", "CommandFailed", "ConfigError", "ConnectionLost", "DeviceError", "PluginError",
            "ProvisionError", "RemoteError", "SerializationError", "SkywardError", "SlurmTimeLimit", "TaskCancelled",
            "TaskTimeout", "WorkerLost",
        ],
        "skyward.errors",
    ),
    "Image": "skyward.image",
    **dict.fromkeys(["CommandResult", "shell"], "skyward._shell"),
    "Secret": "skyward._secrets",
    "Job": "skyward.clusters.spawned",
    **dict.fromkeys(["JobError", "JobFailed", "JobTimeout"], "skyward.job_errors"),
    "PoolInfo": "skyward.plugins._base",
    "Plugin": "skyward.plugins._base",
    "ComputePool": "skyward.pool",
    "AWS": "skyward.providers.aws",
    "Local": "skyward.providers.local",
    "SSH": "skyward.providers.ssh",
    "Slurm": "skyward.providers.slurm",
    **dict.fromkeys(
        ["InstanceInfo", "Peer", "Preemption", "instance_info", "on_preempt", "shard", "silent", "stderr", "stdout"],
        "skyward.runtime"
    ),
}
_MODULES = {"accelerators", "integrations", "jobs", "plugins"}

__all__ = sorted([*(n for n in _WHERE if n != "accelerators"), "__version__"])


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'skyward' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    value = loaded if name in _MODULES else getattr(loaded, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
