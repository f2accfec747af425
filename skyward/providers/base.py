"""The provider contract: acquire machines, describe them, release them.

A provider knows nothing about Python environments, transports or tasks: each instance it
returns says how it is reached and where its environment goes, and the pool does the rest
the same way for every provider (skyward.pool.prepare). Guarantees:

1. ``provision`` returns exactly ``spec.nodes`` instances, or raises
   :class:`~skyward.errors.ProvisionError` having released whatever it acquired.
2. ``terminate`` releases every instance it is given and returns only once the release is
   confirmed (or raises saying which instances are not confirmed).
3. ``validate`` rejects a spec this provider cannot serve before anything is acquired.
4. ``acquire`` (providers that can grow a pool: ``can_acquire`` is True) returns one more
   machine per node number asked for while the pool runs, or raises
   :class:`~skyward.errors.ProvisionError` (:class:`~skyward.errors.CapacityError` when
   there is no capacity left) having released whatever it acquired. *Capacity* is what the
   provider can still hand out: Local, unbounded; SSH, the hosts of its list the pool does
   not hold; a cloud, what the region's quota and the market give. ``release`` gives back
   some of those machines while the pool runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from collections.abc import Callable
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
        max_nodes: an elastic pool (``nodes=(min, max)``): the most machines it may hold at
            once (``nodes`` is then ``min``, what ``provision`` acquires); None for a fixed pool.
    """

    pool_id: str
    nodes: int
    accelerator: Any = None
    concurrency: int = 1
    cluster: str | None = None
    cluster_down: bool = False
    max_nodes: int | None = None


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

    def provision_waiting(self, spec: PoolSpec, report: Callable[[str], None], timeout: float) -> list[Instance]:
        """:meth:`provision`, for a provider whose machines may wait in a queue (a batch
        scheduler's): ``report`` gets a line whenever what it waits for changes, and the wait
        is given up after ``timeout`` seconds (CapacityError, nothing left acquired).
        Default: :meth:`provision`, which does not wait."""
        return self.provision(spec)

    @abstractmethod
    def terminate(self, instances: list[Instance]) -> None:
        """Release ``instances`` and confirm they are gone; raise if that cannot be confirmed."""

    #: Whether :meth:`acquire` is implemented: only such a provider serves an elastic pool
    #: (``nodes=(min, max)``, or ``replace_lost=True``).
    can_acquire: bool = False

    def acquire(self, spec: PoolSpec, nodes: list[int], exclude: frozenset[str]) -> list[Instance]:
        """Acquire one more machine for each of the node numbers ``nodes`` while the pool runs,
        in that order, never one whose instance id is in ``exclude`` (those the pool holds, and
        those it lost). Raise :class:`~skyward.errors.CapacityError` when there is no capacity
        left, having released whatever was acquired."""
        from skyward.errors import ConfigError

        raise ConfigError("nodes", f"a fixed number of nodes with {self.name} (it cannot add machines to a "
                          "running pool)", "an elastic pool")

    def release(self, instances: list[Instance]) -> None:
        """Release some machines of a running pool (an elastic pool's node, released or lost)
        and confirm it; what the pool shares (a cloud's key pair, firewall rules) stays until
        :meth:`terminate`. Default: :meth:`terminate` them."""
        self.terminate(instances)

    def end_pool(self, pool_id: str, instances: list[Instance]) -> None:
        """Release everything of pool ``pool_id`` and confirm it: ``instances`` and what the
        pool shares, also once it holds no machine (an elastic pool whose last node was lost).
        Default: :meth:`terminate` ``instances``."""
        self.terminate(instances)

    def explainer(self, instance: Instance) -> Callable[[Any], Any] | None:
        """How to explain the loss of ``instance``'s worker, for a provider that knows more than
        the pool does (a batch scheduler that ended the job): a function given the
        :class:`~skyward.errors.WorkerLost` that returns the error to raise instead (a WorkerLost
        saying more, whose node ``replace_lost`` replaces; any other error is the pool's end,
        never replaced) or None to keep it. None (the default): losses are as the pool saw them."""
        return None

    def rendezvous_port(self, spec: PoolSpec) -> int:
        """The port node 0 offers for framework rendezvous (``head_port``)."""
        return 29500
