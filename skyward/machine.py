"""A machine as a provider describes it and the rest of skyward reaches it: an :class:`Instance`
(where the other nodes reach it, how the client does, how its Python environment is made), its
:class:`SSHAddress` and its :class:`HostEnvironment`.

Plain frozen values, below both the providers (which make them, :mod:`skyward.providers.base`)
and the transports (which reach them, :mod:`skyward.transport`), so that neither layer imports
the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["HostEnvironment", "Instance", "SSHAddress"]


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
    (``environment``; None: the workers run in the client's own interpreter). ``spot``: the
    provider rents it as a spot instance, which the cloud may take back at short notice (its
    workers watch for the notice). ``price_per_hour``: what it costs per hour as rented
    (approximate USD, from the provider's catalog), None where unknown or free.
    ``launcher``: a command run on this machine that starts a process on that one with its
    stdio carried back (Slurm's ``srun --jobid=J -w NODE``): the client reaches the workers
    through it, as it reaches local ones through a pipe (empty: no such command)."""

    id: str
    node: int
    private_addr: str
    public_addr: str | None = None
    accelerators: int = 0
    ssh: SSHAddress | None = None
    environment: HostEnvironment | None = None
    spot: bool = False
    price_per_hour: float | None = None
    launcher: tuple[str, ...] = ()


def _instance_setstate(self: Instance, state: list[Any]) -> None:
    # A cluster's record keeps its machines pickled: one written before a field was added has
    # fewer values, and the fields it lacks take their defaults. (Set after the class: the
    # dataclass of Python 3.11.2 replaces a __setstate__ defined in a frozen slotted class.)
    given = [*state, *(f.default for f in fields(Instance)[len(state):])]
    for f, value in zip(fields(Instance), given, strict=True):
        object.__setattr__(self, f.name, value)


Instance.__setstate__ = _instance_setstate  # type: ignore[method-assign]
