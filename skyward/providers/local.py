"""The Local provider: every node is a worker process on this machine."""

from __future__ import annotations

import socket
import uuid

from skyward.errors import ConfigError
from skyward.providers.base import Instance, PoolSpec, Provider

__all__ = ["Local"]


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
        return [Instance(id=f"local-{spec.pool_id}-{i}", node=i, private_addr="127.0.0.1") for i in range(spec.nodes)]

    can_acquire = True

    def acquire(self, spec: PoolSpec, nodes: list[int], exclude: frozenset[str]) -> list[Instance]:
        # Always capacity: each new node is one more process here (its own id, never reused).
        return [Instance(id=f"local-{spec.pool_id}-{n}-{uuid.uuid4().hex[:6]}", node=n, private_addr="127.0.0.1")
                for n in nodes]

    def terminate(self, instances: list[Instance]) -> None:
        # Nothing to release: the pool stops (and confirms gone) each worker's process group.
        return None

    def rendezvous_port(self, spec: PoolSpec) -> int:
        # Several local pools (and tests) run side by side: pick a port nobody holds now.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def __repr__(self) -> str:
        return "Local()"
