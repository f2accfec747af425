"""The Local provider: every node is a worker process on this machine."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from typing import Any

from skyward.providers.base import Instance, PoolSpec, Provider
from skyward.transport.base import Transport, WorkerLaunch

__all__ = ["Local"]


class Local(Provider):
    """Run each node as a worker process on this machine, in the client's Python environment.

    Nothing is bought or installed: an ``Image``'s ``env`` is applied to the workers, but its
    packages are expected to be installed here already. Good for development and tests; the
    same bootstrap-free dispatch path is what remote pools use after their machines are ready.

    >>> import skyward as sky
    >>> with sky.ComputePool(provider=sky.Local(), nodes=2) as pool:  # doctest: +SKIP
    ...     ...
    """

    name = "local"
    uses_client_environment = True

    def provision(self, spec: PoolSpec) -> list[Instance]:
        return [Instance(id=f"local-{spec.pool_id}-{i}", node=i, private_addr="127.0.0.1") for i in range(spec.nodes)]

    def transport(self, instance: Instance) -> Transport:
        from skyward.transport.local import LocalTransport

        return LocalTransport()

    def worker_launch(self, instance: Instance, transport: Transport, image: Any,
                      log: Callable[[str], None]) -> WorkerLaunch:
        # The client's interpreter, with the client's import path, so that functions pickled
        # by reference (defined in the user's modules) import on the worker too.
        paths = [os.getcwd()] + [p for p in sys.path if p and os.path.isdir(p)]
        env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
        return WorkerLaunch((sys.executable, "-m", "skyward.worker"), env, os.getcwd())

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
