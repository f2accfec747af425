"""The provider contract: acquire machines, release them, and say how to reach them.

A provider knows nothing about Python environments or tasks. Guarantees:

1. ``provision`` returns exactly ``spec.nodes`` instances, or raises
   :class:`~skyward.errors.ProvisionError` having released whatever it acquired.
2. ``terminate`` releases every instance it is given and returns only once the release is
   confirmed (or raises saying which instances are not confirmed).
3. ``validate`` rejects a spec this provider cannot serve before anything is acquired.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from skyward.transport.base import Transport, WorkerLaunch


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What the pool asks a provider for."""

    pool_id: str
    nodes: int
    accelerator: Any = None
    concurrency: int = 1


@dataclass(frozen=True, slots=True)
class Instance:
    """One acquired machine. ``private_addr`` is where the other nodes reach it."""

    id: str
    node: int
    private_addr: str
    public_addr: str | None = None
    accelerators: int = 0


class Provider(ABC):
    """Acquires and releases machines."""

    #: Short name used in messages and by plugins (``Cluster.provider``).
    name: str = "provider"
    #: True when workers run in the client's own Python environment (nothing to bootstrap).
    uses_client_environment: bool = False

    def validate(self, spec: PoolSpec) -> None:  # noqa: B027 - optional
        """Raise ConfigError for a spec this provider cannot serve."""

    @abstractmethod
    def provision(self, spec: PoolSpec) -> list[Instance]: ...

    @abstractmethod
    def transport(self, instance: Instance) -> Transport: ...

    @abstractmethod
    def terminate(self, instances: list[Instance]) -> None: ...

    @abstractmethod
    def worker_launch(self, instance: Instance, transport: Transport, image: Any,
                      log: Callable[[str], None]) -> WorkerLaunch:
        """Prepare ``instance`` for ``image`` (bootstrap, if any) and say how to start its worker.

        ``log`` receives progress lines for the console. Raises BootstrapError naming the host
        and the failing step.
        """

    def rendezvous_port(self, spec: PoolSpec) -> int:
        """The port node 0 offers for framework rendezvous (``head_port``)."""
        return 29500
