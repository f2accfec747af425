"""The Local provider: every node is a worker process on this machine."""

from __future__ import annotations

import random
import socket
import uuid

from skyward.errors import ConfigError
from skyward.providers.base import Instance, PoolSpec, Provider

__all__ = ["Local"]

#: What a Local node costs per hour: nothing (it is this machine, already yours).
FREE = 0.0


class Local(Provider):
    """Run each node as a worker process on this machine, in the client's Python environment.

    Nothing is bought or installed: an ``Image``'s ``env`` is applied to the workers, but its
    packages are expected to be installed here already. Good for development and tests; the
    same connection and dispatch serve remote pools once their machines are prepared: its
    instances have no SSH address (reached by subprocesses) and no environment to build.

    >>> import skyward as sky
    >>> with sky.ComputePool(provider=sky.Local(), nodes=2) as pool:  # doctest: +SKIP
    ...     ...
    """

    name = "local"

    def validate(self, spec: PoolSpec) -> None:
        # An accelerator chooses machines to rent; here there is nothing to choose, and taking
        # it silently would let plugins install CUDA wheels for a GPU this machine may not have.
        if spec.accelerator is not None:
            raise ConfigError("accelerator", "None with sky.Local() (its workers run on this machine as it is; "
                              "accelerators choose machines on providers such as sky.AWS() or sky.SSH())",
                              str(spec.accelerator), detail="drop accelerator= for a Local pool")

    def provision(self, spec: PoolSpec) -> list[Instance]:
        return [Instance(id=f"local-{spec.pool_id}-{i}", node=i, private_addr="127.0.0.1", price_per_hour=FREE)
                for i in range(spec.nodes)]

    can_acquire = True

    def acquire(self, spec: PoolSpec, nodes: list[int], exclude: frozenset[str]) -> list[Instance]:
        # Always capacity: each new node is one more process here (its own id, never reused).
        return [Instance(id=f"local-{spec.pool_id}-{n}-{uuid.uuid4().hex[:6]}", node=n, private_addr="127.0.0.1",
                         price_per_hour=FREE) for n in nodes]

    def terminate(self, instances: list[Instance]) -> None:
        # Nothing to release: the pool stops (and confirms gone) each worker's process group.
        return None

    def rendezvous_port(self, spec: PoolSpec) -> int:
        # Several local pools (and tests) run side by side, and frameworks listen on the port
        # and the few above it (jax's coordinator on head_port + 1): pick a run of free ports
        # below the kernel's ephemeral range, where no outgoing connection can take one of them
        # between this choice and the framework's listen.
        return free_port_run(RENDEZVOUS_PORTS)

    def __repr__(self) -> str:
        return "Local()"


RENDEZVOUS_PORTS = 8  # head_port and the seven above it are free when chosen


def free_port_run(count: int, *, tries: int = 200) -> int:
    """The first of ``count`` consecutive TCP ports that nothing listens on now.

    Chosen at random below the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``),
    so a connection made meanwhile by any process cannot be given one of them.
    """
    low = _ephemeral_low()
    floor = 10000 if low > 10000 + 2 * count else 1024
    for _ in range(tries):
        first = random.randrange(floor, low - count)
        if all(_free(port) for port in range(first, first + count)):
            return first
    # Every try met a listener (a crowded machine): let the kernel pick one port.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; other systems have theirs higher


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
