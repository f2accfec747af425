"""The provider contract: acquire machines, describe them, release them.

A provider knows nothing about Python environments, transports or tasks: each instance it
returns says how it is reached and where its environment goes, and the pool does the rest
the same way for every provider (skyward.pool.prepare). Guarantees:

1. ``provision`` returns exactly ``spec.nodes`` instances, or raises
   :class:`~skyward.errors.ProvisionError` having released whatever it acquired.
2. ``terminate`` releases every instance it is given and returns only once the release is
   confirmed (or raises saying which instances are not confirmed).
3. ``validate`` rejects a spec this provider cannot serve before anything is acquired.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

# Described here, defined below both layers: the transports reach what an Instance says, and
# must not import the providers that make them.
from skyward.machine import HostEnvironment, Instance, SSHAddress

__all__ = ["HostEnvironment", "Instance", "PoolSpec", "Provider", "SSHAddress"]


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What the pool asks a provider for.

    Attributes:
        pool_id: the pool's id (tags, names of per-pool cloud resources).
        nodes: how many machines.
        accelerator: the parsed accelerator per node, or ``None``.
        concurrency: task slots per node.
        cluster: the named cluster this pool provisions (its machines outlive the client),
            or None for an ordinary pool.
        cluster_down: with ``cluster``: its autostop ends it (machines released), not only stops it.
    """

    pool_id: str
    nodes: int
    accelerator: Any = None
    concurrency: int = 1
    cluster: str | None = None
    cluster_down: bool = False


class Provider(ABC):
    """Acquires, describes and releases machines. Nothing else: the pool reaches and prepares
    every machine the same way, from what its :class:`Instance` says."""

    #: Short name used in messages and by plugins (``PoolInfo.provider``).
    name: str = "provider"

    def validate(self, spec: PoolSpec) -> None:  # noqa: B027 - optional
        """Raise ConfigError for a spec this provider cannot serve."""

    @abstractmethod
    def provision(self, spec: PoolSpec) -> list[Instance]:
        """Acquire ``spec.nodes`` machines and describe each as an :class:`Instance`, in node order.

        On failure, release whatever was acquired before raising (``ProvisionError``,
        ``CapacityError``, ``ConfigError``).
        """

    @abstractmethod
    def terminate(self, instances: list[Instance]) -> None:
        """Release ``instances`` and confirm they are gone; raise if that cannot be confirmed."""

    def rendezvous_port(self, spec: PoolSpec) -> int:
        """The port node 0 offers for framework rendezvous (``head_port``)."""
        return 29500
