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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


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


@dataclass(frozen=True, slots=True)
class SSHAddress:
    """How the client reaches a machine over SSH (the transport opens one connection to it)."""

    host: str
    user: str
    port: int = 22
    key: str | None = None  # a private key file; None: the SSH agent's keys and ~/.ssh/id_*
    known_hosts: tuple[str, ...] = ()
    verify_host_keys: bool = True
    connect_timeout: float = 10.0
    jump: SSHAddress | None = None  # reach the host through this one (ssh's ProxyJump)
    proxy_command: str | None = None  # or through this command's stdin/stdout (ssh's ProxyCommand)


@dataclass(frozen=True, slots=True)
class HostEnvironment:
    """Where and how the pool builds an image's environment on a machine (see skyward.bootstrap)."""

    root: str = "~/.skyward"
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    system_site_packages: bool | tuple[str, ...] = False
    bootstrap_timeout: float = 1800.0
    #: Keep retrying the first connection this long (a machine that is still booting).
    reach_timeout: float = 0.0
    #: Defaults for the image's environment variables (the image's own values win).
    env: Mapping[str, str] = field(default_factory=dict)
    #: A line for the console before the machine is prepared (e.g. what was bought, where).
    note: str = ""


@dataclass(frozen=True, slots=True)
class Instance:
    """One acquired machine, described: where the other nodes reach it (``private_addr``), how
    the client reaches it (``ssh``; None: this machine) and how its Python environment is made
    (``environment``; None: the workers run in the client's own interpreter)."""

    id: str
    node: int
    private_addr: str
    public_addr: str | None = None
    accelerators: int = 0
    ssh: SSHAddress | None = None
    environment: HostEnvironment | None = None


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
